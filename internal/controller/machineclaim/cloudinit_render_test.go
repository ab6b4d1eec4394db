package machineclaim

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clocktesting "k8s.io/utils/clock/testing"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/controller/machineclaim/stuck"
	"github.com/hyperfleet/hyperfleet/internal/testworld/testobjects"
	"github.com/hyperfleet/hyperfleet/internal/vmspec"
)

// brokenTemplates render without per-VM values (the template hash), but
// not for a VM: every claim of them would fail.
var brokenTemplates = []struct {
	name, field string
	mutate      func(*hfv1.HypervisorMachineTemplate)
}{
	{"user data failing with per-VM values", "userData", func(tm *hfv1.HypervisorMachineTemplate) {
		tm.Spec.CloudInit = &hfv1.CloudInit{UserData: "#cloud-config\n{{ if .RunnerName }}runcmd: [{{ .NoSuchVariable }}]{{ end }}\n"}
	}},
	{"runner download without checksum", "downloadSHA256", func(tm *hfv1.HypervisorMachineTemplate) {
		// The CRD refuses this now; objects stored before that rule remain.
		tm.Spec.Bootstrap.GitHub.Runner = &hfv1.RunnerSoftware{DownloadURL: "https://example.com/actions-runner.tar.gz"}
	}},
}

// TestClaimCloudInitChecksBeforeIssuing: a claim whose cloud-init cannot
// render never reaches the workload side; one that renders gets its runner
// settings once, and its seed holds no credential: it names where the
// credential arrives in the running VM, and until when.
func TestClaimCloudInitChecksBeforeIssuing(t *testing.T) {
	claim := &hfv1.MachineClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "ci", Name: "runner-1", UID: "5f0c4a5e-1b7e-4c55-9d55-0a4f7f0b8e21"}}
	cluster := &hfv1.HypervisorCluster{}
	for _, tc := range brokenTemplates {
		t.Run(tc.name, func(t *testing.T) {
			b := &ciDouble{runnerName: "runner-named-by-the-platform"}
			ci := &claimCloudInit{r: &Reconciler{CI: b, Clock: clocktesting.NewFakeClock(time.Now())}, claim: claim.DeepCopy(), tmpl: testobjects.GitHubTemplate(tc.mutate), cluster: cluster}
			_, err := ci.Render(context.Background())
			if !errors.Is(err, vmspec.ErrRender) {
				t.Fatalf("Render error = %v, want a render error", err)
			}
			if !strings.Contains(err.Error(), tc.field) {
				t.Errorf("error %q does not name %s", err, tc.field)
			}
			if b.varsCalls != 0 {
				t.Errorf("the workload side was asked %d times for a cloud-init that does not render, want 0", b.varsCalls)
			}
		})
	}
	t.Run("valid template", func(t *testing.T) {
		b := &ciDouble{runnerName: "runner-named-by-the-platform"}
		now := time.Date(2026, 5, 1, 10, 0, 0, 0, time.UTC)
		ci := &claimCloudInit{r: &Reconciler{CI: b, Clock: clocktesting.NewFakeClock(now)},
			claim: claim.DeepCopy(), tmpl: testobjects.GitHubTemplate(nil), cluster: cluster}
		out, err := ci.Render(context.Background())
		if err != nil {
			t.Fatalf("Render: %v", err)
		}
		if b.varsCalls != 1 {
			t.Errorf("the workload side was asked %d times, want 1", b.varsCalls)
		}
		ud := string(out.UserData)
		deadline := now.Add(stuck.DefaultBounds().Provisioning + stuck.DefaultBounds().Bootstrapping).Format(time.RFC3339)
		for _, want := range []string{"runner-named-by-the-platform", `"secretsFile": "/run/hyperfleet/secrets.json"`, `"secretsDeadline": "` + deadline + `"`} {
			if !strings.Contains(ud, want) {
				t.Errorf("the VM's cloud-init lacks %s", want)
			}
		}
		for _, bad := range []string{"jitConfig", "registrationToken"} {
			if strings.Contains(ud, bad) {
				t.Errorf("the VM's cloud-init holds %s", bad)
			}
		}
	})
}

// TestCheckTemplateRender: the template check renders what a VM gets, so
// it catches what the drift hash (rendered without per-VM values) does not.
func TestCheckTemplateRender(t *testing.T) {
	cluster := &hfv1.HypervisorCluster{}
	for _, tc := range brokenTemplates {
		t.Run(tc.name, func(t *testing.T) {
			tmpl := testobjects.GitHubTemplate(tc.mutate)
			// The case must get past the drift hash, or it would not show
			// that the full render is needed.
			if _, err := vmspec.TemplateHash(ciPlatforms, tmpl, cluster, nil, nil); err != nil {
				t.Fatalf("the drift hash already refuses the template: %v", err)
			}
			err := vmspec.CheckTemplate(ciPlatforms, tmpl, cluster, nil, nil)
			if err == nil || !strings.Contains(err.Error(), tc.field) {
				t.Fatalf("vmspec.CheckTemplate = %v, want an error naming %s", err, tc.field)
			}
		})
	}
	for _, method := range []hfv1.BootstrapMethod{hfv1.BootstrapJITConfig, hfv1.BootstrapRunnerToken} {
		t.Run("valid "+string(method), func(t *testing.T) {
			tmpl := testobjects.GitHubTemplate(func(tm *hfv1.HypervisorMachineTemplate) { tm.Spec.Bootstrap.Method = method })
			if err := vmspec.CheckTemplate(ciPlatforms, tmpl, cluster, nil, nil); err != nil {
				t.Fatalf("vmspec.CheckTemplate of a valid template: %v", err)
			}
		})
	}
}

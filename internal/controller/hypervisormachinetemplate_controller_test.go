package controller_test

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/manager"
	proxmoxsim "github.com/hyperfleet/hyperfleet/internal/testworld/simulator/proxmox"
)

func waitTemplate(t *testing.T, tmpl *hfv1.HypervisorMachineTemplate, status metav1.ConditionStatus, reason string) *hfv1.HypervisorMachineTemplate {
	t.Helper()
	got := &hfv1.HypervisorMachineTemplate{}
	eventually(t, 60*time.Second, fmt.Sprintf("template %s Valid=%s/%s", tmpl.Name, status, reason), func() error {
		if err := env.Client.Get(context.Background(), client.ObjectKeyFromObject(tmpl), got); err != nil {
			return err
		}
		c := hfv1.FindCondition(got.Status.Conditions, hfv1.HypervisorMachineTemplateValidCondition)
		if c == nil || c.Status != status || (reason != "" && c.Reason != reason) || got.Status.ObservedGeneration != got.Generation {
			return fmt.Errorf("Valid = %+v", c)
		}
		return nil
	})
	return got
}

// TestTemplateValidation covers a valid template and each way one is not.
func TestTemplateValidation(t *testing.T) {
	sim := startSim(t, func(c *proxmoxsim.Config) {
		c.Storages = append(c.Storages, proxmoxsim.StorageConfig{ID: "thick", Type: "lvm", Content: []string{"images"}, Capacity: 100 << 30})
		c.Templates = append(c.Templates, proxmoxsim.TemplateConfig{VMID: 9001, Node: "pve1", Name: "on-thick-lvm", Storage: "thick", DiskSize: 8 << 30, Cores: 1, MemoryMiB: 1024, Agent: true})
	})
	startOperator(t, operatorOptions{})
	f := newFixture(t, sim, nil)

	ok := waitTemplate(t, f.template, metav1.ConditionTrue, "")
	if ok.Status.TemplateHash == "" || len(ok.Status.TemplateHash) != 64 {
		t.Errorf("templateHash = %q", ok.Status.TemplateHash)
	}
	if r := ok.Status.ResolvedTemplate; r == nil || r.VMID != 9000 || r.Node != "pve1" {
		t.Errorf("resolvedTemplate = %+v", r)
	}
	if !hfv1.IsConditionTrue(ok.Status.Conditions, hfv1.ReadyCondition) {
		t.Errorf("Ready not True: %+v", ok.Status.Conditions)
	}

	variant := func(name string, mutate func(*hfv1.HypervisorMachineTemplate)) *hfv1.HypervisorMachineTemplate {
		tmpl := f.template.DeepCopy()
		tmpl.ObjectMeta = metav1.ObjectMeta{Namespace: f.namespace, Name: name}
		tmpl.Status = hfv1.HypervisorMachineTemplateStatus{}
		mutate(tmpl)
		f.create(tmpl)
		return tmpl
	}
	cases := []struct {
		name, reason, text string
		mutate             func(*hfv1.HypervisorMachineTemplate)
	}{
		{"missing", string(hfv1.TemplateNotFoundReason), "9999", func(tm *hfv1.HypervisorMachineTemplate) {
			tm.Spec.Source.Proxmox.TemplateID = ptr.To[int32](9999)
		}},
		{"thick-lvm", string(hfv1.LinkedCloneUnsupportedReason), "use a full clone", func(tm *hfv1.HypervisorMachineTemplate) {
			tm.Spec.Source.Proxmox.TemplateID = ptr.To[int32](9001)
		}},
		{"no-secret", string(hfv1.SecretNotFoundReason), "spec.bootstrap.github.credentials.pat: Secret", func(tm *hfv1.HypervisorMachineTemplate) {
			tm.Spec.Bootstrap.GitHub.Credentials.PAT.Name = "absent"
		}},
		{"no-cluster", string(hfv1.ClusterUnavailableReason), "does not exist", func(tm *hfv1.HypervisorMachineTemplate) {
			tm.Spec.HypervisorClusterRef.Name = "nowhere"
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := waitTemplate(t, variant(tc.name, tc.mutate), metav1.ConditionFalse, tc.reason)
			c := hfv1.FindCondition(got.Status.Conditions, hfv1.HypervisorMachineTemplateValidCondition)
			if !strings.Contains(c.Message, tc.text) {
				t.Errorf("message %q does not mention %q", c.Message, tc.text)
			}
		})
	}

	// A full clone of the thick-LVM template is fine.
	full := waitTemplate(t, variant("thick-full", func(tm *hfv1.HypervisorMachineTemplate) {
		tm.Spec.Source.Proxmox.TemplateID = ptr.To[int32](9001)
		tm.Spec.Source.Proxmox.CloneMode = hfv1.CloneModeFull
	}), metav1.ConditionTrue, "")
	if full.Status.TemplateHash == ok.Status.TemplateHash {
		t.Error("templates with different sources share a hash")
	}
}

// TestTemplateHash: equal specs hash equally (across namespaces and
// restarts); anything that shapes the VM changes the hash.
func TestTemplateHash(t *testing.T) {
	sim := startSim(t, nil)
	first := startOperator(t, operatorOptions{})
	f := newFixture(t, sim, nil)
	base := waitTemplate(t, f.template, metav1.ConditionTrue, "").Status.TemplateHash

	twin := f.template.DeepCopy()
	twin.ObjectMeta = metav1.ObjectMeta{Namespace: f.namespace, Name: "twin"}
	twin.Status = hfv1.HypervisorMachineTemplateStatus{}
	f.create(twin)
	if h := waitTemplate(t, twin, metav1.ConditionTrue, "").Status.TemplateHash; h != base {
		t.Errorf("identical spec, different hash: %s vs %s", h, base)
	}

	changes := map[string]func(*hfv1.HypervisorMachineTemplate){
		"memory": func(tm *hfv1.HypervisorMachineTemplate) { tm.Spec.Resources.Memory = resource.MustParse("4Gi") },
		"vlan":   func(tm *hfv1.HypervisorMachineTemplate) { tm.Spec.Network.VLAN = ptr.To[int32](42) },
		"userData": func(tm *hfv1.HypervisorMachineTemplate) {
			tm.Spec.CloudInit = &hfv1.CloudInit{UserData: "#cloud-config\npackages: [git]\n"}
		},
	}
	for name, mutate := range changes {
		t.Run(name, func(t *testing.T) {
			var cur hfv1.HypervisorMachineTemplate
			if err := env.Client.Get(context.Background(), client.ObjectKeyFromObject(twin), &cur); err != nil {
				t.Fatal(err)
			}
			mutate(&cur)
			if err := env.Client.Update(context.Background(), &cur); err != nil {
				t.Fatal(err)
			}
			got := waitTemplate(t, &cur, metav1.ConditionTrue, "")
			if got.Status.TemplateHash == base {
				t.Errorf("changing %s kept the hash", name)
			}
			base = got.Status.TemplateHash
		})
	}

	// A restarted operator computes the same hash for the same spec.
	first.restart(t, operatorOptions{})
	var cur hfv1.HypervisorMachineTemplate
	if err := env.Client.Get(context.Background(), client.ObjectKeyFromObject(twin), &cur); err != nil {
		t.Fatal(err)
	}
	cur.Annotations = map[string]string{"touch": "1"}
	cur.Spec.Resources.CPU++
	if err := env.Client.Update(context.Background(), &cur); err != nil {
		t.Fatal(err)
	}
	afterBump := waitTemplate(t, &cur, metav1.ConditionTrue, "").Status.TemplateHash
	if err := env.Client.Get(context.Background(), client.ObjectKeyFromObject(twin), &cur); err != nil {
		t.Fatal(err)
	}
	cur.Spec.Resources.CPU--
	if err := env.Client.Update(context.Background(), &cur); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "hash back to the pre-restart value", func() error {
		got := waitTemplate(t, &cur, metav1.ConditionTrue, "")
		if got.Status.TemplateHash != base || got.Status.TemplateHash == afterBump {
			return fmt.Errorf("hash %s, want %s", got.Status.TemplateHash, base)
		}
		return nil
	})
}

// TestTemplateAgentUnavailable: a template that takes the agent from the
// operator is not Ready, with a message naming what to configure, until the
// operator serves a binary for its runner's platform.
func TestTemplateAgentUnavailable(t *testing.T) {
	sim := startSim(t, nil)
	op := startOperator(t, operatorOptions{})
	f := newFixture(t, sim, nil)
	image := waitTemplate(t, f.template, metav1.ConditionTrue, "")

	variant := func(name string, mutate func(*hfv1.HypervisorMachineTemplate)) *hfv1.HypervisorMachineTemplate {
		tmpl := f.template.DeepCopy()
		tmpl.ObjectMeta = metav1.ObjectMeta{Namespace: f.namespace, Name: name}
		tmpl.Status = hfv1.HypervisorMachineTemplateStatus{}
		tmpl.Spec.Bootstrap.AgentSource = hfv1.AgentSourceOperator
		if mutate != nil {
			mutate(tmpl)
		}
		f.create(tmpl)
		return tmpl
	}
	wantUnavailable := func(tmpl *hfv1.HypervisorMachineTemplate, texts ...string) {
		t.Helper()
		got := waitTemplate(t, tmpl, metav1.ConditionFalse, string(hfv1.AgentUnavailableReason))
		ready := hfv1.FindCondition(got.Status.Conditions, hfv1.ReadyCondition)
		if ready == nil || ready.Status != metav1.ConditionFalse || ready.Reason != string(hfv1.AgentUnavailableReason) {
			t.Errorf("Ready = %+v, want False/%s", ready, hfv1.AgentUnavailableReason)
		}
		for _, text := range texts {
			if ready != nil && !strings.Contains(ready.Message, text) {
				t.Errorf("message %q does not mention %q", ready.Message, text)
			}
		}
		eventually(t, 10*time.Second, "an AgentUnavailable warning event", func() error {
			var list corev1.EventList
			if err := env.Client.List(context.Background(), &list, client.InNamespace(tmpl.Namespace)); err != nil {
				return err
			}
			for _, e := range list.Items {
				if e.InvolvedObject.UID == tmpl.UID && e.Reason == string(hfv1.AgentUnavailableReason) && e.Type == corev1.EventTypeWarning {
					return nil
				}
			}
			return fmt.Errorf("none among %d events", len(list.Items))
		})
	}

	// No agent server: the message names the flags to set.
	amd := variant("operator-agent", nil)
	wantUnavailable(amd, "--agent-server-addr", "--agent-binaries-dir", "hyperfleet-agent-linux-amd64", "agentSource Image")

	// An agent server with an amd64 build only.
	certFile, keyFile, _ := webhookCertificate(t)
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "hyperfleet-agent-linux-amd64"), []byte("\x7fELF stand-in for the agent"), 0o755); err != nil {
		t.Fatal(err)
	}
	op = op.restart(t, operatorOptions{agentServer: &manager.AgentServerOptions{
		Addr: "127.0.0.1:0", CertFile: certFile, KeyFile: keyFile, Dir: dir, URL: "https://hyperfleet-agent.hyperfleet-system.svc:9443",
	}})
	if op.components.AgentServer == nil {
		t.Fatal("the manager did not set up the agent server")
	}
	ok := waitTemplate(t, amd, metav1.ConditionTrue, "")
	if ok.Status.TemplateHash == image.Status.TemplateHash {
		t.Error("taking the agent from the operator kept the template hash")
	}
	arm := variant("operator-agent-arm64", func(tm *hfv1.HypervisorMachineTemplate) {
		tm.Spec.Bootstrap.GitHub.Runner = &hfv1.RunnerSoftware{OS: "linux", Arch: "arm64"}
	})
	wantUnavailable(arm, "hyperfleet-agent-linux-arm64", "--agent-binaries-dir", "arch arm64")
	// Templates that keep the agent in the image are unaffected.
	if got := waitTemplate(t, f.template, metav1.ConditionTrue, ""); got.Status.TemplateHash != image.Status.TemplateHash {
		t.Error("configuring an agent server changed the hash of a template with agentSource Image")
	}
}

// TestTemplateReusableCredential: a runner-token template, of an
// organization or of a repository scope, carries a True ReusableCredential
// condition (reason MultiJobCredential, and a warning event) saying what
// the token allows and naming jit-config; with an organization scope, on
// the template or on a RunnerPool using it, the message names that field.
// A jit-config template carries it False.
func TestTemplateReusableCredential(t *testing.T) {
	sim := startSim(t, nil)
	startOperator(t, operatorOptions{})
	f := newFixture(t, sim, nil)

	waitCredential := func(tmpl *hfv1.HypervisorMachineTemplate, status metav1.ConditionStatus, texts ...string) {
		t.Helper()
		eventually(t, 60*time.Second, fmt.Sprintf("template %s ReusableCredential=%s", tmpl.Name, status), func() error {
			var got hfv1.HypervisorMachineTemplate
			if err := env.Client.Get(context.Background(), client.ObjectKeyFromObject(tmpl), &got); err != nil {
				return err
			}
			c := hfv1.FindCondition(got.Status.Conditions, hfv1.HypervisorMachineTemplateReusableCredentialCondition)
			if c == nil || c.Status != status {
				return fmt.Errorf("ReusableCredential = %+v", c)
			}
			for _, text := range texts {
				if !strings.Contains(c.Message, text) {
					return fmt.Errorf("message %q does not mention %q", c.Message, text)
				}
			}
			return nil
		})
	}
	variant := func(name string, mutate func(*hfv1.HypervisorMachineTemplate)) *hfv1.HypervisorMachineTemplate {
		tmpl := f.template.DeepCopy()
		tmpl.ObjectMeta = metav1.ObjectMeta{Namespace: f.namespace, Name: name}
		tmpl.Status = hfv1.HypervisorMachineTemplateStatus{}
		mutate(tmpl)
		f.create(tmpl)
		return tmpl
	}

	waitCredential(f.template, metav1.ConditionFalse)
	org := variant("org-token", func(tm *hfv1.HypervisorMachineTemplate) {
		tm.Spec.Bootstrap.Method = hfv1.BootstrapRunnerToken
		tm.Spec.Bootstrap.GitHub.Repository, tm.Spec.Bootstrap.GitHub.Organization = "", "octo-org"
	})
	waitCredential(org, metav1.ConditionTrue, "spec.bootstrap.github.organization (octo-org)", "jit-config")
	wantEvents(t, org, string(hfv1.MultiJobCredentialReason))

	// A repository's registration token registers any number of runners
	// of that repository: reusable as well.
	repo := variant("repo-token", func(tm *hfv1.HypervisorMachineTemplate) {
		tm.Spec.Bootstrap.Method = hfv1.BootstrapRunnerToken
		tm.Spec.Bootstrap.GitHub.Organization, tm.Spec.Bootstrap.GitHub.Repository = "", "app"
	})
	waitCredential(repo, metav1.ConditionTrue, "registers any number of runners", "jit-config")
	wantEvents(t, repo, string(hfv1.MultiJobCredentialReason))
	// A pool narrowing the repository template to an organization makes it
	// organization-wide.
	f.create(&hfv1.RunnerPool{
		ObjectMeta: metav1.ObjectMeta{Namespace: f.namespace, Name: "org-pool"},
		Spec: hfv1.RunnerPoolSpec{
			TemplateRef: hfv1.ObjectName{Name: repo.Name},
			Workload:    hfv1.Workload{Type: hfv1.WorkloadGitHubActions, GitHub: &hfv1.GitHubWorkload{Organization: "octo-org", Labels: []string{"org"}}},
			Scaling:     hfv1.Scaling{MinReplicas: 0, MaxReplicas: 1},
		},
	})
	waitCredential(repo, metav1.ConditionTrue, "RunnerPool org-pool spec.workload.github.organization", "jit-config")

	// A GitLab runner authentication token is multi-job on GitLab's
	// side, whatever the template says: the condition says what limits it.
	gl := variant("gitlab", func(tm *hfv1.HypervisorMachineTemplate) {
		tm.Spec.Bootstrap.Method, tm.Spec.Bootstrap.GitHub = "", nil
		tm.Spec.Bootstrap.GitLab = &hfv1.GitLabBootstrap{Group: "acme", Credentials: hfv1.GitLabCredentials{Token: hfv1.LocalSecretKeySelector{Name: "gitlab", Key: "token"}}}
	})
	waitCredential(gl, metav1.ConditionTrue, "GitLab: a GitLab runner authentication token is multi-job", "paused as soon as its first job is seen",
		"spec.bootstrap.gitlab.group (acme)")
}

// TestHungClusterHoldsUpNoOtherTemplate: a template whose validation is
// held by its cluster's API (connected and Ready, then hung: the first
// ~30 s of a partition, before three probes have failed) occupies one of
// the HypervisorMachineTemplate controller's workers until its calls time
// out, and no template of another cluster waits for it: one created while
// that validation is held is validated first. With one worker (before),
// every template of every cluster waited out the hung calls.
func TestHungClusterHoldsUpNoOtherTemplate(t *testing.T) {
	hung := startSim(t, func(c *proxmoxsim.Config) {
		second := c.Templates[0]
		second.VMID, second.Name = 9001, "second"
		c.Templates = append(c.Templates, second)
	})
	healthy := startSim(t, nil)
	var holding atomic.Bool
	// The template's reads; the cluster's probe and listing go on.
	held, release := hung.holdRequests(func(r *http.Request) bool {
		return holding.Load() && strings.Contains(r.URL.Path, "/qemu/")
	})
	startOperator(t, operatorOptions{})
	fHung := newFixture(t, hung, nil)
	// Before the fixtures are deleted and the operator stops (cleanups
	// run last first): a held validation would keep both until its
	// request timeout.
	t.Cleanup(release)
	waitTemplate(t, fHung.template, metav1.ConditionTrue, "")
	holding.Store(true)
	var tmpl hfv1.HypervisorMachineTemplate
	if err := env.Client.Get(context.Background(), client.ObjectKeyFromObject(fHung.template), &tmpl); err != nil {
		t.Fatal(err)
	}
	before := tmpl.DeepCopy()
	tmpl.Spec.Source.Proxmox.TemplateID = ptr.To[int32](9001)
	if err := env.Client.Patch(context.Background(), &tmpl, client.MergeFrom(before)); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "the hung cluster's template validation held", func() error {
		if held.Load() == 0 {
			return fmt.Errorf("no template read held yet")
		}
		return nil
	})
	fUp := newFixture(t, healthy, nil)
	waitTemplate(t, fUp.template, metav1.ConditionTrue, "")
	var got hfv1.HypervisorMachineTemplate
	if err := env.Client.Get(context.Background(), client.ObjectKeyFromObject(fHung.template), &got); err != nil {
		t.Fatal(err)
	}
	if got.Status.ObservedGeneration == got.Generation {
		t.Fatalf("the healthy cluster's template was validated only after the held validation ended (%+v)", got.Status.Conditions)
	}
}

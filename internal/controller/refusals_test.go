package controller

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/controller/machineclaim"
	"github.com/hyperfleet/hyperfleet/internal/controller/refusal"
	"github.com/hyperfleet/hyperfleet/internal/ipam"
	"github.com/hyperfleet/hyperfleet/internal/tenancy"
	"github.com/hyperfleet/hyperfleet/internal/testworld/testobjects"
	"github.com/hyperfleet/hyperfleet/internal/vmspec"
)

// TestRefusals: each field the operator does not act on is refused with
// the reason and a message naming the field and the way out.
func TestRefusals(t *testing.T) {
	tmpl := func(mutate func(*hfv1.HypervisorMachineTemplate)) *refusal.Refusal {
		tm := testobjects.GitHubTemplate(mutate)
		return refusal.Template(ciPlatforms, tm)
	}
	cases := []struct {
		name    string
		got     *refusal.Refusal
		reason  string
		mention []string
	}{
		{"macOS runner", tmpl(func(tm *hfv1.HypervisorMachineTemplate) {
			tm.Spec.Bootstrap.GitHub.Runner = &hfv1.RunnerSoftware{OS: "osx"}
		}), string(hfv1.UnsupportedReason), []string{"spec.bootstrap.github.runner.os: osx", "set os: linux"}},
		// An operator build without a back-end for a type the API takes
		// (the binary registers all four) refuses that type's pools and
		// claims rather than build VMs that run no runner.
		{"pool of a type without a back-end", refusal.Pool(withoutGitLab, &hfv1.RunnerPool{Spec: hfv1.RunnerPoolSpec{Workload: hfv1.Workload{Type: hfv1.WorkloadGitLabCI}}}),
			string(hfv1.NotImplementedReason), []string{"spec.workload.type: gitlab-ci is not served by this operator build", "github-actions"}},
		{"claim of a type without a back-end", refusal.Claim(withoutGitLab, &hfv1.MachineClaim{Spec: hfv1.MachineClaimSpec{WorkloadConfig: &hfv1.WorkloadConfig{Type: hfv1.WorkloadGitLabCI}}}),
			string(hfv1.NotImplementedReason), []string{"spec.workloadConfig.type: gitlab-ci", "remove spec.workloadConfig"}},
	}
	// Every type the API takes is served: GitLab CI's template, pool and
	// claim are not refused.
	gl := testobjects.GitHubTemplate(func(tm *hfv1.HypervisorMachineTemplate) {
		tm.Spec.Bootstrap.GitHub = nil
		tm.Spec.Bootstrap.GitLab = &hfv1.GitLabBootstrap{Group: "acme", Credentials: hfv1.GitLabCredentials{Token: hfv1.LocalSecretKeySelector{Name: "gl", Key: "token"}}}
	})
	if r := refusal.Template(ciPlatforms, gl); r != nil {
		t.Errorf("a GitLab template is refused: %+v", r)
	}
	if r := refusal.Pool(ciPlatforms, &hfv1.RunnerPool{Spec: hfv1.RunnerPoolSpec{Workload: hfv1.Workload{Type: hfv1.WorkloadGitLabCI}}}); r != nil {
		t.Errorf("a gitlab-ci pool is refused: %+v", r)
	}
	if r := refusal.Claim(ciPlatforms, &hfv1.MachineClaim{Spec: hfv1.MachineClaimSpec{WorkloadConfig: &hfv1.WorkloadConfig{Type: hfv1.WorkloadGitLabCI}}}); r != nil {
		t.Errorf("a gitlab-ci claim is refused: %+v", r)
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if tc.got == nil {
				t.Fatal("not refused")
			}
			if string(tc.got.Reason) != tc.reason {
				t.Errorf("reason %s, want %s", tc.got.Reason, tc.reason)
			}
			for _, m := range tc.mention {
				if !strings.Contains(tc.got.Message, m) {
					t.Errorf("message %q does not mention %q", tc.got.Message, m)
				}
			}
		})
	}

	// What is implemented is not refused.
	if r := tmpl(func(tm *hfv1.HypervisorMachineTemplate) {
		tm.Spec.Attestation.Method = hfv1.AttestationNone
		tm.Spec.Bootstrap.GitHub.Runner = &hfv1.RunnerSoftware{OS: "linux"}
		tm.Spec.CloudInit = &hfv1.CloudInit{Delivery: hfv1.CloudInitDeliveryISO}
	}); r != nil {
		t.Errorf("a template with attestation none and a linux runner is refused: %+v", r)
	}
	if r := tmpl(func(tm *hfv1.HypervisorMachineTemplate) {
		tm.Spec.Guest = &hfv1.Guest{OS: hfv1.GuestWindows}
		tm.Spec.Bootstrap.GitHub.Runner = &hfv1.RunnerSoftware{OS: "win"}
	}); r != nil {
		t.Errorf("a Windows template (guest.os windows, runner.os win) is refused: %+v", r)
	}
	if r := tmpl(func(tm *hfv1.HypervisorMachineTemplate) {
		tm.Spec.CloudInit = &hfv1.CloudInit{Delivery: hfv1.CloudInitDeliveryProxmox, Proxmox: &hfv1.ProxmoxCloudInit{VendorSnippet: "local:snippets/kit.yaml"}}
	}); r != nil {
		t.Errorf("a template with cloudInit.delivery proxmox is refused: %+v", r)
	}
	if r := refusal.Pool(ciPlatforms, &hfv1.RunnerPool{Spec: hfv1.RunnerPoolSpec{Workload: hfv1.Workload{Type: hfv1.WorkloadGitHubActions}}}); r != nil {
		t.Errorf("a github-actions pool is refused: %+v", r)
	}
	if r := refusal.Claim(ciPlatforms, &hfv1.MachineClaim{}); r != nil {
		t.Errorf("a claim without workloadConfig is refused: %+v", r)
	}
}

// TestSamplesWorkAsWritten: no sample in config/samples sets a refused
// field, and every sample template's cloud-init renders for a VM: a sample
// is never accepted and then fails.
func TestSamplesWorkAsWritten(t *testing.T) {
	files, err := filepath.Glob(filepath.Join("..", "..", "config", "samples", "hyperfleet_*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no samples: %v", err)
	}
	var templates []*hfv1.HypervisorMachineTemplate
	pools := map[string]*ipam.Pool{}
	clusters := map[string]*hfv1.HypervisorCluster{}
	for _, f := range files {
		raw, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var head struct{ Kind string }
		if err := yaml.Unmarshal(raw, &head); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		var ref *refusal.Refusal
		switch head.Kind {
		case "HypervisorMachineTemplate":
			tm := &hfv1.HypervisorMachineTemplate{}
			decodeSample(t, f, raw, tm)
			templates = append(templates, tm)
			ref = refusal.Template(ciPlatforms, tm)
		case "RunnerPool":
			p := &hfv1.RunnerPool{}
			decodeSample(t, f, raw, p)
			ref = refusal.Pool(ciPlatforms, p)
		case "MachineClaim":
			c := &hfv1.MachineClaim{}
			decodeSample(t, f, raw, c)
			ref = refusal.Claim(ciPlatforms, c)
		case "HypervisorCluster":
			c := &hfv1.HypervisorCluster{}
			decodeSample(t, f, raw, c)
			clusters[c.Name] = c
		case "IPPool":
			p := &hfv1.IPPool{}
			decodeSample(t, f, raw, p)
			if pools[p.Name], err = ipam.ParsePool(machineclaim.PoolSpec(p)); err != nil {
				t.Fatalf("%s: %v", f, err)
			}
		}
		if ref != nil {
			t.Errorf("%s is refused (%s): %s", filepath.Base(f), ref.Reason, ref.Message)
		}
	}
	agents := sampleAgents{}
	for _, tm := range templates {
		cluster := clusters[tm.Spec.HypervisorClusterRef.Name]
		if cluster == nil {
			cluster = &hfv1.HypervisorCluster{}
		}
		var ps []*ipam.Pool
		for _, name := range tm.Spec.Network.IPPoolNames() {
			p := pools[name]
			if p == nil {
				t.Errorf("sample template %s names IPPool %s, which no sample defines", tm.Name, name)
				continue
			}
			ps = append(ps, p)
		}
		if err := vmspec.CheckTemplate(ciPlatforms, tm, cluster, ps, agents); err != nil {
			t.Errorf("sample template %s does not render for a VM: %v", tm.Name, err)
		}
		// Every entry of the sample cluster's spec.tenancy selects the
		// namespaces its allowedNamespaces admits: one must allow the
		// template (docs/security.md, "Admin allow-lists").
		if problems := tenancy.Violations(tm, cluster, cluster.Spec.Tenancy, nil); len(problems) > 0 {
			t.Errorf("sample template %s is not allowed by sample cluster %s: %s", tm.Name, cluster.Name, strings.Join(problems, "; "))
		}
	}
}

// sampleAgents serves the agents of linux/x64 and linux/arm64 runners to
// VMs that trust their system roots.
type sampleAgents struct{}

func (sampleAgents) Lookup(os, arch string) (url, sha256 string, ok bool) {
	if os != "linux" || arch != "x64" && arch != "arm64" {
		return "", "", false
	}
	return "https://agents.example.com/hf/agent/v1/hyperfleet-agent-" + os + "-" + arch, strings.Repeat("ab", 32), true
}

func (sampleAgents) CA() string     { return "" }
func (sampleAgents) CAError() error { return nil }

func decodeSample(t *testing.T, file string, raw []byte, into any) {
	t.Helper()
	if err := yaml.UnmarshalStrict(raw, into); err != nil {
		t.Fatalf("%s does not decode into the Go types: %v", file, err)
	}
}

package generic

import (
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/pkg/workload"
)

func TestTemplateAndPool(t *testing.T) {
	be, err := NewBackend(workload.Dependencies{})
	if err != nil {
		t.Fatal(err)
	}
	if workload.HasRunner(be) {
		t.Fatal("generic says its VMs run a runner")
	}
	gh := &hfv1.HypervisorMachineTemplate{Spec: hfv1.HypervisorMachineTemplateSpec{Bootstrap: hfv1.Bootstrap{GitHub: &hfv1.GitHubBootstrap{}}}}
	if _, ok := be.Template(gh); ok {
		t.Error("generic reads a GitHub template")
	}
	tmpl := &hfv1.HypervisorMachineTemplate{Spec: hfv1.HypervisorMachineTemplateSpec{Bootstrap: hfv1.Bootstrap{Generic: &hfv1.GenericBootstrap{Script: "echo hi"}}}}
	got, ok := be.Template(tmpl)
	if !ok || got.Script != "echo hi" || got.TTL != time.Hour || got.Runner.WorkDir != defaultWorkDir || got.Runner.OS != "linux" || got.Runner.Arch != "x64" {
		t.Errorf("defaults: %+v %v", got, ok)
	}
	tmpl.Spec.Bootstrap.Generic.TTL = &metav1.Duration{Duration: 2 * time.Hour}
	tmpl.Spec.Bootstrap.Generic.WorkDir, tmpl.Spec.Bootstrap.Generic.Arch = "/srv/work", "arm64"
	if got, _ := be.Template(tmpl); got.TTL != 2*time.Hour || got.Runner.WorkDir != "/srv/work" || got.Runner.Arch != "arm64" {
		t.Errorf("set values: %+v", got)
	}
	pool := &hfv1.RunnerPool{Spec: hfv1.RunnerPoolSpec{Workload: hfv1.Workload{Type: hfv1.WorkloadGeneric}}}
	p, ok := be.Pool(pool, tmpl)
	if !ok || !p.Scope.IsZero() || p.Claim == nil || p.Claim.Type != hfv1.WorkloadGeneric {
		t.Errorf("pool: %+v %v", p, ok)
	}
	pool.Spec.Workload.Type = hfv1.WorkloadGitHubActions
	if _, ok := be.Pool(pool, tmpl); ok {
		t.Error("generic reads a github-actions pool")
	}
}

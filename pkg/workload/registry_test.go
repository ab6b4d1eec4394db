package workload_test

import (
	"context"
	"errors"
	"slices"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/pkg/workload"
)

// stubBackend reads every template whose runner group is its name, and
// the pools and claims of its own type.
type stubBackend struct {
	name string
	typ  hfv1.WorkloadType
}

func (b stubBackend) Name() string { return b.name }

func (b stubBackend) TemplateField() string { return "spec.bootstrap." + b.name }

func (b stubBackend) Template(tmpl *hfv1.HypervisorMachineTemplate) (workload.Template, bool) {
	gh := tmpl.Spec.Bootstrap.GitHub
	return workload.Template{Field: b.name}, gh != nil && gh.RunnerGroup == b.name
}

func (b stubBackend) Pool(pool *hfv1.RunnerPool, _ *hfv1.HypervisorMachineTemplate) (workload.Pool, bool) {
	return workload.Pool{Field: b.name}, pool.Spec.Workload.Type == b.typ
}

func (b stubBackend) Claim(*hfv1.MachineClaim) workload.ClaimRunner {
	return workload.ClaimRunner{Name: b.name}
}

func (b stubBackend) Provider(context.Context, *hfv1.HypervisorMachineTemplate, workload.Scope, workload.SecretReader) (workload.Provider, error) {
	return nil, errors.New("stub")
}

func stub(name string, t hfv1.WorkloadType) workload.Factory {
	return func(workload.Dependencies) (workload.Backend, error) { return stubBackend{name: name, typ: t}, nil }
}

// TestBackends: each object finds the back-end of its workload type, a
// template the first (by type) that reads it, a claim without a type its
// template's; a nil set has none.
func TestBackends(t *testing.T) {
	b, err := workload.NewBackends(map[hfv1.WorkloadType]workload.Factory{
		hfv1.WorkloadGitLabCI: stub("lab", hfv1.WorkloadGitLabCI), hfv1.WorkloadBuildkite: stub("kite", hfv1.WorkloadBuildkite),
	}, workload.Dependencies{})
	if err != nil {
		t.Fatal(err)
	}
	if got := b.Types(); !slices.Equal(got, []hfv1.WorkloadType{hfv1.WorkloadBuildkite, hfv1.WorkloadGitLabCI}) {
		t.Errorf("Types = %v", got)
	}
	tmpl := &hfv1.HypervisorMachineTemplate{}
	tmpl.Spec.Bootstrap.GitHub = &hfv1.GitHubBootstrap{RunnerGroup: "lab"}
	if be, tt, ok := b.Template(tmpl); !ok || be.Name() != "lab" || tt.Field != "lab" {
		t.Errorf("Template = %v, %+v, %v", be, tt, ok)
	}
	pool := &hfv1.RunnerPool{Spec: hfv1.RunnerPoolSpec{Workload: hfv1.Workload{Type: hfv1.WorkloadBuildkite}}}
	if be, p, ok := b.Pool(pool, tmpl); !ok || be.Name() != "kite" || p.Field != "kite" {
		t.Errorf("Pool = %v, %+v, %v", be, p, ok)
	}
	if _, _, ok := b.Pool(&hfv1.RunnerPool{Spec: hfv1.RunnerPoolSpec{Workload: hfv1.Workload{Type: hfv1.WorkloadGitHubActions}}}, tmpl); ok {
		t.Error("a pool of a type no back-end serves was read")
	}
	if be, ok := b.Claim(&hfv1.MachineClaim{}, tmpl); !ok || be.Name() != "lab" {
		t.Errorf("Claim without a type = %v, %v; want its template's", be, ok)
	}
	typed := &hfv1.MachineClaim{Spec: hfv1.MachineClaimSpec{WorkloadConfig: &hfv1.WorkloadConfig{Type: hfv1.WorkloadBuildkite}}}
	if be, ok := b.Claim(typed, tmpl); !ok || be.Name() != "kite" {
		t.Errorf("Claim of a type = %v, %v", be, ok)
	}
	var none *workload.Backends
	if _, _, ok := none.Template(tmpl); ok || none.Types() != nil {
		t.Error("a nil set has back-ends")
	}
	if _, err := workload.NewBackends(map[hfv1.WorkloadType]workload.Factory{hfv1.WorkloadGeneric: func(workload.Dependencies) (workload.Backend, error) {
		return nil, errors.New("no")
	}}, workload.Dependencies{}); err == nil {
		t.Error("a failing factory went unnoticed")
	}
}

// TestRegister: a type registers once.
func TestRegister(t *testing.T) {
	workload.Register("test-registry", stub("x", "test-registry"))
	if _, ok := workload.Registered()["test-registry"]; !ok {
		t.Fatal("not registered")
	}
	defer func() {
		if recover() == nil {
			t.Error("a second registration of a type did not panic")
		}
	}()
	workload.Register("test-registry", stub("y", "test-registry"))
}

// TestRegisterCollectors: a collector already registered is kept, another
// of the same name is refused.
func TestRegisterCollectors(t *testing.T) {
	reg := prometheus.NewRegistry()
	c := prometheus.NewCounter(prometheus.CounterOpts{Name: "x_total", Help: "x"})
	for range 2 {
		if err := workload.RegisterCollectors(reg, c); err != nil {
			t.Fatal(err)
		}
	}
	if err := workload.RegisterCollectors(reg, prometheus.NewCounter(prometheus.CounterOpts{Name: "x_total", Help: "x"})); err == nil {
		t.Error("a second collector of the same name was registered")
	}
	if err := workload.RegisterCollectors(nil, c); err != nil {
		t.Error(err)
	}
}

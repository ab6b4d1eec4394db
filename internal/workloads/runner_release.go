package workloads

import (
	"context"
	"fmt"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/pkg/workload"
)

// RunnerPackage implements internal/controller's RunnerReleaseSource with the template's own
// scope and credentials, on the account the claims use (so its tokens and
// its rate-limit budget are shared).
func (w *Platforms) RunnerPackage(ctx context.Context, tmpl *hfv1.HypervisorMachineTemplate, version, os, arch string) (workload.RunnerPackage, error) {
	be, t, ok := w.Backends.Template(tmpl)
	if !ok {
		return workload.RunnerPackage{}, errNoBackend
	}
	if t.Scope.IsZero() {
		return workload.RunnerPackage{}, fmt.Errorf("%s of HypervisorMachineTemplate %s names no scope to ask for runner releases in: %w", t.Field, tmpl.Name, workload.ErrInvalidRequest)
	}
	p, err := be.Provider(ctx, tmpl, t.Scope, w.readSecret)
	if err != nil {
		return workload.RunnerPackage{}, err
	}
	releases, ok := p.(workload.RunnerReleases)
	if !ok {
		return workload.RunnerPackage{}, fmt.Errorf("%s publishes no runner releases: %w", be.Name(), workload.ErrInvalidRequest)
	}
	return releases.RunnerPackage(ctx, version, os, arch)
}

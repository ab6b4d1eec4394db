package controller

import (
	"context"
	"errors"
	"fmt"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/pkg/workload"
)

// RunnerReleaseSource resolves a template's runner version ("latest" or
// X.Y.Z) to the package its VMs download, with the checksum the CI
// platform publishes for it. Implementations cache: the template
// controller asks on every validation.
type RunnerReleaseSource interface {
	RunnerPackage(ctx context.Context, tmpl *hfv1.HypervisorMachineTemplate, version, os, arch string) (workload.RunnerPackage, error)
}

// Reasons of a template whose runner version cannot be resolved.
const (
	runnerReleaseNotFoundReason    = "RunnerReleaseNotFound"
	runnerReleaseUnavailableReason = "RunnerReleaseUnavailable"
)

// resolveRunner fills status.runner from spec.bootstrap.github.runner.version.
// A non-empty reason means the template cannot be used yet. A release that
// was resolved before stays in use while the platform cannot be asked (a
// GitHub outage must not stop a fleet that already has a good package).
func (r *HypervisorMachineTemplateReconciler) resolveRunner(ctx context.Context, tmpl *hfv1.HypervisorMachineTemplate) (reason, msg string) {
	sw := tmpl.Spec.Bootstrap.GitHub.Runner
	if sw == nil || sw.Version == "" {
		tmpl.Status.Runner = nil
		return "", ""
	}
	if r.Runners == nil {
		return hfv1.UnsupportedReason, "spec.bootstrap.github.runner.version: this operator has no runner release source for the template's CI platform; pin runner.downloadURL and runner.downloadSHA256 instead"
	}
	os, arch := runnerPlatform(tmpl)
	pkg, err := r.Runners.RunnerPackage(ctx, tmpl, sw.Version, os, arch)
	switch {
	case errors.Is(err, workload.ErrNotFound):
		return runnerReleaseNotFoundReason, fmt.Sprintf("spec.bootstrap.github.runner.version: %v; use latest or a released version", err)
	case err != nil && tmpl.Status.Runner != nil && tmpl.Status.Runner.DownloadSHA256 != "":
		ctrl.LoggerFrom(ctx).Info("Could not look up the runner release; keeping the one resolved before", "version", sw.Version, "kept", tmpl.Status.Runner.Version, "err", err.Error())
		return "", ""
	case err != nil:
		return runnerReleaseUnavailableReason, fmt.Sprintf("spec.bootstrap.github.runner.version: cannot resolve %s yet: %v", sw.Version, err)
	}
	if cur := tmpl.Status.Runner; cur != nil && cur.Version == pkg.Version && cur.DownloadURL == pkg.URL && cur.DownloadSHA256 == pkg.SHA256 {
		return "", ""
	}
	tmpl.Status.Runner = &hfv1.ResolvedRunner{Version: pkg.Version, DownloadURL: pkg.URL, DownloadSHA256: pkg.SHA256, ResolvedAt: ptr.To(metav1.Now())}
	return "", ""
}

// RunnerPackage implements RunnerReleaseSource with the template's own
// GitHub scope and credentials, on the provider the claims use (so the
// installation token and the rate-limit budget are shared).
func (b *GitHubBootstrap) RunnerPackage(ctx context.Context, tmpl *hfv1.HypervisorMachineTemplate, version, os, arch string) (workload.RunnerPackage, error) {
	gh := tmpl.Spec.Bootstrap.GitHub
	scope := workload.Scope{Owner: gh.Owner, Repository: gh.Repository}
	if gh.Organization != "" {
		scope = workload.Scope{Owner: gh.Organization}
	}
	p, _, err := b.scopedProvider(ctx, tmpl, scope)
	if err != nil {
		return workload.RunnerPackage{}, err
	}
	releases, ok := p.(workload.RunnerReleases)
	if !ok {
		return workload.RunnerPackage{}, fmt.Errorf("the CI platform publishes no runner releases: %w", workload.ErrInvalidRequest)
	}
	return releases.RunnerPackage(ctx, version, os, arch)
}

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

// resolveRunner fills status.runner from the runner version the template
// asks for (spec.bootstrap.<platform>.runner.version). A non-empty reason
// means the template cannot be used yet. A release that was resolved before
// stays in use while the platform cannot be asked (an outage of the CI
// platform must not stop a fleet that already has a good package).
func (r *HypervisorMachineTemplateReconciler) resolveRunner(ctx context.Context, tmpl *hfv1.HypervisorMachineTemplate) (reason, msg string) {
	_, t, _ := r.Workloads.Template(tmpl)
	sw := t.Runner
	if sw.Version == "" {
		tmpl.Status.Runner = nil
		return "", ""
	}
	field := t.Field + ".runner.version"
	if r.Runners == nil {
		return string(hfv1.UnsupportedReason), field + ": this operator has no runner release source for the template's CI platform; pin runner.downloadURL and runner.downloadSHA256 instead"
	}
	pkg, err := r.Runners.RunnerPackage(ctx, tmpl, sw.Version, sw.OS, sw.Arch)
	switch {
	case errors.Is(err, workload.ErrNotFound):
		return runnerReleaseNotFoundReason, fmt.Sprintf("%s: %v; use latest or a released version", field, err)
	case err != nil && tmpl.Status.Runner != nil && tmpl.Status.Runner.DownloadSHA256 != "":
		ctrl.LoggerFrom(ctx).Info("Could not look up the runner release; keeping the one resolved before", "version", sw.Version, "kept", tmpl.Status.Runner.Version, "err", err.Error())
		return "", ""
	case err != nil:
		return runnerReleaseUnavailableReason, fmt.Sprintf("%s: cannot resolve %s yet: %v", field, sw.Version, err)
	}
	if cur := tmpl.Status.Runner; cur != nil && cur.Version == pkg.Version && cur.DownloadURL == pkg.URL && cur.DownloadSHA256 == pkg.SHA256 {
		return "", ""
	}
	tmpl.Status.Runner = &hfv1.ResolvedRunner{Version: pkg.Version, DownloadURL: pkg.URL, DownloadSHA256: pkg.SHA256, ResolvedAt: ptr.To(metav1.Now())}
	return "", ""
}

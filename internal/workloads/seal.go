package workloads

import (
	"context"

	ctrl "sigs.k8s.io/controller-runtime"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/metrics"
	"github.com/hyperfleet/hyperfleet/pkg/workload"
)

// SealRunner implements internal/controller/machineclaim's RunnerSealer:
// once the claim's runner took its first job, it seals the runner to that
// job when the claim's CI platform would serve its credential more jobs
// (the platform's provider is a workload.Sealer: a GitLab runner
// authentication token that a job copied polls from elsewhere), and
// reports whether it did. A platform whose runner credential serves one
// job has nothing to seal: false, no call. Sealing again is harmless, so
// a restart that lost the claim's record of it seals once more.
func (w *Platforms) SealRunner(ctx context.Context, claim *hfv1.MachineClaim, tmpl *hfv1.HypervisorMachineTemplate) (bool, error) {
	st := claim.Status.Bootstrap
	if st == nil || st.RunnerName == "" && st.RunnerID == 0 {
		return false, nil
	}
	be, p, err := w.runnerProvider(ctx, claim, tmpl)
	if err != nil {
		return false, err
	}
	sealer, ok := p.(workload.Sealer)
	if !ok {
		return false, nil
	}
	if err := sealer.SealRunner(ctx, st.RunnerID, st.RunnerName); err != nil {
		return false, workloadError(be, err)
	}
	metrics.RunnersSealed.WithLabelValues(string(w.workloadType(be))).Inc()
	ctrl.LoggerFrom(ctx).Info("Sealed the runner to the job it took: the CI platform gives it no other job", "platform", be.Name(),
		"runner", st.RunnerName, "runnerID", st.RunnerID, "job", st.Job(), "scope", p.Scope().String())
	return true, nil
}

// workloadType is the workload type be serves, for metrics' platform
// label.
func (w *Platforms) workloadType(be workload.Backend) hfv1.WorkloadType {
	for _, t := range w.Backends.Types() {
		if b, _ := w.Backends.For(t); b == be {
			return t
		}
	}
	return ""
}

package machineclaim

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/controller/fieldindex"
	"github.com/hyperfleet/hyperfleet/internal/phase"
	"github.com/hyperfleet/hyperfleet/internal/vmspec"
	"github.com/hyperfleet/hyperfleet/pkg/workload"
)

// The claim's runner on its CI platform is the runner service's (runner_service.go): what
// the platform says about it, and removing it when the claim ends.

// observeWorkload folds what the CI platform says about the claim's runner
// into its status, records a warm VM standing by for a job, seals a runner
// seen with its job (jobbinding.go) and retires what issued a registered
// runner's credential (jobbinding.go); a runner whose job completed ends
// the claim (the pass stops, and the end list runs).
func (rs runnerService) observeWorkload(ctx context.Context, s *claimScope) (phase.Result, error) {
	if s.runsNoRunner() {
		return rs.observeScript(ctx, s), nil
	}
	rs.standBy(s)
	jobDone, err := rs.observe(ctx, s)
	switch {
	case err != nil:
		return phase.Stop(), err
	case jobDone == "":
		return rs.seal(ctx, s).Sooner(rs.retireRegistration(ctx, s).After()), nil
	}
	s.beginEnd(claimEnd{reason: hfv1.EndJobCompleted, code: string(hfv1.EndJobCompleted), message: jobDone})
	return phase.Stop(), nil
}

// runsNoRunner reports whether the claim's VM runs no CI platform's runner
// but its template's script (workload type generic, a workload.NoRunner
// back-end): no runner credential is issued for it, and no runner observed
// or removed. The claim's spec.workloadConfig says so, else its template's
// section; a claim without either (its template deleted) is taken for a
// runner's, whose steps then find nothing to do.
func (s *claimScope) runsNoRunner() bool {
	claim, tmpl, ws := s.claim, s.tmpl, s.workloads()
	if wc := claim.Spec.WorkloadConfig; wc != nil {
		be, ok := ws.For(wc.Type)
		return ok && !workload.HasRunner(be)
	}
	if tmpl == nil {
		return false
	}
	be, _, ok := ws.Template(tmpl)
	return ok && !workload.HasRunner(be)
}

// observeScript is observeWorkload for a VM that runs its template's
// script (generic): once up, the VM is busy running it (never idle, so its
// pool neither counts it as warm nor ends it for idleness) until it powers
// off, which checkRunning sees as for any VM; at its ttl deadline
// (vmspec.Deadline) the claim ends as at a pool's maxLifetime, and the
// VM's agent powers off at that moment too, as a second line. The pass
// looks again at the deadline.
func (rs runnerService) observeScript(_ context.Context, s *claimScope) phase.Result {
	claim := s.claim
	now := s.clock.Now()
	deadline, hasDeadline := time.Time{}, false
	if s.tmpl != nil {
		deadline, hasDeadline = vmspec.Deadline(s.workloads(), claim, s.tmpl)
	}
	if hasDeadline && !now.Before(deadline) {
		ttl := deadline.Sub(claim.CreationTimestamp.Time)
		msg := fmt.Sprintf("the VM reached spec.bootstrap.generic.ttl (%s) of HypervisorMachineTemplate %s at %s", ttl, s.tmpl.Name, deadline.UTC().Format(time.RFC3339))
		s.beginEnd(claimEnd{reason: hfv1.EndMaxLifetime, code: string(hfv1.EndMaxLifetime), message: msg})
		s.recorder.Event(claim, corev1.EventTypeNormal, string(hfv1.MaxLifetimeReason), "Ending the claim: "+msg)
		return phase.Stop()
	}
	st := claim.Status.Bootstrap
	if st == nil {
		st = &hfv1.BootstrapStatus{}
		claim.Status.Bootstrap = st
	}
	if st.RegisteredAt == nil {
		st.RegisteredAt = &metav1.Time{Time: now}
	}
	st.RunnerState = hfv1.RunnerStateBusy
	if !s.facts.isTrue(claim, hfv1.MachineClaimBootstrappedCondition) {
		msg := "The VM runs its template's script (spec.bootstrap.generic); it ends when the VM powers off"
		if hasDeadline {
			msg += " or at its ttl, " + deadline.UTC().Format(time.RFC3339)
		}
		s.facts.record(hfv1.MachineClaimBootstrappedCondition, metav1.ConditionTrue, hfv1.ScriptRunningReason, msg)
		s.recorder.Event(claim, corev1.EventTypeNormal, string(hfv1.ScriptRunningReason), msg)
	}
	if hasDeadline {
		return phase.Recheck(deadline.Sub(now) + time.Millisecond)
	}
	return phase.Next()
}

// claimsForJob wakes the claim whose runner a CIJob names.
func (r *Reconciler) claimsForJob(ctx context.Context, o client.Object) []reconcile.Request {
	job := o.(*hfv1.CIJob)
	if job.Status.RunnerName == "" {
		return nil
	}
	var list hfv1.MachineClaimList
	if err := r.Client.List(ctx, &list, client.InNamespace(job.Namespace), client.MatchingFields{fieldindex.ClaimRunner: job.Status.RunnerName}); err != nil {
		ctrl.LoggerFrom(ctx).Error(err, "List claims of runner", "runner", job.Status.RunnerName)
		return nil
	}
	out := make([]reconcile.Request, 0, len(list.Items))
	for i := range list.Items {
		out = append(out, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&list.Items[i])})
	}
	return out
}

// poolOf is the claim's RunnerPool from the cache; nil for a claim made by
// hand or whose pool is gone.
func (s *claimScope) poolOf(ctx context.Context) *hfv1.RunnerPool {
	claim := s.claim
	ref := claim.Spec.RunnerPoolRef
	if ref == nil {
		return nil
	}
	var pool hfv1.RunnerPool
	if err := s.client.Get(ctx, client.ObjectKey{Namespace: claim.Namespace, Name: ref.Name}, &pool); err != nil {
		return nil
	}
	return &pool
}

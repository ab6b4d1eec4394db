package workloads

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/poolclaims"
	"github.com/hyperfleet/hyperfleet/pkg/workload"
)

// Claims bound to one job (docs/buildkite.md, "One job per VM"). On a
// platform whose every VM is bound to one job (its back-end reads the
// template as workload.Template.OneJobPerVM: Buildkite), a claim bound to none (a
// warm VM of its pool) gets no credential at all: its VM boots and waits
// until its RunnerPool binds it a queued job (internal/controller's
// runnerpool_scaling.go), and only then is the job's credential issued.
// Once the claim's runner registered, what the operator keeps on the
// platform for issuing it goes too (RetireRegistration).

// errWaitingForJob: the claim is bound to no job yet, and its platform
// gives a VM a credential for its one job only. Not a failure: the VM
// stands by until its pool binds it one (the broker answers the VM to ask
// again; the claim controller asks for nothing until then).
var errWaitingForJob = errors.New("the claim's VM stands by for a job: its platform gives a VM a credential for the one job its RunnerPool binds it to, and none is bound yet")

// WaitsForJob implements internal/controller/machineclaim's JobBinder: it
// reports whether the claim's VM waits, with no credential, for its
// RunnerPool to bind it a job (waitsForJob).
func (w *Platforms) WaitsForJob(claim *hfv1.MachineClaim, tmpl *hfv1.HypervisorMachineTemplate) bool {
	if tmpl == nil {
		return false
	}
	be, ok := w.Backends.Claim(claim, tmpl)
	return ok && waitsForJob(be, claim, tmpl)
}

// WaitingForJob implements internal/broker's JobWaiter: WaitsForJob with
// the claim's template, read from its namespace. A template that cannot be
// read is no reason to wait: the credential request goes on, and fails
// there with its reason.
func (w *Platforms) WaitingForJob(ctx context.Context, claim *hfv1.MachineClaim) bool {
	var tmpl hfv1.HypervisorMachineTemplate
	if err := w.Client.Get(ctx, client.ObjectKey{Namespace: claim.Namespace, Name: claim.Spec.TemplateRef.Name}, &tmpl); err != nil {
		return false
	}
	return w.WaitsForJob(claim, &tmpl)
}

// waitsForJob reports whether be gives the claim's VM a credential for one
// job only (workload.Template.OneJobPerVM) and the claim is bound to none
// yet.
func waitsForJob(be workload.Backend, claim *hfv1.MachineClaim, tmpl *hfv1.HypervisorMachineTemplate) bool {
	t, ok := be.Template(tmpl)
	return ok && t.OneJobPerVM && be.Claim(claim).Job == ""
}

// boundElsewhere refuses the claim's job when another live claim of its
// pool (starting, idle or busy, poolclaims.StateOf) is bound to the same
// job and came first (created earlier; by name when at once): one job, one
// VM, whatever a pool's cache showed when it bound them. The pool binds a
// job once (its bind expectations); this is the line behind it. The pool's
// claims carry its label (hyperfleet.io/runner-pool), which only the
// operator writes, as it alone writes a job into a claim
// (config/admission).
func (w *Platforms) boundElsewhere(ctx context.Context, be workload.Backend, claim *hfv1.MachineClaim, job string) error {
	var claims hfv1.MachineClaimList
	if err := w.Client.List(ctx, &claims, client.InNamespace(claim.Namespace), client.MatchingLabels{hfv1.RunnerPoolLabel: claim.Spec.RunnerPoolRef.Name}); err != nil {
		return fmt.Errorf("list the claims of RunnerPool %s: %w", claim.Spec.RunnerPoolRef.Name, err)
	}
	for i := range claims.Items {
		o := &claims.Items[i]
		wc := o.Spec.WorkloadConfig
		if o.UID == claim.UID || wc == nil || wc.Type != claim.Spec.WorkloadConfig.Type || be.Claim(o).Job != job {
			continue
		}
		if st := poolclaims.StateOf(o, false); st != poolclaims.Starting && st != poolclaims.Idle && st != poolclaims.Busy {
			continue
		}
		if o.CreationTimestamp.Before(&claim.CreationTimestamp) || o.CreationTimestamp.Equal(&claim.CreationTimestamp) && o.Name < claim.Name {
			return fmt.Errorf("job %s is bound to MachineClaim %s of the same RunnerPool, which came first: %w", job, o.Name, workload.ErrJobNotBindable)
		}
	}
	return nil
}

// RegistrationRetirer is implemented by a workload.Provider that keeps, on
// the platform, a credential of its own with which it issued a runner's
// (Buildkite: the claim's cluster agent token, which issued its job
// acquisition token and would register any number of agents): once the
// runner registered it has no use left, and RetireRegistration deletes it,
// which also makes the runner's credential worthless. Deleting what is
// already gone is success.
type RegistrationRetirer interface {
	RetireRegistration(ctx context.Context, runnerName string) error
}

// retired remembers, in this process, the claims whose registration
// credential is gone (RetireRegistration), so that a claim's passes ask the
// platform once: after a restart each registered claim asks once more,
// which finds nothing to delete. Release forgets a claim. The zero value is
// ready to use.
type retired struct{ m sync.Map } // types.UID -> struct{}

func (r *retired) done(uid types.UID) bool { _, ok := r.m.Load(uid); return ok }
func (r *retired) mark(uid types.UID)      { r.m.Store(uid, struct{}{}) }
func (r *retired) forget(uid types.UID)    { r.m.Delete(uid) }

// RetireRegistration implements internal/controller/machineclaim's
// RegistrationRetirer: once the claim's runner registered, it deletes what
// the platform's provider kept for issuing its credential
// (RegistrationRetirer), once per claim in this process, and reports
// whether it deleted anything now. A platform that keeps nothing has
// nothing to do.
func (w *Platforms) RetireRegistration(ctx context.Context, claim *hfv1.MachineClaim, tmpl *hfv1.HypervisorMachineTemplate) (bool, error) {
	st := claim.Status.Bootstrap
	if st == nil || st.RunnerName == "" || w.retired.done(claim.UID) {
		return false, nil
	}
	be, p, err := w.runnerProvider(ctx, claim, tmpl)
	if err != nil {
		return false, err
	}
	rr, ok := p.(RegistrationRetirer)
	if !ok {
		w.retired.mark(claim.UID)
		return false, nil
	}
	if err := rr.RetireRegistration(ctx, st.RunnerName); err != nil {
		return false, workloadError(be, err)
	}
	w.retired.mark(claim.UID)
	ctrl.LoggerFrom(ctx).Info("Deleted what issued the registered runner's credential: neither registers anything again", "platform", be.Name(),
		"runner", st.RunnerName, "scope", p.Scope().String())
	return true, nil
}

package machineclaim

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/metrics"
	"github.com/hyperfleet/hyperfleet/internal/phase"
	"github.com/hyperfleet/hyperfleet/internal/vmspec"
	"github.com/hyperfleet/hyperfleet/pkg/provider"
)

// A standby claim (spec.standby, docs/runnerpool.md "Standby") has its VM
// built and booted as any claim's, then suspended to disk before anything
// secret reaches it: no runner credential, no join token, no broker proof
// is issued for it while it stands by, so its saved memory on the
// hypervisor's storage holds none. Its RunnerPool takes it for a job by
// clearing spec.standby; the claim then resumes the VM, reads its
// addresses again through the same build step as a new VM's (ensureVM:
// Booting until the guest agent answers, then Running), and delivers its
// secrets, which make the guest fresh before they are used (its entropy
// and its clock: agentconfig.Freshness).

// standbyPoll is how soon a claim looks again at a suspend or a resume in
// flight: the hypervisor's own task takes seconds (the guest's memory
// written to or read from storage).
const standbyPoll = 2 * time.Second

// holdStandby runs among a provisioned claim's running phases, once its
// template and cluster are loaded: a standby claim's VM is suspended and
// then left alone (the pass stops: nothing of the running phases is for
// it), and a VM its pool took out of the tier is resumed; any other claim
// goes on.
func (r *Reconciler) holdStandby(ctx context.Context, s *claimScope) (phase.Result, error) {
	claim := s.claim
	switch {
	case claim.Ended() || claim.EndRequested() || !claim.Spec.Standby && !claim.Suspended():
		return phase.Next(), nil
	case claim.Spec.Standby && claim.Status.Standby != nil && claim.Status.Standby.SuspendedAt != nil:
		// Stands by: its pool wakes it (clearing spec.standby) to take it.
		return phase.Stop(), nil
	case claim.Spec.Standby && s.tmpl != nil && Attests(s.tmpl):
		// Its pool makes no standby VMs of such a template
		// (runnerpool_standby.go, standbyUnsupported); one made before
		// the template attested fails rather than wait with an identity
		// issued for a build long past.
		s.fail(claimEnd{reason: hfv1.EndFailed, condition: hfv1.StandbyUnsupportedReason,
			message: fmt.Sprintf("template %s attests its VMs with SPIRE, whose join token or TPM enrollment cannot wait in a standby tier", s.tmpl.Name)})
		return phase.Stop(), nil
	}
	p, vm, res, err := r.readStandbyVM(ctx, s)
	if vm == nil {
		return res, err
	}
	ref := claim.Status.VMRef
	action, from := provider.PowerResume, provider.PowerSuspended
	if claim.Spec.Standby {
		action, from = provider.PowerSuspend, provider.PowerRunning
	}
	switch vm.Power {
	case provider.PowerStopped:
		r.endPoweredOff(ctx, s, fmt.Sprintf("VM %s of the standby tier powered off (with its saved state gone, if it had one) before its %s", ref.ID(), action))
		return phase.Stop(), nil
	case from:
		if action == provider.PowerSuspend {
			if wait, ready := r.agentWaiting(ctx, s); !ready {
				s.facts.record(hfv1.MachineClaimBootstrappedCondition, metav1.ConditionFalse, hfv1.SuspendingReason,
					fmt.Sprintf("VM %s is up; it is suspended to disk for the standby tier once its agent says it waits for its credential (at most %s after the VM came up)", ref.ID(), standbyHintWait))
				return phase.StopAndRequeue(wait), nil
			}
		}
		if _, err := p.SetPower(ctx, vmspec.Owner(claim), vmRefOf(ref), action); err != nil {
			return r.standbyPowerError(ctx, s, action, err)
		}
	}
	switch {
	case !claim.Spec.Standby:
		return r.resumed(ctx, s), nil
	case vm.Power == provider.PowerSuspended:
		return r.standingBy(ctx, s), nil
	}
	// Being suspended (paused while its memory is written), or just asked.
	s.facts.record(hfv1.MachineClaimBootstrappedCondition, metav1.ConditionFalse, hfv1.SuspendingReason,
		fmt.Sprintf("VM %s is up and being suspended to disk for the standby tier; it receives no credential until its RunnerPool takes it for a job", ref.ID()))
	return phase.StopAndRequeue(standbyPoll), nil
}

// standbyHintWait bounds how long a standby claim's running VM waits for
// its agent's ready hint before it is suspended all the same: hints are
// kept in memory, so one sent while the operator restarted is lost, and a
// VM whose agent never says so must not hold its memory for ever. A VM
// suspended before its agent waits still works: the agent goes on from
// where it was after the resume, only later.
const standbyHintWait = 2 * time.Minute

// agentWaiting tells whether a standby claim's running VM may be
// suspended: its agent said it runs and waits for its credential (its
// ready hint), so that a resume finds it waiting and the credential goes
// in at once; or no hint can come (the operator gives VMs no ready URL);
// or standbyHintWait passed since the VM came up. Otherwise wait is when
// to look again; the hint wakes the claim sooner.
func (r *Reconciler) agentWaiting(ctx context.Context, s *claimScope) (wait time.Duration, ready bool) {
	n := r.PowerOff.Notices
	if !n.SendsReadyHints() || n.ReadyHeard(s.claim.UID) {
		return 0, true
	}
	up := hfv1.FindCondition(s.claim.Status.Conditions, hfv1.MachineClaimProvisionedCondition)
	if up == nil || up.Status != metav1.ConditionTrue {
		return 0, true
	}
	waited := s.clock.Since(up.LastTransitionTime.Time)
	if waited >= standbyHintWait {
		ctrl.LoggerFrom(ctx).Info("No ready hint from the standby VM's agent; suspending it all the same",
			"vm", s.claim.Status.VMRef.ID(), "waited", waited.Round(time.Second).String())
		return 0, true
	}
	return standbyHintWait - waited, false
}

// standingBy records a standby claim's VM suspended, ready to be resumed
// (status.standby.suspendedAt), which its pool counts in its tier.
func (r *Reconciler) standingBy(ctx context.Context, s *claimScope) phase.Result {
	claim, ref := s.claim, s.claim.Status.VMRef
	now := metav1.NewTime(s.clock.Now())
	claim.Status.Standby = &hfv1.StandbyStatus{SuspendedAt: &now}
	msg := fmt.Sprintf("VM %s is suspended to disk, with no credential, in the standby tier of RunnerPool %s until the pool takes it for a job",
		ref.ID(), claim.Spec.RunnerPoolRef.Name)
	s.facts.record(hfv1.MachineClaimBootstrappedCondition, metav1.ConditionFalse, hfv1.StandingByReason, msg)
	r.Recorder.Event(claim, corev1.EventTypeNormal, string(hfv1.StandingByReason), msg)
	metrics.StandbyTransitions.WithLabelValues("suspended").Inc()
	logRoutine(ctx, hfv1.StandingByReason, "VM %s is suspended to disk", ref.ID())
	return phase.Stop()
}

// resumed records the resume of a claim's VM its pool took out of the
// standby tier (status.standby.resumedAt: its lifecycle limits count from
// there) and hands the claim back to the build step, which reads the
// resumed guest's addresses before the claim reports them and then places
// its secrets.
func (r *Reconciler) resumed(ctx context.Context, s *claimScope) phase.Result {
	claim, ref := s.claim, s.claim.Status.VMRef
	now := metav1.NewTime(s.clock.Now())
	claim.Status.Standby.ResumedAt = &now
	msg := fmt.Sprintf("VM %s is resumed from the standby tier for a job; waiting for its guest, then its addresses and credential", ref.ID())
	s.facts.record(hfv1.MachineClaimProvisionedCondition, metav1.ConditionFalse, hfv1.ResumingReason, msg)
	s.facts.withdraw(hfv1.MachineClaimBootstrappedCondition)
	r.Recorder.Event(claim, corev1.EventTypeNormal, string(hfv1.ResumingReason), msg)
	metrics.StandbyTransitions.WithLabelValues("resumed").Inc()
	if at := claim.Status.Standby.SuspendedAt; at != nil {
		metrics.StandbyWaitSeconds.Observe(now.Sub(at.Time).Seconds())
	}
	logRoutine(ctx, hfv1.ResumingReason, "VM %s is resumed for a job", ref.ID())
	return phase.StopAndRequeue(r.resumes.Next(ref.HypervisorCluster, 0))
}

// paceResume chooses when a resumed claim whose VM is still suspended
// (the hypervisor reading its memory back) looks again, and learns how
// long the resume took on the first pass that finds the VM back (its
// Provisioned condition as read still says Resuming). Every moment the
// claim looks too late is added to its job's start: it looks just before
// the cluster's resumes have been taking, then closely while one is due
// (pkg/provider/pace, as the Proxmox provider paces its tasks): a few
// reads per resume, and the job waits about pace.NearPoll longer than the
// hypervisor (make bench's standby row: looked at every 2 s, the job
// waited a second longer than the resume, a third of its start).
func (r *Reconciler) paceResume(s *claimScope, cluster string, res *provider.EnsureResult, out phase.Result) phase.Result {
	st := s.claim.Status.Standby
	if st == nil || st.ResumedAt == nil || s.claim.Spec.Standby {
		return out
	}
	since := s.clock.Since(st.ResumedAt.Time)
	if res.Phase == provider.PhaseSuspended {
		return phase.StopAndRequeue(r.resumes.Next(cluster, since))
	}
	if was := hfv1.FindCondition(s.storedConditions, hfv1.MachineClaimProvisionedCondition); hfv1.HasReason(was, hfv1.ResumingReason) {
		r.resumes.Observe(cluster, since)
	}
	return out
}

// readStandbyVM reads the claim's VM through its hypervisor. vm is nil
// when the pass must return res, err instead: the cluster is not
// connected (its controller wakes the claim), the VM is gone (the claim
// ends), or the read failed (retried after the claim's backoff).
func (r *Reconciler) readStandbyVM(ctx context.Context, s *claimScope) (provider.Provider, *provider.VM, phase.Result, error) {
	ref := s.claim.Status.VMRef
	p, _, connected := r.Registry.Provider(ref.HypervisorCluster)
	if !connected {
		return nil, nil, phase.Stop(), nil
	}
	vm, err := p.GetVM(ctx, vmRefOf(ref))
	switch {
	case errors.Is(err, provider.ErrNotFound):
		s.beginEnd(claimEnd{reason: hfv1.EndPoweredOff, condition: hfv1.VMGoneReason,
			message: fmt.Sprintf("VM %s of the standby tier no longer exists on %s", ref.ID(), ref.HypervisorCluster)})
		return nil, nil, phase.Stop(), nil
	case err != nil:
		ctrl.LoggerFrom(ctx).Info("Could not read the standby VM; reading it again later", "vm", ref.ID(), "err", err.Error())
		return nil, nil, phase.StopAndRequeue(s.backoff()), nil
	}
	return p, vm, phase.Result{}, nil
}

// standbyPowerError handles a refused suspend or resume: a transient one
// (the hypervisor busy with the VM) is asked again soon, a VM not the
// claim's goes the way of every provisioning error (provisionError), and a
// VM that cannot be suspended or resumed at all ends the claim, failed:
// its pool replaces it.
func (r *Reconciler) standbyPowerError(ctx context.Context, s *claimScope, action provider.PowerAction, err error) (phase.Result, error) {
	claim := s.claim
	switch provider.Classify(err) {
	case provider.ClassTransient:
		ctrl.LoggerFrom(ctx).Info("The hypervisor cannot change the standby VM's power yet; asking again", "action", action, "err", err.Error())
		return phase.StopAndRequeue(standbyPoll), nil
	case provider.ClassPermanent, provider.ClassConfiguration:
		if !errors.Is(err, provider.ErrNotOwned) {
			metrics.StandbyTransitions.WithLabelValues(string(action) + "_failed").Inc()
			s.fail(claimEnd{reason: hfv1.EndFailed, condition: hfv1.StandbyFailedReason,
				message: fmt.Sprintf("VM %s of the standby tier could not be %s (%s): %v", claim.Status.VMRef.ID(), pastTense(action), provider.ReasonOf(err), err)})
			return phase.Stop(), nil
		}
	}
	return r.provisionError(ctx, s, err)
}

// pastTense is how a message says a standby power action was done.
func pastTense(a provider.PowerAction) string {
	if a == provider.PowerSuspend {
		return "suspended to disk"
	}
	return "resumed"
}

// rereadResumedAddresses reads a resumed claim's VM's addresses once more
// once its runner registered. The claim reported them when the resumed
// guest answered, before its credential; the agent renews the guest's
// DHCP leases before it uses the credential (a lease may have lapsed
// while the VM stood by), and a server that refused the address held gave
// the guest another, which the claim reports now (status.network; its DNS
// records follow on the next pass). A failed read leaves the addresses as
// they are: the running checks handle a VM gone.
func (r *Reconciler) rereadResumedAddresses(ctx context.Context, s *claimScope) (phase.Result, error) {
	claim := s.claim
	st, boot := claim.Status.Standby, claim.Status.Bootstrap
	if st == nil || st.ResumedAt == nil || claim.Spec.Standby || claim.Ended() || s.provider == nil ||
		boot == nil || boot.RegisteredAt == nil || claim.Status.Network == nil || !r.memory.rereadAddresses(claim.UID) {
		return phase.Next(), nil
	}
	call, res, err := r.prepareVMCall(ctx, s)
	if call == nil {
		return res, err
	}
	got, err := s.provider.EnsureVM(ctx, call.spec, call.prev)
	if err != nil || got.Phase != provider.PhaseRunning {
		ctrl.LoggerFrom(ctx).Info("Could not read the resumed VM's addresses again; keeping those read at its resume", "vm", claim.Status.VMRef.ID(), "err", err)
		return phase.Next(), nil
	}
	if was := claim.Status.Network.Addresses; !slices.Equal(was, got.Addresses) {
		claim.Status.Network = networkStatus(claim, call.tmpl, call.cluster, got)
		s.facts.record(hfv1.MachineClaimProvisionedCondition, metav1.ConditionTrue, hfv1.ReadyReason, runningMessage(call.cluster.Name, got))
		r.Recorder.Eventf(claim, corev1.EventTypeNormal, "AddressesChanged",
			"VM %s renewed its DHCP lease after its resume and has addresses %s (it had %s)", claim.Status.VMRef.ID(), strings.Join(got.Addresses, ", "), strings.Join(was, ", "))
	}
	return phase.Next(), nil
}

// The VM service is a MachineClaim's VM as its reconciler drives it
// through pkg/provider, one provider step per call (docs/architecture.md,
// "Never block in Reconcile"): building it (ensureVM) and deleting it,
// never one whose ownership marker does not verify (deleteVM, keepForAdmin;
// this file), the provider's progress kept in the claim's status
// (vm_progress.go), and keeping a failed VM stopped for debugging
// (vm_retain.go). Which step comes when is the phase lists'.

package machineclaim

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/conditions"
	"github.com/hyperfleet/hyperfleet/internal/isolation"
	"github.com/hyperfleet/hyperfleet/internal/metrics"
	"github.com/hyperfleet/hyperfleet/internal/phase"
	"github.com/hyperfleet/hyperfleet/internal/vmspec"
	"github.com/hyperfleet/hyperfleet/pkg/ownership"
	"github.com/hyperfleet/hyperfleet/pkg/provider"
	"github.com/hyperfleet/hyperfleet/pkg/workload"
)

const (
	// CallAgainNow is the requeue for a provider that asks to be called
	// again at once.
	CallAgainNow = 10 * time.Millisecond
	// ownershipRecheck is how often a claim whose VM's ownership does not
	// verify reads its VM again. The cluster poller wakes it sooner when
	// the VM leaves the listing.
	ownershipRecheck = 10 * time.Minute
)

// ensureVM advances the claim's VM by one provider step and records where
// it is (the Provisioned condition), in two steps a test reaches one by
// one: vmCallFor builds the provider call's inputs, settleVM records its
// answer. A fresh VM reservation is stored with the finalizer in one
// write, the only one before the clone request (reserveVM).
func (r *Reconciler) ensureVM(ctx context.Context, s *claimScope) (phase.Result, error) {
	if wait, paused := r.memory.provisionPaused(s.claim, s.tmpl, s.cluster, r.Clock.Now()); paused {
		return phase.StopAndRequeue(wait), nil
	}
	call, res, err := r.prepareVMCall(ctx, s)
	if call == nil {
		return res, err
	}
	if s.claim.Status.VMRef == nil {
		s.claim.Status.TemplateHash = call.tmpl.Status.TemplateHash
		// The namespace's quota, checked and charged under the ledger's
		// lock before the placement record is written: the charge holds
		// the room until the cache shows the record, and goes unless the
		// record is written in this pass.
		charged, stop, res, err := r.admitQuota(ctx, s, call)
		if stop {
			return res, err
		}
		if charged {
			recorded := false
			defer func() {
				if !recorded {
					r.releaseQuota(s.claim.UID)
				}
			}()
			call.recorded = &recorded
		}
	}
	got, err := s.provider.EnsureVM(ctx, call.spec, call.prev)
	if err == nil && got.Phase == provider.PhasePlaced && got.RetryAfter <= 0 && call.prev.ID != got.Progress.ID {
		if stop, err := r.reserveVM(ctx, s, call, got); stop {
			return phase.Stop(), err
		}
		call.prev = got.Progress
		got, err = s.provider.EnsureVM(ctx, call.spec, call.prev)
	}
	return r.settleVM(ctx, s, call, got, err)
}

// vmCall is one provider call's inputs: the VM's spec, the progress it
// goes on from, and the template and cluster it is built from (with a
// placed claim's recorded DNS domain).
type vmCall struct {
	spec    *provider.VMSpec
	prev    provider.Progress
	tmpl    *hfv1.HypervisorMachineTemplate
	cluster *hfv1.HypervisorCluster
	// recorded, when set, is told whether the placement record was
	// written (its quota charge then stays until the cache shows it).
	recorded *bool
}

// prepareVMCall gathers what the provider call needs beyond the scope (a
// placed claim's verified placement record, its static addresses) and
// builds the call (vmCallFor); a nil call stops the pass with res.
func (r *Reconciler) prepareVMCall(ctx context.Context, s *claimScope) (*vmCall, phase.Result, error) {
	claim, tmpl := s.claim, s.tmpl
	var placed *ownership.Placement
	if claim.Status.VMRef != nil {
		// Placed: the VM is built from what was authorized then, never
		// from the template's current values (docs/security.md, "The
		// placement record").
		p, err := r.reservations().verifiedPlacement(ctx, s)
		if err != nil {
			// The claim fails with the refusal (the end list runs in
			// this pass); the pass itself succeeded.
			s.fail(claimEnd{reason: hfv1.EndFailed, condition: hfv1.PlacementRecordRejectedReason, message: err.Error()})
			return nil, phase.Stop(), nil //nolint:nilerr // the refusal is recorded in the claim's end, not a failed reconcile
		}
		placed = &p
		tmpl, _ = withPlacedDomain(tmpl, s.cluster, p.DNSDomain)
	}
	var addrs []vmspec.StaticAddr
	if tmpl.Spec.Network.Mode == hfv1.NetworkModeStatic {
		var err error
		if addrs, _, err = r.addresses().forClaim(ctx, s, tmpl); err != nil {
			res, err := r.provisionError(ctx, s, err)
			return nil, res, err
		}
	}
	var iso *provider.Isolation
	if placed == nil {
		// Compiled once, at placement: the record keeps it.
		var err error
		if iso, err = isolation.Compile(ctx, tmpl, s.cluster, r.IsolationOperator, r.resolver()); err != nil {
			res, err := r.provisionError(ctx, s, isolationError(err))
			return nil, res, err
		}
	}
	ci := &claimCloudInit{r: r, claim: claim, addrs: addrs}
	call, err := vmCallFor(claim, s.tmpl, s.cluster, placed, iso, r.workloads(), ci, addrs, r.memory.progressOf(claim))
	if err != nil {
		res, err := r.provisionError(ctx, s, err)
		return nil, res, err
	}
	return call, phase.Result{}, nil
}

// vmCallFor builds the provider call of a claim of tmpl on cluster: the
// VM's spec (its cloud-init rendered by ci when the provider asks, from
// the call's template and cluster), from the placement record when the
// claim is placed, else with iso (its isolation compiled now), going on
// from prev.
func vmCallFor(claim *hfv1.MachineClaim, tmpl *hfv1.HypervisorMachineTemplate, cluster *hfv1.HypervisorCluster, placed *ownership.Placement, iso *provider.Isolation,
	workloads *workload.Backends, ci *claimCloudInit, addrs []vmspec.StaticAddr, prev provider.Progress) (*vmCall, error) {
	if placed != nil {
		tmpl, cluster = withPlacedDomain(tmpl, cluster, placed.DNSDomain)
	}
	ci.tmpl, ci.cluster = tmpl, cluster
	spec, err := vmspec.For(claim, tmpl, cluster, ci)
	if err != nil {
		return nil, err
	}
	spec.Native = vmspec.Native(tmpl, cluster, vmspec.DNS(cluster, tmpl), vmspec.ClaimVars(workloads, claim, tmpl, cluster, addrs))
	spec.Isolation = iso
	if placed != nil {
		if err := ApplyPlacement(spec, *placed); err != nil {
			return nil, fmt.Errorf("placement record: %w", err)
		}
	}
	spec.Isolation = isolation.WithAddresses(spec.Isolation, addrs)
	return &vmCall{spec: spec, prev: prev, tmpl: tmpl, cluster: cluster}, nil
}

// reserveVM stores a fresh reservation, the VM id with its placement
// record, in one status write, so that the clone follows in this same
// pass instead of waiting for that write's watch event; stop is set when
// the pass must not clone (the write failed: the next pass starts over
// from the stored state; or the claim is gone).
func (r *Reconciler) reserveVM(ctx context.Context, s *claimScope, call *vmCall, res *provider.EnsureResult) (stop bool, err error) {
	claim, cluster := s.claim, call.cluster.Name
	s.recordProgress(ctx, cluster, call.prev, res.Progress)
	r.reservations().set(claim, cluster, call.spec, vmspec.DNS(call.cluster, call.tmpl).Domain)
	// A clone that will wait for a slot (res.Waits) is said so in the
	// build's one condition, written with the reservation: the wait is a
	// step of the build, and a condition of its own (Queued, then
	// BuildingVM once the slot frees) was a status write per claim that
	// waits, in the bursts that load the API server most (0.36 per job in
	// make bench's churn).
	s.facts.record(hfv1.MachineClaimProvisionedCondition, metav1.ConditionFalse, hfv1.BuildingVMReason, queuedBuildMessage(cluster, res.Progress, res.Waits))
	if err := r.writeReservation(ctx, s); err != nil {
		return true, fmt.Errorf("record VM id %s before cloning: %w", res.Progress.ID, err)
	}
	log := ctrl.LoggerFrom(ctx)
	if s.patch.Gone() {
		// Deleted before it had a finalizer, after this pass read it from
		// the cache: the reservation and the finalizer were not stored,
		// and a clone now would belong to no claim (found by property 7's
		// test, TestFinalizerCleanupProperty, which deletes claims within
		// a millisecond of creating them). The provider's own hold on the
		// VM id goes the way of any VM that was never cloned: a deletion
		// finds nothing and releases it.
		if del, err := s.provider.DeleteVM(ctx, vmspec.Owner(claim), res.Progress); err != nil || !del.Done {
			log.Info("Claim deleted before its VM reservation was stored; its VM id is released later", "vm", res.Progress.ID, "err", err)
		}
		log.V(1).Info("Claim deleted before its VM reservation was stored; not cloning", "vm", res.Progress.ID)
		return true, nil
	}
	if call.recorded != nil {
		*call.recorded = true
	}
	log.V(1).Info("Recorded the VM reservation", "vm", res.Progress.ID, "node", res.Progress.Node)
	return false, nil
}

// settleVM records the provider call's answer: an error as provisionError
// classifies it; else the progress (the claim's VM reference, the task in
// memory), the end of a failed step's backoff or hold, and where the VM
// stands (vmStanding). A VM that stopped before it was ready ends the
// claim.
func (r *Reconciler) settleVM(ctx context.Context, s *claimScope, call *vmCall, res *provider.EnsureResult, err error) (phase.Result, error) {
	if err != nil {
		return r.provisionError(ctx, s, err)
	}
	r.memory.provisioned(s.claim.UID)
	s.recordProgress(ctx, call.cluster.Name, call.prev, res.Progress)
	out, poweredOff := vmStanding(ctx, s.claim, &s.facts, call, res)
	out = r.paceResume(s, call.cluster.Name, res, out)
	if poweredOff != "" {
		r.endPoweredOff(ctx, s, poweredOff)
	}
	return out, nil
}

// runningMessage is the Provisioned condition's message of a claim whose
// VM runs, as res reports it.
func runningMessage(cluster string, res *provider.EnsureResult) string {
	return fmt.Sprintf("VM %s runs on %s/%s with addresses %s", res.Progress.ID, cluster, res.Progress.Node, strings.Join(res.Addresses, ", "))
}

// vmStanding records in facts (and the claim's network status) where the
// provider says the claim's VM stands, and chooses when to call again; a
// VM that stopped before it was ready is reported in poweredOff.
func vmStanding(ctx context.Context, claim *hfv1.MachineClaim, facts *claimFacts, call *vmCall, res *provider.EnsureResult) (out phase.Result, poweredOff string) {
	cluster := call.cluster.Name
	// "Call again now": no status write wakes the claim between the
	// provider's steps (the steps are not written), the requeue does.
	retry := CallAgain(res.RetryAfter)
	switch res.Phase {
	case provider.PhaseCloning, provider.PhaseConfiguring, provider.PhaseStarting, provider.PhaseBooting:
		// One condition for the whole build: its reason and message name
		// the VM, not the step, so that the steps make no status write of
		// their own (vm_progress.go).
		msg := buildingMessage(cluster, res.Progress)
		if res.Progress.Task == nil && res.RetryAfter > 0 && res.Message != "" {
			// No task runs: the step waits (a lock) or is retried after a
			// task that failed for a reason worth retrying. Why is for
			// the person reading the claim (property 8's test,
			// TestRetryAndErrorHandlingProperty in internal/controller,
			// fails without it).
			msg += "; " + res.Message
		} else if cur := facts.condition(claim, hfv1.MachineClaimProvisionedCondition); cur != nil && cur.Reason == string(hfv1.BuildingVMReason) &&
			strings.HasPrefix(cur.Message, msg+queuedNote) {
			// Built after a wait for a clone slot: the message written
			// with the reservation stays true for the whole build.
			msg = cur.Message
		}
		facts.record(hfv1.MachineClaimProvisionedCondition, metav1.ConditionFalse, hfv1.BuildingVMReason, msg)
		return phase.StopAndRequeue(retry), ""
	case provider.PhaseRunning:
		claim.Status.Network = networkStatus(claim, call.tmpl, call.cluster, res)
		facts.record(hfv1.MachineClaimProvisionedCondition, metav1.ConditionTrue, hfv1.ReadyReason, runningMessage(cluster, res))
		facts.record(hfv1.MachineClaimOwnershipVerifiedCondition, metav1.ConditionTrue, hfv1.ReadyReason, "The VM carries this operator's verified ownership marker")
		logRoutine(ctx, hfv1.ReadyReason, "VM %s is up on %s/%s", res.Progress.ID, cluster, res.Progress.Node)
		// The running phases follow in this same pass (runStateList):
		// the VM's being up and its credential's delivery are one status
		// write.
		return phase.StopAndRequeue(resyncRunning()), ""
	case provider.PhaseStopped:
		return phase.Stop(), fmt.Sprintf("VM %s powered off before it was ready", res.Progress.ID)
	case provider.PhaseSuspended:
		if claim.Status.Standby == nil || claim.Status.Standby.ResumedAt == nil {
			return phase.Stop(), fmt.Sprintf("VM %s was suspended to disk before it was ready", res.Progress.ID)
		}
		// Taken from the standby tier: its resume is asked for
		// (standby.go); a resume that never comes ends the claim at its
		// pool's bootstrapTimeout, counted from status.standby.resumedAt.
		facts.record(hfv1.MachineClaimProvisionedCondition, metav1.ConditionFalse, hfv1.ResumingReason,
			fmt.Sprintf("VM %s is resumed from the standby tier for a job; waiting for the hypervisor to bring it back", res.Progress.ID))
		return phase.StopAndRequeue(standbyPoll), ""
	}
	if res.Waits != "" && res.Progress.ID != "" {
		// A wait for a clone slot is a step of the build: its one
		// condition says so, written once (already with the reservation
		// when the placement foresaw it), and stays through the steps
		// that follow.
		facts.record(hfv1.MachineClaimProvisionedCondition, metav1.ConditionFalse, hfv1.BuildingVMReason, queuedBuildMessage(cluster, res.Progress, res.Waits))
		return phase.StopAndRequeue(retry), ""
	}
	facts.record(hfv1.MachineClaimProvisionedCondition, metav1.ConditionFalse, hfv1.QueuedReason, cmp.Or(res.Message, "Waiting for a clone slot"))
	return phase.StopAndRequeue(retry), ""
}

// writeReservation stores a fresh VM reservation before its clone
// request: the finalizer and the standard labels first, when the claim's
// creator did not write them (a RunnerPool does), then the status that
// records the VM (status.vmRef) with its signed placement record, derived
// as closeScope derives it, under an optimistic lock (a copy from a stale
// cache must not reserve a second VM over a newer reservation). The
// status that closes the pass is then written only if it changed since.
func (r *Reconciler) writeReservation(ctx context.Context, s *claimScope) error {
	claim := s.claim
	if err := s.patch.PatchMetadata(ctx, claim); err != nil || s.patch.Gone() {
		return err
	}
	now := metav1.NewTime(r.Clock.Now())
	if d := deriveStatus(claim, &s.facts, now.Time, r.Stuck.Bounds); d.changed {
		RecordPhase(ctx, r.Recorder, claim, d.left, now)
	}
	claim.Status.ObservedGeneration = claim.Generation
	return s.patch.PatchStatusLocked(ctx, claim)
}

// buildingMessage is the Provisioned condition's message while the VM at p
// is built: the same for every step, so that a step is no status write.
func buildingMessage(cluster string, p provider.Progress) string {
	return fmt.Sprintf("Building VM %s on %s/%s: cloning, configuring and starting it, then waiting for its guest agent", p.ID, cluster, p.Node)
}

// queuedNote leads the part of a build's message that says its clone
// waited for a slot (queuedBuildMessage).
const queuedNote = "; before its clone, "

// queuedBuildMessage is buildingMessage for a VM whose clone had to wait
// for a slot, for the reason waits (none: buildingMessage). It is written
// once (with the reservation, when the placement foresaw the wait) and
// stays true for the whole build: the wait's end, and then the steps, make
// no status write of their own.
func queuedBuildMessage(cluster string, p provider.Progress, waits string) string {
	if waits == "" {
		return buildingMessage(cluster, p)
	}
	return buildingMessage(cluster, p) + queuedNote + waits
}

// deleteVM advances the deletion of the claim's VM by one step, and reports
// done once no VM is left to delete (the claim's VM reference is then
// cleared, and the VM's addresses and power-off hint go with it). Where it
// is, or why it waits, is in the claim's Ending condition.
func (r *Reconciler) deleteVM(ctx context.Context, s *claimScope) (bool, ctrl.Result) {
	ref := s.claim.Status.VMRef
	done, requeue := r.deleteVMStep(ctx, s)
	if done {
		r.PowerOff.forgetTransition(ref, r.Clock.Now())
		r.addresses().release(ctx, s.claim)
		// Its quota charge, if the cache never showed its record.
		r.ledger().Forget(s.claim.UID)
	}
	return done, ctrl.Result{RequeueAfter: requeue}
}

// deleteVMStep is one provider step of deleteVM.
func (r *Reconciler) deleteVMStep(ctx context.Context, s *claimScope) (bool, time.Duration) {
	claim := s.claim
	ref := claim.Status.VMRef
	if ref.ID() == "" {
		return true, 0
	}
	p, health, connected := r.Registry.Provider(ref.HypervisorCluster)
	if !connected {
		s.facts.ending(hfv1.ClusterUnavailableReason,
			fmt.Sprintf("Cannot delete VM %s yet: HypervisorCluster %s is not connected: %s", ref.ID(), ref.HypervisorCluster, health.Message))
		return false, s.backoff()
	}
	prev := r.memory.progressOf(claim)
	res, err := p.DeleteVM(ctx, vmspec.Owner(claim), prev)
	switch {
	case errors.Is(err, provider.ErrNotOwned):
		return false, r.keepForAdmin(ctx, s, err)
	case err != nil:
		class, reason := provider.Classify(err), provider.ReasonOf(err)
		metrics.ClaimErrors.WithLabelValues(string(class), reason).Inc()
		msg := fmt.Sprintf("Deleting VM %s failed (%s, will retry): %v", ref.ID(), class, err)
		if s.facts.endingReason(claim) != reason {
			r.Recorder.Event(claim, corev1.EventTypeWarning, string(hfv1.FailedDeleteReason), conditions.Truncate(msg, 1024))
		}
		s.facts.ending(hfv1.ConditionReason(reason), msg)
		return false, s.backoff()
	}
	r.memory.succeeded(claim.UID)
	if !res.Done {
		s.recordProgress(ctx, ref.HypervisorCluster, prev, res.Progress)
		// The same message for every step (stop, destroy, the ISO's
		// removal), so that a step is no status write; the task is in the
		// log (vm_progress.go).
		s.facts.ending(hfv1.DeletingVMReason, fmt.Sprintf("Deleting VM %s on %s: stopping and destroying it, then removing its cloud-init media", ref.ID(), ref.HypervisorCluster))
		return false, CallAgain(res.RetryAfter)
	}
	s.teardownEvent(ctx, hfv1.VMDeletedReason, "VM %s on %s destroyed and its cloud-init ISO removed", ref.ID(), ref.HypervisorCluster)
	claim.Status.VMRef, claim.Status.Task = nil, nil
	r.memory.forgetProgress(claim)
	s.facts.record(hfv1.MachineClaimProvisionedCondition, metav1.ConditionFalse, hfv1.VMDeletedReason, fmt.Sprintf("VM %s was destroyed", ref.ID()))
	s.facts.ending(hfv1.VMDeletedReason, fmt.Sprintf("VM %s was destroyed", ref.ID()))
	return true, 0
}

// keepForAdmin handles a VM whose ownership marker does not verify at
// deletion. The VM is never touched, and since it may be the claim's own VM
// with a damaged marker (still running with the claim's address), nothing
// is released either: the claim keeps its VM reference, its addresses and
// its finalizer until the VM is gone or an admin removes the finalizer
// (docs/operations.md, docs/security.md "Absence and release").
func (r *Reconciler) keepForAdmin(ctx context.Context, s *claimScope, err error) time.Duration {
	s.ownershipUnverified(ctx, err, fmt.Sprintf(". HyperFleet neither touches it nor releases this claim's addresses while it may exist. "+
		"An admin must check VM %s by hand: once it is deleted the claim finishes on its own; if it is someone else's VM, delete this MachineClaim and remove its finalizer %s",
		s.claim.Status.VMRef.ID(), hfv1.MachineClaimFinalizer), "VM ownership does not verify; keeping the claim's finalizer and addresses for an admin")
	return ownershipRecheck
}

// ownershipUnverified records that the claim's VM does not carry its
// verified ownership marker (err says why), consequence saying what the
// step that met it does about it: the OwnershipVerified and Ending
// conditions, and, once, a warning event and the log line logMsg.
func (s *claimScope) ownershipUnverified(ctx context.Context, err error, consequence, logMsg string) {
	claim, ref := s.claim, s.claim.Status.VMRef
	msg := fmt.Sprintf("VM %s on HypervisorCluster %s does not carry this claim's verified ownership marker (%v)", ref.ID(), ref.HypervisorCluster, err) + consequence
	if s.facts.endingReason(claim) != string(hfv1.OwnershipMismatchReason) {
		s.recorder.Event(claim, corev1.EventTypeWarning, string(hfv1.OwnershipMismatchReason), conditions.Truncate(msg, 1024))
		ctrl.LoggerFrom(ctx).Info(logMsg, "vm", ref.ID(), "cluster", ref.HypervisorCluster, "err", err.Error())
	}
	s.facts.record(hfv1.MachineClaimOwnershipVerifiedCondition, metav1.ConditionFalse, hfv1.OwnershipMismatchReason, msg)
	s.facts.ending(hfv1.OwnershipMismatchReason, msg)
}

// CallAgain is the requeue a provider asked for, CallAgainNow when it asked
// for none ("call again now").
func CallAgain(retryAfter time.Duration) time.Duration {
	if retryAfter <= 0 {
		return CallAgainNow
	}
	return retryAfter
}

// networkStatus is what the claim reports about its VM's network.
func networkStatus(claim *hfv1.MachineClaim, tmpl *hfv1.HypervisorMachineTemplate, cluster *hfv1.HypervisorCluster, res *provider.EnsureResult) *hfv1.MachineNetworkStatus {
	host := vmspec.Hostname(claim, tmpl.Spec.Network.Hostname)
	st := &hfv1.MachineNetworkStatus{
		Addresses:  res.Addresses,
		MACAddress: res.MACAddress,
		Hostname:   host,
		FQDN:       vmspec.FQDN(host, vmspec.DNS(cluster, tmpl).Domain),
	}
	if claim.Status.Network != nil {
		st.IPAllocations = claim.Status.Network.IPAllocations
	}
	if len(st.Addresses) > 16 {
		st.Addresses = st.Addresses[:16]
	}
	return st
}

// provisionError surfaces a classified error (docs/architecture.md,
// "Classified errors") and chooses how to go on: it always stops the pass,
// and a claim it fails goes on to the end list in the same pass.
func (r *Reconciler) provisionError(ctx context.Context, s *claimScope, err error) (phase.Result, error) {
	claim := s.claim
	class, reason := provider.Classify(err), provider.ReasonOf(err)
	if errors.Is(err, vmspec.ErrRender) {
		class, reason = provider.ClassConfiguration, "InvalidCloudInit"
	}
	if wait, limited := RetryAfter(err, r.Clock.Now()); limited {
		// The CI platform's rate limit: wait for it without counting a
		// failure; the claim says until when.
		metrics.ClaimErrors.WithLabelValues(string(provider.ClassResource), string(hfv1.RateLimitedReason)).Inc()
		s.facts.record(hfv1.MachineClaimProvisionedCondition, metav1.ConditionFalse, hfv1.RateLimitedReason,
			fmt.Sprintf("Waiting %s for the CI platform's rate limit: %v", wait.Round(time.Second), err))
		return phase.StopAndRequeue(wait), nil
	}
	metrics.ClaimErrors.WithLabelValues(string(class), reason).Inc()
	msg := fmt.Sprintf("%s error: %v", class, err)
	cond := s.facts.condition(claim, hfv1.MachineClaimProvisionedCondition)
	changed := cond == nil || cond.Reason != reason
	ctrl.LoggerFrom(ctx).Info("Provisioning step failed", "class", class, "reason", reason, "err", err.Error())

	switch {
	case errors.Is(err, provider.ErrNotOwned):
		owned := "The VM recorded for this claim does not carry its verified ownership marker; it is never modified or destroyed: " + err.Error()
		s.facts.record(hfv1.MachineClaimOwnershipVerifiedCondition, metav1.ConditionFalse, hfv1.OwnershipMismatchReason, owned)
		// The same warning as a mismatch found at deletion (keepForAdmin,
		// which then records no second one): whichever step meets the
		// marker first, an admin is told once.
		r.Recorder.Event(claim, corev1.EventTypeWarning, string(hfv1.OwnershipMismatchReason), conditions.Truncate(owned, 1024))
		s.fail(claimEnd{reason: hfv1.EndFailed, condition: hfv1.OwnershipMismatchReason, message: msg})
		return phase.Stop(), nil
	case class == provider.ClassPermanent:
		s.fail(claimEnd{reason: hfv1.EndFailed, condition: hfv1.ProvisioningFailedReason, message: msg})
		return phase.Stop(), nil
	}
	s.facts.record(hfv1.MachineClaimProvisionedCondition, metav1.ConditionFalse, hfv1.ConditionReason(reason), msg)
	if changed {
		r.Recorder.Event(claim, corev1.EventTypeWarning, "FailedProvision", conditions.Truncate(msg, 1024))
	}
	switch class {
	case provider.ClassConfiguration:
		// The user must act: a change of the claim, its template or its
		// cluster tries again (ensureVM's hold), or the hold's end.
		if s.tmpl != nil && s.cluster != nil {
			r.memory.hold(claim.UID, heldProvision{claim: claim.Generation, template: s.tmpl.Generation, cluster: s.cluster.Generation,
				until: r.Clock.Now().Add(configurationHold)})
		}
		return phase.StopAndRequeue(configurationHold), nil
	case provider.ClassResource:
		return phase.StopAndRequeue(30 * time.Second), nil
	default:
		wait := s.backoff()
		r.memory.setRetryAt(claim.UID, r.Clock.Now().Add(wait))
		return phase.StopAndRequeue(wait), nil
	}
}

// isolationError classifies a failure to compile a claim's isolation
// policy: a policy its cluster does not define is the template's to fix
// (IsolationPolicyNotFound), a proxy whose name does not resolve is worth
// a retry.
func isolationError(err error) error {
	if errors.Is(err, isolation.ErrPolicyNotFound) {
		return provider.Errorf(provider.ClassConfiguration, string(hfv1.IsolationPolicyNotFoundReason), "%v", err)
	}
	return provider.Errorf(provider.ClassTransient, "IsolationNotCompiled", "compile the network isolation policy: %v", err)
}

// resolver resolves the host names of templates' proxies for their
// isolation policies.
func (r *Reconciler) resolver() isolation.Resolver {
	if r.Resolver != nil {
		return r.Resolver
	}
	return isolation.NetResolver
}

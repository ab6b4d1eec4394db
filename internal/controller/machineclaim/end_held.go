package machineclaim

import (
	"slices"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
)

// A claim's routine end (its job done or its pool's request carried out,
// its VM on the way out, the claim deleted once the VM is gone) is not
// written to its status: the claim goes a few seconds later, and a status
// write saying that it goes is one Kubernetes write per job that nobody
// acts on (test/e2e's TestKubernetesRequestsPerJob). The end is held in
// this process's memory, by claim UID, and put back into every later pass
// of the claim (restoreHeldEnd). A restart loses it, and the next pass
// finds the end again from what is persisted: the job's CIJob completed,
// the pool's spec.end, the VM stopped or gone (checkRunning); the claim's
// outcome is still its job's (Outcome).
//
// An end a person may act on is written as before: a failure, a claim
// kept as history (its end is what the history says), a deleted claim's,
// one whose pass found more than the end (a condition other than Ending
// and the Ready and Stuck summaries changed: an attestation that failed as
// the VM powered off, say), a teardown that waits on anything but the VM's
// deletion (a busy runner, a secrets store, SPIRE, DNS) and a stuck one.

// heldEndReasons are the Ending condition's reasons of a teardown that
// goes as planned: the VM's deletion under way, or done.
var heldEndReasons = []hfv1.ConditionReason{hfv1.DeletingVMReason, hfv1.VMDeletedReason}

// holdsEnd reports whether the pass's status is the routine end of a claim
// not yet written (see above), which closeScope then does not write.
func (s *claimScope) holdsEnd(d derivedStatus) bool {
	claim := s.claim
	if s.persistedEnd || claim.Status.End == nil || claim.HasFailed() || claim.IsFinished() ||
		!claim.DeletionTimestamp.IsZero() || d.stuck.Stuck || claim.Disowned() {
		return false
	}
	return slices.Contains(heldEndReasons, hfv1.ConditionReason(s.facts.endingReason(claim))) &&
		!conditionsChanged(s.storedConditions, claim.Status.Conditions)
}

// summaryConditions are the conditions an end changes by itself: the
// Ending condition and the summaries derived from the others.
var summaryConditions = []string{string(hfv1.MachineClaimEndingCondition), string(hfv1.ReadyCondition), string(hfv1.MachineClaimStuckCondition)}

// conditionsChanged reports whether a condition other than the summary
// ones differs between stored and now (its status, reason or message).
func conditionsChanged(stored, now []metav1.Condition) bool {
	differs := func(a, b []metav1.Condition) bool {
		for _, c := range a {
			if slices.Contains(summaryConditions, c.Type) {
				continue
			}
			o := meta.FindStatusCondition(b, c.Type)
			if o == nil || o.Status != c.Status || o.Reason != c.Reason || o.Message != c.Message {
				return true
			}
		}
		return false
	}
	return differs(stored, now) || differs(now, stored)
}

// restoreHeldEnd puts a held end back into a pass of its claim whose
// stored status has none; a stored end (written since) replaces it.
func (s *claimScope) restoreHeldEnd() {
	claim := s.claim
	held := s.memory.recall(claim.UID).heldEnd
	if held == nil {
		return
	}
	if s.persistedEnd {
		s.memory.dropHeldEnd(claim.UID)
		return
	}
	held.DeepCopyInto(&claim.Status)
}

// HeldEnd is the routine end this process holds for the claim of uid and
// has not written (nil when it holds none): what the operator knows of a
// claim's end beyond its stored status, for tests and diagnosis.
func (r *Reconciler) HeldEnd(uid types.UID) *hfv1.MachineClaimEnd {
	held := r.memory.recall(uid).heldEnd
	if held == nil {
		return nil
	}
	return held.End.DeepCopy()
}

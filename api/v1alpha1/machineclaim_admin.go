package v1alpha1

import (
	"fmt"
	"strings"
	"unicode/utf8"
)

// A platform admin's actions on one MachineClaim, each an annotation whose
// value is the admin's reason. The admission policy of config/admission
// lets only callers that the Kubernetes authorizer grants the verb of the
// same name on machineclaims in group hyperfleet.io (the ClusterRole
// hyperfleet-claim-admin of config/rbac) add, change or remove them; the
// operator reads them and nothing else writes them (docs/security.md,
// "Platform admins' actions on claims").
const (
	// ForceDeleteAnnotation asks the operator to stop waiting on the
	// hypervisor: it deletes the claim if it is not being deleted, abandons
	// its VM without calling the hypervisor, releases its runner, identity
	// and static addresses and removes its finalizer. For a claim whose
	// hypervisor is gone for good (docs/troubleshooting.md, "A claim stuck
	// because its hypervisor is gone").
	ForceDeleteAnnotation = "hyperfleet.io/force-delete"
	// ForceDeleteVerb is the verb on machineclaims that lets a caller
	// write ForceDeleteAnnotation.
	ForceDeleteVerb = "force-delete"
	// DisownAnnotation asks the operator to release the claim's VM from
	// management without deleting it: its tags and ownership block are
	// stripped, it keeps running, and the claim ends with Finalized=True
	// (docs/troubleshooting.md, "Keeping a VM: disownment").
	DisownAnnotation = "hyperfleet.io/disown"
	// DisownVerb is the verb on machineclaims that lets a caller write
	// DisownAnnotation.
	DisownVerb = "disown"
	// MaxAdminReasonLength bounds the reason an admin annotation carries,
	// in characters (the admission policy's bound too).
	MaxAdminReasonLength = 256
)

// AdminReason is the reason the claim's annotation key (ForceDeleteAnnotation
// or DisownAnnotation) gives. set is false without the annotation; err says
// why a set value is unusable (empty or blank, or longer than
// MaxAdminReasonLength), naming the annotation and the fix.
func (c *MachineClaim) AdminReason(key string) (reason string, set bool, err error) {
	v, ok := c.Annotations[key]
	if !ok {
		return "", false, nil
	}
	reason = strings.TrimSpace(v)
	switch n := utf8.RuneCountInString(v); {
	case reason == "":
		return "", true, fmt.Errorf("metadata.annotations[%s] is empty: its value is the admin's reason, 1 to %d characters; set it to why", key, MaxAdminReasonLength)
	case n > MaxAdminReasonLength:
		return "", true, fmt.Errorf("metadata.annotations[%s] holds %d characters: its value is the admin's reason, at most %d; shorten it", key, n, MaxAdminReasonLength)
	}
	return reason, true, nil
}

// ForceDeleteRequested reports whether a platform admin asked to
// force-delete the claim, with the reason.
func (c *MachineClaim) ForceDeleteRequested() (string, bool) {
	reason, _, err := c.AdminReason(ForceDeleteAnnotation)
	return reason, reason != "" && err == nil
}

// DisownRequested reports whether a platform admin asked to disown the
// claim's VM, with the reason.
func (c *MachineClaim) DisownRequested() (string, bool) {
	reason, _, err := c.AdminReason(DisownAnnotation)
	return reason, reason != "" && err == nil
}

// Disowned reports whether the claim's VM was released from management
// (Finalized True, reason Disowned). It stays so whatever happens to the
// annotation: the VM keeps the claim's static addresses.
func (c *MachineClaim) Disowned() bool {
	f := FindCondition(c.Status.Conditions, MachineClaimFinalizedCondition)
	return f != nil && f.Status == "True" && f.Reason == string(DisownedReason)
}

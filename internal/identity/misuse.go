package identity

import (
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/conditions"
	"github.com/hyperfleet/hyperfleet/internal/metrics"
)

// RecordMisuse records in claim's status.identity that its VM's identity
// was used by someone other than the VM (docs/identity.md, "A stolen join
// token"), unless a misuse is recorded already. It returns whether the
// record is new (the caller persists it and reports it with an event). The
// claim controller then evicts the identity and fails the claim. Every
// attempt seen is counted with CountMisuse, recorded or not.
func RecordMisuse(claim *hfv1.MachineClaim, reason hfv1.IdentityMisuseReason, message string, now time.Time) bool {
	st := claim.Status.Identity
	if st == nil || st.Misuse != nil {
		return false
	}
	st.Misuse = &hfv1.IdentityMisuse{Reason: reason, DetectedAt: metav1.NewTime(now), Message: conditions.Truncate(message, 1024)}
	return true
}

// CountMisuse counts one attempt to use a VM's identity by someone other
// than the VM in hyperfleet_identity_misuse_total.
func CountMisuse(reason hfv1.IdentityMisuseReason) {
	metrics.IdentityMisuse.WithLabelValues(string(reason)).Inc()
}

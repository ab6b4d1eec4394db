// Package conditions sets status conditions the way every HyperFleet
// controller does: LastTransitionTime changes only when the status does
// (meta.SetStatusCondition's rule) and messages are bounded.
package conditions

import (
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
)

// MaxMessage is the longest message a condition keeps (the API's bound).
const MaxMessage = 32768

// Set sets a condition of the given generation.
func Set(conds *[]metav1.Condition, generation int64, typ hfv1.ConditionType, status metav1.ConditionStatus, reason hfv1.ConditionReason, msg string) {
	meta.SetStatusCondition(conds, metav1.Condition{
		Type: string(typ), Status: status, Reason: string(reason), Message: Truncate(msg, MaxMessage), ObservedGeneration: generation,
	})
}

// Truncate shortens s to at most n bytes, marking the cut with "...".
func Truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n-3] + "..."
}

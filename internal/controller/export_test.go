package controller

import (
	"context"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
)

// RemoveFinalizerForTest lets the envtest suite (package controller_test)
// call removeFinalizer with a copy of its choosing, such as a stale one.
func (r *MachineClaimReconciler) RemoveFinalizerForTest(ctx context.Context, claim *hfv1.MachineClaim) error {
	return r.removeFinalizer(ctx, r.newClaimScope(claim))
}

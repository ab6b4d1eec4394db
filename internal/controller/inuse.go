package controller

import (
	"context"
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/conditions"
	"github.com/hyperfleet/hyperfleet/internal/patch"
)

// maxUsersListed bounds the claims an InUse message names.
const maxUsersListed = 5

// inUse is an object people create and delete that claims depend on (a
// HypervisorCluster, HypervisorMachineTemplate or IPPool), held by its
// finalizer while they do: deleting it leaves it Terminating until the
// last claim using it is gone.
type inUse struct {
	obj        client.Object
	conditions *[]metav1.Condition
	finalizer  string
	// usage says what the claims hold, as in "MachineClaims with VMs on
	// this cluster".
	usage string
}

// open starts a reconcile of u's object, named by req: it reads the object
// into u.obj; a gone object is forgotten (gone) and ends the reconcile; a
// found one is named in ctx's logger as kind and gets its finalizer
// (ensureFinalizer), which ends the reconcile when it wrote. done is true
// when the caller returns err without running its phases. Every reconciler
// of an object claims depend on opens this way.
func (u inUse) open(ctx context.Context, c client.Client, req ctrl.Request, kind string, gone func()) (_ context.Context, done bool, err error) {
	if err := c.Get(ctx, req.NamespacedName, u.obj); err != nil {
		if apierrors.IsNotFound(err) {
			gone()
		}
		return ctx, true, client.IgnoreNotFound(err)
	}
	ctx = ctrl.LoggerInto(ctx, ctrl.LoggerFrom(ctx).WithValues(kind, klog.KObj(u.obj)))
	wrote, err := u.ensureFinalizer(ctx, c)
	return ctx, wrote || err != nil, err
}

// ensureFinalizer adds the finalizer to an object that is not being
// deleted and writes it at once, under an optimistic lock (a copy from a
// stale cache must not drop a finalizer someone added since: a merge patch
// replaces the whole list). It reports whether it wrote: the caller then
// returns, and the write's watch event brings the object back.
func (u inUse) ensureFinalizer(ctx context.Context, c client.Client) (bool, error) {
	if !u.obj.GetDeletionTimestamp().IsZero() || controllerutil.ContainsFinalizer(u.obj, u.finalizer) {
		return false, nil
	}
	h := patch.NewHelper(c, u.obj, patch.WithOptimisticLock())
	controllerutil.AddFinalizer(u.obj, u.finalizer)
	if err := h.PatchMetadata(ctx, u.obj); err != nil {
		return true, fmt.Errorf("add finalizer %s: %w", u.finalizer, err)
	}
	return true, nil
}

// releaseWhenUnused lets a deleted object go once no claim uses it. While
// users (claims as namespace/name) is not empty the object keeps its
// finalizer and the hold is returned: Ready False with reason InUse naming
// them, which the scope's close sets, and an InUse warning event when the
// wait begins. Then the finalizer is removed and written at once (the
// object may be gone the moment it is) under h's optimistic lock: a stale
// copy gets a conflict instead of dropping someone else's finalizer. A nil
// hold means the object was let go.
func (u inUse) releaseWhenUnused(ctx context.Context, h *patch.Helper, rec record.EventRecorder, users []string) (*readiness, error) {
	if len(users) == 0 {
		if !controllerutil.ContainsFinalizer(u.obj, u.finalizer) {
			return nil, nil
		}
		controllerutil.RemoveFinalizer(u.obj, u.finalizer)
		if err := h.PatchMetadata(ctx, u.obj); err != nil {
			controllerutil.AddFinalizer(u.obj, u.finalizer)
			return nil, fmt.Errorf("remove finalizer %s: %w", u.finalizer, err)
		}
		return nil, nil
	}
	slices.Sort(users)
	named := users[:min(len(users), maxUsersListed)]
	more := ""
	if n := len(users) - len(named); n > 0 {
		more = fmt.Sprintf(" and %d more", n)
	}
	msg := fmt.Sprintf("Deletion waits for %d %s: %s%s; it completes once they are gone (finalizer %s)",
		len(users), u.usage, strings.Join(named, ", "), more, u.finalizer)
	if !hfv1.HasReason(hfv1.FindCondition(*u.conditions, hfv1.ReadyCondition), hfv1.InUseReason) {
		rec.Event(u.obj, corev1.EventTypeWarning, string(hfv1.InUseReason), conditions.Truncate(msg, 1024))
	}
	return notReady(hfv1.InUseReason, msg), nil
}

// claimNames are the claims keep selects, as namespace/name.
func claimNames(claims []hfv1.MachineClaim, keep func(*hfv1.MachineClaim) bool) []string {
	var out []string
	for i := range claims {
		if keep(&claims[i]) {
			out = append(out, claims[i].Namespace+"/"+claims[i].Name)
		}
	}
	return out
}

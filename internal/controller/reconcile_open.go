package controller

import (
	"context"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
)

// openObject is the start of a reconcile that the reconcilers of objects
// with an in-use finalizer share: it reads req's object into obj (one
// that is gone is forgotten, and the pass ends), names it in the pass's
// log context under kind, and adds its in-use finalizer (hold; a write
// ends the pass, whose watch event comes back). done says the pass ends,
// with err.
func openObject(ctx context.Context, c client.Client, req ctrl.Request, obj client.Object, kind string, forget func(), hold func() inUse) (_ context.Context, done bool, err error) {
	if err := c.Get(ctx, req.NamespacedName, obj); err != nil {
		if apierrors.IsNotFound(err) {
			forget()
		}
		return ctx, true, client.IgnoreNotFound(err)
	}
	ctx = ctrl.LoggerInto(ctx, ctrl.LoggerFrom(ctx).WithValues(kind, klog.KObj(obj)))
	wrote, err := hold().ensureFinalizer(ctx, c)
	return ctx, wrote || err != nil, err
}

// listRequests lists the objects of list (with opts) and returns a
// reconcile request for each: the map function of a watch that wakes
// every object a changed one concerns. A failed list is logged with what
// it was for and wakes none; the next resync catches up.
func listRequests[T any, PT interface {
	*T
	client.Object
}](ctx context.Context, c client.Reader, list client.ObjectList, items func() []T, what string, opts ...client.ListOption) []reconcile.Request {
	if err := c.List(ctx, list, opts...); err != nil {
		ctrl.LoggerFrom(ctx).Error(err, "List "+what)
		return nil
	}
	objs := items()
	out := make([]reconcile.Request, 0, len(objs))
	for i := range objs {
		out = append(out, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(PT(&objs[i]))})
	}
	return out
}

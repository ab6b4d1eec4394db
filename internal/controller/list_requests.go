package controller

import (
	"context"

	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
)

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

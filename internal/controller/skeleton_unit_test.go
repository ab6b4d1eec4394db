package controller

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/record"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/controller/fieldindex"
)

// The helpers of the table tests of the reconcilers' phase lists
// (docs/architecture.md, "One skeleton for every reconciler"): each row is
// a starting state, one Reconcile on a fake API server, and the Result,
// conditions and events it must end with.

// errInjected is the failure the rows inject into the fake API server.
var errInjected = errors.New("injected API server failure")

// unitWorld is a fake API server holding objs, with the field indexes the
// manager registers (fieldIndexes), the status subresource of every
// HyperFleet kind, and names for objects created with a generateName (the
// fake client gives none). funcs make calls fail.
func unitWorld(t *testing.T, funcs interceptor.Funcs, objs ...client.Object) client.WithWatch {
	t.Helper()
	scheme := runtime.NewScheme()
	if err := hfv1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	if err := corev1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	b := fake.NewClientBuilder().WithScheme(scheme).WithObjects(objs...).
		WithStatusSubresource(&hfv1.HypervisorCluster{}, &hfv1.HypervisorMachineTemplate{}, &hfv1.IPPool{}, &hfv1.RunnerPool{}, &hfv1.MachineClaim{}, &hfv1.CIJob{})
	for _, ix := range fieldindex.All(ciPlatforms) {
		b = b.WithIndex(ix.Obj, ix.Field, ix.Extract)
	}
	var names atomic.Int64
	create := funcs.Create
	funcs.Create = func(ctx context.Context, c client.WithWatch, o client.Object, opts ...client.CreateOption) error {
		if o.GetName() == "" && o.GetGenerateName() != "" {
			o.SetName(fmt.Sprintf("%s%05d", o.GetGenerateName(), names.Add(1)))
		}
		if create != nil {
			return create(ctx, c, o, opts...)
		}
		return c.Create(ctx, o, opts...)
	}
	return b.WithInterceptorFuncs(funcs).Build()
}

// failStatusWrites makes every status write fail.
func failStatusWrites() interceptor.Funcs {
	return interceptor.Funcs{SubResourcePatch: func(context.Context, client.Client, string, client.Object, client.Patch, ...client.SubResourcePatchOption) error {
		return errInjected
	}}
}

// failLists makes every List of the kind of list fail.
func failLists(list client.ObjectList) interceptor.Funcs {
	return interceptor.Funcs{List: func(ctx context.Context, c client.WithWatch, l client.ObjectList, opts ...client.ListOption) error {
		if fmt.Sprintf("%T", l) == fmt.Sprintf("%T", list) {
			return errInjected
		}
		return c.List(ctx, l, opts...)
	}}
}

// failGets makes every Get of the kind of obj fail.
func failGets(obj client.Object) interceptor.Funcs {
	return interceptor.Funcs{Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, o client.Object, opts ...client.GetOption) error {
		if fmt.Sprintf("%T", o) == fmt.Sprintf("%T", obj) {
			return errInjected
		}
		return c.Get(ctx, key, o, opts...)
	}}
}

// deleting marks obj as being deleted (the fake API server keeps it while
// it has finalizers).
func deleting[O client.Object](obj O) O {
	obj.SetDeletionTimestamp(&metav1.Time{Time: unitEpoch})
	return obj
}

// eventsOf drains rec into "Type Reason" strings.
func eventsOf(rec *record.FakeRecorder) []string {
	var out []string
	for {
		select {
		case e := <-rec.Events:
			f := strings.Fields(e)
			out = append(out, strings.Join(f[:min(2, len(f))], " "))
		default:
			return out
		}
	}
}

// wantCondition is a condition a row expects: its status, its reason and
// words of its message; a zero status expects no such condition.
type wantCondition struct {
	status metav1.ConditionStatus
	reason hfv1.ConditionReason
	says   []string
}

// checkConditions compares conds with want, by condition type.
func checkConditions(t *testing.T, conds []metav1.Condition, want map[hfv1.ConditionType]wantCondition) {
	t.Helper()
	for typ, w := range want {
		c := hfv1.FindCondition(conds, typ)
		switch {
		case w.status == "" && c != nil:
			t.Errorf("%s = %s %s (%q), want none", typ, c.Status, c.Reason, c.Message)
			continue
		case w.status == "":
			continue
		case c == nil:
			t.Errorf("no %s condition, want %s %s", typ, w.status, w.reason)
			continue
		case c.Status != w.status || c.Reason != string(w.reason):
			t.Errorf("%s = %s %s (%q), want %s %s", typ, c.Status, c.Reason, c.Message, w.status, w.reason)
		}
		for _, s := range w.says {
			if !strings.Contains(c.Message, s) {
				t.Errorf("%s message %q does not say %q", typ, c.Message, s)
			}
		}
	}
}

// checkEvents compares the events a pass emitted with want, in order.
func checkEvents(t *testing.T, rec *record.FakeRecorder, want ...string) {
	t.Helper()
	if got := eventsOf(rec); !slices.Equal(got, want) {
		t.Errorf("events %q, want %q", got, want)
	}
}

// passWant is what a row expects of one pass: its result, error (matched
// with errors.Is; nil: none) and events, and the object after it: gone
// (the pass let it go), or holding finalizer (unless empty) with
// status.observedGeneration at observed and the conditions conds.
type passWant struct {
	res       ctrl.Result
	err       error
	events    []string
	gone      bool
	finalizer string
	observed  int64
	conds     map[hfv1.ConditionType]wantCondition
}

// checkPass checks a pass against want and reads the object named by obj
// back into it; it reports whether the object is still there.
func checkPass(t *testing.T, c client.Client, rec *record.FakeRecorder, obj conditioned, res ctrl.Result, err error, want passWant) bool {
	t.Helper()
	checkErr(t, err, want.err)
	if res != want.res {
		t.Errorf("result %+v, want %+v", res, want.res)
	}
	checkEvents(t, rec, want.events...)
	err = c.Get(context.Background(), client.ObjectKeyFromObject(obj), obj)
	switch {
	case want.gone && !apierrors.IsNotFound(err):
		t.Fatalf("%s is still there (%v): finalizers %v", obj.GetName(), err, obj.GetFinalizers())
	case want.gone:
		return false
	case err != nil:
		t.Fatal(err)
	}
	if want.finalizer != "" && !controllerutil.ContainsFinalizer(obj, want.finalizer) {
		t.Errorf("finalizers %v, want %s", obj.GetFinalizers(), want.finalizer)
	}
	u, err := runtime.DefaultUnstructuredConverter.ToUnstructured(obj)
	if err != nil {
		t.Fatal(err)
	}
	if got, _, _ := unstructured.NestedInt64(u, "status", "observedGeneration"); got != want.observed {
		t.Errorf("observedGeneration %d, want %d", got, want.observed)
	}
	checkConditions(t, obj.GetConditions(), want.conds)
	return true
}

// conditioned is an object of a kind whose status has conditions.
type conditioned interface {
	client.Object
	GetConditions() []metav1.Condition
}

// checkErr compares a pass's error with the one wanted (errors.Is; nil:
// none).
func checkErr(t *testing.T, err, want error) {
	t.Helper()
	switch {
	case want != nil && !errors.Is(err, want):
		t.Errorf("error %v, want %v", err, want)
	case want == nil && err != nil:
		t.Errorf("error %v", err)
	}
}

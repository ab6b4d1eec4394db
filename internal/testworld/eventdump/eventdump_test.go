package eventdump

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
)

// TestFormatOrdersAndFilters lists two namespaces' events oldest first,
// with their counts, and keeps of "default" only the named object's.
func TestFormatOrdersAndFilters(t *testing.T) {
	at := func(s int) metav1.Time { return metav1.NewTime(time.Date(2026, 11, 28, 3, 0, s, 0, time.UTC)) }
	ev := func(ns, name, obj, reason string, s int, count int32) client.Object {
		return &corev1.Event{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Type: corev1.EventTypeWarning, Reason: reason,
			InvolvedObject: corev1.ObjectReference{Kind: "MachineClaim", Namespace: ns, Name: obj}, Message: reason + " happened", LastTimestamp: at(s), Count: count}
	}
	c := fake.NewClientBuilder().WithScheme(scheme.Scheme).WithObjects(
		ev("t1", "a", "claim-a", "Second", 2, 3),
		ev("t1", "b", "claim-b", "First", 1, 1),
		ev("default", "c", "cluster-mine", "Cluster", 3, 1),
		ev("default", "d", "cluster-other", "Other", 0, 1),
	).Build()
	got := Format(context.Background(), c, func(e corev1.Event) bool { return e.Namespace != "default" || Names("cluster-mine")(e) }, "t1", "default")
	lines := strings.Split(strings.TrimSpace(got), "\n")
	if len(lines) != 3 || !strings.Contains(lines[0], "First") || !strings.Contains(lines[1], "Second happened (x3)") || !strings.Contains(lines[2], "cluster-mine") {
		t.Errorf("events:\n%s\nwant First, Second (x3), then cluster-mine's, and not cluster-other's", got)
	}
	if got := Format(context.Background(), c, nil, "empty"); !strings.Contains(got, "no events in empty") {
		t.Errorf("an empty namespace gives %q", got)
	}
}

// Package eventdump writes the Kubernetes events of a failed test's
// namespaces into its log: with the operator's log, they are what a person
// reads first when an operator-driving test fails (docs/testing.md,
// "Stress"), and both are gone once the test's API server stops.
package eventdump

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Filter keeps an event; nil keeps every event of the listed namespaces.
type Filter func(corev1.Event) bool

// Format lists the events of the namespaces, oldest first, one a line:
// when, type, reason, the object, the message and how many times it was
// seen. Events of cluster-scoped objects (a HypervisorCluster's) are in
// "default": pass it with a filter that keeps the test's own objects.
func Format(ctx context.Context, c client.Reader, keep Filter, namespaces ...string) string {
	var all []corev1.Event
	for _, ns := range namespaces {
		var list corev1.EventList
		if err := c.List(ctx, &list, client.InNamespace(ns)); err != nil {
			return fmt.Sprintf("(events of %s not listed: %v)", ns, err)
		}
		for _, e := range list.Items {
			if keep == nil || keep(e) {
				all = append(all, e)
			}
		}
	}
	if len(all) == 0 {
		return "(no events in " + strings.Join(namespaces, ", ") + ")"
	}
	sort.SliceStable(all, func(i, j int) bool { return seen(all[i]).Before(seen(all[j])) })
	var b strings.Builder
	for _, e := range all {
		fmt.Fprintf(&b, "%s %-7s %-28s %s %s/%s: %s", seen(e).UTC().Format("15:04:05.000"), e.Type, e.Reason,
			e.InvolvedObject.Kind, e.InvolvedObject.Namespace, e.InvolvedObject.Name, e.Message)
		if e.Count > 1 {
			fmt.Fprintf(&b, " (x%d)", e.Count)
		}
		b.WriteByte('\n')
	}
	return b.String()
}

// seen is when the event was last seen, whichever field its recorder set.
func seen(e corev1.Event) time.Time {
	for _, t := range []time.Time{e.LastTimestamp.Time, e.EventTime.Time, e.FirstTimestamp.Time, e.CreationTimestamp.Time} {
		if !t.IsZero() {
			return t
		}
	}
	return time.Time{}
}

// Names keeps the events whose object has one of the names: the test's
// cluster-scoped objects among other tests' in "default".
func Names(names ...string) Filter {
	return func(e corev1.Event) bool {
		for _, n := range names {
			if e.InvolvedObject.Name == n {
				return true
			}
		}
		return false
	}
}

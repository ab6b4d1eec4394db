//go:build e2e

package e2e

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"

	"github.com/hyperfleet/hyperfleet/internal/testworld/devenv"
)

// watchPoolWrites watches the world's RunnerPools and returns, for each new
// version of each (each write of its status), what changed: status fields
// with their new value, and conditions by type with the parts that moved
// (status, reason, message, lastTransitionTime, observedGeneration). It is
// the diagnosis of TestKubernetesRequestsPerJob's pool status writes, as
// watchClaimWrites is of the claims'.
func watchPoolWrites(t *testing.T, w *devenv.World) func() string {
	t.Helper()
	wi := watchNamespace(t, w, &hfv1.RunnerPoolList{})
	var mu sync.Mutex
	var lines []string
	last := map[string]*hfv1.RunnerPool{}
	go func() {
		for ev := range wi.ResultChan() {
			pool, ok := ev.Object.(*hfv1.RunnerPool)
			if !ok {
				continue
			}
			// The watch starts with the pool as it is (ADDED): its
			// changes are counted from there.
			line := fmt.Sprintf("%s %s gen %d", pool.Name, ev.Type, pool.Generation)
			if prev := last[pool.Name]; prev != nil {
				line += ": " + strings.Join(poolChanges(prev, pool), " ")
			}
			last[pool.Name] = pool.DeepCopy()
			mu.Lock()
			lines = append(lines, line)
			mu.Unlock()
		}
	}()
	return func() string {
		mu.Lock()
		defer mu.Unlock()
		return strings.Join(lines, "\n")
	}
}

// poolChanges lists what after changed from before: spec and metadata as
// wholes, each status field (with its new value) and each condition's
// parts.
func poolChanges(before, after *hfv1.RunnerPool) []string {
	js := func(v any) string { b, _ := json.Marshal(v); return string(b) }
	var out []string
	if js(before.Spec) != js(after.Spec) {
		out = append(out, "spec")
	}
	if js(before.Labels) != js(after.Labels) || js(before.Annotations) != js(after.Annotations) || js(before.Finalizers) != js(after.Finalizers) {
		out = append(out, "metadata")
	}
	fields := func(p *hfv1.RunnerPool) map[string]json.RawMessage {
		var m map[string]json.RawMessage
		_ = json.Unmarshal([]byte(js(p.Status)), &m)
		delete(m, "conditions")
		return m
	}
	b, a := fields(before), fields(after)
	for k, v := range a {
		if string(b[k]) != string(v) {
			out = append(out, "status."+k+"="+string(v))
		}
	}
	for k := range b {
		if _, ok := a[k]; !ok {
			out = append(out, "status."+k+"(removed)")
		}
	}
	for _, c := range after.Status.Conditions {
		old := hfv1.FindCondition(before.Status.Conditions, hfv1.ConditionType(c.Type))
		if parts := conditionChanges(old, c); len(parts) > 0 {
			out = append(out, fmt.Sprintf("condition.%s=%s/%s[%s]", c.Type, c.Status, c.Reason, strings.Join(parts, ",")))
		}
	}
	slices.Sort(out)
	return out
}

// conditionChanges names the parts of a condition that moved; "new" when
// the condition was not there before.
func conditionChanges(old *metav1.Condition, c metav1.Condition) []string {
	if old == nil {
		return []string{"new"}
	}
	var parts []string
	if old.Status != c.Status {
		parts = append(parts, "status")
	}
	if old.Reason != c.Reason {
		parts = append(parts, "reason")
	}
	if old.Message != c.Message {
		parts = append(parts, fmt.Sprintf("message %q", c.Message))
	}
	if !old.LastTransitionTime.Equal(&c.LastTransitionTime) {
		parts = append(parts, "lastTransitionTime")
	}
	if old.ObservedGeneration != c.ObservedGeneration {
		parts = append(parts, "observedGeneration")
	}
	return parts
}

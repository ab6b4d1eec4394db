package machineclaim

import (
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/hyperfleet/hyperfleet/pkg/workload"
)

// TestObservations: Set reports a change of presence or state only, Get
// returns the latest observation, Forget drops one claim's.
func TestObservations(t *testing.T) {
	epoch := time.Date(2025, 1, 1, 12, 0, 0, 0, time.UTC)
	o := NewRunnerObservations()
	const uid = types.UID("u1")
	if _, ok := o.Get(uid); ok {
		t.Fatal("Get on an empty store found something")
	}
	steps := []struct {
		name string
		obs  RunnerObservation
		want bool
	}{
		{"first", RunnerObservation{Present: true, State: workload.RunnerOffline, At: epoch}, true},
		{"same, later", RunnerObservation{Present: true, State: workload.RunnerOffline, At: epoch.Add(time.Minute)}, false},
		{"state", RunnerObservation{Present: true, State: workload.RunnerIdle, At: epoch.Add(2 * time.Minute)}, true},
		{"same state", RunnerObservation{Present: true, State: workload.RunnerIdle, At: epoch.Add(2 * time.Minute)}, false},
		{"busy", RunnerObservation{Present: true, State: workload.RunnerBusy, At: epoch.Add(3 * time.Minute)}, true},
		{"gone", RunnerObservation{Present: false, State: workload.RunnerBusy, At: epoch.Add(4 * time.Minute)}, true},
		{"gone again", RunnerObservation{Present: false, State: workload.RunnerBusy, At: epoch.Add(5 * time.Minute)}, false},
		{"gone, state cleared", RunnerObservation{Present: false, At: epoch.Add(6 * time.Minute)}, true},
	}
	for _, s := range steps {
		if got := o.Set(uid, s.obs); got != s.want {
			t.Errorf("%s: Set = %v, want %v", s.name, got, s.want)
		}
		if got, ok := o.Get(uid); !ok || got != s.obs {
			t.Errorf("%s: Get = %+v, %v; want the latest observation %+v", s.name, got, ok, s.obs)
		}
	}
	if !o.Set("u2", RunnerObservation{}) {
		t.Error("first Set of another claim reported no change")
	}
	o.Forget(uid)
	if _, ok := o.Get(uid); ok {
		t.Error("Get found a forgotten observation")
	}
	if _, ok := o.Get("u2"); !ok {
		t.Error("Forget dropped another claim's observation")
	}
	if !o.Set(uid, RunnerObservation{Present: true, State: workload.RunnerIdle}) {
		t.Error("Set after Forget reported no change")
	}

	var nilStore *RunnerObservations
	if v, ok := nilStore.Get(uid); ok || v != (RunnerObservation{}) {
		t.Errorf("nil store Get = %+v, %v; want zero, false", v, ok)
	}
	nilStore.Forget(uid) // no panic
}

package poolplacement

import (
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
)

const (
	av = hfv1.TemplateAvailable
	fu = hfv1.TemplateFull
	oq = hfv1.TemplateOverQuota
	un = hfv1.TemplateUnreachable
	in = hfv1.TemplateInvalid
)

func templates(states []hfv1.TemplatePlacementState, machines []int) []Template {
	ts := make([]Template, len(states))
	for i, s := range states {
		ts[i] = Template{Name: string(rune('a' + i)), State: s}
		if machines != nil {
			ts[i].Machines = machines[i]
		}
	}
	return ts
}

func TestChoose(t *testing.T) {
	for _, tc := range []struct {
		name       string
		states     []hfv1.TemplatePlacementState
		machines   []int
		pack, sprd int
	}{
		{"all available, pack fills the first, spread the emptiest", []hfv1.TemplatePlacementState{av, av, av}, []int{3, 1, 2}, 0, 1},
		{"first full", []hfv1.TemplatePlacementState{fu, av, av}, []int{0, 2, 1}, 1, 2},
		{"first unreachable", []hfv1.TemplatePlacementState{un, av}, []int{5, 9}, 1, 1},
		{"first over quota, second invalid", []hfv1.TemplatePlacementState{oq, in, av}, nil, 2, 2},
		{"spread ties go to priority", []hfv1.TemplatePlacementState{av, av}, []int{2, 2}, 0, 0},
		{"spread skips an emptier template that is full", []hfv1.TemplatePlacementState{av, fu, av}, []int{4, 0, 3}, 0, 2},
		{"none available: templateRef", []hfv1.TemplatePlacementState{fu, un, oq, in}, nil, 0, 0},
		{"one template", []hfv1.TemplatePlacementState{av}, nil, 0, 0},
		{"one template, full", []hfv1.TemplatePlacementState{fu}, nil, 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := Choose(hfv1.PlacementPack, templates(tc.states, tc.machines)); got != tc.pack {
				t.Errorf("pack: %d, want %d", got, tc.pack)
			}
			if got := Choose(hfv1.PlacementSpread, templates(tc.states, tc.machines)); got != tc.sprd {
				t.Errorf("spread: %d, want %d", got, tc.sprd)
			}
			// An unset strategy is pack (the API's default).
			if got := Choose("", templates(tc.states, tc.machines)); got != tc.pack {
				t.Errorf("unset strategy: %d, want pack's %d", got, tc.pack)
			}
		})
	}
}

func TestPlanSpreadBalancesWithinThePass(t *testing.T) {
	ts := templates([]hfv1.TemplatePlacementState{av, fu, av}, []int{2, 0, 0})
	got := Plan(hfv1.PlacementSpread, ts, 4)
	if want := []int{2, 2, 0, 2}; !slices.Equal(got, want) {
		t.Fatalf("spread plan %v, want %v", got, want)
	}
	if ts[0].Machines != 3 || ts[1].Machines != 0 || ts[2].Machines != 3 {
		t.Errorf("counts after the plan: %+v", ts)
	}
	pack := templates([]hfv1.TemplatePlacementState{fu, av, av}, nil)
	if got := Plan(hfv1.PlacementPack, pack, 3); !slices.Equal(got, []int{1, 1, 1}) {
		t.Errorf("pack plan %v, want every VM on the first Available template", got)
	}
}

func TestStateOf(t *testing.T) {
	w := func(r hfv1.ConditionReason, n int) map[hfv1.ConditionReason]int {
		return map[hfv1.ConditionReason]int{r: n}
	}
	for _, tc := range []struct {
		name  string
		facts Facts
		state hfv1.TemplatePlacementState
		msg   string
	}{
		{"nothing observed", Facts{}, av, ""},
		{"invalid wins over everything", Facts{Invalid: "bootstrap differs", Unreachable: "down", Full: "full"}, in, "bootstrap differs"},
		{"cluster not connected", Facts{Unreachable: "not connected", Full: "full"}, un, "not connected"},
		{"claims wait for the cluster", Facts{Waiting: w(hfv1.ClusterUnavailableReason, 2)}, un, "2 of the pool's claims wait with ClusterUnavailable"},
		{"status full", Facts{Full: "no node has 4Gi free"}, fu, "no node has 4Gi free"},
		{"at maxMachines", Facts{Waiting: w(hfv1.MaxMachinesReachedReason, 1)}, fu, "MaxMachinesReached"},
		{"no capacity", Facts{Waiting: w(hfv1.InsufficientCapacityReason, 3)}, fu, "InsufficientCapacity"},
		{"over quota", Facts{Waiting: w(hfv1.QuotaExceededReason, 1)}, oq, "QuotaExceeded"},
		{"full wins over quota", Facts{Waiting: map[hfv1.ConditionReason]int{hfv1.QuotaExceededReason: 1, hfv1.MaxMachinesReachedReason: 1}}, fu, "MaxMachinesReached"},
		{"other reasons do not change the state", Facts{Waiting: w(hfv1.IPPoolExhaustedReason, 1)}, av, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			state, msg := StateOf(tc.facts)
			if state != tc.state || !strings.Contains(msg, tc.msg) || (tc.msg == "" && msg != "") {
				t.Errorf("StateOf = %s %q, want %s containing %q", state, msg, tc.state, tc.msg)
			}
		})
	}
}

func TestSpillable(t *testing.T) {
	ts := templates([]hfv1.TemplatePlacementState{fu, av}, nil)
	if !Spillable(ts, 0, hfv1.MaxMachinesReachedReason) {
		t.Error("a claim waiting at maxMachines on a full template is not spilled to an Available one")
	}
	if Spillable(ts, 1, hfv1.MaxMachinesReachedReason) {
		t.Error("a claim on the Available template is spilled")
	}
	if Spillable(ts, 0, hfv1.IPPoolExhaustedReason) {
		t.Error("a claim waiting for a reason of its own template (its IP pool) is spilled")
	}
	if Spillable(templates([]hfv1.TemplatePlacementState{fu, un}, nil), 0, hfv1.MaxMachinesReachedReason) {
		t.Error("a claim is spilled while no template is Available")
	}
	if Spillable(ts, 5, hfv1.MaxMachinesReachedReason) {
		t.Error("a claim of no template of the pool is spilled")
	}
	if got := FirstUnavailable(templates([]hfv1.TemplatePlacementState{av, un, av}, nil), 2); got != 1 {
		t.Errorf("FirstUnavailable = %d, want 1", got)
	}
	if got := FirstUnavailable(templates([]hfv1.TemplatePlacementState{av, av}, nil), 1); got != -1 {
		t.Errorf("FirstUnavailable = %d, want -1", got)
	}
}

func TestCarry(t *testing.T) {
	since := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	full := &hfv1.TemplatePlacement{Name: "a", State: fu, Message: "1 of the pool's claims wait with MaxMachinesReached", Machines: 3,
		Since: &metav1.Time{Time: since}}
	for _, tc := range []struct {
		name     string
		prev     *hfv1.TemplatePlacement
		state    hfv1.TemplatePlacementState
		machines int
		polled   time.Time
		carried  bool
	}{
		{"nothing observed since the spill", full, av, 3, since.Add(-time.Second), true},
		{"the cluster's status not polled yet", full, av, 3, time.Time{}, true},
		{"the cluster polled since", full, av, 3, since.Add(time.Second), false},
		{"one of the pool's VMs on it ended", full, av, 2, since.Add(-time.Second), false},
		{"the pool grew there (a VM placed)", full, av, 4, since.Add(-time.Second), true},
		{"fresh facts win", full, un, 3, time.Time{}, false},
		{"no previous state", nil, av, 3, time.Time{}, false},
		{"previously Unreachable: the connection is observed directly", &hfv1.TemplatePlacement{State: un, Since: &metav1.Time{Time: since}}, av, 0, time.Time{}, false},
		{"over quota holds too", &hfv1.TemplatePlacement{State: oq, Message: "2 of the pool's claims wait with QuotaExceeded", Since: &metav1.Time{Time: since}}, av, 0, time.Time{}, true},
		{"a Full the cluster's status showed is observed again", &hfv1.TemplatePlacement{State: fu, Message: "HypervisorCluster a is at its spec.limits.maxMachines (1)", Since: &metav1.Time{Time: since}}, av, 3, since.Add(-time.Second), false},
		{"no since recorded", &hfv1.TemplatePlacement{State: fu}, av, 0, time.Time{}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			state, msg, carried := Carry(tc.prev, tc.state, "fresh", tc.machines, tc.polled)
			if carried != tc.carried {
				t.Fatalf("carried %v, want %v (state %s %q)", carried, tc.carried, state, msg)
			}
			if carried && (state != tc.prev.State || msg != tc.prev.Message) {
				t.Errorf("carried state %s %q, want prev's", state, msg)
			}
			if !carried && (state != tc.state || msg != "fresh") {
				t.Errorf("state %s %q, want the fresh one", state, msg)
			}
		})
	}
}

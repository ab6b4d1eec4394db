package poolclaims

import (
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/scaling"
)

// unitEpoch is the reference instant of the unit tests in this file.
var unitEpoch = time.Date(2025, 1, 1, 12, 0, 0, 0, time.UTC)

func TestTimes(t *testing.T) {
	at := func(d time.Duration) *metav1.Time { return &metav1.Time{Time: unitEpoch.Add(d)} }
	for _, tc := range []struct {
		name string
		mut  func(*hfv1.MachineClaim)
		want scaling.ClaimTimes
	}{
		{name: "bare", mut: func(*hfv1.MachineClaim) {}, want: scaling.ClaimTimes{Created: unitEpoch}},
		{
			name: "phase times without provisioning",
			mut:  func(c *hfv1.MachineClaim) { c.Status.PhaseTimes = &hfv1.PhaseTimes{Pending: at(time.Second)} },
			want: scaling.ClaimTimes{Created: unitEpoch},
		},
		{
			name: "provisioning",
			mut:  func(c *hfv1.MachineClaim) { c.Status.PhaseTimes = &hfv1.PhaseTimes{Provisioning: at(time.Minute)} },
			want: scaling.ClaimTimes{Created: unitEpoch, Provisioning: unitEpoch.Add(time.Minute)},
		},
		{
			name: "registered",
			mut: func(c *hfv1.MachineClaim) {
				c.Status.Bootstrap = &hfv1.BootstrapStatus{RegisteredAt: at(2 * time.Minute)}
			},
			want: scaling.ClaimTimes{Created: unitEpoch, Registered: unitEpoch.Add(2 * time.Minute)},
		},
		{
			name: "job start without job id is ignored",
			mut: func(c *hfv1.MachineClaim) {
				c.Status.Bootstrap = &hfv1.BootstrapStatus{JobStartedAt: at(3 * time.Minute)}
			},
			want: scaling.ClaimTimes{Created: unitEpoch},
		},
		{
			name: "job id without start",
			mut:  func(c *hfv1.MachineClaim) { c.Status.Bootstrap = &hfv1.BootstrapStatus{JobID: 9} },
			want: scaling.ClaimTimes{Created: unitEpoch},
		},
		{
			name: "job key with start (a Buildkite job's UUID)",
			mut: func(c *hfv1.MachineClaim) {
				c.Status.Bootstrap = &hfv1.BootstrapStatus{JobKey: "0190a1b2-7c4d-7e8f-9a0b-1c2d3e4f5a6b", JobStartedAt: at(3 * time.Minute)}
			},
			want: scaling.ClaimTimes{Created: unitEpoch, JobStarted: unitEpoch.Add(3 * time.Minute)},
		},
		{
			name: "all",
			mut: func(c *hfv1.MachineClaim) {
				c.Status.PhaseTimes = &hfv1.PhaseTimes{Provisioning: at(time.Minute)}
				c.Status.Bootstrap = &hfv1.BootstrapStatus{RegisteredAt: at(2 * time.Minute), JobID: 9, JobStartedAt: at(3 * time.Minute)}
			},
			want: scaling.ClaimTimes{
				Created: unitEpoch, Provisioning: unitEpoch.Add(time.Minute),
				Registered: unitEpoch.Add(2 * time.Minute), JobStarted: unitEpoch.Add(3 * time.Minute),
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := hfv1.MachineClaim{ObjectMeta: metav1.ObjectMeta{Name: "c", CreationTimestamp: metav1.Time{Time: unitEpoch}}}
			tc.mut(&c)
			got := Times(&c)
			if !got.Created.Equal(tc.want.Created) || !got.Provisioning.Equal(tc.want.Provisioning) ||
				!got.Registered.Equal(tc.want.Registered) || !got.JobStarted.Equal(tc.want.JobStarted) {
				t.Errorf("Times = %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestLimits(t *testing.T) {
	dur := func(d time.Duration) *metav1.Duration { return &metav1.Duration{Duration: d} }
	for _, tc := range []struct {
		name string
		lc   hfv1.Lifecycle
		want scaling.Limits
	}{
		{
			name: "defaults",
			want: scaling.Limits{BootstrapTimeout: 10 * time.Minute, IdleTimeout: 30 * time.Minute, JobTimeout: 3 * time.Hour, MaxLifetime: 6 * time.Hour},
		},
		{
			name: "all set",
			lc:   hfv1.Lifecycle{BootstrapTimeout: dur(time.Minute), IdleTimeout: dur(2 * time.Minute), JobTimeout: dur(3 * time.Minute), MaxLifetime: dur(4 * time.Minute)},
			want: scaling.Limits{BootstrapTimeout: time.Minute, IdleTimeout: 2 * time.Minute, JobTimeout: 3 * time.Minute, MaxLifetime: 4 * time.Minute},
		},
		{
			name: "some set",
			lc:   hfv1.Lifecycle{IdleTimeout: dur(5 * time.Minute), MaxLifetime: dur(48 * time.Hour)},
			want: scaling.Limits{BootstrapTimeout: 10 * time.Minute, IdleTimeout: 5 * time.Minute, JobTimeout: 3 * time.Hour, MaxLifetime: 48 * time.Hour},
		},
		{
			name: "explicit zero",
			lc:   hfv1.Lifecycle{JobTimeout: dur(0)},
			want: scaling.Limits{BootstrapTimeout: 10 * time.Minute, IdleTimeout: 30 * time.Minute, JobTimeout: 0, MaxLifetime: 6 * time.Hour},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := &hfv1.RunnerPool{}
			p.Spec.Lifecycle = tc.lc
			if got := Limits(p); got != tc.want {
				t.Errorf("Limits = %+v, want %+v", got, tc.want)
			}
		})
	}
}

// TestStateOfAdminActions: a claim whose VM a platform admin disowned is no
// longer the pool's (Finished: not counted, so the pool replaces it), also
// while it still holds its address; one being disowned still counts as
// terminating, since its VM is the pool's until released.
func TestStateOfAdminActions(t *testing.T) {
	finalized := metav1.Condition{Type: string(hfv1.MachineClaimFinalizedCondition), Status: metav1.ConditionTrue, Reason: string(hfv1.DisownedReason)}
	for _, tc := range []struct {
		name string
		mut  func(*hfv1.MachineClaim)
		want State
	}{
		{name: "idle", mut: func(*hfv1.MachineClaim) {}, want: Idle},
		{name: "being disowned", mut: func(c *hfv1.MachineClaim) {
			c.Annotations = map[string]string{hfv1.DisownAnnotation: "forensics"}
			c.Status.End = &hfv1.MachineClaimEnd{Reason: hfv1.EndDisowned}
		}, want: Terminating},
		{name: "disowned, holding its address", mut: func(c *hfv1.MachineClaim) {
			c.Status.End = &hfv1.MachineClaimEnd{Reason: hfv1.EndDisowned}
			c.Status.Conditions = append(c.Status.Conditions, finalized)
			c.Status.Network = &hfv1.MachineNetworkStatus{IPAllocations: []hfv1.IPAllocation{{PoolRef: "p", Address: "10.0.0.5/24"}}}
		}, want: Finished},
		{name: "took a job known by its key", mut: func(c *hfv1.MachineClaim) {
			c.Status.Bootstrap.SetJob("0190a1b2-7c4d-7e8f-9a0b-1c2d3e4f5a6b")
		}, want: Busy},
		{name: "disowned, runner busy", mut: func(c *hfv1.MachineClaim) {
			c.Status.End = &hfv1.MachineClaimEnd{Reason: hfv1.EndDisowned}
			c.Status.Conditions = append(c.Status.Conditions, finalized)
			c.Status.Bootstrap.JobID = 42
		}, want: Finished},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := hfv1.MachineClaim{ObjectMeta: metav1.ObjectMeta{Name: "c"}, Status: hfv1.MachineClaimStatus{
				Bootstrap:  &hfv1.BootstrapStatus{RunnerName: "r"},
				Conditions: []metav1.Condition{{Type: string(hfv1.MachineClaimBootstrappedCondition), Status: metav1.ConditionTrue, Reason: string(hfv1.RunnerOnlineReason)}},
			}}
			tc.mut(&c)
			for _, retains := range []bool{false, true} {
				if got := StateOf(&c, retains); got != tc.want {
					t.Errorf("StateOf (retains %v) = %d, want %d", retains, got, tc.want)
				}
			}
		})
	}
}

// TestClassifyTemplatesJudgesEachClaimByItsTemplate: in a pool with
// several templates a claim is stale against its own template's hash; the
// primary template's hash would call every overflow VM stale and replace
// it at once.
func TestClassifyTemplatesJudgesEachClaimByItsTemplate(t *testing.T) {
	claim := func(uid, tmpl, hash string) hfv1.MachineClaim {
		c := hfv1.MachineClaim{ObjectMeta: metav1.ObjectMeta{UID: types.UID(uid)}}
		c.Spec.TemplateRef.Name = tmpl
		c.Status.TemplateHash = hash
		return c
	}
	claims := []hfv1.MachineClaim{claim("a-fresh", "a", "ha2"), claim("a-old", "a", "ha1"), claim("b-fresh", "b", "hb1"),
		claim("b-old", "b", "hb0"), claim("c-any", "c", "hc0")}
	pc := ClassifyTemplates(claims, map[string]string{"a": "ha2", "b": "hb1"}, false)
	want := map[types.UID]bool{"a-old": true, "b-old": true}
	if len(pc.Stale) != len(want) {
		t.Fatalf("stale %v, want %v", pc.Stale, want)
	}
	for uid := range want {
		if !pc.Stale[uid] {
			t.Errorf("%s not stale; stale: %v", uid, pc.Stale)
		}
	}
	if single := Classify(claims, "ha2", false); !single.Stale["b-fresh"] {
		t.Error("Classify with one hash no longer judges every claim by it")
	}
}

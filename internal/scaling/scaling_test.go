package scaling

import (
	"testing"
	"time"
)

func at(d time.Duration) *time.Time {
	t := baseNow.Add(d)
	return &t
}

func sameDecision(a, b Decision) bool {
	if (a.LowDemandSince == nil) != (b.LowDemandSince == nil) {
		return false
	}
	if a.LowDemandSince != nil && !a.LowDemandSince.Equal(*b.LowDemandSince) {
		return false
	}
	a.LowDemandSince, b.LowDemandSince = nil, nil
	if !a.ScaleDownAt.Equal(b.ScaleDownAt) {
		return false
	}
	a.ScaleDownAt, b.ScaleDownAt = time.Time{}, time.Time{}
	return a == b
}

func TestPlan(t *testing.T) {
	now := baseNow
	for _, tc := range []struct {
		name string
		in   Input
		want Decision
	}{
		{
			name: "scale from zero for 3 pending jobs",
			in:   Input{MaxReplicas: 10, Pending: 3},
			want: Decision{Desired: 3, Create: 3},
		},
		{
			name: "warm pool of minIdle 2 with no jobs",
			in:   Input{MaxReplicas: 10, MinIdle: 2},
			want: Decision{Desired: 2, Create: 2},
		},
		{
			name: "warm pool already warm",
			in:   Input{MaxReplicas: 10, MinIdle: 2, Idle: 2},
			want: Decision{Desired: 2},
		},
		{
			name: "minIdle comes on top of busy and pending",
			in:   Input{MinReplicas: 1, MaxReplicas: 10, MinIdle: 2, Busy: 3, Pending: 1, Idle: 1},
			want: Decision{Desired: 6, Create: 2},
		},
		{
			name: "minReplicas above demand",
			in:   Input{MinReplicas: 4, MaxReplicas: 10, Pending: 1, Starting: 1},
			want: Decision{Desired: 4, Create: 3},
		},
		{
			name: "maxReplicas caps",
			in:   Input{MaxReplicas: 5, Pending: 8},
			want: Decision{Desired: 5, Create: 5, Limit: AtMaxReplicas},
		},
		{
			name: "maxReplicas caps with the pool already full",
			in:   Input{MaxReplicas: 5, Pending: 8, Busy: 3, Starting: 2},
			want: Decision{Desired: 5, Limit: AtMaxReplicas},
		},
		{
			name: "retained VMs reduce the ceiling",
			in:   Input{MaxReplicas: 5, Pending: 8, Retained: 2},
			want: Decision{Desired: 3, Create: 3, Limit: AtMaxReplicas},
		},
		{
			name: "retained VMs under the ceiling do not limit",
			in:   Input{MaxReplicas: 5, Pending: 2, Retained: 2},
			want: Decision{Desired: 2, Create: 2},
		},
		{
			name: "retained VMs above maxReplicas leave room for nothing",
			in:   Input{MaxReplicas: 3, Pending: 2, Retained: 4},
			want: Decision{Desired: 0, Limit: AtMaxReplicas},
		},
		{
			name: "terminating VMs hold room",
			in:   Input{MaxReplicas: 5, Pending: 4, Terminating: 3},
			want: Decision{Desired: 4, Create: 2, Limit: WaitingForTermination},
		},
		{
			name: "terminating VMs under the limit do not hold anything",
			in:   Input{MaxReplicas: 10, Pending: 4, Terminating: 3},
			want: Decision{Desired: 4, Create: 4},
		},
		{
			name: "at maxReplicas wins over waiting for termination",
			in:   Input{MaxReplicas: 5, Pending: 9, Terminating: 3},
			want: Decision{Desired: 5, Create: 2, Limit: AtMaxReplicas},
		},
		{
			name: "drift replaces stale idle and stale starting, never busy",
			in:   Input{MaxReplicas: 10, MinIdle: 3, Busy: 2, StaleIdle: 2, StaleStarting: 1},
			want: Decision{Desired: 5, Create: 3, RemoveStaleStarting: 1, RemoveStaleIdle: 2},
		},
		{
			name: "drift at maxReplicas waits for the stale VMs to go",
			in:   Input{MaxReplicas: 3, MinIdle: 3, StaleIdle: 3},
			want: Decision{Desired: 3, RemoveStaleIdle: 3, Limit: WaitingForTermination},
		},
		{
			name: "drift with only busy claims removes nothing",
			in:   Input{MaxReplicas: 10, Busy: 4},
			want: Decision{Desired: 4},
		},
		{
			name: "surplus idle waits for scaleDownDelay",
			in:   Input{MaxReplicas: 10, MinIdle: 1, Idle: 5, ScaleDownDelay: 5 * time.Minute, Now: now},
			want: Decision{Desired: 1, LowDemandSince: at(0), ScaleDownAt: now.Add(5 * time.Minute)},
		},
		{
			name: "surplus idle still waiting",
			in:   Input{MaxReplicas: 10, MinIdle: 1, Idle: 5, ScaleDownDelay: 5 * time.Minute, Now: now, LowDemandSince: at(-4 * time.Minute)},
			want: Decision{Desired: 1, LowDemandSince: at(-4 * time.Minute), ScaleDownAt: now.Add(time.Minute)},
		},
		{
			name: "surplus idle removed once scaleDownDelay passed",
			in:   Input{MaxReplicas: 10, MinIdle: 1, Idle: 5, ScaleDownDelay: 5 * time.Minute, Now: now, LowDemandSince: at(-5 * time.Minute)},
			want: Decision{Desired: 1, RemoveIdle: 4, LowDemandSince: at(-5 * time.Minute)},
		},
		{
			name: "a LowDemandSince in the future counts from now",
			in:   Input{MaxReplicas: 10, Idle: 2, ScaleDownDelay: time.Minute, Now: now, LowDemandSince: at(time.Hour)},
			want: Decision{Desired: 0, LowDemandSince: at(0), ScaleDownAt: now.Add(time.Minute)},
		},
		{
			name: "no scaleDownDelay removes surplus at once",
			in:   Input{MaxReplicas: 10, Idle: 2, Busy: 1, Now: now},
			want: Decision{Desired: 1, RemoveIdle: 2, LowDemandSince: at(0)},
		},
		{
			name: "surplus starting claims are not removed",
			in:   Input{MaxReplicas: 10, Starting: 3, Idle: 1, Now: now, LowDemandSince: at(-time.Hour)},
			want: Decision{Desired: 0, RemoveIdle: 1, LowDemandSince: at(-time.Hour)},
		},
		{
			name: "demand back to the pool's size forgets LowDemandSince",
			in:   Input{MaxReplicas: 10, Idle: 2, Pending: 2, ScaleDownDelay: time.Minute, Now: now, LowDemandSince: at(-time.Hour)},
			want: Decision{Desired: 2},
		},
		{
			name: "minReplicas lowered below busy keeps busy",
			in:   Input{MinReplicas: 2, MaxReplicas: 10, Busy: 5, Idle: 1, Now: now},
			want: Decision{Desired: 5, RemoveIdle: 1, LowDemandSince: at(0)},
		},
		{
			name: "maxReplicas lowered below busy keeps busy",
			in:   Input{MaxReplicas: 3, Busy: 5, Idle: 1, Pending: 2, Now: now},
			want: Decision{Desired: 5, RemoveIdle: 1, LowDemandSince: at(0), Limit: AtMaxReplicas},
		},
		{
			name: "negative inputs are sanitized",
			in: Input{MinReplicas: -1, MaxReplicas: -3, MinIdle: -2, ScaleDownDelay: -time.Minute, Pending: -5,
				Starting: -1, StaleStarting: -1, Idle: -1, StaleIdle: -1, Busy: -1, Terminating: -1, Retained: -1, Now: now},
			want: Decision{},
		},
		{
			name: "negative terminating and retained hold no room",
			in:   Input{MaxReplicas: 2, Pending: 5, Terminating: -4, Retained: -3},
			want: Decision{Desired: 2, Create: 2, Limit: AtMaxReplicas},
		},
		{
			name: "negative scaleDownDelay removes surplus at once",
			in:   Input{MaxReplicas: 10, Idle: 3, ScaleDownDelay: -time.Hour, Now: now},
			want: Decision{RemoveIdle: 3, LowDemandSince: at(0)},
		},
		{
			name: "inverted bounds clamp minReplicas to maxReplicas",
			in:   Input{MinReplicas: 5, MaxReplicas: 3},
			want: Decision{Desired: 3, Create: 3},
		},

		// The standby tier.
		{
			name: "3 jobs, 1 idle runner, 2 ready standby claims: the idle runner takes one, 2 resumed, none created",
			in:   Input{MaxReplicas: 10, Pending: 3, Idle: 1, StandbySize: 2, Standby: 2},
			want: Decision{Desired: 3, Activate: 2, CreateStandby: 2},
		},
		{
			name: "4 jobs, 1 idle runner, 2 ready standby claims: warm first, standby next, cold last",
			in:   Input{MaxReplicas: 10, Pending: 4, Idle: 1, StandbySize: 2, Standby: 2},
			want: Decision{Desired: 4, Activate: 2, Create: 1, CreateStandby: 2},
		},
		{
			name: "idle runners enough for the jobs resume nothing",
			in:   Input{MaxReplicas: 10, Pending: 3, Idle: 3, StandbySize: 2, Standby: 2},
			want: Decision{Desired: 3},
		},
		{
			name: "minIdle is met by resuming standby claims",
			in:   Input{MaxReplicas: 10, MinIdle: 2, StandbySize: 2, Standby: 2},
			want: Decision{Desired: 2, Activate: 2, CreateStandby: 2},
		},
		{
			name: "stale idle claims are replaced by resumed standby claims",
			in:   Input{MaxReplicas: 10, MinIdle: 2, StaleIdle: 2, StandbySize: 2, Standby: 2},
			want: Decision{Desired: 2, Activate: 2, RemoveStaleIdle: 2, CreateStandby: 2},
		},
		{
			name: "a tier at its size with no shortfall changes nothing",
			in:   Input{MaxReplicas: 10, MinIdle: 1, Idle: 1, StandbySize: 3, Standby: 2, StandbyBuilding: 1},
			want: Decision{Desired: 1},
		},
		{
			name: "an activation needs no room under maxReplicas; the refill does",
			in:   Input{MaxReplicas: 3, Busy: 1, Pending: 2, StandbySize: 2, Standby: 2},
			want: Decision{Desired: 3, Activate: 2, StandbyLimit: AtMaxReplicas},
		},
		{
			name: "the refill comes behind demand",
			in:   Input{MaxReplicas: 4, Pending: 3, StandbySize: 2},
			want: Decision{Desired: 3, Create: 3, CreateStandby: 1, StandbyLimit: AtMaxReplicas},
		},
		{
			name: "demand above maxReplicas resumes what is ready and leaves the tier empty",
			in:   Input{MaxReplicas: 5, Pending: 8, StandbySize: 2, Standby: 1},
			want: Decision{Desired: 5, Activate: 1, Create: 4, Limit: AtMaxReplicas, StandbyLimit: AtMaxReplicas},
		},
		{
			name: "standby claims being built hold room demand waits for",
			in:   Input{MaxReplicas: 5, Pending: 4, StandbySize: 3, StandbyBuilding: 3},
			want: Decision{Desired: 4, Create: 2, Limit: WaitingForStandby},
		},
		{
			name: "VMs being destroyed hold the room, not the tier",
			in:   Input{MaxReplicas: 5, Pending: 4, Terminating: 2, StandbySize: 1, StandbyBuilding: 1},
			want: Decision{Desired: 4, Create: 2, Limit: WaitingForTermination},
		},
		{
			name: "stale and expired standby claims are removed and replaced",
			in:   Input{MaxReplicas: 10, StandbySize: 3, Standby: 1, StaleStandby: 1, ExpiredStandby: 1},
			want: Decision{RemoveStaleStandby: 1, RemoveExpiredStandby: 1, CreateStandby: 2},
		},
		{
			name: "stale standby claims at maxReplicas are replaced once their VMs are gone",
			in:   Input{MaxReplicas: 3, StandbySize: 3, StaleStandby: 3},
			want: Decision{RemoveStaleStandby: 3, StandbyLimit: WaitingForTermination},
		},
		{
			name: "a stale standby claim is never resumed",
			in:   Input{MaxReplicas: 10, Pending: 1, StandbySize: 1, StaleStandby: 1},
			want: Decision{Desired: 1, Create: 1, RemoveStaleStandby: 1, CreateStandby: 1},
		},
		{
			name: "a lowered size removes ready claims down to it",
			in:   Input{MaxReplicas: 10, StandbySize: 1, Standby: 4},
			want: Decision{RemoveSurplusStandby: 3},
		},
		{
			name: "a lowered size waits for building claims to be ready",
			in:   Input{MaxReplicas: 10, StandbySize: 1, Standby: 1, StandbyBuilding: 2},
			want: Decision{RemoveSurplusStandby: 1},
		},
		{
			name: "surplus standby claims serve demand before they are removed",
			in:   Input{MaxReplicas: 10, Pending: 2, StandbySize: 1, Standby: 4},
			want: Decision{Desired: 2, Activate: 2, RemoveSurplusStandby: 1},
		},
		{
			name: "negative standby counts are sanitized",
			in:   Input{MaxReplicas: 2, Pending: 1, StandbySize: -1, Standby: -1, StandbyBuilding: -1, StaleStandby: -1, ExpiredStandby: -1},
			want: Decision{Desired: 1, Create: 1},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := Plan(tc.in)
			if !sameDecision(got, tc.want) {
				t.Errorf("Plan(%s)\n   = %s\n want %s", describeInput(tc.in), describeDecision(tc.in, got), describeDecision(tc.in, tc.want))
			}
		})
	}
}

func TestLiveAndRemovals(t *testing.T) {
	in := Input{Starting: 1, StaleStarting: 2, Idle: 4, StaleIdle: 8, Busy: 16, Terminating: 32, Retained: 64, Pending: 128}
	in.StandbySize, in.Standby, in.StandbyBuilding, in.StaleStandby, in.ExpiredStandby = 256, 512, 1024, 2048, 4096
	if got := in.Live(); got != 31 {
		t.Errorf("Live() = %d, want 31", got)
	}
	if got := in.StandbyClaims(); got != 7680 {
		t.Errorf("StandbyClaims() = %d, want 7680", got)
	}
	d := Decision{Create: 1, RemoveStaleStarting: 2, RemoveStaleIdle: 4, RemoveIdle: 8, Desired: 16,
		Activate: 32, CreateStandby: 64, RemoveStaleStandby: 128, RemoveExpiredStandby: 256, RemoveSurplusStandby: 512}
	if got := d.Removals(); got != 14 {
		t.Errorf("Removals() = %d, want 14", got)
	}
	if got := d.StandbyRemovals(); got != 896 {
		t.Errorf("StandbyRemovals() = %d, want 896", got)
	}
}

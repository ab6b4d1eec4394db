// Package scaling decides a RunnerPool's size with pure rules: the pool's
// desired size and which claims to remove (scaling.go: the RunnerPool
// controller counts the pool's claims and jobs into an Input, and Plan says
// how many claims to create and which kinds to remove), the lifecycle limits
// (lifecycle.go) and the replacement backoff (backoff.go). Nothing here
// reads a clock or the API server, so every rule is checked by property
// tests.
//
// # The rule
//
// Every claim of a pool that is not finished is in exactly one state:
// starting (being created or booting, its runner not registered yet), idle
// (registered, no job), busy (running a job), terminating (being deleted;
// its VM still exists), or retained (failed, kept stopped for debugging).
// Starting and idle claims are stale when they were built from an older
// template hash. Busy claims never count as stale here: they are replaced
// after their job (docs/architecture.md, "Template drift hash").
//
//	want    = max(minReplicas, busy + pending + minIdle)
//	ceiling = maxReplicas - retained
//	desired = max(busy, min(want, ceiling))
//
// desired is the number of live claims (starting + idle + busy) the pool
// moves to. Pending jobs are the queued jobs routed to the pool with no
// runner yet; each needs one VM (runners are single-use), and minIdle more
// are kept warm on top. Busy claims are never removed, so desired is never
// below them even when maxReplicas was lowered.
//
// Removals come first and only from claims that are not busy:
//
//   - stale starting and idle claims are always removed (drift
//     replacement); the creations below replace them with fresh ones;
//   - when the live claims left exceed desired, the surplus of idle claims
//     is removed, but only once demand has stayed below the pool's size for
//     scaleDownDelay (LowDemandSince). Starting claims are not removed for
//     surplus: they become idle first, which gives a job queued meanwhile
//     the chance to use them.
//
// Creations fill the live claims up to desired, and never make the VMs that
// exist (live + terminating + retained) exceed maxReplicas: a VM still
// being destroyed holds its place until it is gone.
package scaling

import "time"

// Input is a pool's situation at one instant.
type Input struct {
	// MinReplicas, MaxReplicas and MinIdle are the pool's bounds
	// (spec.scaling); MinReplicas <= MaxReplicas.
	MinReplicas, MaxReplicas, MinIdle int
	// ScaleDownDelay is how long demand must stay low before idle claims
	// are removed for surplus.
	ScaleDownDelay time.Duration

	// Pending counts queued jobs routed to the pool that no runner took.
	Pending int
	// Starting and Idle count fresh claims (current template hash);
	// StaleStarting and StaleIdle those built from an older one.
	Starting, StaleStarting int
	Idle, StaleIdle         int
	// Busy counts claims whose runner runs a job, stale or not.
	Busy int
	// Terminating counts claims being deleted whose VM still exists.
	Terminating int
	// Retained counts failed claims whose VM is kept for debugging.
	Retained int

	// Now is the decision's time; LowDemandSince is when the pool's live
	// claims first exceeded desired without interruption (nil when they
	// do not), as returned by the previous Plan.
	Now            time.Time
	LowDemandSince *time.Time
}

// Live is the number of claims that are, or will be, runners.
func (in Input) Live() int {
	return in.Starting + in.StaleStarting + in.Idle + in.StaleIdle + in.Busy
}

// Limit says why a pool is smaller than its demand.
type Limit string

const (
	// NotLimited: the pool can serve its demand.
	NotLimited Limit = ""
	// AtMaxReplicas: demand exceeds maxReplicas (less retained VMs).
	AtMaxReplicas Limit = "AtMaxReplicas"
	// WaitingForTermination: room under maxReplicas is held by VMs still
	// being destroyed.
	WaitingForTermination Limit = "WaitingForTermination"
)

// Decision is what to do now.
type Decision struct {
	// Desired is the number of live claims the pool moves to.
	Desired int
	// Create is how many new claims to create now.
	Create int
	// RemoveStaleStarting and RemoveStaleIdle are stale claims to remove
	// (drift replacement); RemoveIdle is fresh idle claims to remove for
	// surplus.
	RemoveStaleStarting, RemoveStaleIdle, RemoveIdle int
	// LowDemandSince is the value to keep for the next Plan.
	LowDemandSince *time.Time
	// ScaleDownAt is when surplus idle claims become removable, when some
	// wait for scaleDownDelay; zero otherwise.
	ScaleDownAt time.Time
	// Limit says why Create falls short of what demand asks, if it does.
	Limit Limit
}

// Removals is the number of claims the decision removes.
func (d Decision) Removals() int { return d.RemoveStaleStarting + d.RemoveStaleIdle + d.RemoveIdle }

// Plan applies the rule in the package documentation.
func Plan(in Input) Decision {
	in = in.sanitized()
	want := max(in.MinReplicas, in.Busy+in.Pending+in.MinIdle)
	ceiling := in.MaxReplicas - in.Retained
	desired := max(in.Busy, min(want, ceiling))
	d := Decision{Desired: desired}
	if want > ceiling {
		d.Limit = AtMaxReplicas
	}

	// Drift: every stale claim that is not busy goes.
	d.RemoveStaleStarting, d.RemoveStaleIdle = in.StaleStarting, in.StaleIdle
	live := in.Live() - d.RemoveStaleStarting - d.RemoveStaleIdle

	// Surplus idle claims go once demand stayed low for the delay.
	if surplus := min(live-desired, in.Idle); live > desired {
		since := in.Now
		if in.LowDemandSince != nil && !in.LowDemandSince.After(in.Now) {
			since = *in.LowDemandSince
		}
		d.LowDemandSince = &since
		if at := since.Add(in.ScaleDownDelay); !in.Now.Before(at) {
			d.RemoveIdle = max(surplus, 0)
		} else if surplus > 0 {
			d.ScaleDownAt = at
		}
	}
	live -= d.RemoveIdle

	// Creations: up to desired, within maxReplicas counting every VM that
	// still exists (removed claims' VMs included: they are terminating).
	exist := live + in.Terminating + d.Removals() + in.Retained
	room := max(in.MaxReplicas-exist, 0)
	short := max(desired-live, 0)
	d.Create = min(short, room)
	if d.Create < short && d.Limit == NotLimited {
		d.Limit = WaitingForTermination
	}
	return d
}

// sanitized clamps negative counts to zero and repairs inverted bounds, so
// that Plan is total over its input.
func (in Input) sanitized() Input {
	for _, p := range []*int{&in.MinReplicas, &in.MaxReplicas, &in.MinIdle, &in.Pending, &in.Starting, &in.StaleStarting,
		&in.Idle, &in.StaleIdle, &in.Busy, &in.Terminating, &in.Retained} {
		*p = max(*p, 0)
	}
	in.MinReplicas = min(in.MinReplicas, in.MaxReplicas)
	in.ScaleDownDelay = max(in.ScaleDownDelay, 0)
	return in
}

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
//
// # The standby tier
//
// A pool may keep a tier of standby claims (spec.standby.size of them):
// VMs booted once and suspended to disk, resumed one per job. A suspended
// VM holds no host memory and no credential, and a resume takes seconds
// where a creation takes a boot. A standby claim is ready (suspended,
// built from the current template, younger than the tier's maxAge) or
// building (being created, booted or suspended); stale standby claims were
// built from an older template hash and expired ones are past maxAge, at
// any stage.
//
// Standby claims are not runners: Live, want and desired are as above. The
// tier changes only how the live shortfall is met and what else the room
// under maxReplicas holds:
//
//	short         = max(desired - live, 0)   (live after the removals above)
//	activate      = min(short, ready)
//	create        = min(short - activate, room)
//	surplus       = min(max(ready - activate + building - size, 0), ready - activate)
//	tier          = ready - activate - surplus + building
//	createStandby = min(max(size - tier, 0), room - create)
//
// Warm first, standby next, cold last: idle claims already count in live,
// so they serve demand before anything is resumed; then ready standby
// claims are activated (resumed; they become starting claims, live), and
// only the rest is created. The shortfall is the same whatever its cause
// (jobs, minIdle, minReplicas, stale claims replaced), since a resume beats
// a boot for each of them.
//
// Every VM counts toward maxReplicas: room is maxReplicas less the live,
// terminating and retained VMs and every standby claim (ready, building,
// and those removed now, which exist until they are destroyed). An
// activation needs no room: the VM exists already. Building standby claims
// are never removed to make room for demand: they are activated once
// ready, sooner than a creation in their place would boot.
//
// Refill comes behind demand: the tier is refilled only with the room that
// creations for the live shortfall left. The tier counts the fresh standby
// claims left after the decision, building ones included (they are on
// their way), and not the stale and expired ones, which are always removed
// in the same decision, at any stage: a standby claim runs nothing, so
// drift replaces it at once where a busy claim waits for its job (the
// standby tier first). Their replacements are created as room allows, as
// stale live claims' are. When the tier is above its size
// (a lowered spec.standby.size), the surplus of ready claims left after
// activation is removed at once: the size is the pool's spec, not a
// demand that comes and goes, so there is no scaleDownDelay. Building
// claims are not removed for surplus, as starting ones are not: they
// become ready first, and a job queued meanwhile can use them.
//
// Limit keeps its meaning, why the live claims fall short of demand:
// AtMaxReplicas as above; otherwise WaitingForTermination when the VMs
// being destroyed hold the room, and WaitingForStandby when standby claims
// being built hold room that desired needs even once those are gone. A
// refill cut short says why apart, in StandbyLimit, so that a tier that is
// not full never reads as demand left unserved: AtMaxReplicas when the
// live claims (or desired, when above them) and the tier at its size do
// not fit under maxReplicas less retained VMs, else WaitingForTermination.
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

	// StandbySize is the standby tier's target size (spec.standby.size;
	// zero: no tier).
	StandbySize int
	// Standby counts fresh standby claims ready to be resumed: suspended,
	// built from the current template hash, not past the tier's maxAge.
	Standby int
	// StandbyBuilding counts fresh standby claims not ready yet (being
	// created, booted or suspended): they count toward the tier but cannot
	// be resumed yet.
	StandbyBuilding int
	// StaleStandby counts standby claims at any stage built from an older
	// template hash; ExpiredStandby the other standby claims past the
	// tier's maxAge. The controller counts each claim once, stale before
	// expired.
	StaleStandby, ExpiredStandby int

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

// StandbyClaims is the number of standby claims, each holding a VM (or
// about to): ready, building, stale and expired.
func (in Input) StandbyClaims() int {
	return in.Standby + in.StandbyBuilding + in.StaleStandby + in.ExpiredStandby
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
	// WaitingForStandby: room under maxReplicas is held by standby claims
	// still being built, which serve the demand once ready (resumed)
	// rather than being removed for creations that would boot no sooner.
	WaitingForStandby Limit = "WaitingForStandby"
)

// Decision is what to do now.
type Decision struct {
	// Desired is the number of live claims the pool moves to.
	Desired int
	// Activate is how many ready standby claims to resume now; they
	// become starting claims (live).
	Activate int
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
	// Limit says why Activate and Create fall short of what demand asks,
	// if they do.
	Limit Limit

	// CreateStandby is how many new standby claims to create now (refill).
	CreateStandby int
	// RemoveStaleStandby and RemoveExpiredStandby are every stale and
	// expired standby claim; RemoveSurplusStandby is ready standby claims
	// above the tier's size, none of those activated.
	RemoveStaleStandby, RemoveExpiredStandby, RemoveSurplusStandby int
	// StandbyLimit says why CreateStandby falls short of the tier's size,
	// if it does: AtMaxReplicas or WaitingForTermination.
	StandbyLimit Limit
}

// Removals is the number of live claims the decision removes.
func (d Decision) Removals() int { return d.RemoveStaleStarting + d.RemoveStaleIdle + d.RemoveIdle }

// StandbyRemovals is the number of standby claims the decision removes.
func (d Decision) StandbyRemovals() int {
	return d.RemoveStaleStandby + d.RemoveExpiredStandby + d.RemoveSurplusStandby
}

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

	// Drift: every stale claim that is not busy goes, and every stale or
	// expired standby claim.
	d.RemoveStaleStarting, d.RemoveStaleIdle = in.StaleStarting, in.StaleIdle
	d.RemoveStaleStandby, d.RemoveExpiredStandby = in.StaleStandby, in.ExpiredStandby
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

	// The shortfall: ready standby claims first (a resume needs no room),
	// then creations within maxReplicas, counting every VM that still
	// exists (removed claims' VMs included: they are terminating).
	exist := live + in.Terminating + d.Removals() + in.Retained + in.StandbyClaims()
	room := max(in.MaxReplicas-exist, 0)
	short := max(desired-live, 0)
	d.Activate = min(short, in.Standby)
	d.Create = min(short-d.Activate, room)
	if d.Create < short-d.Activate && d.Limit == NotLimited {
		// The VMs being destroyed free room by going; what they do not
		// free is held by standby claims being built.
		d.Limit = WaitingForTermination
		if desired+in.StandbyBuilding > ceiling {
			d.Limit = WaitingForStandby
		}
	}
	live += d.Activate + d.Create
	room -= d.Create

	// The tier: surplus ready claims go, and it is refilled with the room
	// demand left.
	ready := in.Standby - d.Activate
	d.RemoveSurplusStandby = min(max(ready+in.StandbyBuilding-in.StandbySize, 0), ready)
	tier := ready - d.RemoveSurplusStandby + in.StandbyBuilding
	refill := max(in.StandbySize-tier, 0)
	d.CreateStandby = min(refill, room)
	if d.CreateStandby < refill {
		d.StandbyLimit = WaitingForTermination
		if max(live, desired)+in.StandbySize > ceiling {
			d.StandbyLimit = AtMaxReplicas
		}
	}
	return d
}

// sanitized clamps negative counts to zero and repairs inverted bounds, so
// that Plan is total over its input.
func (in Input) sanitized() Input {
	for _, p := range []*int{&in.MinReplicas, &in.MaxReplicas, &in.MinIdle, &in.Pending, &in.Starting, &in.StaleStarting,
		&in.Idle, &in.StaleIdle, &in.Busy, &in.Terminating, &in.Retained,
		&in.StandbySize, &in.Standby, &in.StandbyBuilding, &in.StaleStandby, &in.ExpiredStandby} {
		*p = max(*p, 0)
	}
	in.MinReplicas = min(in.MinReplicas, in.MaxReplicas)
	in.ScaleDownDelay = max(in.ScaleDownDelay, 0)
	return in
}

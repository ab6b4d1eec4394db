package scaling

import (
	"time"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
)

// Reason is why a pool's VM ends: the API's end reason (a claim's
// spec.end and status.end), which is also the runner outcome counted by the
// runner outcomes metric.
type Reason = hfv1.EndReason

// The reasons, as the API names them.
const (
	JobCompleted     = hfv1.EndJobCompleted
	IdleTimeout      = hfv1.EndIdleTimeout
	MaxLifetime      = hfv1.EndMaxLifetime
	JobTimeout       = hfv1.EndJobTimeout
	BootstrapTimeout = hfv1.EndBootstrapTimeout
	DriftReplaced    = hfv1.EndDriftReplaced
	ScaledDown       = hfv1.EndScaledDown
	StandbyExpired   = hfv1.EndStandbyExpired
	Orphaned         = hfv1.EndOrphaned
	Failed           = hfv1.EndFailed
	PoweredOff       = hfv1.EndPoweredOff
	Deleted          = hfv1.EndDeleted
)

// Limits are a pool's lifecycle bounds (spec.lifecycle); zero disables one.
type Limits struct {
	BootstrapTimeout, IdleTimeout, JobTimeout, MaxLifetime time.Duration
}

// ClaimTimes is what the limits are measured from, for one claim.
type ClaimTimes struct {
	// Created is when the claim was created.
	Created time.Time
	// Provisioning is when its VM started being built; zero while the
	// claim waits (for capacity, a cluster, a template): bootstrapTimeout
	// counts from here, so waiting in a queue is not a bootstrap failure.
	Provisioning time.Time
	// Registered is when its runner came online; zero before.
	Registered time.Time
	// JobStarted is when its runner took a job; zero before.
	JobStarted time.Time
}

// Expiry is a limit a claim reached, or will reach.
type Expiry struct {
	// Reason is the limit; empty when none applies.
	Reason Reason
	// At is when the limit is (or was) reached.
	At time.Time
}

// Expired reports the limit a claim has reached at now, if any, and
// otherwise the earliest one it will reach (Reason empty, At the next
// deadline, zero when no limit applies). maxLifetime wins over the others;
// a busy claim is judged by jobTimeout, an idle one by idleTimeout and one
// not registered yet by bootstrapTimeout.
func Expired(c ClaimTimes, l Limits, now time.Time) (Expiry, Expiry) {
	var candidates []Expiry
	if l.MaxLifetime > 0 && !c.Created.IsZero() {
		candidates = append(candidates, Expiry{MaxLifetime, c.Created.Add(l.MaxLifetime)})
	}
	switch {
	case !c.JobStarted.IsZero():
		if l.JobTimeout > 0 {
			candidates = append(candidates, Expiry{JobTimeout, c.JobStarted.Add(l.JobTimeout)})
		}
	case !c.Registered.IsZero():
		if l.IdleTimeout > 0 {
			candidates = append(candidates, Expiry{IdleTimeout, c.Registered.Add(l.IdleTimeout)})
		}
	case !c.Provisioning.IsZero():
		if l.BootstrapTimeout > 0 {
			candidates = append(candidates, Expiry{BootstrapTimeout, c.Provisioning.Add(l.BootstrapTimeout)})
		}
	}
	var reached, next Expiry
	for _, e := range candidates {
		if !now.Before(e.At) {
			// The first reached in candidate order: maxLifetime first.
			if reached.Reason == "" {
				reached = e
			}
			continue
		}
		if next.At.IsZero() || e.At.Before(next.At) {
			next = Expiry{At: e.At}
		}
	}
	return reached, next
}

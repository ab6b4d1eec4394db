package scaling

import "time"

// Reason is why a pool's VM ends: the runner outcome recorded in the
// claim's status.terminationReason and counted by the runner outcomes
// metric.
type Reason string

const (
	// JobCompleted: the runner ran its one job.
	JobCompleted Reason = "job_completed"
	// IdleTimeout: registered, but no job came within idleTimeout.
	IdleTimeout Reason = "idle_timeout"
	// MaxLifetime: the VM reached maxLifetime (a hard limit).
	MaxLifetime Reason = "max_lifetime"
	// JobTimeout: the job ran longer than jobTimeout (a hard limit).
	JobTimeout Reason = "job_timeout"
	// BootstrapTimeout: the runner did not register within bootstrapTimeout.
	BootstrapTimeout Reason = "bootstrap_timeout"
	// DriftReplaced: built from an older template; replaced by a fresh VM.
	DriftReplaced Reason = "drift_replaced"
	// ScaledDown: an idle VM removed because demand fell.
	ScaledDown Reason = "scaled_down"
	// Orphaned: the orphan sweeper destroyed a VM that had no claim.
	Orphaned Reason = "orphaned"
	// Failed: provisioning failed for good.
	Failed Reason = "failed"
	// PoweredOff: the VM powered off before its runner took a job.
	PoweredOff Reason = "powered_off"
	// Deleted: the claim was deleted by someone else.
	Deleted Reason = "deleted"
)

// Hard reports whether the reason is a hard limit: it ends a busy runner,
// after cancelling its job on the CI platform (docs/architecture.md,
// "Teardown never kills a busy runner").
func (r Reason) Hard() bool { return r == MaxLifetime || r == JobTimeout }

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

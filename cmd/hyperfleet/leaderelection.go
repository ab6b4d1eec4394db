package main

import (
	"fmt"
	"time"
)

// The lease timings' defaults are controller-runtime's.
const (
	defaultLeaseDuration = 15 * time.Second
	defaultRenewDeadline = 10 * time.Second
	defaultRetryPeriod   = 2 * time.Second
	// leaseJitter is client-go's leader election jitter factor: a retry
	// waits up to this many retry periods, and the renew deadline must
	// leave room for one such wait.
	leaseJitter = 1.2
)

// leaderElectionFlags are the lease timings of --leader-elect
// (docs/high-availability.md, "Settings").
type leaderElectionFlags struct {
	duration, renewDeadline, retryPeriod time.Duration
}

// check refuses timings client-go's leader election would refuse when the
// manager starts (or, for a renew deadline the lease does not outlast,
// would let two replicas lead at once), naming the flag and the fix.
func (f leaderElectionFlags) check() error {
	switch {
	case f.duration <= 0 || f.renewDeadline <= 0 || f.retryPeriod <= 0:
		return fmt.Errorf("--leader-elect-lease-duration %s, --leader-elect-renew-deadline %s and --leader-elect-retry-period %s: set each above 0 (defaults %s, %s, %s)",
			f.duration, f.renewDeadline, f.retryPeriod, defaultLeaseDuration, defaultRenewDeadline, defaultRetryPeriod)
	case f.duration <= f.renewDeadline:
		return fmt.Errorf("--leader-elect-lease-duration %s is not above --leader-elect-renew-deadline %s: a standby could take the lease while the leader still believes it leads; make the lease duration longer than the renew deadline", f.duration, f.renewDeadline)
	case float64(f.renewDeadline) <= leaseJitter*float64(f.retryPeriod):
		return fmt.Errorf("--leader-elect-renew-deadline %s leaves no room for one renewal every --leader-elect-retry-period %s (with client-go's jitter, up to %.1f times it): make the renew deadline longer than %s or the retry period shorter",
			f.renewDeadline, f.retryPeriod, leaseJitter, time.Duration(leaseJitter*float64(f.retryPeriod)))
	}
	return nil
}

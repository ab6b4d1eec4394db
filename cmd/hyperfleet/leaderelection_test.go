package main

import (
	"strings"
	"testing"
	"time"
)

// TestLeaderElectionFlags: the lease timings client-go would refuse at
// start, or that would let two replicas lead, are refused with the flag
// named; the defaults and the chaos run's timings pass.
func TestLeaderElectionFlags(t *testing.T) {
	s := time.Second
	for _, c := range []struct {
		f    leaderElectionFlags
		want string
	}{
		{leaderElectionFlags{defaultLeaseDuration, defaultRenewDeadline, defaultRetryPeriod}, ""},
		{leaderElectionFlags{10 * s, 8 * s, 2 * s}, ""},
		{leaderElectionFlags{0, 8 * s, 2 * s}, "set each above 0"},
		{leaderElectionFlags{10 * s, 8 * s, -s}, "set each above 0"},
		{leaderElectionFlags{10 * s, 10 * s, 2 * s}, "--leader-elect-lease-duration 10s is not above --leader-elect-renew-deadline 10s"},
		{leaderElectionFlags{10 * s, 12 * s, 2 * s}, "not above --leader-elect-renew-deadline"},
		{leaderElectionFlags{10 * s, 2400 * time.Millisecond, 2 * s}, "--leader-elect-renew-deadline 2.4s leaves no room"},
	} {
		err := c.f.check()
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%+v: %v; want accepted", c.f, err)
		case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
			t.Errorf("%+v: %v; want an error containing %q", c.f, err, c.want)
		}
	}
}

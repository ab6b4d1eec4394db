package buildkitesim

import "github.com/hyperfleet/hyperfleet/internal/testworld/simulator/simclock"

// Clock is the simulator's source of time (package simclock): token expiry,
// agents' lost timeouts and rate-limit windows run on it.
type Clock = simclock.Clock

// FakeClock is a clock that only moves when a test advances it.
type FakeClock = simclock.FakeClock

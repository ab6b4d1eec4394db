package proxmoxsim

import (
	"time"

	"github.com/hyperfleet/hyperfleet/internal/testworld/simulator/simclock"
)

// Clock is the simulator's source of time (package simclock). Every task, boot and status sample is scheduled on it.
type Clock = simclock.Clock

// Timer is a scheduled call that can be stopped.
type Timer = simclock.Timer

// RealClock is the system clock.
type RealClock = simclock.RealClock

// FakeClock is a clock that only moves when a test advances it.
type FakeClock = simclock.FakeClock

// NewFakeClock returns a FakeClock reading start.
func NewFakeClock(start time.Time) *FakeClock { return simclock.NewFakeClock(start) }

//go:build !linux

package agent

import "time"

// hostSystem is the guest's own system where the agent has no way to
// step the clock or reseed (Windows guests take their time from the
// hypervisor's time service): freshen goes on without it.
type hostSystem struct{}

func (hostSystem) SetClock(time.Time) error { return errNotSupported }

func (hostSystem) AddEntropy([]byte) error { return errNotSupported }

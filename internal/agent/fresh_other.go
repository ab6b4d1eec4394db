//go:build !linux

package agent

import (
	"context"
	"time"
)

// hostSystem is the guest's own system where the agent has no way to
// step the clock, reseed or renew leases (Windows guests take their time
// from the hypervisor's time service): freshen goes on without it.
type hostSystem struct{}

func (hostSystem) SetClock(time.Time) error { return errNotSupported }

func (hostSystem) AddEntropy([]byte) error { return errNotSupported }

func (hostSystem) RenewLeases(context.Context) ([]string, error) { return nil, errNotSupported }

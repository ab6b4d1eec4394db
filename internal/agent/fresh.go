package agent

import (
	"errors"
	"log/slog"
	"time"

	"github.com/hyperfleet/hyperfleet/internal/agentconfig"
)

// GuestSystem is what freshen changes in the guest: its clock and its
// random number generator. The host's (hostSystem) in a real VM; tests and
// the simulators' guests, which share one host (Options.Root set), must
// leave the host's alone.
type GuestSystem interface {
	// SetClock steps the system clock to t.
	SetClock(t time.Time) error
	// AddEntropy mixes seed into the kernel's entropy pool and makes its
	// random number generator reseed from it before it returns.
	AddEntropy(seed []byte) error
}

// errNotSupported is a GuestSystem's answer where the guest's OS has no
// such call.
var errNotSupported = errors.New("not supported on this operating system")

// sharedHost is the GuestSystem of an agent that shares its host
// (Options.Root set): it changes nothing and says so.
type sharedHost struct{ log *slog.Logger }

func (s sharedHost) SetClock(t time.Time) error {
	s.log.Info("not stepping the clock of a shared host (Options.Root is set)", "to", t)
	return nil
}

func (s sharedHost) AddEntropy([]byte) error {
	s.log.Info("not reseeding the random number generator of a shared host (Options.Root is set)")
	return nil
}

// guestSystem is the GuestSystem of o: its own, the host's in a real VM,
// or sharedHost when the agent shares its host.
func guestSystem(o *Options) GuestSystem {
	switch {
	case o.System != nil:
		return o.System
	case o.Root != "":
		return sharedHost{log: o.Logger}
	}
	return hostSystem{}
}

// freshen makes the guest fresh from f before any secret that came with it
// is used (agentconfig.Freshness): the entropy first, so that nothing drawn
// from the kernel after this can be foretold from a saved memory image,
// then the clock, stepped when it is further than agentconfig.MaxClockSkew
// from the operator's. The operator's clock now is f.Time plus the time
// since the document was written (sinceWritten, measured on the guest's
// own clock from the file's modification time: a difference of two
// readings of one clock, right however far off that clock is): the agent
// may read the document seconds after it was written (its poll, a guest
// busy after its resume), and stepping to f.Time alone would set the
// clock back by that long. A document without f (an operator from before
// Freshness) changes nothing. Failing either is failing the delivery: a
// resumed guest must not use a credential with a foreseeable random state
// or a clock hours behind.
func freshen(log *slog.Logger, sys GuestSystem, f *agentconfig.Freshness, sinceWritten time.Duration, code int) error {
	if f == nil {
		return nil
	}
	if err := sys.AddEntropy(f.Entropy); err != nil && !errors.Is(err, errNotSupported) {
		return fail(code, "reseed the random number generator with the operator's entropy: %v", err)
	}
	operatorNow := f.Time.Add(max(sinceWritten, 0))
	skew := time.Until(operatorNow)
	if skew.Abs() <= agentconfig.MaxClockSkew {
		return nil
	}
	switch err := sys.SetClock(operatorNow); {
	case errors.Is(err, errNotSupported):
		log.Warn("the clock is off from the operator's, and this system gives the agent no way to step it", "by", skew.Round(time.Millisecond))
		return nil
	case err != nil:
		return fail(code, "step the clock by %s to the operator's %s: %v", skew.Round(time.Millisecond), operatorNow.UTC().Format(time.RFC3339Nano), err)
	}
	log.Info("clock stepped to the operator's (the guest was suspended, or its clock is off)", "by", skew.Round(time.Millisecond),
		"documentWrittenAgo", sinceWritten.Round(time.Millisecond))
	return nil
}

// systemOr is sys, or for a source built without the agent's settings
// (nil) one that changes nothing.
func systemOr(sys GuestSystem, log *slog.Logger) GuestSystem {
	if sys == nil {
		return sharedHost{log: log}
	}
	return sys
}

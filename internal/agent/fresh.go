package agent

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"time"

	"github.com/hyperfleet/hyperfleet/internal/agentconfig"
)

// GuestSystem is what freshen changes in the guest: its clock, its
// random number generator and its DHCP leases. The host's (hostSystem) in
// a real VM; tests and the simulators' guests, which share one host
// (Options.Root set), must leave the host's alone.
type GuestSystem interface {
	// SetClock steps the system clock to t.
	SetClock(t time.Time) error
	// AddEntropy mixes seed into the kernel's entropy pool and makes its
	// random number generator reseed from it before it returns.
	AddEntropy(seed []byte) error
	// RenewLeases has the DHCP client of each interface configured by
	// DHCP renew its lease, and returns those interfaces (none when every
	// address is static).
	RenewLeases(ctx context.Context) ([]string, error)
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

func (s sharedHost) RenewLeases(context.Context) ([]string, error) {
	s.log.Info("not renewing the DHCP leases of a shared host (Options.Root is set)")
	return nil, nil
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
// from the kernel after this can be foretold from a saved memory image;
// then, when the guest was resumed, its clock and its DHCP leases. A
// document without f (an operator from before Freshness) changes nothing.
// Failing any is failing the delivery: a resumed guest must not use a
// credential with a foreseeable random state, a clock hours behind, or an
// address whose lease may have lapsed while it was suspended.
//
// The operator's clock now is f.Time plus the time since the document was
// written (sinceWritten, measured on the guest's own clock from the file's
// modification time: a difference of two readings of one clock, right
// however far off that clock is): the agent may read the document seconds
// after it was written (its poll, a guest busy after its resume), and
// stepping to f.Time alone would set a right clock back by that long.
//
// Resumed is what the operator says (f.Resumed: it resumed the VM from
// the standby tier), or the guest's clock further than
// agentconfig.MaxClockSkew from the operator's, before the step. A
// suspend to disk may stop every clock of the guest at once (realtime,
// monotonic and boot time alike: the machine's clock sources are part of
// its saved state), so nothing inside the guest need show a jump after the
// resume; and it may not (under QEMU's TCG a restored guest's TSC went on
// with the host's, its clock right), so the clock alone does not tell. A
// guest whose clock was off for another reason renews its leases too,
// which costs one DHCP exchange and keeps its addresses when the server
// agrees.
func freshen(ctx context.Context, log *slog.Logger, sys GuestSystem, f *agentconfig.Freshness, sinceWritten time.Duration, code int) error {
	if f == nil {
		return nil
	}
	switch err := sys.AddEntropy(f.Entropy); {
	case errors.Is(err, errNotSupported):
		// Windows: its own generator, which the agent cannot reach.
	case err != nil:
		return fail(code, "reseed the random number generator with the operator's entropy: %v", err)
	default:
		log.Info("random number generator reseeded with the operator's entropy, before any secret is used")
	}
	operatorNow := f.Time.Add(max(sinceWritten, 0))
	skew := time.Until(operatorNow)
	offClock := skew.Abs() > agentconfig.MaxClockSkew
	if !offClock && !f.Resumed {
		return nil
	}
	if offClock {
		switch err := sys.SetClock(operatorNow); {
		case errors.Is(err, errNotSupported):
			log.Warn("the clock is off from the operator's, and this system gives the agent no way to step it", "by", skew.Round(time.Millisecond))
		case err != nil:
			return fail(code, "step the clock by %s to the operator's %s: %v", skew.Round(time.Millisecond), operatorNow.UTC().Format(time.RFC3339Nano), err)
		default:
			log.Info("clock stepped to the operator's (the guest was suspended, or its clock is off)", "by", skew.Round(time.Millisecond),
				"documentWrittenAgo", sinceWritten.Round(time.Millisecond))
		}
	}
	switch renewed, err := sys.RenewLeases(ctx); {
	case errors.Is(err, errNotSupported):
		log.Warn("the guest was resumed, and this system gives the agent no way to renew its DHCP leases")
	case err != nil:
		return fail(code, "renew the DHCP leases after the resume: %v", err)
	case len(renewed) == 0:
		log.Info("the guest was resumed; no interface holds a DHCP lease the agent can renew (static addresses keep theirs)")
	default:
		log.Info("DHCP leases renewed after the resume", "interfaces", strings.Join(renewed, ","))
	}
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

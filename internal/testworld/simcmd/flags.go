package simcmd

import (
	"flag"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/hyperfleet/hyperfleet/internal/testworld/simulator/simclock"
)

// Main runs a simulator command: run's error, prefixed with the command's
// name, goes to stderr and the process exits 1.
func Main(name string, run func() error) {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, name+":", err)
		os.Exit(1)
	}
}

// Flags are the flags every simulator command takes.
type Flags struct {
	// Listen is the address to listen on (--listen).
	Listen string
	// Config is the file describing the simulated world (--config).
	Config string
	// Admin enables the admin API under /_sim/ (--admin).
	Admin bool
	// Insecure serves plain HTTP (--insecure-http).
	Insecure bool
	// CAOut is where the CA's PEM is written (--ca-out); only the
	// commands that call DefineCAOut take it.
	CAOut string
	// FakeClock runs the simulator on a manually advanced clock
	// (--fake-clock); only the commands that call DefineFakeClock take it.
	FakeClock bool
}

// Define defines the common flags on the command line: listen is
// --listen's default, config and admin say what --config holds and what
// --admin offers in this simulator.
func (f *Flags) Define(listen, config, admin string) {
	flag.StringVar(&f.Listen, "listen", listen, "address to listen on")
	flag.StringVar(&f.Config, "config", "", config)
	flag.BoolVar(&f.Admin, "admin", false, "enable the /_sim/ admin API ("+admin+"); it answers loopback clients only")
	flag.BoolVar(&f.Insecure, "insecure-http", false, "serve plain HTTP instead of HTTPS")
}

// DefineCAOut defines --ca-out, for the commands that serve with Listen's
// throw-away CA.
func (f *Flags) DefineCAOut() {
	flag.StringVar(&f.CAOut, "ca-out", "", "write the CA certificate (PEM) that signs the server certificate to this file")
}

// AdminAPI says whether the admin API is on, for the line a command prints
// when it listens.
func (f *Flags) AdminAPI() string {
	if f.Admin {
		return "enabled under /_sim/"
	}
	return "disabled"
}

// DefineFakeClock defines --fake-clock, for the commands whose simulator
// can run on a simclock.FakeClock (see ClockOption).
func (f *Flags) DefineFakeClock() {
	flag.BoolVar(&f.FakeClock, "fake-clock", false, "run on a manually advanced clock (POST /_sim/clock/advance?by=5s)")
}

// ClockOption is the option, made with the simulator's WithClock, that
// puts it on a fake clock starting now when --fake-clock is set; none
// otherwise (the simulator's real clock).
func ClockOption[O any](f *Flags, withClock func(simclock.Clock) O) []O {
	if !f.FakeClock {
		return nil
	}
	return []O{withClock(simclock.NewFakeClock(time.Now()))}
}

// World is the simulated world a command serves: def's without --config,
// else what load reads from the --config file.
func World[C any](f *Flags, def func() C, load func(path string) (C, error)) (C, error) {
	if f.Config == "" {
		return def(), nil
	}
	return load(f.Config)
}

// Decode is World's load for a simulator whose configuration is a plain
// document: the file decoded with unmarshal into a zero C.
func Decode[C any](unmarshal func([]byte, any) error) func(path string) (C, error) {
	return func(path string) (C, error) {
		var c C
		raw, err := os.ReadFile(path)
		if err != nil {
			return c, fmt.Errorf("read config: %w", err)
		}
		if err := unmarshal(raw, &c); err != nil {
			return c, fmt.Errorf("config %s: %w", path, err)
		}
		return c, nil
	}
}

// Logger is the simulators' log: text on stderr.
func Logger() *slog.Logger { return slog.New(slog.NewTextHandler(os.Stderr, nil)) }

package simcmd

import (
	"flag"
	"fmt"
	"os"
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

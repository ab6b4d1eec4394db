package rfc2136_test

import (
	"testing"

	"github.com/miekg/dns"

	"github.com/hyperfleet/hyperfleet/internal/testworld/dnsserver"
)

// The zones and keys of the test servers (internal/testworld/dnsserver).
const (
	fwdZone = dnsserver.FwdZone
	v4Zone  = dnsserver.V4Zone
	v6Zone  = dnsserver.V6Zone
)

var (
	updateKey   = dnsserver.UpdateKey
	readonlyKey = dnsserver.ReadonlyKey
)

type (
	key    = dnsserver.Key
	server = dnsserver.Server
)

func startBIND(t *testing.T) *server { return dnsserver.StartBIND(t, dnsserver.Options{}) }

// startBINDPolicy is startBIND with an update-policy that grants
// updateKey only the types HyperFleet writes.
func startBINDPolicy(t *testing.T) *server {
	return dnsserver.StartBIND(t, dnsserver.Options{Policy: true})
}

func startKnot(t *testing.T) *server { return dnsserver.StartKnot(t, dnsserver.Options{}) }

// lookup and add are s.Lookup and s.Add for the contract's harness.
func lookup(s *server) func(*testing.T, string, uint16) []dns.RR {
	return func(t *testing.T, name string, qtype uint16) []dns.RR { return s.Lookup(t, name, qtype) }
}

func add(s *server) func(*testing.T, string) {
	return func(t *testing.T, rr string) { s.Add(t, rr) }
}

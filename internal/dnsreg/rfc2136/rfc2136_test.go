package rfc2136_test

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/hyperfleet/hyperfleet/internal/dnsreg"
	"github.com/hyperfleet/hyperfleet/internal/dnsreg/rfc2136"
	"github.com/hyperfleet/hyperfleet/internal/testworld/dnsregtest"
	"github.com/hyperfleet/hyperfleet/pkg/errclass"
)

// servers are the DNS servers every test runs against.
var servers = []struct {
	name  string
	start func(*testing.T) *server
}{
	{"bind", startBIND},
	{"knot", startKnot},
}

func config(s *server, k key) rfc2136.Config {
	return rfc2136.Config{
		Server:       s.Addr,
		Timeout:      2 * time.Second,
		Key:          rfc2136.TSIGKey{Name: k.Name, Secret: k.Secret},
		Zone:         fwdZone,
		ReverseZones: []string{v4Zone, v6Zone},
	}
}

func newRegistrar(t *testing.T, cfg rfc2136.Config) *rfc2136.Registrar {
	t.Helper()
	r, err := rfc2136.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func TestContract(t *testing.T) {
	for _, srv := range append(servers, struct {
		name  string
		start func(*testing.T) *server
	}{"bind-update-policy", startBINDPolicy}) {
		t.Run(srv.name, func(t *testing.T) {
			s := srv.start(t)
			dnsregtest.Run(t, dnsregtest.Harness{
				Zone:    fwdZone,
				New:     func(t *testing.T) dnsreg.Registrar { return newRegistrar(t, config(s, updateKey)) },
				Lookup:  lookup(s),
				Add:     add(s),
				Markers: true,
			})
		})
	}
}

// TestServerErrors checks what the operator is told when the server
// refuses: each message names the part of the set-up to fix.
func TestServerErrors(t *testing.T) {
	ctx := context.Background()
	rec := dnsreg.Record{Name: "vm-err." + fwdZone, Addrs: []netip.Addr{netip.MustParseAddr("192.0.2.200")}, Owner: dnsreg.Owner{Claim: "c", Install: "op-1"}}
	for _, srv := range servers {
		t.Run(srv.name, func(t *testing.T) {
			s := srv.start(t)
			check := func(t *testing.T, err error, want ...string) {
				t.Helper()
				t.Log(err)
				if !errors.Is(err, dnsreg.ErrRefused) || errclass.Classify(err) != errclass.ClassConfiguration {
					t.Fatalf("error %v: want ErrRefused, a Configuration error", err)
				}
				for _, w := range want {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("error %q does not say %q", err, w)
					}
				}
			}
			t.Run("WrongSecret", func(t *testing.T) {
				cfg := config(s, updateKey)
				cfg.Key.Secret = readonlyKey.Secret
				err := newRegistrar(t, cfg).Register(ctx, rec)
				check(t, err, "BADSIG", "secret of TSIG key hf-update.", fwdZone)
			})
			t.Run("UnknownKey", func(t *testing.T) {
				cfg := config(s, key{Name: "hf-nobody.", Secret: updateKey.Secret})
				err := newRegistrar(t, cfg).Register(ctx, rec)
				check(t, err, "BADKEY", "hf-nobody.", "key name and algorithm")
			})
			t.Run("WrongAlgorithm", func(t *testing.T) {
				cfg := config(s, updateKey)
				cfg.Key.Algorithm = "hmac-sha512"
				err := newRegistrar(t, cfg).Register(ctx, rec)
				check(t, err, "hmac-sha512")
			})
			t.Run("KeyNotAllowedToUpdate", func(t *testing.T) {
				err := newRegistrar(t, config(s, readonlyKey)).Register(ctx, rec)
				if srv.name == "knot" {
					// Knot rejects a key no acl of the zone names as
					// unknown.
					check(t, err, "BADKEY", "hf-readonly.", "Knot: an acl with the key and action update")
					return
				}
				check(t, err, "REFUSED", "update policy", "hf-readonly.")
			})
			t.Run("KeyNotAllowedToTransfer", func(t *testing.T) {
				_, err := newRegistrar(t, config(s, readonlyKey)).List(ctx, dnsreg.Owner{Install: "op-1"})
				check(t, err, "zone transfer", "allow-transfer")
			})
			t.Run("ZoneNotServed", func(t *testing.T) {
				cfg := config(s, updateKey)
				cfg.Zone = "other.test."
				err := newRegistrar(t, cfg).Register(ctx, dnsreg.Record{Name: "vm.other.test", Addrs: rec.Addrs, Owner: rec.Owner})
				if err == nil || errclass.Classify(err) != errclass.ClassConfiguration || !strings.Contains(err.Error(), "other.test.") {
					t.Fatalf("Register in a zone the server does not serve: %v, want a Configuration error naming the zone", err)
				}
			})
			t.Run("UDP", func(t *testing.T) {
				cfg := config(s, updateKey)
				cfg.Transport = rfc2136.UDP
				r := newRegistrar(t, cfg)
				udp := dnsreg.Record{Name: "vm-udp." + fwdZone, Addrs: []netip.Addr{netip.MustParseAddr("192.0.2.201")}, Owner: rec.Owner}
				if err := r.Register(ctx, udp); err != nil {
					t.Fatal(err)
				}
				if got := s.Lookup(t, udp.Name, dns.TypeA); len(got) != 1 {
					t.Fatalf("A of %s over UDP registration = %v", udp.Name, got)
				}
				if err := r.Remove(ctx, udp); err != nil {
					t.Fatal(err)
				}
			})
		})
	}
}

// TestUnreachableServerTimesOut: a server that takes the request and
// never answers costs one timeout, not a hang, over either transport; a
// closed port fails at once. All are transient.
func TestUnreachableServerTimesOut(t *testing.T) {
	silentTCP, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = silentTCP.Close() })
	go func() {
		for {
			c, err := silentTCP.Accept()
			if err != nil {
				return
			}
			t.Cleanup(func() { _ = c.Close() })
		}
	}()
	silentUDP, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = silentUDP.Close() })
	closed, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closedAddr := closed.Addr().String()
	_ = closed.Close()

	for _, c := range []struct {
		name, transport, server, want string
	}{
		{"SilentTCP", rfc2136.TCP, silentTCP.Addr().String(), "no answer from DNS server " + silentTCP.Addr().String() + " over tcp within 300ms"},
		{"SilentUDP", rfc2136.UDP, silentUDP.LocalAddr().String(), "no answer from DNS server " + silentUDP.LocalAddr().String() + " over udp within 300ms"},
		{"ClosedPort", rfc2136.TCP, closedAddr, "connection refused"},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := newRegistrar(t, rfc2136.Config{
				Server:    c.server,
				Transport: c.transport,
				Timeout:   300 * time.Millisecond,
				Key:       rfc2136.TSIGKey{Name: updateKey.Name, Secret: updateKey.Secret},
				Zone:      fwdZone,
			})
			start := time.Now()
			err := r.Register(context.Background(), dnsreg.Record{Name: "vm." + fwdZone, Addrs: []netip.Addr{netip.MustParseAddr("192.0.2.1")}, Owner: dnsreg.Owner{Claim: "c", Install: "i"}})
			took := time.Since(start)
			if err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), "vm."+fwdZone) {
				t.Fatalf("Register: %v, want an error naming the record and saying %q", err, c.want)
			}
			if errclass.Classify(err) != errclass.ClassTransient {
				t.Errorf("classified %s, want Transient", errclass.Classify(err))
			}
			if took > 2*time.Second {
				t.Errorf("Register took %s with a 300ms timeout", took)
			}
		})
	}
}

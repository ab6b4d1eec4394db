// Package dnsserver starts real DNS servers for tests: BIND's named and
// Knot's knotd, on a free loopback port, each with a forward zone and
// reverse zones that a TSIG key may update and transfer, the way
// docs/networking.md ("DNS registration (rfc2136)") asks an operator to set
// up theirs. The DNS registration library (internal/dnsreg/rfc2136) runs
// its contract against both; the controller tests register VMs on a BIND.
//
// The servers come from Debian's packages bind9 and knot, which
// hack/test-deps.sh installs; a test that needs one fails, never skips,
// when it is missing.
package dnsserver

import (
	"bytes"
	"context"
	"encoding/base64"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// The zones a server holds unless Options say otherwise: a forward zone and
// the reverse zones of the documentation prefixes 192.0.2.0/24 and
// 2001:db8::/32.
const (
	FwdZone = "ci.example.test."
	V4Zone  = "2.0.192.in-addr.arpa."
	V6Zone  = "8.b.d.0.1.0.0.2.ip6.arpa."
)

// Keys the servers know: UpdateKey may update and transfer every zone;
// ReadonlyKey is known but allowed nothing. Both are HMAC-SHA256.
var (
	UpdateKey   = Key{Name: "hf-update.", Secret: base64.StdEncoding.EncodeToString([]byte("hyperfleet-test-update-secret-32b"))}
	ReadonlyKey = Key{Name: "hf-readonly.", Secret: base64.StdEncoding.EncodeToString([]byte("hyperfleet-test-readonly-secret!"))}
)

// Key is a TSIG key: its name (fully qualified) and its secret in base64.
type Key struct{ Name, Secret string }

// Clause is the key as BIND's key clause, the form tsig-keygen prints and
// a Secret's tsigKey may hold.
func (k Key) Clause() string {
	return fmt.Sprintf("key %q {\n\talgorithm hmac-sha256;\n\tsecret %q;\n};\n", strings.TrimSuffix(k.Name, "."), k.Secret)
}

// Options say what a server holds.
type Options struct {
	// Zones are the zones it serves, the forward zone first (its SOA and
	// NS name the others'); nil means FwdZone, V4Zone and V6Zone.
	Zones []string
	// Policy (BIND only) grants UpdateKey, with an update-policy instead
	// of allow-update, only the types HyperFleet writes, as
	// docs/networking.md suggests.
	Policy bool
	// Listen (BIND only), when set, is the address the server listens on
	// at the standard port 53, instead of a free port on 127.0.0.1: where
	// the operator looks for the resolvers of spec.dns.servers, which are
	// addresses without a port. Give an address no other test uses.
	Listen netip.Addr
}

func (o Options) zones() []string {
	if len(o.Zones) == 0 {
		return []string{FwdZone, V4Zone, V6Zone}
	}
	out := make([]string, len(o.Zones))
	for i, z := range o.Zones {
		out[i] = dns.Fqdn(strings.ToLower(z))
	}
	return out
}

// Server is a DNS server started for a test; it stops at the test's end.
type Server struct {
	// Kind is named or knotd.
	Kind string
	// Addr is where it listens, over TCP and UDP: 127.0.0.1:port.
	Addr  string
	zones []string
}

// binary finds a server program, failing (never skipping) when it is not
// installed.
func binary(t testing.TB, prog, pkg string) string {
	t.Helper()
	if p, err := exec.LookPath(prog); err == nil {
		return p
	}
	p := "/usr/sbin/" + prog
	if _, err := os.Stat(p); err == nil {
		return p
	}
	t.Fatalf("%s (Debian package %s) is not installed: run hack/test-deps.sh (make test-deps)", prog, pkg)
	return ""
}

// FreePort returns a port that is free for both TCP and UDP on loopback
// at the time of the call (nothing listens there: a DNS server that is
// down).
func FreePort(t testing.TB) int {
	t.Helper()
	for range 20 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		port := l.Addr().(*net.TCPAddr).Port
		u, err := net.ListenPacket("udp", "127.0.0.1:"+strconv.Itoa(port))
		_ = l.Close()
		if err == nil {
			_ = u.Close()
			return port
		}
	}
	t.Fatal("no free port for TCP and UDP on 127.0.0.1")
	return 0
}

func zoneFile(zone, fwd string) string {
	return fmt.Sprintf(`$TTL 300
@ IN SOA ns.%[1]s hostmaster.%[1]s 1 3600 600 86400 60
@ IN NS ns.%[1]s
`, fwd) + map[bool]string{true: "ns IN A 127.0.0.1\n", false: ""}[zone == fwd]
}

// logBuffer collects a server's output for failure messages.
type logBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// run starts cmd in the foreground, stops it at the end of the test, and
// waits until it answers SOA queries for every zone over TCP and UDP.
func run(t testing.TB, kind, addr string, zones []string, cmd *exec.Cmd) *Server {
	t.Helper()
	out := &logBuffer{}
	cmd.Stdout, cmd.Stderr = out, out
	// Killed with the test binary if it dies without its cleanups.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", kind, err)
	}
	done := make(chan struct{})
	var waitErr error
	go func() { waitErr = cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
		if t.Failed() {
			t.Logf("%s output:\n%s", kind, out)
		}
	})
	deadline := time.Now().Add(20 * time.Second)
	for _, zone := range zones {
		for _, network := range []string{"tcp", "udp"} {
			for {
				select {
				case <-done:
					t.Fatalf("%s exited before it served: %v\n%s", kind, waitErr, out)
				default:
				}
				m := new(dns.Msg)
				m.SetQuestion(zone, dns.TypeSOA)
				c := &dns.Client{Net: network, Timeout: 500 * time.Millisecond}
				r, _, err := c.Exchange(m, addr)
				if err == nil && r.Rcode == dns.RcodeSuccess && len(r.Answer) == 1 {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("%s does not serve %s over %s at %s (last: %v, %v)\n%s", kind, zone, network, addr, r, err, out)
				}
				time.Sleep(50 * time.Millisecond)
			}
		}
	}
	return &Server{Kind: kind, Addr: addr, zones: zones}
}

// StartBIND runs named with the zones of opts, updatable (allow-update,
// or the update-policy of opts.Policy) and transferable with UpdateKey.
func StartBIND(t testing.TB, opts Options) *Server {
	t.Helper()
	named := binary(t, "named", "bind9")
	zones := opts.zones()
	fwd := zones[0]
	policy := opts.Policy
	dir := t.TempDir()
	host, port := "127.0.0.1", 53
	if opts.Listen.IsValid() {
		host = opts.Listen.String()
	} else {
		port = FreePort(t)
	}
	var conf strings.Builder
	fmt.Fprintf(&conf, `options {
	directory %q;
	pid-file %q;
	session-keyfile %q;
	managed-keys-directory %q;
	listen-on port %d { %s; };
	listen-on-v6 { none; };
	recursion no;
	dnssec-validation no;
	notify no;
};
controls { };
`, dir, filepath.Join(dir, "named.pid"), filepath.Join(dir, "session.key"), dir, port, host)
	for _, k := range []Key{UpdateKey, ReadonlyKey} {
		fmt.Fprintf(&conf, "key %q { algorithm hmac-sha256; secret %q; };\n", strings.TrimSuffix(k.Name, "."), k.Secret)
	}
	for i, zone := range zones {
		file := filepath.Join(dir, fmt.Sprintf("zone%d.db", i))
		if err := os.WriteFile(file, []byte(zoneFile(zone, fwd)), 0o644); err != nil {
			t.Fatal(err)
		}
		keyName := strings.TrimSuffix(UpdateKey.Name, ".")
		update := fmt.Sprintf("allow-update { key %q; };", keyName)
		if policy {
			types := "PTR TXT"
			if zone == fwd {
				types = "A AAAA TXT"
			}
			update = fmt.Sprintf("update-policy { grant %s subdomain %s %s; };", keyName, zone, types)
		}
		fmt.Fprintf(&conf, `zone %q {
	type primary;
	file %q;
	%s
	allow-transfer { key %q; };
};
`, strings.TrimSuffix(zone, "."), file, update, keyName)
	}
	confPath := filepath.Join(dir, "named.conf")
	if err := os.WriteFile(confPath, []byte(conf.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	addr := net.JoinHostPort(host, strconv.Itoa(port))
	// -g: foreground, log to stderr; -4: IPv4 only. Root is fine here:
	// without -u named keeps the user it was started as.
	return run(t, "named", addr, zones, exec.Command(named, "-g", "-4", "-c", confPath))
}

// StartKnot runs knotd with the zones of opts; an ACL lets UpdateKey
// update and transfer them.
func StartKnot(t testing.TB, opts Options) *Server {
	t.Helper()
	knotd := binary(t, "knotd", "knot")
	zones := opts.zones()
	dir := t.TempDir()
	if err := os.Mkdir(filepath.Join(dir, "db"), 0o755); err != nil {
		t.Fatal(err)
	}
	port := FreePort(t)
	var conf strings.Builder
	fmt.Fprintf(&conf, `server:
    rundir: %q
    listen: 127.0.0.1@%d
log:
  - target: stderr
    any: info
database:
    storage: %q
key:
`, dir, port, filepath.Join(dir, "db"))
	for _, k := range []Key{UpdateKey, ReadonlyKey} {
		fmt.Fprintf(&conf, "  - id: %s\n    algorithm: hmac-sha256\n    secret: %s\n", strings.TrimSuffix(k.Name, "."), k.Secret)
	}
	fmt.Fprintf(&conf, `acl:
  - id: hyperfleet
    key: %s
    action: [update, transfer]
template:
  - id: default
    storage: %q
    acl: hyperfleet
    zonefile-sync: -1
    journal-content: changes
zone:
`, strings.TrimSuffix(UpdateKey.Name, "."), dir)
	for i, zone := range zones {
		file := fmt.Sprintf("zone%d.db", i)
		if err := os.WriteFile(filepath.Join(dir, file), []byte(zoneFile(zone, zones[0])), 0o644); err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(&conf, "  - domain: %s\n    file: %s\n", zone, file)
	}
	confPath := filepath.Join(dir, "knot.conf")
	if err := os.WriteFile(confPath, []byte(conf.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	return run(t, "knotd", addr, zones, exec.Command(knotd, "-c", confPath))
}

// Lookup asks s for name's records of type qtype, over TCP, without
// recursion.
func (s *Server) Lookup(t testing.TB, name string, qtype uint16) []dns.RR {
	t.Helper()
	m := new(dns.Msg)
	m.SetQuestion(dns.Fqdn(name), qtype)
	m.RecursionDesired = false
	c := &dns.Client{Net: "tcp", Timeout: 2 * time.Second}
	r, _, err := c.ExchangeContext(context.Background(), m, s.Addr)
	if err != nil {
		t.Fatalf("query %s %s at %s: %v", name, dns.TypeToString[qtype], s.Kind, err)
	}
	if r.Rcode != dns.RcodeSuccess && r.Rcode != dns.RcodeNameError {
		t.Fatalf("query %s %s at %s: %s", name, dns.TypeToString[qtype], s.Kind, dns.RcodeToString[r.Rcode])
	}
	var rrs []dns.RR
	for _, rr := range r.Answer {
		if rr.Header().Rrtype == qtype {
			rrs = append(rrs, rr)
		}
	}
	return rrs
}

// Add inserts a record, given in zone-file syntax, unconditionally,
// signed with UpdateKey, as a tool other than HyperFleet would.
func (s *Server) Add(t testing.TB, text string) {
	t.Helper()
	rr, err := dns.NewRR(text)
	if err != nil {
		t.Fatal(err)
	}
	zone := s.zones[0]
	for _, z := range s.zones {
		if dns.IsSubDomain(z, rr.Header().Name) {
			zone = z
		}
	}
	m := new(dns.Msg)
	m.SetUpdate(zone)
	m.Insert([]dns.RR{rr})
	m.SetTsig(UpdateKey.Name, dns.HmacSHA256, 300, time.Now().Unix())
	c := &dns.Client{Net: "tcp", Timeout: 2 * time.Second, TsigSecret: map[string]string{UpdateKey.Name: UpdateKey.Secret}}
	r, _, err := c.Exchange(m, s.Addr)
	if err != nil || r.Rcode != dns.RcodeSuccess {
		t.Fatalf("add %s at %s: %v %v", text, s.Kind, r, err)
	}
}

package rfc2136_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"fmt"
	"net"
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

// The zones every test server holds.
const (
	fwdZone = "ci.example.test."
	v4Zone  = "2.0.192.in-addr.arpa."
	v6Zone  = "8.b.d.0.1.0.0.2.ip6.arpa."
)

var zones = []string{fwdZone, v4Zone, v6Zone}

// Keys the servers know: update may update and transfer every zone;
// readonly is known but allowed nothing.
var (
	updateKey   = key{name: "hf-update.", secret: base64.StdEncoding.EncodeToString([]byte("hyperfleet-test-update-secret-32b"))}
	readonlyKey = key{name: "hf-readonly.", secret: base64.StdEncoding.EncodeToString([]byte("hyperfleet-test-readonly-secret!"))}
)

type key struct{ name, secret string }

// server is a DNS server started for a test.
type server struct {
	kind string
	addr string // 127.0.0.1:port
}

// binary finds a server program, failing (never skipping) when it is not
// installed.
func binary(t *testing.T, prog, pkg string) string {
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

// freePort returns a port that is free for both TCP and UDP on loopback
// at the time of the call.
func freePort(t *testing.T) int {
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

func zoneFile(zone string) string {
	return fmt.Sprintf(`$TTL 300
@ IN SOA ns.%[1]s hostmaster.%[1]s 1 3600 600 86400 60
@ IN NS ns.%[1]s
`, fwdZone) + map[bool]string{true: "ns IN A 127.0.0.1\n", false: ""}[zone == fwdZone]
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
func run(t *testing.T, kind, addr string, cmd *exec.Cmd) *server {
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
	return &server{kind: kind, addr: addr}
}

// startBIND runs named with the three zones, updatable (allow-update)
// and transferable with updateKey.
func startBIND(t *testing.T) *server { return bind(t, false) }

// startBINDPolicy is startBIND with an update-policy that grants
// updateKey only the types HyperFleet writes, as docs/networking.md
// suggests.
func startBINDPolicy(t *testing.T) *server { return bind(t, true) }

func bind(t *testing.T, policy bool) *server {
	named := binary(t, "named", "bind9")
	dir := t.TempDir()
	port := freePort(t)
	var conf strings.Builder
	fmt.Fprintf(&conf, `options {
	directory %q;
	pid-file %q;
	session-keyfile %q;
	managed-keys-directory %q;
	listen-on port %d { 127.0.0.1; };
	listen-on-v6 { none; };
	recursion no;
	dnssec-validation no;
	notify no;
};
controls { };
`, dir, filepath.Join(dir, "named.pid"), filepath.Join(dir, "session.key"), dir, port)
	for _, k := range []key{updateKey, readonlyKey} {
		fmt.Fprintf(&conf, "key %q { algorithm hmac-sha256; secret %q; };\n", strings.TrimSuffix(k.name, "."), k.secret)
	}
	for i, zone := range zones {
		file := filepath.Join(dir, fmt.Sprintf("zone%d.db", i))
		if err := os.WriteFile(file, []byte(zoneFile(zone)), 0o644); err != nil {
			t.Fatal(err)
		}
		keyName := strings.TrimSuffix(updateKey.name, ".")
		update := fmt.Sprintf("allow-update { key %q; };", keyName)
		if policy {
			types := "PTR TXT"
			if zone == fwdZone {
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
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	// -g: foreground, log to stderr; -4: IPv4 only. Root is fine here:
	// without -u named keeps the user it was started as.
	return run(t, "named", addr, exec.Command(named, "-g", "-4", "-c", confPath))
}

// startKnot runs knotd with the three zones; an ACL lets updateKey
// update and transfer them.
func startKnot(t *testing.T) *server {
	knotd := binary(t, "knotd", "knot")
	dir := t.TempDir()
	if err := os.Mkdir(filepath.Join(dir, "db"), 0o755); err != nil {
		t.Fatal(err)
	}
	port := freePort(t)
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
	for _, k := range []key{updateKey, readonlyKey} {
		fmt.Fprintf(&conf, "  - id: %s\n    algorithm: hmac-sha256\n    secret: %s\n", strings.TrimSuffix(k.name, "."), k.secret)
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
`, strings.TrimSuffix(updateKey.name, "."), dir)
	for i, zone := range zones {
		file := fmt.Sprintf("zone%d.db", i)
		if err := os.WriteFile(filepath.Join(dir, file), []byte(zoneFile(zone)), 0o644); err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(&conf, "  - domain: %s\n    file: %s\n", zone, file)
	}
	confPath := filepath.Join(dir, "knot.conf")
	if err := os.WriteFile(confPath, []byte(conf.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	return run(t, "knotd", addr, exec.Command(knotd, "-c", confPath))
}

// lookup asks s for name's records of type qtype, over TCP, without
// recursion.
func (s *server) lookup(t *testing.T, name string, qtype uint16) []dns.RR {
	t.Helper()
	m := new(dns.Msg)
	m.SetQuestion(dns.Fqdn(name), qtype)
	m.RecursionDesired = false
	c := &dns.Client{Net: "tcp", Timeout: 2 * time.Second}
	r, _, err := c.ExchangeContext(context.Background(), m, s.addr)
	if err != nil {
		t.Fatalf("query %s %s at %s: %v", name, dns.TypeToString[qtype], s.kind, err)
	}
	if r.Rcode != dns.RcodeSuccess && r.Rcode != dns.RcodeNameError {
		t.Fatalf("query %s %s at %s: %s", name, dns.TypeToString[qtype], s.kind, dns.RcodeToString[r.Rcode])
	}
	var rrs []dns.RR
	for _, rr := range r.Answer {
		if rr.Header().Rrtype == qtype {
			rrs = append(rrs, rr)
		}
	}
	return rrs
}

// add inserts rr unconditionally, signed with updateKey, as a tool other
// than HyperFleet would.
func (s *server) add(t *testing.T, text string) {
	t.Helper()
	rr, err := dns.NewRR(text)
	if err != nil {
		t.Fatal(err)
	}
	zone := fwdZone
	for _, z := range zones {
		if dns.IsSubDomain(z, rr.Header().Name) {
			zone = z
		}
	}
	m := new(dns.Msg)
	m.SetUpdate(zone)
	m.Insert([]dns.RR{rr})
	m.SetTsig(updateKey.name, dns.HmacSHA256, 300, time.Now().Unix())
	c := &dns.Client{Net: "tcp", Timeout: 2 * time.Second, TsigSecret: map[string]string{updateKey.name: updateKey.secret}}
	r, _, err := c.Exchange(m, s.addr)
	if err != nil || r.Rcode != dns.RcodeSuccess {
		t.Fatalf("add %s at %s: %v %v", text, s.kind, r, err)
	}
}

// Package proxytest runs Debian's tinyproxy as the only way to a set of
// test servers, for the proxy tests of the operator's clients and the
// agent: tinyproxy and the servers live in a network namespace of their
// own (internal/testworld/netns), joined to the host by a veth pair; a
// firewall rule in the namespace resets every TCP connection from the host
// but those to tinyproxy's port, so a client that ignores its proxy
// settings fails at once ("connection refused") while tinyproxy, which
// reaches the servers over the namespace's loopback, gets through. Its
// log records every request, CONNECT included, which the tests read back.
// It needs root, ip (iproute2), nft (nftables) and tinyproxy
// (hack/test-deps.sh installs them). Nothing in the operator imports it.
package proxytest

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/hyperfleet/hyperfleet/internal/testworld/netns"
)

// Port is tinyproxy's port in the namespace (its own: nothing else
// listens there).
const Port = 3128

// Proxy is a running tinyproxy in front of its namespace's servers.
type Proxy struct {
	// URL is the proxy's URL, http://<namespace address>:3128, for
	// HTTP_PROXY, HTTPS_PROXY or a template's spec.network.proxy.
	URL string
	// Addr is the namespace's address, where Listen's servers are.
	Addr netip.Addr

	link *netns.Link
	log  string
}

// Start runs tinyproxy in a new namespace until the test ends. Each test
// process gets its own namespace and /30 (from its process id), so that
// packages running at once do not meet.
func Start(t testing.TB) *Proxy {
	t.Helper()
	bin, err := exec.LookPath("tinyproxy")
	if err != nil {
		t.Fatalf("tinyproxy is not installed (hack/test-deps.sh installs it): %v", err)
	}
	// 10.243.0.0/16 in /30s: 16384 networks (the chaos tests use
	// 10.242.0.0/30). The namespace's name is the network's index, so that
	// creating it claims the network: a process that meets one taken (by
	// another test process, or left by a killed one) takes the next.
	var link *netns.Link
	start := os.Getpid() % 16384
	for i := 0; link == nil; i++ {
		idx := (start + i) % 16384
		n := uint32(idx) * 4
		subnet := netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 243, byte(n >> 8), byte(n)}), 30)
		l, err := netns.Create(fmt.Sprintf("hfpx%d", idx), subnet)
		if err == nil {
			link = l
		} else if i == 16 {
			t.Fatalf("proxy namespace: %v", err)
		}
	}
	t.Cleanup(func() { _ = link.Close() })
	p := &Proxy{URL: fmt.Sprintf("http://%s:%d", link.NSAddr, Port), Addr: link.NSAddr, link: link}

	// Only tinyproxy's port answers the host; the namespace's own
	// connections (tinyproxy's, over lo) are not filtered.
	rules := fmt.Sprintf(`table inet hyperfleet_proxytest {
	chain input {
		type filter hook input priority 0; policy accept;
		iifname "vn-%s" tcp dport != %d reject with tcp reset
	}
}
`, link.Name, Port)
	nft := exec.Command("ip", "netns", "exec", link.Name, "nft", "-f", "-")
	nft.Stdin = strings.NewReader(rules)
	if out, err := nft.CombinedOutput(); err != nil {
		t.Fatalf("proxy namespace firewall (nft): %v: %s", err, out)
	}

	dir := t.TempDir()
	p.log = filepath.Join(dir, "tinyproxy.log")
	conf := filepath.Join(dir, "tinyproxy.conf")
	// No Allow: any client (the host's end only can reach it); no
	// ConnectPort: CONNECT to any port (the servers' ports are random); no
	// User: it stays the test's user (it warns), which can write its log
	// in the test's private directory.
	body := fmt.Sprintf("Port %d\nListen %s\nTimeout 30\nMaxClients 64\nLogFile %q\nLogLevel Info\n",
		Port, link.NSAddr, p.log)
	if err := os.WriteFile(conf, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cmd := exec.CommandContext(ctx, "ip", "netns", "exec", link.Name, bin, "-d", "-c", conf)
	var stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stderr, &stderr
	if err := cmd.Start(); err != nil {
		cancel()
		t.Fatalf("tinyproxy: %v", err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() { cancel(); <-exited })

	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", net.JoinHostPort(link.NSAddr.String(), fmt.Sprint(Port)), time.Second)
		if err == nil {
			_ = c.Close()
			break
		}
		select {
		case <-exited:
			t.Fatalf("tinyproxy exited: %s", stderr.String())
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("tinyproxy does not answer at %s: %v: %s", p.URL, err, stderr.String())
		}
	}
	return p
}

// Listen opens a TCP listener in the namespace: reachable through the
// proxy only.
func (p *Proxy) Listen(t testing.TB) net.Listener {
	t.Helper()
	ln, err := p.link.Listen("0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	return ln
}

// requestRE is tinyproxy's log line of a request: "Request (file
// descriptor 7): CONNECT 10.243.0.2:40123 HTTP/1.1".
var requestRE = regexp.MustCompile(`Request \(file descriptor \d+\): ([A-Z]+) (\S+) HTTP/`)

// Requests are the requests tinyproxy has logged so far, each "METHOD
// target" (CONNECT host:port, or GET with an absolute URL).
func (p *Proxy) Requests(t testing.TB) []string {
	t.Helper()
	f, err := os.Open(p.log)
	if err != nil {
		t.Fatalf("tinyproxy's log: %v", err)
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if m := requestRE.FindStringSubmatch(sc.Text()); m != nil {
			out = append(out, m[1]+" "+m[2])
		}
	}
	return out
}

// Proxied says whether tinyproxy has passed on a request for hostport
// (a CONNECT to it, or a plain request for a URL on it).
func (p *Proxy) Proxied(t testing.TB, hostport string) bool {
	t.Helper()
	for _, r := range p.Requests(t) {
		method, target, _ := strings.Cut(r, " ")
		if method == "CONNECT" && target == hostport || strings.Contains(target, "://"+hostport+"/") {
			return true
		}
	}
	return false
}

// CheckDirectRefused fails t unless a direct connection to addr (a
// server of the namespace) is refused: the proxy is the only way in.
func CheckDirectRefused(t testing.TB, addr string) {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err == nil {
		_ = c.Close()
		t.Fatalf("a direct connection to %s succeeded; the namespace's firewall should refuse it", addr)
	}
}

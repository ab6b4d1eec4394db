package netcheck

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"
	"golang.org/x/sys/unix"

	"github.com/hyperfleet/hyperfleet/internal/testworld/dnsserver"
	"github.com/hyperfleet/hyperfleet/internal/testworld/sshserver"
)

func addrs(s ...string) []netip.Addr {
	out := make([]netip.Addr, len(s))
	for i, a := range s {
		out[i] = netip.MustParseAddr(a)
	}
	return out
}

func timeout(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// TestLookupsAgainstBIND: forward and reverse lookups against a real BIND
// holding a VM's A, AAAA and PTR records pass only for exactly the VM's
// addresses and name, and a server that is down fails with no answer.
func TestLookupsAgainstBIND(t *testing.T) {
	srv := dnsserver.StartBIND(t, dnsserver.Options{})
	for _, rr := range []string{
		"vm-1.ci.example.test. 300 IN A 192.0.2.10",
		"vm-1.ci.example.test. 300 IN AAAA 2001:db8::10",
		"10.2.0.192.in-addr.arpa. 300 IN PTR vm-1.ci.example.test.",
		"11.2.0.192.in-addr.arpa. 300 IN PTR other.ci.example.test.",
	} {
		srv.Add(t, rr)
	}
	server := netip.MustParseAddrPort(srv.Addr)
	ctx := timeout(t, 30*time.Second)
	if err := Forward(ctx, server, "vm-1.ci.example.test", addrs("2001:db8::10", "192.0.2.10")); err != nil {
		t.Errorf("forward lookup of the VM's own addresses: %v", err)
	}
	for _, c := range []struct {
		name string
		want []netip.Addr
	}{
		{"vm-1.ci.example.test", addrs("192.0.2.10")},                               // an address too many in DNS
		{"vm-1.ci.example.test", addrs("192.0.2.10", "192.0.2.11", "2001:db8::10")}, // one missing
		{"vm-2.ci.example.test", addrs("192.0.2.12")},                               // no such name
	} {
		if err := Forward(ctx, server, c.name, c.want); !errors.Is(err, ErrMismatch) {
			t.Errorf("forward %s want %v: got %v, want a mismatch", c.name, c.want, err)
		}
	}
	if err := Reverse(ctx, server, netip.MustParseAddr("192.0.2.10"), "vm-1.ci.example.test"); err != nil {
		t.Errorf("reverse lookup of the VM's address: %v", err)
	}
	for _, a := range []string{"192.0.2.11", "192.0.2.12"} { // another name; no PTR
		err := Reverse(ctx, server, netip.MustParseAddr(a), "vm-1.ci.example.test")
		if !errors.Is(err, ErrMismatch) {
			t.Errorf("reverse %s: got %v, want a mismatch", a, err)
		}
	}
	down := netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), uint16(dnsserver.FreePort(t)))
	err := Forward(timeout(t, 3*time.Second), down, "vm-1.ci.example.test", addrs("192.0.2.10"))
	if err == nil || errors.Is(err, ErrMismatch) || !strings.Contains(err.Error(), "no answer") {
		t.Errorf("forward lookup at a server that is down: %v, want no answer", err)
	}
}

// TestPingLoopback: the kernel's own echo reply on loopback (IPv4 and
// IPv6) passes; an
// address nobody answers for fails when the context ends.
func TestPingLoopback(t *testing.T) {
	for _, a := range []string{"127.0.0.1", "::1"} {
		rtt, err := Ping(timeout(t, 5*time.Second), netip.MustParseAddr(a))
		if err != nil {
			t.Fatalf("ping %s: %v", a, err)
		}
		t.Logf("%s answered in %s", a, rtt)
	}
	// 192.0.2.0/24 (TEST-NET-1) is never routed to a host that answers.
	if _, err := Ping(timeout(t, 2500*time.Millisecond), netip.MustParseAddr("192.0.2.254")); err == nil || errors.Is(err, ErrNotPermitted) {
		t.Errorf("ping of an address without a host: %v, want no reply", err)
	}
}

// TestSSHHostKey: an SSH server (golang.org/x/crypto/ssh's) on loopback
// shows its host key; a TCP server that does not speak SSH, and a closed
// port, fail.
func TestSSHHostKey(t *testing.T) {
	srv, err := sshserver.New()
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	srv.Serve(ln)
	sshAddr := netip.MustParseAddrPort(ln.Addr().String())
	key, err := SSH(timeout(t, 5*time.Second), sshAddr)
	if err != nil {
		t.Fatalf("SSH host key: %v", err)
	}
	if want := ssh.FingerprintSHA256(srv.HostKey); key.Type != ssh.KeyAlgoED25519 || key.Fingerprint != want {
		t.Errorf("host key %+v, want %s %s", key, ssh.KeyAlgoED25519, want)
	}
	httpAddr := serve(t, func(c net.Conn) { _, _ = c.Write([]byte("HTTP/1.1 400 Bad Request\r\n\r\n")) })
	if _, err := SSH(timeout(t, 5*time.Second), httpAddr); err == nil {
		t.Error("a server that does not speak SSH passed")
	}
	closed := netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), uint16(dnsserver.FreePort(t)))
	if _, err := SSH(timeout(t, 5*time.Second), closed); err == nil {
		t.Error("a closed port passed")
	}
}

// serve accepts connections on a loopback port and hands each to handle,
// closing it afterwards, until the test ends.
func serve(t *testing.T, handle func(net.Conn)) netip.AddrPort {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer func() { _ = c.Close() }()
				_ = c.SetDeadline(time.Now().Add(10 * time.Second))
				handle(c)
			}()
		}
	}()
	return netip.MustParseAddrPort(ln.Addr().String())
}

// TestPingUnprivileged: in a network namespace whose
// net.ipv4.ping_group_range admits the test's group, Ping uses an
// unprivileged ICMP socket, the one an operator pod without CAP_NET_RAW
// gets, and its echo is answered; where the range admits no group the
// kernel refuses that socket and only a raw one (root here) is left.
func TestPingUnprivileged(t *testing.T) {
	name := fmt.Sprintf("hfping%d", os.Getpid()%100000)
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add: %v: %s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", name).Run() })
	for _, args := range [][]string{{"ip", "-n", name, "link", "set", "lo", "up"}} {
		if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
			t.Fatalf("%v: %v: %s", args, err, out)
		}
	}
	setRange := func(r string) {
		t.Helper()
		if out, err := exec.Command("ip", "netns", "exec", name, "sysctl", "-w", "net.ipv4.ping_group_range="+r).CombinedOutput(); err != nil {
			t.Fatalf("sysctl: %v: %s", err, out)
		}
	}
	gid := fmt.Sprint(os.Getgid())
	setRange(gid + " " + gid)
	inNamespace(t, name, func() {
		conn, raw, err := listenICMP(true)
		if err != nil {
			t.Errorf("ICMP socket with the group in ping_group_range: %v", err)
			return
		}
		_ = conn.Close()
		if raw {
			t.Error("a raw socket was opened though the group may open an unprivileged one")
		}
		if _, err := Ping(timeout(t, 5*time.Second), netip.MustParseAddr("127.0.0.1")); err != nil {
			t.Errorf("ping over an unprivileged socket: %v", err)
		}
	})
	setRange("1 0")
	inNamespace(t, name, func() {
		conn, raw, err := listenICMP(true)
		if err != nil {
			t.Errorf("ICMP socket as root: %v", err)
			return
		}
		_ = conn.Close()
		if !raw {
			t.Error("an unprivileged socket was opened though ping_group_range admits no group")
		}
	})
}

// inNamespace runs f on a thread in the network namespace name: the
// sockets f opens belong to it. f runs outside the test's goroutine, so it
// reports with t.Errorf, never t.Fatal.
func inNamespace(t *testing.T, name string, f func()) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		// The thread stays locked, and so exits with the goroutine rather
		// than serve others in the wrong namespace.
		runtime.LockOSThread()
		ns, err := os.Open("/run/netns/" + name)
		if err != nil {
			t.Errorf("open the namespace: %v", err)
			return
		}
		defer func() { _ = ns.Close() }()
		if err := unix.Setns(int(ns.Fd()), unix.CLONE_NEWNET); err != nil {
			t.Errorf("enter the namespace: %v", err)
			return
		}
		f()
	}()
	<-done
}

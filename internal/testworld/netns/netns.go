// Package netns gives tests a network namespace joined to the host by a
// veth pair: a server listening inside it (Listen) is reached by the
// process under test at an address of its own, and Cut drops every packet
// in the namespace, as a network partition does (connections hang, new
// ones get no answer), until Heal. It needs root, ip (iproute2) and nft
// (nftables). Nothing in the operator imports it.
package netns

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// partitionTable is the nftables table Cut adds inside the namespace.
const partitionTable = "hyperfleet_partition"

// Link is a network namespace joined to the host by a veth pair.
type Link struct {
	// Name is the namespace's name (ip netns).
	Name string
	// HostAddr is the host end's address, NSAddr the namespace end's.
	HostAddr, NSAddr netip.Addr
}

// Create makes the namespace name (at most 11 characters: the veth names
// derive from it) and a veth pair whose host end has the first address of
// subnet (an IPv4 /30 or larger) and whose namespace end has the second.
// Close it.
func Create(name string, subnet netip.Prefix) (*Link, error) {
	subnet = subnet.Masked()
	if !subnet.Addr().Is4() || subnet.Bits() > 30 {
		return nil, fmt.Errorf("netns: %s: want an IPv4 network of /30 or larger", subnet)
	}
	if len(name) > 11 {
		return nil, fmt.Errorf("netns: name %q is longer than 11 characters (interface names are at most 15)", name)
	}
	l := &Link{Name: name, HostAddr: subnet.Addr().Next(), NSAddr: subnet.Addr().Next().Next()}
	if err := run("ip", "netns", "add", name); err != nil {
		return nil, err
	}
	host, peer := "vh-"+name, "vn-"+name
	bits := fmt.Sprint(subnet.Bits())
	for _, args := range [][]string{
		{"ip", "link", "add", host, "type", "veth", "peer", "name", peer, "netns", name},
		{"ip", "addr", "add", l.HostAddr.String() + "/" + bits, "dev", host},
		{"ip", "link", "set", host, "up"},
		{"ip", "-n", name, "link", "set", "lo", "up"},
		{"ip", "-n", name, "addr", "add", l.NSAddr.String() + "/" + bits, "dev", peer},
		{"ip", "-n", name, "link", "set", peer, "up"},
	} {
		if err := run(args...); err != nil {
			_ = l.Close()
			return nil, err
		}
	}
	return l, nil
}

// Listen opens a TCP listener at the namespace end's address and port
// ("0" picks one).
func (l *Link) Listen(port string) (net.Listener, error) {
	return Listen(l.Name, net.JoinHostPort(l.NSAddr.String(), port))
}

// Cut drops every packet into and out of the namespace: its servers stop
// answering without refusing anything, as behind a network partition.
func (l *Link) Cut() error {
	if err := run("ip", "netns", "exec", l.Name, "nft", "add", "table", "inet", partitionTable); err != nil {
		return err
	}
	for _, hook := range []string{"input", "output"} {
		if err := run("ip", "netns", "exec", l.Name, "nft", "add chain inet "+partitionTable+" "+hook+" { type filter hook "+hook+" priority 0; policy drop; }"); err != nil {
			return err
		}
	}
	return nil
}

// Heal undoes Cut; connections that timed out meanwhile stay closed.
func (l *Link) Heal() error {
	return run("ip", "netns", "exec", l.Name, "nft", "delete", "table", "inet", partitionTable)
}

// Close deletes the namespace, its end of the pair with it (and so the
// host's end).
func (l *Link) Close() error {
	return run("ip", "netns", "del", l.Name)
}

// Listen opens a TCP listener at addr inside the namespace name: a socket
// keeps the namespace of the thread that made it.
func Listen(name, addr string) (net.Listener, error) {
	var ln net.Listener
	err := In(name, func() error {
		var err error
		ln, err = net.Listen("tcp", addr)
		return err
	})
	if err != nil {
		if ln != nil {
			_ = ln.Close()
		}
		return nil, fmt.Errorf("netns: listen in %s: %w", name, err)
	}
	return ln, nil
}

// Dial opens a TCP connection to addr from inside the namespace name,
// giving up after timeout.
func Dial(name, addr string, timeout time.Duration) (net.Conn, error) {
	var c net.Conn
	err := In(name, func() error {
		var err error
		c, err = net.DialTimeout("tcp", addr, timeout)
		return err
	})
	if err != nil {
		if c != nil {
			_ = c.Close()
		}
		return nil, fmt.Errorf("netns: dial %s in %s: %w", addr, name, err)
	}
	return c, nil
}

// In runs f on one locked OS thread that has entered the namespace name,
// then leaves it: the sockets f opens keep that namespace for their whole
// life, whichever thread uses them later. A thread that could not leave
// stays locked and exits with its goroutine instead of serving others in
// the wrong namespace.
func In(name string, f func() error) error {
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		home, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			done <- fmt.Errorf("netns: %w", err)
			return
		}
		defer home.Close()
		target, err := os.Open("/run/netns/" + name)
		if err != nil {
			done <- fmt.Errorf("netns: %w", err)
			return
		}
		defer target.Close()
		if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
			done <- fmt.Errorf("netns: enter %s: %w", name, err)
			return
		}
		ferr := f()
		if err := unix.Setns(int(home.Fd()), unix.CLONE_NEWNET); err != nil {
			done <- fmt.Errorf("netns: leave %s: %w", name, err)
			return
		}
		runtime.UnlockOSThread()
		done <- ferr
	}()
	return <-done
}

func run(args ...string) error {
	out, err := exec.Command(args[0], args[1:]...).CombinedOutput()
	if err != nil {
		var ee *exec.Error
		if errors.As(err, &ee) {
			return fmt.Errorf("netns: %s is not installed (hack/test-deps.sh --chaos installs it): %w", args[0], err)
		}
		return fmt.Errorf("netns: %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// Pipe copies between two TCP connections both ways until both directions
// are done, half-closing each side as the other finishes sending: what a
// forwarder between two networks does with each connection.
func Pipe(a, b net.Conn) {
	done := make(chan struct{})
	go func() {
		_, _ = io.Copy(b, a)
		closeWrite(b)
		close(done)
	}()
	_, _ = io.Copy(a, b)
	closeWrite(a)
	<-done
}

// closeWrite half-closes a TCP connection (anything else is closed).
func closeWrite(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.CloseWrite()
		return
	}
	_ = c.Close()
}

// Announce answers every connection ln accepts with one line, line, and
// closes it, until ln is closed: the other end a network test dials and
// recognises by what it says.
func Announce(ln net.Listener, line string) {
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			_, _ = fmt.Fprintln(c, line)
			_ = c.Close()
		}
	}()
}

// Package guestnet gives real guests (internal/testworld/simulator/qemu behind the
// Proxmox simulator) a network of their own for tests: a network namespace
// with a bridge, a real DHCP server on it (dnsmasq) and forwarders from
// the bridge's address to servers on the host's loopback. Everything it
// starts listens inside the namespace; Close removes it all. It needs
// root (ip netns, setns). Nothing in the operator imports it.
package guestnet

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"net"
	"net/netip"
	"os/exec"
	"strings"
	"sync"
	"time"

	"github.com/hyperfleet/hyperfleet/internal/testworld/netns"
)

// Bridge is the name of the namespace's bridge.
const Bridge = "br0"

// Network is a network namespace with a bridge whose address is Host in
// Prefix: the guests' taps plug into the bridge.
type Network struct {
	// Netns is the namespace's name (ip netns).
	Netns string
	// Prefix is the network; Host, its first address, is the bridge's.
	Prefix netip.Prefix
	Host   netip.Addr
	// Prefix6 and Host6 are the same for IPv6, once AddIPv6 gave the
	// bridge an IPv6 network; invalid until then.
	Prefix6 netip.Prefix
	Host6   netip.Addr

	mu        sync.Mutex
	listeners map[string]net.Listener // port -> forwarder
	conns     map[net.Conn]bool       // open forwarded connections, both sides
	wg        sync.WaitGroup
	closed    bool
}

// Create makes the namespace name with a bridge at the first address of
// prefix (an IPv4 network, /24 or larger). Close it.
func Create(name string, prefix netip.Prefix) (*Network, error) {
	prefix = prefix.Masked()
	if !prefix.Addr().Is4() || prefix.Bits() > 24 {
		return nil, fmt.Errorf("guestnet: %s: want an IPv4 network of /24 or larger", prefix)
	}
	n := &Network{Netns: name, Prefix: prefix, Host: prefix.Addr().Next(), listeners: map[string]net.Listener{}, conns: map[net.Conn]bool{}}
	if err := ip("netns", "add", name); err != nil {
		return nil, err
	}
	for _, args := range [][]string{
		{"link", "set", "lo", "up"},
		{"link", "add", Bridge, "type", "bridge"},
		{"addr", "add", netip.PrefixFrom(n.Host, prefix.Bits()).String(), "dev", Bridge},
		{"link", "set", Bridge, "up"},
	} {
		if err := ip(append([]string{"-n", name}, args...)...); err != nil {
			_ = n.Close()
			return nil, err
		}
	}
	return n, nil
}

// AddIPv6 gives the bridge the first address of prefix (an IPv6 network,
// /64 or larger) as well, for guests with static IPv6 addresses: the
// namespace sends no router advertisements, so a guest's only IPv6
// addresses are the ones it configures and its link-local one. The
// address skips duplicate address detection, so that it answers at once.
func (n *Network) AddIPv6(prefix netip.Prefix) error {
	prefix = prefix.Masked()
	if !prefix.Addr().Is6() || prefix.Addr().Is4In6() || prefix.Bits() > 64 {
		return fmt.Errorf("guestnet: %s: want an IPv6 network of /64 or larger", prefix)
	}
	host := prefix.Addr().Next()
	if err := ip("-n", n.Netns, "addr", "add", netip.PrefixFrom(host, prefix.Bits()).String(), "dev", Bridge, "nodad"); err != nil {
		return err
	}
	n.Prefix6, n.Host6 = prefix, host
	return nil
}

// Addr is the address offset addresses into the network (Host is 1).
func (n *Network) Addr(offset int) netip.Addr {
	a := n.Prefix.Addr()
	for range offset {
		a = a.Next()
	}
	return a
}

// Join plugs the caller's network namespace into the bridge with a veth
// pair whose end on this side has the network's address at offset: a
// process here (the operator under test) then reaches the guests
// directly, over the bridge, as an operator on the VMs' network would,
// and the guests reach servers listening here at that address. The pair
// goes with the namespace (Close).
func (n *Network) Join(offset int) (netip.Addr, error) {
	addr := n.Addr(offset)
	if !n.Prefix.Contains(addr) || addr == n.Host {
		return netip.Addr{}, fmt.Errorf("guestnet: offset %d is not a free address of %s", offset, n.Prefix)
	}
	// Interface names are at most 15 characters; the namespace's name is
	// unique to the test, and so is its hash.
	h := fnv.New32a()
	_, _ = h.Write([]byte(n.Netns))
	host := fmt.Sprintf("hfj%08x", h.Sum32())
	for _, args := range [][]string{
		{"link", "add", host, "type", "veth", "peer", "name", "join0", "netns", n.Netns},
		{"-n", n.Netns, "link", "set", "join0", "master", Bridge},
		{"-n", n.Netns, "link", "set", "join0", "up"},
		{"addr", "add", netip.PrefixFrom(addr, n.Prefix.Bits()).String(), "dev", host},
		{"link", "set", host, "up"},
	} {
		if err := ip(args...); err != nil {
			_ = ip("link", "del", host)
			return netip.Addr{}, err
		}
	}
	return addr, nil
}

// Listen opens a TCP listener at addr inside the namespace, for a test's
// own server on the bridge, such as one a guest connects to.
func (n *Network) Listen(addr string) (net.Listener, error) {
	return n.listen(addr)
}

// Forward listens on the bridge's address at port, inside the namespace,
// and connects every connection to 127.0.0.1:port in the caller's
// namespace: the guests reach a loopback server at Host:port. A port
// already forwarded is left as it is.
func (n *Network) Forward(port string) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return errors.New("guestnet: network closed")
	}
	if n.listeners[port] != nil {
		return nil
	}
	ln, err := n.listen(net.JoinHostPort(n.Host.String(), port))
	if err != nil {
		return err
	}
	n.listeners[port] = ln
	n.wg.Add(1)
	go n.serve(ln, net.JoinHostPort("127.0.0.1", port))
	return nil
}

// listen opens a TCP listener inside the namespace.
func (n *Network) listen(addr string) (net.Listener, error) {
	ln, err := netns.Listen(n.Netns, addr)
	if err != nil {
		return nil, fmt.Errorf("guestnet: %w", err)
	}
	return ln, nil
}

func (n *Network) serve(ln net.Listener, target string) {
	defer n.wg.Done()
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		n.wg.Add(1)
		go func() {
			defer n.wg.Done()
			if !n.track(c) {
				return
			}
			defer n.untrack(c)
			var d net.Dialer
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			up, err := d.DialContext(ctx, "tcp", target)
			cancel()
			if err != nil || !n.track(up) {
				return
			}
			defer n.untrack(up)
			netns.Pipe(c, up)
		}()
	}
}

// track registers an open connection; false (and the connection closed)
// once the network is closed.
func (n *Network) track(c net.Conn) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		_ = c.Close()
		return false
	}
	n.conns[c] = true
	return true
}

func (n *Network) untrack(c net.Conn) {
	n.mu.Lock()
	defer n.mu.Unlock()
	delete(n.conns, c)
	_ = c.Close()
}

// Close stops the forwarders, closes their open connections (a guest that
// is gone never closes its side) and deletes the namespace, with
// everything in it.
func (n *Network) Close() error {
	n.mu.Lock()
	n.closed = true
	for _, ln := range n.listeners {
		_ = ln.Close()
	}
	for c := range n.conns {
		_ = c.Close()
	}
	n.mu.Unlock()
	err := ip("netns", "del", n.Netns)
	n.wg.Wait()
	return err
}

func ip(args ...string) error {
	out, err := exec.Command("ip", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("guestnet: ip %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

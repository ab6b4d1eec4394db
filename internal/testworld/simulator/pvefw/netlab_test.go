package pvefw

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hyperfleet/hyperfleet/internal/testworld/netns"
)

// lab is a bridge in a namespace of its own (the hub, standing for the
// Proxmox node) and one namespace per VM, each joined to the bridge by a
// veth pair whose bridge end is the VM's tap.
type lab struct {
	t      *testing.T
	prefix string
	hub    string
	vms    map[string]*labVM
	mu     sync.Mutex
	got    map[string]bool // UDP payloads received
}

type labVM struct {
	name, ns, tap, mac, ip4, ip6 string
	vmid                         int
}

const (
	hubIP4 = "10.77.0.1"
	hubIP6 = "fd77::1"
	// spoofIP4 is an extra address of VM a that no configuration names.
	spoofIP4 = "10.77.0.99"
	// wait is how long a probe waits for an answer before calling it
	// dropped: the lab is one host, answers take microseconds.
	wait = 250 * time.Millisecond
)

var labPorts = []string{"22", "80", "443"}

func newLab(t *testing.T) *lab {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("pvefw: the rule-table tests need root (network namespaces, nftables)")
	}
	for _, tool := range []string{"ip", "nft"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("pvefw: the rule-table tests need %s: %v", tool, err)
		}
	}
	l := &lab{t: t, prefix: fmt.Sprintf("pf%d", os.Getpid()%100000), vms: map[string]*labVM{}, got: map[string]bool{}}
	l.hub = l.prefix + "h"
	t.Cleanup(l.close)
	l.sh("ip", "netns", "add", l.hub)
	l.sh("ip", "-n", l.hub, "link", "set", "lo", "up")
	l.sh("ip", "-n", l.hub, "link", "add", "br0", "type", "bridge")
	l.sh("ip", "-n", l.hub, "addr", "add", hubIP4+"/24", "dev", "br0")
	l.sh("ip", "-n", l.hub, "addr", "add", hubIP6+"/64", "dev", "br0", "nodad")
	l.sh("ip", "-n", l.hub, "link", "set", "br0", "up")
	for i, name := range []string{"a", "b", "c"} {
		vm := &labVM{name: name, ns: l.prefix + name, vmid: 101 + i, tap: fmt.Sprintf("hf%d", 101+i),
			mac: fmt.Sprintf("02:00:00:00:00:%02x", 0x11+i), ip4: fmt.Sprintf("10.77.0.%d", 11+i), ip6: fmt.Sprintf("fd77::%d", 11+i)}
		l.vms[name] = vm
		l.sh("ip", "netns", "add", vm.ns)
		l.sh("ip", "link", "add", vm.tap, "netns", l.hub, "type", "veth", "peer", "name", "eth0", "netns", vm.ns)
		l.sh("ip", "-n", l.hub, "link", "set", vm.tap, "master", "br0", "up")
		l.sh("ip", "-n", vm.ns, "link", "set", "lo", "up")
		l.sh("ip", "-n", vm.ns, "link", "set", "eth0", "address", vm.mac)
		l.sh("ip", "-n", vm.ns, "addr", "add", vm.ip4+"/24", "dev", "eth0")
		l.sh("ip", "-n", vm.ns, "addr", "add", vm.ip6+"/64", "dev", "eth0", "nodad")
		l.sh("ip", "-n", vm.ns, "link", "set", "eth0", "up")
		l.listen(vm.ns, vm.ip4, vm.ip6)
	}
	l.sh("ip", "-n", l.vms["a"].ns, "addr", "add", spoofIP4+"/32", "dev", "eth0")
	l.listen(l.hub, hubIP4, hubIP6)
	return l
}

func (l *lab) sh(args ...string) {
	l.t.Helper()
	if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
		l.t.Fatalf("%s: %v: %s", strings.Join(args, " "), err, out)
	}
}

func (l *lab) close() {
	for _, vm := range l.vms {
		_ = exec.Command("ip", "netns", "del", vm.ns).Run()
	}
	_ = exec.Command("ip", "netns", "del", l.hub).Run()
}

// listen serves TCP on labPorts (accept and close) and records UDP
// datagrams on 67 and 5353, at each address.
func (l *lab) listen(ns string, addrs ...string) {
	l.t.Helper()
	err := netns.In(ns, func() error {
		for _, a := range addrs {
			for _, p := range labPorts {
				ln, err := net.Listen("tcp", net.JoinHostPort(a, p))
				if err != nil {
					return err
				}
				l.t.Cleanup(func() { _ = ln.Close() })
				go func() {
					for {
						c, err := ln.Accept()
						if err != nil {
							return
						}
						_ = c.Close()
					}
				}()
			}
			for _, p := range []string{"67", "5353"} {
				pc, err := net.ListenPacket("udp", net.JoinHostPort(a, p))
				if err != nil {
					return err
				}
				l.t.Cleanup(func() { _ = pc.Close() })
				go func() {
					buf := make([]byte, 512)
					for {
						n, _, err := pc.ReadFrom(buf)
						if err != nil {
							return
						}
						l.mu.Lock()
						l.got[string(buf[:n])] = true
						l.mu.Unlock()
					}
				}()
			}
		}
		return nil
	})
	if err != nil {
		l.t.Fatalf("listen in %s: %v", ns, err)
	}
}

// Verdicts a probe observes.
const (
	vAccept = "accept"
	vDrop   = "drop"
	vReject = "reject"
)

// probe is one packet (a TCP connection or a UDP datagram) and the verdict
// expected for it.
type probe struct {
	from, to string // lab VM name or "host"
	proto    string // "tcp" (default), "udp"
	port     int
	v6       bool
	src      string // source address, if not the sender's own
	sport    int
	want     string
}

func (p probe) String() string {
	proto := p.proto
	if proto == "" {
		proto = "tcp"
	}
	s := fmt.Sprintf("%s->%s %s/%d", p.from, p.to, proto, p.port)
	if p.v6 {
		s += " v6"
	}
	if p.src != "" {
		s += " from " + p.src
	}
	if p.sport != 0 {
		s += fmt.Sprintf(" sport %d", p.sport)
	}
	return s
}

func (l *lab) endpoint(name string, v6 bool) (ns, addr string) {
	if name == "host" {
		if v6 {
			return l.hub, hubIP6
		}
		return l.hub, hubIP4
	}
	vm := l.vms[name]
	if v6 {
		return vm.ns, vm.ip6
	}
	return vm.ns, vm.ip4
}

var udpSeq int

// run sends the probe and reports what became of it.
func (l *lab) run(p probe) string {
	fromNS, srcAddr := l.endpoint(p.from, p.v6)
	_, dstAddr := l.endpoint(p.to, p.v6)
	if p.src != "" {
		srcAddr = p.src
	}
	var got string
	err := netns.In(fromNS, func() error {
		if p.proto == "udp" {
			udpSeq++
			payload := fmt.Sprintf("%s #%d", p, udpSeq)
			la := &net.UDPAddr{IP: net.ParseIP(srcAddr), Port: p.sport}
			c, err := net.DialUDP("udp", la, &net.UDPAddr{IP: net.ParseIP(dstAddr), Port: p.port})
			if err != nil {
				return err
			}
			defer c.Close()
			if _, err := c.Write([]byte(payload)); err != nil {
				return err
			}
			deadline := time.Now().Add(wait)
			for time.Now().Before(deadline) {
				l.mu.Lock()
				ok := l.got[payload]
				l.mu.Unlock()
				if ok {
					got = vAccept
					return nil
				}
				time.Sleep(5 * time.Millisecond)
			}
			got = vDrop
			return nil
		}
		d := net.Dialer{Timeout: wait, LocalAddr: &net.TCPAddr{IP: net.ParseIP(srcAddr)}}
		c, err := d.Dial("tcp", net.JoinHostPort(dstAddr, fmt.Sprint(p.port)))
		switch {
		case err == nil:
			_ = c.Close()
			got = vAccept
		case errors.Is(err, syscall.ECONNREFUSED):
			got = vReject
		case isTimeout(err) || errors.Is(err, syscall.EHOSTUNREACH):
			got = vDrop
		default:
			return err
		}
		return nil
	})
	if err != nil {
		l.t.Fatalf("probe %s: %v", p, err)
	}
	return got
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// vm builds the VM configuration of a lab VM: NIC firewall on, VM firewall
// enabled, the given options on top.
func (l *lab) vm(name string, o VMOptions, rules []Rule, sets ...IPSet) VM {
	v := l.vms[name]
	o.Enable = true
	return VM{VMID: v.vmid, NetID: "net0", Tap: v.tap, MAC: v.mac, Firewall: true, Options: o, Rules: rules, IPSets: sets}
}

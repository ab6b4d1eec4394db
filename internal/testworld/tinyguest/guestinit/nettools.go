package main

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"time"
)

// netTools are the tools a network test runs in the guest, by name.
var netTools = map[string]func(arg string) int{"dial": dialTool, "serve": serveTool, "readdress": readdressTool, "remac": remacTool}

// dialTimeout bounds a dial tool: a filtered SYN is dropped silently, so
// only the timeout ends it.
const dialTimeout = 3 * time.Second

// dialTool connects to address (host:port) over TCP and prints the first
// line the other end says, or "connected" when it says nothing (a DNS
// server waits for a query): "dial ADDRESS". It exits 1 when no
// connection is made, the network test's verdict.
func dialTool(address string) int {
	c, err := net.DialTimeout("tcp", address, dialTimeout)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer c.Close()
	_ = c.SetReadDeadline(time.Now().Add(dialTimeout))
	buf := make([]byte, 256)
	n, err := c.Read(buf)
	if n == 0 && err != nil {
		// Connected, and the other end keeps quiet: the connection is
		// the verdict.
		fmt.Println("connected")
		return 0
	}
	_, _ = os.Stdout.Write(buf[:n])
	return 0
}

// serveTool answers every TCP connection to port with one line naming
// the guest, until the guest powers off: "serve PORT". Started by
// guest-exec, it is never waited for.
func serveTool(port string) int {
	l, err := net.Listen("tcp", ":"+port)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	host, _ := os.Hostname()
	for {
		c, err := l.Accept()
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		_, _ = fmt.Fprintf(c, "%s:%s\n", host, port)
		_ = c.Close()
	}
}

// readdressTool gives the first NIC another IPv4 address and prefix in
// place of its own, as a job spoofing its address would: "readdress
// ADDRESS/PREFIX".
func readdressTool(prefix string) int {
	p, err := netip.ParsePrefix(prefix)
	if err != nil || !p.Addr().Is4() {
		fmt.Fprintf(os.Stderr, "readdress: %q is no IPv4 address with a prefix\n", prefix)
		return 2
	}
	nic, err := waitNIC()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if err := setIPv4(nic.Name, p); err != nil {
		fmt.Fprintf(os.Stderr, "readdress %s: %v\n", nic.Name, err)
		return 1
	}
	return 0
}

// remacTool gives the first NIC another MAC address, as a job spoofing
// another VM's would: "remac MAC". virtio-net takes a new address while
// the link is up.
func remacTool(mac string) int {
	hw, err := net.ParseMAC(mac)
	if err != nil || len(hw) != 6 {
		fmt.Fprintf(os.Stderr, "remac: %q is no Ethernet MAC address\n", mac)
		return 2
	}
	nic, err := waitNIC()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if err := setMAC(nic.Name, hw); err != nil {
		fmt.Fprintf(os.Stderr, "remac %s: %v\n", nic.Name, err)
		return 1
	}
	return 0
}

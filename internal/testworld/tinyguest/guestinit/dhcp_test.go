package main

import (
	"bytes"
	"net"
	"net/netip"
	"testing"
	"time"
)

func TestDHCPRoundTrip(t *testing.T) {
	mac := net.HardwareAddr{0x52, 0x54, 0, 1, 2, 3}
	ack := dhcpMessage{
		op: 2, xid: 0xdeadbeef, flags: 0x8000, yiaddr: netip.MustParseAddr("10.9.0.42"), chaddr: mac,
		options: map[byte][]byte{
			optMessageType: {dhcpAck},
			optSubnetMask:  {255, 255, 255, 0},
			optServerID:    {10, 9, 0, 1},
			optLeaseTime:   {0, 0, 0x0e, 0x10},
		},
	}
	raw := ack.encode()
	if len(raw) < 300 {
		t.Errorf("message of %d bytes, want at least 300", len(raw))
	}
	got, err := parseDHCP(raw)
	if err != nil {
		t.Fatal(err)
	}
	if got.xid != ack.xid || got.op != 2 || got.yiaddr != ack.yiaddr || !bytes.Equal(got.chaddr, mac) || got.msgType() != dhcpAck {
		t.Errorf("decoded %+v", got)
	}
	l, err := leaseFrom(got)
	if err != nil {
		t.Fatal(err)
	}
	if l.addr != netip.MustParsePrefix("10.9.0.42/24") || l.server != netip.MustParseAddr("10.9.0.1") || l.duration != time.Hour {
		t.Errorf("lease %+v", l)
	}
	delete(got.options, optSubnetMask)
	if _, err := leaseFrom(got); err == nil {
		t.Error("an ACK without a subnet mask made a lease")
	}
}

func FuzzParseDHCP(f *testing.F) {
	f.Add(dhcpMessage{op: 2, options: map[byte][]byte{optMessageType: {dhcpOffer}}}.encode())
	f.Add(make([]byte, 240))
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := parseDHCP(b)
		if err != nil {
			return
		}
		again, err := parseDHCP(m.encode())
		if err != nil || again.xid != m.xid || again.msgType() != m.msgType() {
			t.Errorf("re-encoding %+v: %+v, %v", m, again, err)
		}
	})
}

func TestStaticAddresses(t *testing.T) {
	nic := net.Interface{Name: "eth0", HardwareAddr: net.HardwareAddr{0x52, 0x54, 0, 0xaa, 0xbb, 0xcc}}
	for _, tc := range []struct {
		name, config string
		want         []string
	}{
		{"dhcp", "version: 2\nethernets:\n  eth0:\n    dhcp4: true\n", nil},
		{"static", "version: 2\nethernets:\n  eth0:\n    addresses: [10.1.0.5/24, 'fd00::5/64']\n    gateway4: 10.1.0.1\n", []string{"10.1.0.5/24", "fd00::5/64"}},
		{"matched by MAC", "version: 2\nethernets:\n  id0:\n    match: {macaddress: '52:54:00:AA:BB:CC'}\n    set-name: eth0\n    addresses: [10.1.0.6/24]\n", []string{"10.1.0.6/24"}},
		{"another MAC", "version: 2\nethernets:\n  id0:\n    match: {macaddress: '52:54:00:00:00:01'}\n    addresses: [10.1.0.7/24]\n", nil},
		{"version 1", "version: 1\nconfig: []\n", nil},
		{"none", "", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := staticAddresses([]byte(tc.config), nic)
			if len(got) != len(tc.want) {
				t.Fatalf("got %v, want %v", got, tc.want)
			}
			for i := range got {
				if got[i].String() != tc.want[i] {
					t.Errorf("got %v, want %v", got, tc.want)
				}
			}
		})
	}
}

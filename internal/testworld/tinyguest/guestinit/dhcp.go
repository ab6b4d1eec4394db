package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// DHCPv4 message types (RFC 2132, option 53).
const (
	dhcpDiscover = 1
	dhcpOffer    = 2
	dhcpRequest  = 3
	dhcpAck      = 5
	dhcpNak      = 6
)

// DHCP options used here.
const (
	optSubnetMask  = 1
	optRouter      = 3
	optHostname    = 12
	optRequestedIP = 50
	optLeaseTime   = 51
	optMessageType = 53
	optServerID    = 54
	optParamList   = 55
	optClientID    = 61
	optEnd         = 255
)

var dhcpMagic = []byte{99, 130, 83, 99}

// dhcpMessage is the part of a BOOTP/DHCP message the client uses.
type dhcpMessage struct {
	op      byte
	xid     uint32
	flags   uint16
	yiaddr  netip.Addr
	chaddr  net.HardwareAddr
	options map[byte][]byte
}

// encode renders m as a BOOTREQUEST or BOOTREPLY of at least 300 bytes
// (the BOOTP minimum some servers insist on). Options are written in
// ascending code order.
func (m dhcpMessage) encode() []byte {
	b := make([]byte, 236, 576)
	b[0] = m.op
	b[1] = 1 // Ethernet
	b[2] = 6
	binary.BigEndian.PutUint32(b[4:], m.xid)
	binary.BigEndian.PutUint16(b[10:], m.flags)
	if m.yiaddr.Is4() {
		a := m.yiaddr.As4()
		copy(b[16:20], a[:])
	}
	copy(b[28:44], m.chaddr)
	b = append(b, dhcpMagic...)
	for code := 1; code < optEnd; code++ {
		if v, ok := m.options[byte(code)]; ok {
			b = append(b, byte(code), byte(len(v)))
			b = append(b, v...)
		}
	}
	b = append(b, optEnd)
	for len(b) < 300 {
		b = append(b, 0)
	}
	return b
}

// parseDHCP decodes a DHCP message; options may be padded and end early.
func parseDHCP(b []byte) (dhcpMessage, error) {
	if len(b) < 240 || !bytes.Equal(b[236:240], dhcpMagic) {
		return dhcpMessage{}, errors.New("not a DHCP message")
	}
	m := dhcpMessage{
		op:      b[0],
		xid:     binary.BigEndian.Uint32(b[4:]),
		flags:   binary.BigEndian.Uint16(b[10:]),
		yiaddr:  netip.AddrFrom4([4]byte(b[16:20])),
		chaddr:  net.HardwareAddr(append([]byte(nil), b[28:34]...)),
		options: map[byte][]byte{},
	}
	for rest := b[240:]; len(rest) > 0; {
		code := rest[0]
		if code == optEnd {
			break
		}
		if code == 0 {
			rest = rest[1:]
			continue
		}
		if len(rest) < 2 || len(rest) < 2+int(rest[1]) {
			return dhcpMessage{}, errors.New("truncated DHCP option")
		}
		m.options[code] = rest[2 : 2+int(rest[1])]
		rest = rest[2+int(rest[1]):]
	}
	return m, nil
}

// msgType is option 53, or 0.
func (m dhcpMessage) msgType() byte {
	if v := m.options[optMessageType]; len(v) == 1 {
		return v[0]
	}
	return 0
}

// lease is an acknowledged address.
type lease struct {
	addr     netip.Prefix
	server   netip.Addr
	duration time.Duration
}

// leaseFrom reads a DHCPACK.
func leaseFrom(ack dhcpMessage) (lease, error) {
	mask := ack.options[optSubnetMask]
	if len(mask) != 4 || !ack.yiaddr.IsValid() || ack.yiaddr.IsUnspecified() {
		return lease{}, errors.New("DHCPACK without an address and subnet mask")
	}
	bits, _ := net.IPMask(mask).Size()
	l := lease{addr: netip.PrefixFrom(ack.yiaddr, bits), duration: time.Hour}
	if v := ack.options[optServerID]; len(v) == 4 {
		l.server = netip.AddrFrom4([4]byte(v))
	}
	if v := ack.options[optLeaseTime]; len(v) == 4 {
		l.duration = time.Duration(binary.BigEndian.Uint32(v)) * time.Second
	}
	return l, nil
}

// keepDHCPLease obtains a lease for nic and renews it at half its time,
// forever (a failed attempt is retried).
func keepDHCPLease(nic net.Interface, hostname string) {
	for {
		l, err := obtainLease(nic, hostname)
		if err != nil {
			logf("dhcp: %s: %v", nic.Name, err)
			time.Sleep(time.Second)
			continue
		}
		if err := setIPv4(nic.Name, l.addr); err != nil {
			logf("dhcp: %s: %s: %v", nic.Name, l.addr, err)
		} else {
			logf("dhcp: %s %s from %s for %s", nic.Name, l.addr, l.server, l.duration)
		}
		time.Sleep(l.duration / 2)
	}
}

// obtainLease runs DISCOVER, OFFER, REQUEST, ACK with broadcast replies
// over a UDP socket bound to the NIC (Linux sends a limited broadcast
// from an interface without an address through SO_BINDTODEVICE).
func obtainLease(nic net.Interface, hostname string) (lease, error) {
	lc := net.ListenConfig{Control: func(_, _ string, c syscall.RawConn) error {
		var serr error
		err := c.Control(func(fd uintptr) {
			if serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_REUSEADDR, 1); serr != nil {
				return
			}
			if serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_BROADCAST, 1); serr != nil {
				return
			}
			serr = unix.BindToDevice(int(fd), nic.Name)
		})
		if err != nil {
			return err
		}
		return serr
	}}
	pc, err := lc.ListenPacket(context.Background(), "udp4", "0.0.0.0:68")
	if err != nil {
		return lease{}, fmt.Errorf("listening on port 68: %w", err)
	}
	defer pc.Close()
	var xidb [4]byte
	_, _ = rand.Read(xidb[:])
	base := dhcpMessage{op: 1, xid: binary.BigEndian.Uint32(xidb[:]), flags: 0x8000, chaddr: nic.HardwareAddr}
	common := map[byte][]byte{
		optClientID:  append([]byte{1}, nic.HardwareAddr...),
		optParamList: {optSubnetMask, optRouter, 6, 15, optLeaseTime, optServerID},
	}
	if hostname != "" {
		common[optHostname] = []byte(hostname)
	}
	discover := base
	discover.options = withOptions(common, map[byte][]byte{optMessageType: {dhcpDiscover}})
	offer, err := exchange(pc, discover, dhcpOffer)
	if err != nil {
		return lease{}, fmt.Errorf("discover: %w", err)
	}
	request := base
	yi := offer.yiaddr.As4()
	request.options = withOptions(common, map[byte][]byte{
		optMessageType: {dhcpRequest},
		optRequestedIP: yi[:],
		optServerID:    offer.options[optServerID],
	})
	ack, err := exchange(pc, request, dhcpAck)
	if err != nil {
		return lease{}, fmt.Errorf("request %s: %w", offer.yiaddr, err)
	}
	return leaseFrom(ack)
}

func withOptions(maps ...map[byte][]byte) map[byte][]byte {
	out := map[byte][]byte{}
	for _, m := range maps {
		for k, v := range m {
			out[k] = v
		}
	}
	return out
}

// exchange broadcasts msg until a reply of type want with msg's xid
// arrives: three tries, two seconds each. A NAK ends it.
func exchange(pc net.PacketConn, msg dhcpMessage, want byte) (dhcpMessage, error) {
	dst := &net.UDPAddr{IP: net.IPv4bcast, Port: 67}
	buf := make([]byte, 1500)
	for try := 0; try < 3; try++ {
		if _, err := pc.WriteTo(msg.encode(), dst); err != nil {
			return dhcpMessage{}, err
		}
		deadline := time.Now().Add(2 * time.Second)
		_ = pc.SetReadDeadline(deadline)
		for {
			n, _, err := pc.ReadFrom(buf)
			if err != nil {
				break // timed out: send again
			}
			reply, err := parseDHCP(buf[:n])
			if err != nil || reply.op != 2 || reply.xid != msg.xid {
				continue
			}
			switch reply.msgType() {
			case want:
				return reply, nil
			case dhcpNak:
				return dhcpMessage{}, errors.New("DHCPNAK")
			}
		}
	}
	return dhcpMessage{}, errors.New("no answer")
}

package netcheck

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"syscall"
	"time"

	"golang.org/x/net/icmp"
	"golang.org/x/net/ipv4"
	"golang.org/x/net/ipv6"
)

// ErrNotPermitted is the error of a ping the operator may not send: the
// kernel refused both an unprivileged ICMP socket (the process's group is
// outside net.ipv4.ping_group_range) and a raw one (no CAP_NET_RAW).
var ErrNotPermitted = errors.New("no permission to open an ICMP socket")

// pingInterval is the wait between echo requests: a lost packet is sent
// again rather than failing the check.
const pingInterval = time.Second

// Ping sends ICMP echo requests to addr, one a second, until one is
// answered (it returns the round trip) or ctx ends.
//
// It opens an unprivileged ICMP ("ping") socket first, which Linux allows
// to the groups of net.ipv4.ping_group_range without any capability, and a
// raw socket only when that is refused (root, or CAP_NET_RAW).
func Ping(ctx context.Context, addr netip.Addr) (time.Duration, error) {
	addr = addr.Unmap()
	conn, raw, err := listenICMP(addr.Is4())
	if err != nil {
		return 0, err
	}
	defer func() { _ = conn.Close() }()
	stop := context.AfterFunc(ctx, func() { _ = conn.SetDeadline(time.Now()) })
	defer stop()

	token := make([]byte, 16)
	_, _ = rand.Read(token)
	id := int(token[0])<<8 | int(token[1])
	var dst net.Addr = &net.UDPAddr{IP: addr.AsSlice()}
	if raw {
		dst = &net.IPAddr{IP: addr.AsSlice()}
	}
	var echo icmp.Type = ipv4.ICMPTypeEcho
	proto := 1
	if !addr.Is4() {
		echo, proto = ipv6.ICMPTypeEchoRequest, 58
	}
	buf := make([]byte, 1500)
	for seq := 1; ; seq++ {
		msg := icmp.Message{Type: echo, Body: &icmp.Echo{ID: id, Seq: seq, Data: token}}
		b, err := msg.Marshal(nil)
		if err != nil {
			return 0, fmt.Errorf("ping %s: %w", addr, err)
		}
		sent := time.Now()
		if _, err := conn.WriteTo(b, dst); err != nil {
			if ctx.Err() != nil {
				return 0, fmt.Errorf("ping %s: no reply to %d echo requests: %w", addr, seq-1, ctx.Err())
			}
			return 0, fmt.Errorf("ping %s: send: %w", addr, err)
		}
		_ = conn.SetReadDeadline(sent.Add(pingInterval))
		for {
			n, peer, err := conn.ReadFrom(buf)
			if err != nil {
				break
			}
			if isReply(buf[:n], proto, peer, addr, token) {
				return time.Since(sent), nil
			}
		}
		if ctx.Err() != nil {
			return 0, fmt.Errorf("ping %s: no reply to %d echo requests: %w", addr, seq, ctx.Err())
		}
	}
}

// isReply reports whether b, from peer, is the echo reply of addr to a
// request carrying token. A raw socket sees every ICMP message of the
// host (other pings, the requests themselves on loopback): the token and
// the source tell this check's apart.
func isReply(b []byte, proto int, peer net.Addr, addr netip.Addr, token []byte) bool {
	m, err := icmp.ParseMessage(proto, b)
	if err != nil || (m.Type != ipv4.ICMPTypeEchoReply && m.Type != ipv6.ICMPTypeEchoReply) {
		return false
	}
	e, ok := m.Body.(*icmp.Echo)
	if !ok || !bytes.Equal(e.Data, token) {
		return false
	}
	var from net.IP
	switch p := peer.(type) {
	case *net.UDPAddr:
		from = p.IP
	case *net.IPAddr:
		from = p.IP
	}
	got, ok := netip.AddrFromSlice(from)
	return ok && got.Unmap() == addr
}

// listenICMP opens an ICMP socket of the family: unprivileged first, raw
// when that is refused. raw says which.
func listenICMP(v4 bool) (conn *icmp.PacketConn, raw bool, err error) {
	dgram, rawNet, wildcard := "udp4", "ip4:icmp", "0.0.0.0"
	if !v4 {
		dgram, rawNet, wildcard = "udp6", "ip6:ipv6-icmp", "::"
	}
	conn, err = icmp.ListenPacket(dgram, wildcard)
	if err == nil {
		return conn, false, nil
	}
	conn, rerr := icmp.ListenPacket(rawNet, wildcard)
	if rerr == nil {
		return conn, true, nil
	}
	if denied(err) && denied(rerr) {
		// Both refusals wrap: the message shows each; ErrNotPermitted is
		// what callers match.
		return nil, false, fmt.Errorf("%w (unprivileged: %w; raw: %w): allow the operator's group in net.ipv4.ping_group_range, or give it CAP_NET_RAW", ErrNotPermitted, err, rerr)
	}
	return nil, false, fmt.Errorf("open an ICMP socket: %w", errors.Join(err, rerr))
}

func denied(err error) bool {
	return errors.Is(err, os.ErrPermission) || errors.Is(err, syscall.EACCES) || errors.Is(err, syscall.EPERM) || errors.Is(err, syscall.EPROTONOSUPPORT)
}

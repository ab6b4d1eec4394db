//go:build flood

package flood

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// attack is one kind of hostile client: what it sends on a connection it
// got, after which it stalls.
type attack struct {
	name string
	// alpn is what the attacker offers in its TLS handshake.
	alpn []string
	// send writes the attack on connection i.
	send func(c net.Conn, i int) error
	// smallWindow shrinks the attacker's receive buffer before it
	// connects: a download it never reads then stops at once (a zero TCP
	// window), holding the server's writer.
	smallWindow bool
	// hold keeps connection i after send until the server closes it (it
	// reports true) or ctx ends; nil: holdUntilClosed, reading nothing.
	hold func(ctx context.Context, c *tls.Conn, i int) bool
}

// flood is an attack under way: conns connections, each from one of
// sources, each sending its attack and then stalling. A connection the
// server closes is opened again after a second, until stop: the attacker
// keeps up the pressure for as long as the variant runs.
type flood struct {
	cancel context.CancelFunc
	wg     sync.WaitGroup
	// established counts TLS handshakes completed, refused connections
	// the server closed before or during the handshake, cut connections
	// the server closed while a reading attacker (slowRead) held them.
	established, refused, cut atomic.Int64
	// firstRound is done once every connection was tried once.
	firstRound sync.WaitGroup
}

// dialers bounds the attacker's concurrent handshakes, to stay kind to a
// 2-core machine that also runs the manager and the world.
const dialers = 128

func startFlood(addr string, sources []string, conns int, a attack) *flood {
	ctx, cancel := context.WithCancel(context.Background())
	f := &flood{cancel: cancel}
	slots := make(chan struct{}, dialers)
	f.firstRound.Add(conns)
	for i := range conns {
		f.wg.Add(1)
		go func() {
			defer f.wg.Done()
			first := true
			for ctx.Err() == nil {
				slots <- struct{}{}
				c, err := dialTLS(ctx, sources[i%len(sources)], addr, a)
				if err == nil {
					f.established.Add(1)
					if err := a.send(c, i); err == nil {
						<-slots
						if first {
							f.firstRound.Done()
							first = false
						}
						hold := a.hold
						if hold == nil {
							hold = holdUntilClosed
						}
						if hold(ctx, c, i) {
							f.cut.Add(1)
						}
					} else {
						<-slots
					}
					_ = c.Close()
				} else {
					<-slots
					f.refused.Add(1)
				}
				if first {
					f.firstRound.Done()
					first = false
				}
				select {
				case <-ctx.Done():
				case <-time.After(time.Second):
				}
			}
		}()
	}
	return f
}

// stop ends the attack and closes every connection.
func (f *flood) stop() {
	f.cancel()
	f.wg.Wait()
}

func dialTLS(ctx context.Context, source, addr string, a attack) (*tls.Conn, error) {
	d := net.Dialer{Timeout: 10 * time.Second, LocalAddr: &net.TCPAddr{IP: net.ParseIP(source)}}
	if a.smallWindow {
		d.Control = func(_, _ string, rc syscall.RawConn) error {
			var serr error
			err := rc.Control(func(fd uintptr) {
				serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096)
			})
			if err != nil {
				return err
			}
			return serr
		}
	}
	raw, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	c := tls.Client(raw, &tls.Config{InsecureSkipVerify: true, NextProtos: a.alpn}) //nolint:gosec // the attacker trusts anything
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if err := c.Handshake(); err != nil {
		_ = raw.Close()
		return nil, err
	}
	_ = c.SetDeadline(time.Time{})
	return c, nil
}

// holdUntilClosed keeps c open, reading nothing, until the server closes
// it (true) or ctx ends. A one-byte peek per second notices the close
// without draining a download: a download's data is never read, so its
// window stays shut.
func holdUntilClosed(ctx context.Context, c *tls.Conn, _ int) bool {
	raw := c.NetConn()
	for ctx.Err() == nil {
		if closedByPeer(raw) {
			return true
		}
		select {
		case <-ctx.Done():
		case <-time.After(time.Second):
		}
	}
	return false
}

// slowRead reads a download slowly but steadily: 256 KiB every 20 s
// (13 KiB/s), enough for the kernel to wake the server's writer well
// within the 30 s a stalled download is cut after, so that the download
// never stalls (such downloads used to stay in progress for hours). It
// reports true when the server ended the download (an error, or the end
// of the body) while it read on.
func slowRead(ctx context.Context, c *tls.Conn, _ int) bool {
	buf := make([]byte, 256<<10)
	for ctx.Err() == nil {
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		if _, err := io.ReadFull(c, buf); err != nil {
			var ne net.Error
			// A timeout is this client's deadline, not the server's cut.
			return !errors.As(err, &ne) || !ne.Timeout()
		}
		select {
		case <-ctx.Done():
		case <-time.After(20 * time.Second):
		}
	}
	return false
}

// closedByPeer peeks at raw without consuming: EOF or a reset means the
// server closed it.
func closedByPeer(raw net.Conn) bool {
	sc, ok := raw.(syscall.Conn)
	if !ok {
		return false
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return true
	}
	closed := false
	_ = rc.Read(func(fd uintptr) bool {
		buf := make([]byte, 1)
		n, _, err := syscall.Recvfrom(int(fd), buf, syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		closed = (n == 0 && err == nil) || (err != nil && err != syscall.EAGAIN)
		return true // never wait for readiness
	})
	return closed
}

// stalledHead sends a request head declaring a body of 1,000 bytes and
// four bytes of it.
func stalledHead(c net.Conn, method, path string, headers ...string) error {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s HTTP/1.1\r\nHost: hyperfleet\r\n", method, path)
	for _, h := range headers {
		b.WriteString(h + "\r\n")
	}
	b.WriteString("Content-Length: 1000\r\n\r\n{\"ru")
	_ = c.SetWriteDeadline(time.Now().Add(10 * time.Second))
	_, err := io.WriteString(c, b.String())
	return err
}

// noticeAttack: power-off notices with a bogus token, half at a claim's
// path (the token check's way in) and half in the old format (the body
// names the claim: today's main reads it before the token).
var noticeAttack = attack{name: "stalled power-off notices", alpn: []string{"http/1.1"}, send: func(c net.Conn, i int) error {
	path := "/hints/v1/power-off"
	if i%2 == 0 {
		path = fmt.Sprintf("/hints/v1/power-off/ci/flood-%d/%08d-0000-0000-0000-000000000000", i, i)
	}
	return stalledHead(c, "POST", path, "Authorization: Bearer "+strings.Repeat("0f", 32), "Content-Type: application/json")
}}

// webhookAttack: deliveries with a bad signature.
var webhookAttack = attack{name: "stalled unsigned deliveries", alpn: []string{"http/1.1"}, send: func(c net.Conn, i int) error {
	return stalledHead(c, "POST", "/webhooks/github", "Content-Type: application/json", "X-GitHub-Event: workflow_job",
		fmt.Sprintf("X-GitHub-Delivery: %08d-0000-0000-0000-000000000000", i), "X-Hub-Signature-256: sha256="+strings.Repeat("0", 64))
}}

// downloadAttack: GETs of the agent binary whose answer is never read.
var downloadAttack = attack{name: "zero-window downloads", alpn: []string{"http/1.1"}, smallWindow: true, send: getBinary}

// slowDownloadAttack: GETs of the agent binary read a little at a time,
// enough to never stall (slowRead).
var slowDownloadAttack = attack{name: "slow downloads", alpn: []string{"http/1.1"}, smallWindow: true, send: getBinary, hold: slowRead}

// capAttack: what a hostile job holds the agent server's connections
// with, half of each source's connections zero-window downloads (held
// until they stall), half request heads that never end (held until the
// server's header timeout).
var capAttack = attack{name: "cap-holding", alpn: []string{"http/1.1"}, smallWindow: true, send: func(c net.Conn, i int) error {
	if i%4 < 2 { // both sources, connections 0 and 1 of every 4
		return getBinary(c, i)
	}
	_ = c.SetWriteDeadline(time.Now().Add(10 * time.Second))
	_, err := io.WriteString(c, "GET /agent/v1/hyperfleet-agent-linux-amd64 HTTP/1.1\r\nHost: hyperfleet\r\n")
	return err
}}

func getBinary(c net.Conn, _ int) error {
	_ = c.SetWriteDeadline(time.Now().Add(10 * time.Second))
	_, err := io.WriteString(c, "GET /agent/v1/hyperfleet-agent-linux-amd64 HTTP/1.1\r\nHost: hyperfleet\r\n\r\n")
	return err
}

// http2Attack: HTTP/2 connections, each opening streamsPerConn streams
// that POST to path declaring a body that never comes. Even connections
// offer h2 in ALPN, odd ones offer http/1.1 and speak HTTP/2 anyway
// (prior knowledge).
func http2Attack(path string, headers map[string]string) attack {
	return attack{name: "HTTP/2 streams", send: func(c net.Conn, _ int) error {
		_ = c.SetWriteDeadline(time.Now().Add(10 * time.Second))
		_, err := c.Write(http2Streams(path, headers))
		return err
	}}
}

const streamsPerConn = 250

// http2Streams is an HTTP/2 client's preface, an empty SETTINGS frame and
// streamsPerConn HEADERS frames without END_STREAM: each an open stream
// waiting for its body.
func http2Streams(path string, headers map[string]string) []byte {
	var out bytes.Buffer
	out.WriteString("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
	frame := func(typ, flags byte, stream uint32, payload []byte) {
		var h [9]byte
		h[0], h[1], h[2] = byte(len(payload)>>16), byte(len(payload)>>8), byte(len(payload))
		h[3], h[4] = typ, flags
		binary.BigEndian.PutUint32(h[5:], stream)
		out.Write(h[:])
		out.Write(payload)
	}
	frame(0x4, 0, 0, nil) // SETTINGS
	// HPACK: static-table entries (RFC 7541, appendix A) and literals
	// without indexing.
	var block bytes.Buffer
	block.WriteByte(0x83) // :method POST
	block.WriteByte(0x87) // :scheme https
	literal := func(index byte, value string) {
		block.WriteByte(index) // literal without indexing, indexed name (index < 15)
		block.WriteByte(byte(len(value)))
		block.WriteString(value)
	}
	literal(0x01, "hyperfleet") // :authority
	literal(0x04, path)         // :path
	literalName := func(name, value string) {
		block.WriteByte(0x00)
		block.WriteByte(byte(len(name)))
		block.WriteString(name)
		block.WriteByte(byte(len(value)))
		block.WriteString(value)
	}
	literalName("content-length", "1000")
	for k, v := range headers {
		literalName(k, v)
	}
	for i := range streamsPerConn {
		frame(0x1, 0x4, uint32(2*i+1), block.Bytes()) // HEADERS, END_HEADERS
	}
	return out.Bytes()
}

// withALPN returns a copy of a whose even connections offer h2 and odd
// ones http/1.1 only: startFlood gives each connection a's alpn, so the
// flood runs as two halves.
func withALPN(a attack, alpn ...string) attack {
	a.alpn = alpn
	return a
}

// insecureTransport is a legitimate client's transport that does not
// check the server's certificate (the figures, not the PKI, are tested
// here).
func insecureTransport() *http.Transport {
	return &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}} //nolint:gosec // test client
}

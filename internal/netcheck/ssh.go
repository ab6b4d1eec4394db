package netcheck

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"

	"golang.org/x/crypto/ssh"
)

// HostKey is what an SSH server showed of itself.
type HostKey struct {
	// Type is the key's algorithm, such as ssh-ed25519; Fingerprint its
	// SHA256 fingerprint as ssh-keygen -l prints it.
	Type, Fingerprint string
}

// errHaveKey stops the handshake once the server proved it holds its host
// key: the check never logs in.
var errHaveKey = errors.New("host key read")

// SSH connects to an SSH server at addr and runs the protocol up to the
// server's host key (version exchange, key exchange, the server's
// signature over it), then hangs up without authenticating. It proves
// that an SSH server, not just an open port, answers.
func SSH(ctx context.Context, addr netip.AddrPort) (HostKey, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", addr.String())
	if err != nil {
		return HostKey{}, fmt.Errorf("connect to %s: %w", addr, err)
	}
	defer func() { _ = conn.Close() }()
	if dl, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(dl)
	}
	stop := context.AfterFunc(ctx, func() { _ = conn.Close() })
	defer stop()
	var key ssh.PublicKey
	cfg := &ssh.ClientConfig{
		User: "hyperfleet-validation",
		HostKeyCallback: func(_ string, _ net.Addr, k ssh.PublicKey) error {
			key = k
			return errHaveKey
		},
	}
	c, chans, reqs, err := ssh.NewClientConn(conn, addr.String(), cfg)
	if err == nil {
		// Unreachable with the callback above; close what was opened.
		go ssh.DiscardRequests(reqs)
		go func() {
			for ch := range chans {
				_ = ch.Reject(ssh.Prohibited, "")
			}
		}()
		_ = c.Close()
	}
	if key == nil {
		return HostKey{}, fmt.Errorf("no SSH host key from %s: %w", addr, err)
	}
	return HostKey{Type: key.Type(), Fingerprint: ssh.FingerprintSHA256(key)}, nil
}

package machineclaim

import (
	"context"
	"net"
	"net/netip"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/hyperfleet/hyperfleet/internal/testworld/sshserver"
)

// lateSSH starts, after delay, an SSH server (golang.org/x/crypto/ssh's)
// on a loopback port chosen now, as a VM's sshd starts a little after its
// network; it returns the address.
func lateSSH(t *testing.T, delay time.Duration) netip.AddrPort {
	t.Helper()
	srv, err := sshserver.New()
	if err != nil {
		t.Fatal(err)
	}
	// Reserve a port, free it, listen on it later.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := netip.MustParseAddrPort(ln.Addr().String())
	_ = ln.Close()
	stop := make(chan struct{})
	t.Cleanup(func() { close(stop) })
	go func() {
		select {
		case <-stop:
			return
		case <-time.After(delay):
		}
		ln, err := net.Listen("tcp", addr.String())
		if err != nil {
			return
		}
		srv.Serve(ln)
		<-stop
		_ = ln.Close()
	}()
	return addr
}

// TestSSHCheckWaitsForTheServer: an SSH server that starts two seconds
// after the check begins (a VM's sshd starting after its network) passes a
// check with a 10 s timeout; one that never starts fails when the timeout
// ends, with the connection's error.
func TestSSHCheckWaitsForTheServer(t *testing.T) {
	addr := lateSSH(t, 2*time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	key, err := sshWithin(ctx, addr)
	if err != nil || key.Type != ssh.KeyAlgoED25519 {
		t.Fatalf("an SSH server starting 2 s late: %+v, %v", key, err)
	}

	never := lateSSH(t, time.Hour)
	ctx, cancel = context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if _, err := sshWithin(ctx, never); err == nil {
		t.Fatal("no SSH server, and the check passed")
	}
}

package machineclaim

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"net"
	"net/netip"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"
)

// lateSSH starts, after delay, an SSH server (golang.org/x/crypto/ssh's)
// on a loopback port chosen now, as a VM's sshd starts a little after its
// network; it returns the address.
func lateSSH(t *testing.T, delay time.Duration) netip.AddrPort {
	t.Helper()
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	signer, err := ssh.NewSignerFromKey(priv)
	if err != nil {
		t.Fatal(err)
	}
	cfg := &ssh.ServerConfig{PasswordCallback: func(ssh.ConnMetadata, []byte) (*ssh.Permissions, error) {
		return nil, errors.New("no login here")
	}}
	cfg.AddHostKey(signer)
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
		go func() { <-stop; _ = ln.Close() }()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer func() { _ = c.Close() }()
				_ = c.SetDeadline(time.Now().Add(5 * time.Second))
				if sc, _, _, err := ssh.NewServerConn(c, cfg); err == nil {
					_ = sc.Close()
				}
			}()
		}
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
	start := time.Now()
	if _, err := sshWithin(ctx, never); err == nil {
		t.Fatal("no SSH server, and the check passed")
	}
	if d := time.Since(start); d < 1500*time.Millisecond {
		t.Errorf("gave up after %s, before the timeout", d)
	}
}

// Package sshserver is the test world's SSH server (golang.org/x/crypto/ssh's):
// it completes the key exchange with its own ed25519 host key and lets
// nobody log in, which is all network validation's SSH check asks of a
// VM's sshd (internal/netcheck).
package sshserver

import (
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"fmt"
	"net"
	"time"

	"golang.org/x/crypto/ssh"
)

// Server is a host key and the configuration that serves it.
type Server struct {
	cfg *ssh.ServerConfig
	// HostKey is the key the server shows.
	HostKey ssh.PublicKey
}

// New makes a server with a fresh ed25519 host key.
func New() (*Server, error) {
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("sshserver: host key: %w", err)
	}
	signer, err := ssh.NewSignerFromKey(priv)
	if err != nil {
		return nil, fmt.Errorf("sshserver: host key: %w", err)
	}
	cfg := &ssh.ServerConfig{PasswordCallback: func(ssh.ConnMetadata, []byte) (*ssh.Permissions, error) {
		return nil, errors.New("no login")
	}}
	cfg.AddHostKey(signer)
	return &Server{cfg: cfg, HostKey: signer.PublicKey()}, nil
}

// Serve accepts connections on ln until it is closed, each bounded to
// 10 seconds; it returns at once.
func (s *Server) Serve(ln net.Listener) {
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go s.handle(c)
		}
	}()
}

// handle runs the SSH handshake on c and closes it.
func (s *Server) handle(c net.Conn) {
	defer func() { _ = c.Close() }()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if sc, _, _, err := ssh.NewServerConn(c, s.cfg); err == nil {
		_ = sc.Close()
	}
}

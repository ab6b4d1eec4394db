package libvirt

import (
	"crypto/ed25519"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"io"
	"net"
	"strconv"
	"sync"
	"testing"

	"golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/knownhosts"

	"github.com/hyperfleet/hyperfleet/internal/testworld/libvirtd"
	"github.com/hyperfleet/hyperfleet/internal/testworld/mtlsproxy"
	"github.com/hyperfleet/hyperfleet/pkg/provider"
)

// probeVia probes a private libvirtd through a host whose URI is uri.
func probeVia(t *testing.T, cfg provider.ClusterConfig, s *ClusterSettings, uri string) (*provider.ClusterInfo, error) {
	t.Helper()
	s.Hosts, s.VolumePool = []Host{{Name: "remote", URI: uri}}, "none"
	cfg.Name, cfg.VMIDStart, cfg.VMIDEnd, cfg.Settings = "transport", 1, 9, s
	p, err := New(cfg, provider.Deps{Signer: testSigner(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p.Probe(t.Context())
}

// pipe copies between a and b until either side ends, then closes both.
func pipe(a, b net.Conn) {
	var wg sync.WaitGroup
	wg.Add(2)
	for _, pair := range [][2]net.Conn{{a, b}, {b, a}} {
		go func() {
			defer wg.Done()
			_, _ = io.Copy(pair[0], pair[1])
			_ = pair[0].Close()
			_ = pair[1].Close()
		}()
	}
	wg.Wait()
}

// serveTLS stands in for libvirtd's TLS listener in front of d's unix
// socket: it requires a client certificate of ca and, as libvirtd does,
// sends the byte 1 once it has checked it.
func serveTLS(t *testing.T, d *libvirtd.Daemon, ca *mtlsproxy.CA) string {
	t.Helper()
	server := ca.Issue(t, mtlsproxy.CertOptions{CommonName: "kvm1", Usage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, IPs: []net.IP{net.IPv4(127, 0, 0, 1)}})
	cert, err := tls.X509KeyPair(server.CertPEM, server.KeyPEM)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ca.PEM)
	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{cert}, ClientCAs: pool,
		ClientAuth: tls.RequireAndVerifyClientCert, MinVersion: tls.VersionTLS12})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				tc := c.(*tls.Conn)
				if tc.Handshake() != nil {
					_ = c.Close()
					return
				}
				up, err := net.Dial("unix", d.SocketPath())
				if err != nil {
					_ = c.Close()
					return
				}
				if _, err := c.Write([]byte{1}); err != nil {
					_ = c.Close()
					_ = up.Close()
					return
				}
				pipe(c, up)
			}()
		}
	}()
	return ln.Addr().String()
}

// TestTLSTransport: the provider reaches libvirtd over TLS with the
// cluster's CA bundle and client certificate; a certificate of another CA
// is refused (libvirtd's listener is stood in for by a TLS server in front
// of its socket, with libvirtd's handshake byte).
func TestTLSTransport(t *testing.T) {
	d := libvirtd.Start(t)
	ca := mtlsproxy.NewCA(t, "libvirt-ca")
	addr := serveTLS(t, d, ca)
	client := ca.Issue(t, mtlsproxy.CertOptions{CommonName: "hyperfleet"})
	uri := "qemu+tls://" + addr + "/system"
	cfg := provider.ClusterConfig{CABundle: ca.PEM, ClientCertificate: client.CertPEM, ClientKey: client.KeyPEM}
	info, err := probeVia(t, cfg, &ClusterSettings{}, uri)
	if err != nil || len(info.Nodes) != 1 || !info.Nodes[0].Online || info.Version == "" {
		t.Fatalf("Probe over TLS: %+v, %v", info, err)
	}
	stranger := mtlsproxy.NewCA(t, "other-ca").Issue(t, mtlsproxy.CertOptions{CommonName: "stranger"})
	cfg.ClientCertificate, cfg.ClientKey = stranger.CertPEM, stranger.KeyPEM
	if _, err := probeVia(t, cfg, &ClusterSettings{}, uri); !errors.Is(err, provider.ErrUnauthorized) {
		t.Errorf("Probe with a client certificate of another CA: %v, want ErrUnauthorized", err)
	}
	cfg = provider.ClusterConfig{CABundle: mtlsproxy.NewCA(t, "wrong-ca").PEM, ClientCertificate: client.CertPEM, ClientKey: client.KeyPEM}
	if _, err := probeVia(t, cfg, &ClusterSettings{}, uri); provider.ReasonOf(err) != "TLSVerificationFailed" {
		t.Errorf("Probe with another CA bundle: %v, want TLSVerificationFailed", err)
	}
}

// serveSSH is an SSH server that admits key and forwards OpenSSH's
// direct-streamlocal channels to d's socket, as sshd on a libvirt host
// does for virsh -c qemu+ssh://.
func serveSSH(t *testing.T, d *libvirtd.Daemon, key ssh.PublicKey) (addr string, hostKey ssh.PublicKey) {
	t.Helper()
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	signer, err := ssh.NewSignerFromKey(priv)
	if err != nil {
		t.Fatal(err)
	}
	cfg := &ssh.ServerConfig{PublicKeyCallback: func(_ ssh.ConnMetadata, k ssh.PublicKey) (*ssh.Permissions, error) {
		if string(k.Marshal()) != string(key.Marshal()) {
			return nil, errors.New("unknown key")
		}
		return nil, nil
	}}
	cfg.AddHostKey(signer)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go serveSSHConn(c, cfg, d.SocketPath())
		}
	}()
	return ln.Addr().String(), signer.PublicKey()
}

func serveSSHConn(c net.Conn, cfg *ssh.ServerConfig, socket string) {
	_, chans, reqs, err := ssh.NewServerConn(c, cfg)
	if err != nil {
		return
	}
	go ssh.DiscardRequests(reqs)
	for nc := range chans {
		var target struct {
			Path      string
			Reserved0 string
			Reserved1 uint32
		}
		if nc.ChannelType() != "direct-streamlocal@openssh.com" || ssh.Unmarshal(nc.ExtraData(), &target) != nil || target.Path != socket {
			_ = nc.Reject(ssh.Prohibited, "only the libvirt socket")
			continue
		}
		ch, creqs, err := nc.Accept()
		if err != nil {
			continue
		}
		go ssh.DiscardRequests(creqs)
		up, err := net.Dial("unix", socket)
		if err != nil {
			_ = ch.Close()
			continue
		}
		go func() {
			_, _ = io.Copy(ch, up)
			_ = ch.Close()
		}()
		go func() {
			_, _ = io.Copy(up, ch)
			_ = up.Close()
		}()
	}
}

// TestSSHTransport: the provider reaches libvirtd through SSH with the
// configured key, checking the host key against the configured
// known_hosts lines; an unknown host key is refused.
func TestSSHTransport(t *testing.T) {
	d := libvirtd.Start(t)
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	block, err := ssh.MarshalPrivateKey(priv, "hyperfleet")
	if err != nil {
		t.Fatal(err)
	}
	clientKey, err := ssh.NewPublicKey(priv.Public())
	if err != nil {
		t.Fatal(err)
	}
	addr, hostKey := serveSSH(t, d, clientKey)
	_, port, _ := net.SplitHostPort(addr)
	uri := "qemu+ssh://root@127.0.0.1:" + port + "/system?socket=" + d.SocketPath()
	known := knownhosts.Line([]string{"127.0.0.1:" + port}, hostKey)
	s := &ClusterSettings{SSHPrivateKey: pem.EncodeToMemory(block), SSHKnownHosts: []byte("# the host\n" + known + "\n")}
	info, err := probeVia(t, provider.ClusterConfig{}, s, uri)
	if err != nil || !info.Nodes[0].Online || info.Version == "" {
		t.Fatalf("Probe over SSH: %+v, %v", info, err)
	}
	_, other, _ := ed25519.GenerateKey(rand.Reader)
	otherKey, _ := ssh.NewPublicKey(other.Public())
	s.SSHKnownHosts = []byte(knownhosts.Line([]string{"127.0.0.1:" + strconv.Itoa(22)}, hostKey) + "\n" + knownhosts.Line([]string{"127.0.0.1:" + port}, otherKey) + "\n")
	if _, err := probeVia(t, provider.ClusterConfig{}, s, uri); !errors.Is(err, provider.ErrUnauthorized) {
		t.Errorf("Probe of a host whose key is not known: %v, want ErrUnauthorized", err)
	}
}

package libvirt

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strings"
	"time"

	"github.com/digitalocean/go-libvirt/socket"
	"golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/knownhosts"

	"github.com/hyperfleet/hyperfleet/pkg/provider"
)

// dialTimeout bounds connecting to a host.
const dialTimeout = 10 * time.Second

// defaultRemoteSocket is libvirtd's socket on a host reached over SSH.
const defaultRemoteSocket = "/var/run/libvirt/libvirt-sock"

// dialerFor returns how to reach h's libvirtd. The credentials come from
// the configuration, never from files: go-libvirt's own TLS and SSH
// dialers read theirs from the file system.
func dialerFor(h Host, cfg provider.ClusterConfig, s *ClusterSettings) (socket.Dialer, error) {
	bad := func(format string, args ...any) error {
		return provider.Errorf(provider.ClassConfiguration, "InvalidSettings", "HypervisorCluster %q: spec.libvirt.hosts[%s].uri %q: %s", cfg.Name, h.Name, h.URI, fmt.Sprintf(format, args...))
	}
	u, err := url.Parse(h.URI)
	if err != nil {
		return nil, bad("%v", err)
	}
	driver, transport, _ := strings.Cut(u.Scheme, "+")
	if driver != "qemu" || u.Path != "/system" {
		return nil, bad("only qemu:///system URIs are supported")
	}
	switch {
	case transport == "" && u.Host == "" || transport == "unix":
		path := u.Query().Get("socket")
		if path == "" {
			path = defaultRemoteSocket
		}
		return dialFunc(func() (net.Conn, error) { return net.DialTimeout("unix", path, dialTimeout) }), nil
	case transport == "tls" || transport == "" && u.Host != "":
		conf, err := tlsConfig(cfg, u.Hostname())
		if err != nil {
			return nil, bad("%v", err)
		}
		addr := net.JoinHostPort(u.Hostname(), portOr(u, "16514"))
		return dialFunc(func() (net.Conn, error) { return dialTLS(addr, conf) }), nil
	case transport == "ssh":
		conf, err := sshConfig(u, s)
		if err != nil {
			return nil, bad("%v", err)
		}
		addr := net.JoinHostPort(u.Hostname(), portOr(u, "22"))
		remote := u.Query().Get("socket")
		if remote == "" {
			remote = defaultRemoteSocket
		}
		return dialFunc(func() (net.Conn, error) { return dialSSH(addr, conf, remote) }), nil
	}
	return nil, bad("transport %q is not supported (unix, tls or ssh)", transport)
}

// dialFunc adapts a function to socket.Dialer.
type dialFunc func() (net.Conn, error)

// Dial implements socket.Dialer.
func (f dialFunc) Dial() (net.Conn, error) { return f() }

func portOr(u *url.URL, port string) string {
	if p := u.Port(); p != "" {
		return p
	}
	return port
}

// tlsConfig is the client side of libvirtd's TLS transport: the cluster's
// CA bundle verifies the host, its client certificate authenticates the
// operator (libvirtd requires one).
func tlsConfig(cfg provider.ClusterConfig, serverName string) (*tls.Config, error) {
	if len(cfg.ClientCertificate) == 0 || len(cfg.ClientKey) == 0 {
		return nil, errors.New("libvirt's TLS transport needs a client certificate and key")
	}
	cert, err := tls.X509KeyPair(cfg.ClientCertificate, cfg.ClientKey)
	if err != nil {
		return nil, fmt.Errorf("client certificate: %w", err)
	}
	conf := &tls.Config{Certificates: []tls.Certificate{cert}, ServerName: serverName, MinVersion: tls.VersionTLS12,
		InsecureSkipVerify: cfg.InsecureSkipVerify} //nolint:gosec // an explicit opt-in of the cluster's spec
	if len(cfg.CABundle) > 0 {
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(cfg.CABundle) {
			return nil, errors.New("the CA bundle holds no PEM certificate")
		}
		conf.RootCAs = pool
	}
	return conf, nil
}

// dialTLS connects and reads the byte libvirtd sends once it has checked
// the client certificate (1: accepted).
func dialTLS(addr string, conf *tls.Config) (net.Conn, error) {
	c, err := tls.DialWithDialer(&net.Dialer{Timeout: dialTimeout}, "tcp", addr, conf)
	var verify *tls.CertificateVerificationError
	if errors.As(err, &verify) {
		return nil, provider.Errorf(provider.ClassConfiguration, "TLSVerificationFailed",
			"the certificate of libvirtd at %s is not trusted: %w; set the cluster's CA bundle to the CA that signed it", addr, err)
	}
	if err != nil {
		return nil, err
	}
	_ = c.SetReadDeadline(time.Now().Add(dialTimeout))
	buf := make([]byte, 1)
	if _, err := c.Read(buf); err != nil || buf[0] != 1 {
		_ = c.Close()
		return nil, provider.Errorf(provider.ClassConfiguration, "Unauthorized",
			"libvirtd at %s refused the client certificate (spec credentials' client certificate): %w", addr, provider.ErrUnauthorized)
	}
	_ = c.SetReadDeadline(time.Time{})
	return c, nil
}

// sshConfig authenticates with the configured private key and checks the
// host key against the configured known_hosts lines.
func sshConfig(u *url.URL, s *ClusterSettings) (*ssh.ClientConfig, error) {
	if len(s.SSHPrivateKey) == 0 || len(s.SSHKnownHosts) == 0 {
		return nil, errors.New("the SSH transport needs spec.libvirt.sshPrivateKey and sshKnownHosts")
	}
	signer, err := ssh.ParsePrivateKey(s.SSHPrivateKey)
	if err != nil {
		return nil, fmt.Errorf("SSH private key: %w", err)
	}
	check, err := knownHostsCallback(s.SSHKnownHosts)
	if err != nil {
		return nil, err
	}
	user := u.User.Username()
	if user == "" {
		user = "root"
	}
	return &ssh.ClientConfig{User: user, Auth: []ssh.AuthMethod{ssh.PublicKeys(signer)}, HostKeyCallback: check, Timeout: dialTimeout}, nil
}

// knownHostsCallback checks host keys against known_hosts lines held in
// memory (knownhosts reads files only, so it gets a private copy).
func knownHostsCallback(lines []byte) (ssh.HostKeyCallback, error) {
	var keys []knownKey
	rest := lines
	for len(bytes.TrimSpace(rest)) > 0 {
		_, hosts, key, _, next, err := ssh.ParseKnownHosts(rest)
		if err != nil {
			return nil, fmt.Errorf("SSH known hosts: %w", err)
		}
		keys = append(keys, knownKey{hosts: hosts, key: key})
		rest = next
	}
	return func(hostname string, remote net.Addr, key ssh.PublicKey) error {
		for _, k := range keys {
			for _, pattern := range k.hosts {
				if (pattern == knownhosts.Normalize(hostname) || pattern == knownhosts.Normalize(remote.String())) &&
					bytes.Equal(k.key.Marshal(), key.Marshal()) {
					return nil
				}
			}
		}
		return provider.Errorf(provider.ClassConfiguration, "Unauthorized", "host key of %s is not in spec.libvirt.sshKnownHosts: %w", hostname, provider.ErrUnauthorized)
	}, nil
}

type knownKey struct {
	hosts []string
	key   ssh.PublicKey
}

// dialSSH opens an SSH connection and, through it, libvirtd's unix
// socket; closing the returned connection closes both.
func dialSSH(addr string, conf *ssh.ClientConfig, remoteSocket string) (net.Conn, error) {
	client, err := ssh.Dial("tcp", addr, conf)
	if err != nil {
		return nil, err
	}
	c, err := client.Dial("unix", remoteSocket)
	if err != nil {
		_ = client.Close()
		return nil, fmt.Errorf("open %s on %s: %w", remoteSocket, addr, err)
	}
	return &sshConn{Conn: c, client: client}, nil
}

type sshConn struct {
	net.Conn
	client *ssh.Client
}

func (c *sshConn) Close() error {
	err := c.Conn.Close()
	return errors.Join(err, c.client.Close())
}

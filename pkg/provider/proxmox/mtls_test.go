package proxmox

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/hyperfleet/hyperfleet/internal/testworld/mtlsproxy"
	"github.com/hyperfleet/hyperfleet/pkg/provider"
)

// mtlsEnv is the simulated cluster behind a real nginx that requires
// client certificates signed by clientCA.
type mtlsEnv struct {
	*env
	proxy    *mtlsproxy.Proxy
	clientCA *mtlsproxy.CA
	// cfg reaches the API through the proxy, trusting the proxy's
	// certificate, with the API token and no client certificate.
	cfg provider.ClusterConfig
}

func newMTLSEnv(t *testing.T) *mtlsEnv {
	t.Helper()
	e := newEnv(t)
	ca := mtlsproxy.NewCA(t, "operators")
	proxy := mtlsproxy.Start(t, mtlsproxy.Options{Upstream: e.srv.URL, ClientCA: ca.PEM})
	cfg := e.cfg
	cfg.Endpoint = proxy.URL + "/api2/json"
	cfg.FingerprintSHA256, cfg.CABundle = "", proxy.ServerCA
	return &mtlsEnv{env: e, proxy: proxy, clientCA: ca, cfg: cfg}
}

// with returns m.cfg presenting kp.
func (m *mtlsEnv) with(kp mtlsproxy.KeyPair) provider.ClusterConfig {
	cfg := m.cfg
	cfg.ClientCertificate, cfg.ClientKey = kp.CertPEM, kp.KeyPEM
	return cfg
}

// probe builds a provider for cfg on the real clock (the certificates'
// validity is real time) and probes the cluster.
func (m *mtlsEnv) probe(t *testing.T, cfg provider.ClusterConfig) error {
	t.Helper()
	p, err := New(cfg, provider.Deps{Signer: m.signer})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	_, err = p.Probe(context.Background())
	return err
}

// lastSerial is the client certificate serial of the proxy's latest request.
func (m *mtlsEnv) lastSerial(t *testing.T) string {
	t.Helper()
	reqs := m.proxy.Requests(t)
	if len(reqs) == 0 {
		t.Fatal("the proxy logged no request")
	}
	r := reqs[len(reqs)-1]
	if r.Verify != "SUCCESS" {
		t.Fatalf("the proxy's latest request: %+v, want a verified client certificate", r)
	}
	return r.Serial
}

// TestMutualTLSThroughNginx: a Proxmox API behind nginx with
// ssl_verify_client on is reached with the configured client certificate,
// with the API token and with a ticket login; a missing certificate or one
// from another CA is reported as ClientCertificateRefused naming the field,
// not as a rejected parameter; and a provider built with a rotated
// certificate (what the controller does when the Secret changes) presents
// the new one on its next connection.
func TestMutualTLSThroughNginx(t *testing.T) {
	m := newMTLSEnv(t)
	right := m.clientCA.Issue(t, mtlsproxy.CertOptions{CommonName: "hyperfleet-operator"})

	t.Run("token and certificate", func(t *testing.T) {
		p, err := New(m.with(right), provider.Deps{Signer: m.signer})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := p.Probe(context.Background()); err != nil {
			t.Fatalf("Probe through nginx: %v", err)
		}
		if _, err := p.ListVMs(context.Background()); err != nil {
			t.Fatalf("ListVMs through nginx: %v", err)
		}
		if got := m.lastSerial(t); got != right.Serial {
			t.Fatalf("nginx saw certificate %s, want %s", got, right.Serial)
		}
	})
	t.Run("ticket and certificate", func(t *testing.T) {
		cfg := m.with(right)
		cfg.TokenID, cfg.TokenSecret, cfg.Username, cfg.Password = "", "", opUser, opPassword
		if err := m.probe(t, cfg); err != nil {
			t.Fatalf("Probe with a ticket through nginx: %v", err)
		}
	})

	refused := func(name string, cfg provider.ClusterConfig, words string) {
		t.Run(name, func(t *testing.T) {
			err := m.probe(t, cfg)
			if provider.Classify(err) != provider.ClassConfiguration || provider.ReasonOf(err) != reasonClientCertRefused ||
				!strings.Contains(err.Error(), words) || !strings.Contains(err.Error(), "spec.credentials.clientCert") {
				t.Fatalf("Probe: %s/%s %v; want a Configuration error ClientCertificateRefused quoting %q and naming spec.credentials.clientCert",
					provider.Classify(err), provider.ReasonOf(err), err, words)
			}
			t.Logf("reported as: %v", err)
		})
	}
	refused("no certificate", m.cfg, "No required SSL certificate was sent")
	noCertTicket := m.cfg
	noCertTicket.TokenID, noCertTicket.TokenSecret, noCertTicket.Username, noCertTicket.Password = "", "", opUser, opPassword
	refused("no certificate, ticket login", noCertTicket, "No required SSL certificate was sent")
	other := mtlsproxy.NewCA(t, "someone else").Issue(t, mtlsproxy.CertOptions{CommonName: "hyperfleet-operator"})
	refused("certificate of another CA", m.with(other), "The SSL certificate error")

	t.Run("rotated certificate", func(t *testing.T) {
		if err := m.probe(t, m.with(right)); err != nil {
			t.Fatal(err)
		}
		rotated := m.clientCA.Issue(t, mtlsproxy.CertOptions{CommonName: "hyperfleet-operator"})
		if err := m.probe(t, m.with(rotated)); err != nil {
			t.Fatalf("Probe with the rotated certificate: %v", err)
		}
		if got := m.lastSerial(t); got != rotated.Serial || got == right.Serial {
			t.Fatalf("nginx saw certificate %s after the rotation, want the new %s (old %s)", got, rotated.Serial, right.Serial)
		}
	})
}

// TestClientCertificateInvalid: a certificate that cannot work is refused
// when the provider is built, before any connection, as
// InvalidClientCertificate naming the field and the fix.
func TestClientCertificateInvalid(t *testing.T) {
	e := newEnv(t)
	ca := mtlsproxy.NewCA(t, "operators")
	good := ca.Issue(t, mtlsproxy.CertOptions{CommonName: "op"})
	another := ca.Issue(t, mtlsproxy.CertOptions{CommonName: "op2"})
	now := time.Now()
	expired := ca.Issue(t, mtlsproxy.CertOptions{CommonName: "old", NotBefore: now.Add(-48 * time.Hour), NotAfter: now.Add(-time.Hour)})
	early := ca.Issue(t, mtlsproxy.CertOptions{CommonName: "new", NotBefore: now.Add(time.Hour)})
	serverOnly := ca.Issue(t, mtlsproxy.CertOptions{CommonName: "srv", Usage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}})
	for _, tc := range []struct {
		name, words string
		cert, key   []byte
	}{
		{"certificate without key", "must both be set", good.CertPEM, nil},
		{"key without certificate", "must both be set", nil, good.KeyPEM},
		{"key of another certificate", "private key does not match public key", good.CertPEM, another.KeyPEM},
		{"not PEM", "failed to find any PEM data", []byte("tls.crt"), good.KeyPEM},
		{"expired", "expired at", expired.CertPEM, expired.KeyPEM},
		{"not yet valid", "not valid before", early.CertPEM, early.KeyPEM},
		{"server-only usage", "clientAuth", serverOnly.CertPEM, serverOnly.KeyPEM},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := e.cfg
			cfg.ClientCertificate, cfg.ClientKey = tc.cert, tc.key
			_, err := New(cfg, provider.Deps{Signer: e.signer})
			if provider.Classify(err) != provider.ClassConfiguration || provider.ReasonOf(err) != reasonInvalidClientCert ||
				!strings.Contains(err.Error(), "spec.credentials.clientCert") || !strings.Contains(err.Error(), tc.words) {
				t.Fatalf("New: %s/%s %v; want a Configuration error InvalidClientCertificate naming spec.credentials.clientCert and saying %q",
					provider.Classify(err), provider.ReasonOf(err), err, tc.words)
			}
			if strings.Contains(err.Error(), "PRIVATE KEY") {
				t.Fatalf("the error quotes the key: %v", err)
			}
		})
	}
}

// TestClientCertificateRefusedByTLSAlert: a proxy that refuses the
// certificate in the handshake (a TLS alert, as HAProxy and Envoy do)
// rather than with nginx's 400 page is reported the same way.
func TestClientCertificateRefusedByTLSAlert(t *testing.T) {
	e := newEnv(t)
	trusted := mtlsproxy.NewCA(t, "operators")
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(trusted.PEM)
	srv := httptest.NewUnstartedServer(e.sim)
	srv.EnableHTTP2 = false
	srv.TLS = &tls.Config{ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: pool, MinVersion: tls.VersionTLS12}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	cfg := e.cfg
	cfg.Endpoint, cfg.FingerprintSHA256 = srv.URL+"/api2/json", fingerprint(srv)
	for name, kp := range map[string]*mtlsproxy.KeyPair{"none": nil, "another CA": ptr(mtlsproxy.NewCA(t, "other").Issue(t, mtlsproxy.CertOptions{CommonName: "op"}))} {
		t.Run(name, func(t *testing.T) {
			c := cfg
			if kp != nil {
				c.ClientCertificate, c.ClientKey = kp.CertPEM, kp.KeyPEM
			}
			p, err := New(c, provider.Deps{Signer: e.signer})
			if err != nil {
				t.Fatal(err)
			}
			_, err = p.Probe(context.Background())
			if provider.Classify(err) != provider.ClassConfiguration || provider.ReasonOf(err) != reasonClientCertRefused || !strings.Contains(err.Error(), "spec.credentials.clientCert") {
				t.Fatalf("Probe: %s/%s %v; want a Configuration error ClientCertificateRefused", provider.Classify(err), provider.ReasonOf(err), err)
			}
			t.Logf("reported as: %v", err)
		})
	}
	ok := trusted.Issue(t, mtlsproxy.CertOptions{CommonName: "op"})
	c := cfg
	c.ClientCertificate, c.ClientKey = ok.CertPEM, ok.KeyPEM
	p, err := New(c, provider.Deps{Signer: e.signer})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.Probe(context.Background()); err != nil {
		t.Fatalf("Probe with a trusted certificate: %v", err)
	}
}

func ptr[T any](v T) *T { return &v }

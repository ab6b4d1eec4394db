package webhook

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/hyperfleet/hyperfleet/pkg/workload/github"
)

// writeCert writes a self-signed certificate for 127.0.0.1 and its key.
func writeCert(t *testing.T, dir string) (certFile, keyFile string, cert *x509.Certificate) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()),
		Subject:      pkix.Name{CommonName: "hyperfleet-webhook"},
		IPAddresses:  []net.IP{net.ParseIP("127.0.0.1")},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ = x509.ParseCertificate(der)
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile = filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), 0o600); err != nil {
		t.Fatal(err)
	}
	return certFile, keyFile, cert
}

func TestServer(t *testing.T) {
	certFile, keyFile, cert := writeCert(t, t.TempDir())
	rec := newFakeRecorder()
	r, err := NewReceiver(Options{Parser: github.WebhookParser{Secret: testSecret}, Router: routeTo("team", "gpu"), Recorder: rec})
	if err != nil {
		t.Fatal(err)
	}
	srv, err := NewServer(ServerOptions{Addr: "127.0.0.1:0", CertFile: certFile, KeyFile: keyFile, Receiver: r})
	if err != nil {
		t.Fatal(err)
	}
	if srv.NeedLeaderElection() {
		t.Fatal("the webhook server must run on every replica")
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Start(ctx) }()
	defer func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Start: %v", err)
			}
		case <-time.After(20 * time.Second):
			t.Error("the server did not stop")
		}
	}()
	<-srv.Ready()
	if srv.Addr() == nil {
		t.Fatal("not listening")
	}
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	url := "https://" + srv.Addr().String()

	body := jobBody(77, "queued")
	req, _ := http.NewRequest(http.MethodPost, url+Path, bytes.NewReader(body))
	req.Header = delivery("srv-1", "workflow_job", body).Header
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	msg, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusAccepted {
		t.Fatalf("status %d: %s", resp.StatusCode, msg)
	}
	if got := rec.wait(t); got.ev.Job.ID != 77 {
		t.Fatalf("recorded %+v", got)
	}

	resp, err = c.Get(url + "/elsewhere")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound {
		t.Fatalf("other path: %d", resp.StatusCode)
	}

	// Plain HTTP is not served.
	plain := &http.Client{Timeout: 5 * time.Second}
	if resp, err := plain.Get("http://" + srv.Addr().String() + Path); err == nil {
		resp.Body.Close()
		if resp.StatusCode < 400 {
			t.Fatalf("plain HTTP answered %d", resp.StatusCode)
		}
	}
}

func TestServerBadCert(t *testing.T) {
	r, err := NewReceiver(Options{Parser: github.WebhookParser{Secret: testSecret}, Router: routeTo("a", "b"), Recorder: newFakeRecorder()})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	srv, err := NewServer(ServerOptions{Addr: "127.0.0.1:0", CertFile: filepath.Join(dir, "none.crt"), KeyFile: filepath.Join(dir, "none.key"), Receiver: r})
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Start(context.Background()); err == nil {
		t.Fatal("started without a certificate")
	}
	if _, err := NewServer(ServerOptions{Addr: ":0"}); err == nil {
		t.Fatal("NewServer accepted missing options")
	}
}

func TestReadSecretFile(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "secret")
	if err := os.WriteFile(p, []byte("hunter2\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	b, err := ReadSecretFile(p)
	if err != nil || string(b) != "hunter2" {
		t.Fatalf("ReadSecretFile = %q, %v", b, err)
	}
	if err := os.WriteFile(p, []byte("\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadSecretFile(p); err == nil {
		t.Fatal("an empty secret was accepted")
	}
	if _, err := ReadSecretFile(filepath.Join(dir, "missing")); err == nil {
		t.Fatal("a missing file was accepted")
	}
}

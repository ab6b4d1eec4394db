package webhook

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/hyperfleet/hyperfleet/internal/selfsigned"
	"github.com/hyperfleet/hyperfleet/pkg/workload/github"
)

// writeCert writes a certificate for 127.0.0.1 to dir/tls.crt and
// dir/tls.key and returns a pool that trusts it.
func writeCert(t *testing.T, dir string) (certFile, keyFile string, roots *x509.CertPool) {
	t.Helper()
	c, err := selfsigned.NewWith(selfsigned.Options{CommonName: "hyperfleet-webhook", Hosts: []string{"127.0.0.1"}})
	if err != nil {
		t.Fatal(err)
	}
	if certFile, keyFile, _, err = c.WriteDir(dir); err != nil {
		t.Fatal(err)
	}
	return certFile, keyFile, c.Pool()
}

func TestServer(t *testing.T) {
	certFile, keyFile, pool := writeCert(t, t.TempDir())
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

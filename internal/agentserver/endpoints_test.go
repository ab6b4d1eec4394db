package agentserver

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hyperfleet/hyperfleet/internal/agentconfig"
	"github.com/hyperfleet/hyperfleet/internal/httpsserver"
)

// startTLS runs a Server from opts (a linux-amd64 binary of size bytes in
// a fresh directory) as the manager does, until the test ends, and returns
// it with a TLS config that trusts it.
func startTLS(t *testing.T, opts Options, size int) (*Server, *tls.Config) {
	t.Helper()
	opts.Dir = t.TempDir()
	writeBinary(t, opts.Dir, "hyperfleet-agent-linux-amd64", size)
	certFile, keyFile, _, caPEM := writeTLS(t)
	opts.URL, opts.Addr, opts.CertFile, opts.KeyFile = "https://127.0.0.1:9443", "127.0.0.1:0", certFile, keyFile
	s, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Start(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Start: %v", err)
		}
	})
	select {
	case <-s.Ready():
	case <-time.After(10 * time.Second):
		t.Fatal("the server did not become ready")
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(caPEM)
	return s, &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12, ServerName: "127.0.0.1"}
}

// countingHandler answers 200 and counts its requests.
type countingHandler struct{ calls atomic.Int64 }

func (h *countingHandler) ServeHTTP(w http.ResponseWriter, _ *http.Request) {
	h.calls.Add(1)
	_, _ = io.WriteString(w, "{}")
}

// headOnly sends a request line and headers declaring a body that never
// comes, and returns what the server answers before it closes the
// connection (within a minute: the server waits 5 s for headers, its read
// timeout is 10 s, so only an answer that does not wait for the body
// comes with a close before that).
func headOnly(t *testing.T, addr string, cfg *tls.Config, method, path string) (answer string, closed bool) {
	t.Helper()
	conn, err := tls.Dial("tcp", addr, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprintf(conn, "%s %s HTTP/1.1\r\nHost: agent\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{\"sp", method, path)
	_ = conn.SetReadDeadline(time.Now().Add(time.Minute))
	b, err := io.ReadAll(conn)
	return string(b), err == nil
}

// TestEndpointsOnlyWhenConfigured: the credential broker and the TPM
// enrollment are served only while a HypervisorCluster configures what
// they serve (BrokerServed, TPMServed, which the manager keeps from the
// clusters): while not, a request to them is answered 404 and its
// connection closed at once, its handler never called and its body never
// read. Before, both were mounted whenever the agent server ran, and
// every forged enrollment reached the enrollment's handler.
func TestEndpointsOnlyWhenConfigured(t *testing.T) {
	var brokerOn, tpmOn atomic.Bool
	broker, enroll := &countingHandler{}, &countingHandler{}
	s, cfg := startTLS(t, Options{
		Broker: broker, TPMEnrollment: enroll,
		BrokerServed: brokerOn.Load, TPMServed: tpmOn.Load,
	}, 4096)
	addr := s.Addr().String()
	for _, path := range []string{BrokerPath, agentconfig.TPMEnrollPath, agentconfig.TPMActivatePath} {
		got, closed := headOnly(t, addr, cfg, http.MethodPost, path)
		if !closed || !strings.HasPrefix(got, "HTTP/1.1 404 ") {
			t.Errorf("POST %s with nothing configured: %q (closed %v), want 404 and a close", path, got, closed)
		}
	}
	if broker.calls.Load() != 0 || enroll.calls.Load() != 0 {
		t.Fatalf("unconfigured endpoints were served: broker %d, enrollment %d", broker.calls.Load(), enroll.calls.Load())
	}
	// A later request on a kept-alive connection is refused the same way.
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: cfg}}
	for range 2 {
		resp, err := client.Post("https://"+addr+agentconfig.TPMEnrollPath, "application/json", strings.NewReader("{}"))
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusNotFound {
			t.Errorf("POST %s: %s, want 404", agentconfig.TPMEnrollPath, resp.Status)
		}
	}

	// Configured: served.
	brokerOn.Store(true)
	tpmOn.Store(true)
	for _, path := range []string{BrokerPath, agentconfig.TPMEnrollPath} {
		resp, err := client.Post("https://"+addr+path, "application/json", strings.NewReader("{}"))
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Errorf("POST %s once configured: %s", path, resp.Status)
		}
	}
	if broker.calls.Load() != 1 || enroll.calls.Load() != 1 {
		t.Errorf("configured endpoints: broker %d, enrollment %d calls; want 1 each", broker.calls.Load(), enroll.calls.Load())
	}
}

// TestUnknownPathsDroppedAtTheRequestLine: a request for nothing the
// server serves is answered 404 and closed at its request line; the same
// headers for a binary are read and served.
func TestUnknownPathsDroppedAtTheRequestLine(t *testing.T) {
	s, cfg := startTLS(t, Options{PowerOff: &fakeReceiver{}}, 4096)
	addr := s.Addr().String()
	for _, path := range []string{"/", "/admin", "/broker/v1/credential", "/tpm/v1/enroll", "/hints/v2/x", "/agent"} {
		conn, err := tls.Dial("tcp", addr, cfg)
		if err != nil {
			t.Fatal(err)
		}
		// The request line alone: no header follows.
		fmt.Fprintf(conn, "POST %s HTTP/1.1\r\n", path)
		_ = conn.SetReadDeadline(time.Now().Add(time.Minute))
		b, err := io.ReadAll(conn)
		_ = conn.Close()
		if err != nil || !strings.HasPrefix(string(b), "HTTP/1.1 404 ") {
			t.Errorf("POST %s: %q (%v), want 404 and a close at the request line", path, b, err)
		}
	}
}

// TestDownloadTimeout: a download is cut after DownloadTimeout however
// steadily its client reads (before, a client reading a little every
// 25 s kept its download, and its connection, for hours);
// DownloadTimeout's default gives the binary 128 KiB/s.
func TestDownloadTimeout(t *testing.T) {
	const size = 32 << 20
	s, cfg := startTLS(t, Options{DownloadTimeout: time.Second, StallTimeout: time.Minute}, size)
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: cfg}}
	resp, err := client.Get("https://" + s.Addr().String() + PathPrefix + "hyperfleet-agent-linux-amd64")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	// 64 KiB every 20 ms: the whole would take about 10 s.
	buf := make([]byte, 64<<10)
	var n int
	for {
		k, err := io.ReadFull(resp.Body, buf)
		n += k
		if err != nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if n >= size {
		t.Fatalf("a steadily reading client got all %d bytes of a download bounded to 1 s", n)
	}

	d, err := New(Options{Dir: s.opts.Dir, URL: "https://127.0.0.1:9443"})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if got, want := d.DownloadTimeout(), 30*time.Second+256*time.Second; got != want {
		t.Errorf("the default for a 32 MiB binary: %s, want %s", got, want)
	}
}

// TestClassify: downloads are general; the broker, the enrollment (while
// served) and the hints reserved; anything else unknown.
func TestClassify(t *testing.T) {
	on := true
	s, _, _ := newTestServer(t, Options{Broker: &countingHandler{}, TPMEnrollment: &countingHandler{}, PowerOff: &fakeReceiver{},
		BrokerServed: func() bool { return on }})
	for path, want := range map[string]httpsserver.RequestClass{
		PathPrefix + "hyperfleet-agent-linux-amd64":        httpsserver.RequestGeneral,
		PathPrefix + "hyperfleet-agent-linux-amd64.sha256": httpsserver.RequestGeneral,
		BrokerPath:                      httpsserver.RequestReserved,
		agentconfig.TPMEnrollPath:       httpsserver.RequestReserved,
		agentconfig.TPMActivatePath:     httpsserver.RequestReserved,
		PowerOffPath + "/ci/r/u":        httpsserver.RequestReserved,
		ReadyPath + "/ci/r/u":           httpsserver.RequestReserved,
		PowerOffPath:                    httpsserver.RequestReserved,
		"/":                             httpsserver.RequestUnknown,
		"/agent/v2/x":                   httpsserver.RequestUnknown,
		BrokerPath + "/x":               httpsserver.RequestUnknown,
		agentconfig.TPMEnrollPath + "x": httpsserver.RequestUnknown,
	} {
		if got := s.Classify(http.MethodPost, path); got != want {
			t.Errorf("Classify(%s) = %v, want %v", path, got, want)
		}
	}
	on = false
	if got := s.Classify(http.MethodPost, BrokerPath); got != httpsserver.RequestUnknown {
		t.Errorf("Classify(%s) with no broker served = %v, want unknown", BrokerPath, got)
	}
}

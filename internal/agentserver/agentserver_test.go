package agentserver

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hyperfleet/hyperfleet/internal/selfsigned"
)

// writeBinary writes a stand-in agent binary and returns its bytes.
func writeBinary(t *testing.T, dir, name string, size int) []byte {
	t.Helper()
	b := make([]byte, size)
	for i := range b {
		b[i] = byte(i*7 + len(name))
	}
	copy(b, "\x7fELF stand-in for "+name)
	if err := os.WriteFile(filepath.Join(dir, name), b, 0o755); err != nil {
		t.Fatal(err)
	}
	return b
}

func sum(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// newTestServer serves a directory with a linux-amd64 binary (and a file
// that is not a binary) through httptest.
func newTestServer(t *testing.T, opts Options) (*Server, *httptest.Server, []byte) {
	t.Helper()
	if opts.Dir == "" {
		opts.Dir = t.TempDir()
	}
	bin := writeBinary(t, opts.Dir, "hyperfleet-agent-linux-amd64", 300<<10)
	if err := os.WriteFile(filepath.Join(opts.Dir, "README"), []byte("not a binary"), 0o644); err != nil {
		t.Fatal(err)
	}
	if opts.URL == "" {
		opts.URL = "https://hyperfleet-agent.hyperfleet-system.svc:9443"
	}
	s, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	ts := httptest.NewServer(s.Handler())
	t.Cleanup(ts.Close)
	return s, ts, bin
}

func get(t *testing.T, method, url string) (*http.Response, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, body
}

func TestServesBinaryAndChecksum(t *testing.T) {
	_, ts, bin := newTestServer(t, Options{})
	name := "hyperfleet-agent-linux-amd64"

	resp, body := get(t, http.MethodGet, ts.URL+PathPrefix+name)
	if resp.StatusCode != http.StatusOK || string(body) != string(bin) {
		t.Fatalf("GET binary: %s, %d bytes (want %d)", resp.Status, len(body), len(bin))
	}
	if ct := resp.Header.Get("Content-Type"); ct != "application/octet-stream" {
		t.Errorf("Content-Type = %q", ct)
	}
	if cl := resp.Header.Get("Content-Length"); cl != strconv.Itoa(len(bin)) {
		t.Errorf("Content-Length = %q, want %d", cl, len(bin))
	}

	resp, body = get(t, http.MethodGet, ts.URL+PathPrefix+name+ChecksumSuffix)
	if want := sum(bin) + "  " + name + "\n"; resp.StatusCode != http.StatusOK || string(body) != want {
		t.Fatalf("GET checksum: %s %q, want %q", resp.Status, body, want)
	}
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/plain") {
		t.Errorf("checksum Content-Type = %q", ct)
	}

	// The URL Lookup hands out, with its checksum, serves the same bytes.
	resp, body = get(t, http.MethodGet, ts.URL+PathPrefix+name+"?sha256="+sum(bin))
	if resp.StatusCode != http.StatusOK || string(body) != string(bin) {
		t.Fatalf("GET with the matching checksum: %s", resp.Status)
	}
}

func TestHead(t *testing.T) {
	_, ts, bin := newTestServer(t, Options{})
	for _, path := range []string{"hyperfleet-agent-linux-amd64", "hyperfleet-agent-linux-amd64.sha256"} {
		resp, body := get(t, http.MethodHead, ts.URL+PathPrefix+path)
		if resp.StatusCode != http.StatusOK || len(body) != 0 {
			t.Errorf("HEAD %s: %s with %d body bytes", path, resp.Status, len(body))
		}
		want := int64(len(bin))
		if strings.HasSuffix(path, ChecksumSuffix) {
			want = int64(64 + 2 + len("hyperfleet-agent-linux-amd64") + 1)
		}
		if resp.ContentLength != want {
			t.Errorf("HEAD %s: Content-Length %d, want %d", path, resp.ContentLength, want)
		}
	}
}

func TestNotFoundAndRefusals(t *testing.T) {
	_, ts, bin := newTestServer(t, Options{})
	for _, path := range []string{
		PathPrefix + "hyperfleet-agent-linux-arm64", // not in the directory
		PathPrefix + "README",                       // in the directory, not a binary
		PathPrefix + "hyperfleet-agent-linux-amd64.sha512",
		PathPrefix,
		"/",
		"/hyperfleet-agent-linux-amd64",
	} {
		resp, body := get(t, http.MethodGet, ts.URL+path)
		if resp.StatusCode != http.StatusNotFound {
			t.Errorf("GET %s: %s, want 404", path, resp.Status)
			continue
		}
		for _, want := range []string{"--agent-binaries-dir", PathPrefix + "hyperfleet-agent-linux-amd64", "linux-arm64"} {
			if !strings.Contains(string(body), want) {
				t.Errorf("GET %s: the 404 message %q does not mention %q", path, body, want)
			}
		}
	}

	resp, _ := get(t, http.MethodPost, ts.URL+PathPrefix+"hyperfleet-agent-linux-amd64")
	if resp.StatusCode != http.StatusMethodNotAllowed || resp.Header.Get("Allow") != "GET, HEAD" {
		t.Errorf("POST: %s, Allow %q", resp.Status, resp.Header.Get("Allow"))
	}

	// A URL handed out for another build (another replica's) is refused
	// with a status curl --retry retries.
	other := strings.Repeat("0", 64)
	resp, body := get(t, http.MethodGet, ts.URL+PathPrefix+"hyperfleet-agent-linux-amd64?sha256="+other)
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" ||
		!strings.Contains(string(body), other) || !strings.Contains(string(body), sum(bin)) {
		t.Errorf("GET with another checksum: %s, Retry-After %q, %q", resp.Status, resp.Header.Get("Retry-After"), body)
	}
}

func TestLookup(t *testing.T) {
	dir := t.TempDir()
	arm := writeBinary(t, dir, "hyperfleet-agent-linux-arm64", 1000)
	s, _, amd := newTestServer(t, Options{Dir: dir, URL: "https://agents.example.com:9443/hyperfleet/"})
	cases := []struct {
		os, arch string
		file     string
		content  []byte
	}{
		{"linux", "x64", "hyperfleet-agent-linux-amd64", amd},
		{"linux", "arm64", "hyperfleet-agent-linux-arm64", arm},
		{"linux", "arm", "", nil},
		{"win", "x64", "", nil},
		{"osx", "arm64", "", nil},
		{"linux", "amd64", "", nil}, // Go's naming is not the runner's
	}
	for _, tc := range cases {
		url, sha, ok := s.Lookup(tc.os, tc.arch)
		if tc.file == "" {
			if ok {
				t.Errorf("Lookup(%s, %s) = %s, want none", tc.os, tc.arch, url)
			}
			continue
		}
		wantURL := "https://agents.example.com:9443/hyperfleet/agent/v1/" + tc.file + "?sha256=" + sum(tc.content)
		if !ok || url != wantURL || sha != sum(tc.content) {
			t.Errorf("Lookup(%s, %s) = %s %s %v, want %s", tc.os, tc.arch, url, sha, ok, wantURL)
		}
	}
	if got := s.Binaries(); strings.Join(got, ",") != "hyperfleet-agent-linux-amd64,hyperfleet-agent-linux-arm64" {
		t.Errorf("Binaries() = %v", got)
	}
	if s.CA() != "" {
		t.Errorf("CA() = %q without a CA file", s.CA())
	}

	if _, err := FileName("win", "x64"); err == nil || !strings.Contains(err.Error(), "linux/x64 and linux/arm64") {
		t.Errorf("FileName(win, x64) error = %v", err)
	}
}

// TestServesWhatItHashed: a binary replaced by rename (a new image, a
// volume update) is still served in the version whose checksum VMs got.
func TestServesWhatItHashed(t *testing.T) {
	dir := t.TempDir()
	s, ts, bin := newTestServer(t, Options{Dir: dir})
	newer := filepath.Join(dir, ".new")
	if err := os.WriteFile(newer, []byte("another build"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(newer, filepath.Join(dir, "hyperfleet-agent-linux-amd64")); err != nil {
		t.Fatal(err)
	}
	_, body := get(t, http.MethodGet, ts.URL+PathPrefix+"hyperfleet-agent-linux-amd64")
	if string(body) != string(bin) {
		t.Errorf("after a rename over the binary the server serves %d other bytes", len(body))
	}
	if _, sha, _ := s.Lookup("linux", "x64"); sha != sum(bin) {
		t.Errorf("Lookup's checksum changed to %s", sha)
	}
}

func TestNewRejectsBadOptions(t *testing.T) {
	empty := t.TempDir()
	withBin := t.TempDir()
	writeBinary(t, withBin, "hyperfleet-agent-linux-amd64", 10)
	notPEM := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(notPEM, []byte("not a certificate"), 0o644); err != nil {
		t.Fatal(err)
	}
	url := "https://hyperfleet-agent.hyperfleet-system.svc:9443"
	cases := []struct {
		name string
		opts Options
		want string
	}{
		{"no dir", Options{URL: url}, "binaries directory is required"},
		{"empty dir", Options{Dir: empty, URL: url}, "hyperfleet-agent-linux-amd64, hyperfleet-agent-linux-arm64"},
		{"missing dir", Options{Dir: filepath.Join(empty, "absent"), URL: url}, "holds no agent binary"},
		{"http url", Options{Dir: withBin, URL: "http://hyperfleet-agent:9443"}, "must be an https:// URL"},
		{"no url", Options{Dir: withBin}, "must be an https:// URL"},
		{"url with query", Options{Dir: withBin, URL: url + "/?x=1"}, "without query"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s, err := New(tc.opts)
			if err == nil {
				s.Close()
				t.Fatalf("New accepted %+v", tc.opts)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q does not say %q", err, tc.want)
			}
		})
	}
}

// TestCAFileIsWaitedFor: a CA file that is missing, or holds no
// certificate, does not stop the server (nor, through it, the manager):
// CAError and the readiness check say why, CA is empty, and once the file
// holds a certificate the running server reads it.
func TestCAFileIsWaitedFor(t *testing.T) {
	dir := t.TempDir()
	writeBinary(t, dir, "hyperfleet-agent-linux-amd64", 10)
	certFile, keyFile, caFile, caPEM := writeTLS(t)
	pending := filepath.Join(t.TempDir(), "ca.crt")
	if err := os.WriteFile(pending, []byte("not a certificate"), 0o644); err != nil {
		t.Fatal(err)
	}
	s, err := New(Options{Dir: dir, URL: "https://127.0.0.1:9443", CAFile: pending, Addr: "127.0.0.1:0", CertFile: certFile, KeyFile: keyFile})
	if err != nil {
		t.Fatalf("New with a CA file that holds no certificate yet: %v", err)
	}
	for _, err := range []error{s.CAError(), s.Check(nil)} {
		if err == nil || !strings.Contains(err.Error(), "waits for the CA file") || !strings.Contains(err.Error(), "holds no PEM CERTIFICATE block") {
			t.Fatalf("error %v, want one saying the server waits for its CA file, and why", err)
		}
	}
	if s.CA() != "" {
		t.Fatalf("CA() = %q before the CA file holds one", s.CA())
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Start(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Start returned %v", err)
		}
	}()
	b, err := os.ReadFile(caFile)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(pending+".tmp", b, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(pending+".tmp", pending); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for s.CAError() != nil || s.Check(nil) != nil {
		if time.Now().After(deadline) {
			t.Fatalf("30 s after the CA file holds a certificate: CAError %v, Check %v", s.CAError(), s.Check(nil))
		}
		time.Sleep(20 * time.Millisecond)
	}
	if strings.TrimSpace(s.CA()) != strings.TrimSpace(string(caPEM)) {
		t.Fatalf("CA() = %q, want the CA file", s.CA())
	}
}

// writeTLS writes a serving certificate for 127.0.0.1 signed by a fresh CA
// and returns the files and the CA's PEM.
func writeTLS(t *testing.T) (certFile, keyFile, caFile string, caPEM []byte) {
	t.Helper()
	c, err := selfsigned.New("127.0.0.1", "localhost")
	if err != nil {
		t.Fatal(err)
	}
	if certFile, keyFile, caFile, err = c.WriteDir(t.TempDir()); err != nil {
		t.Fatal(err)
	}
	return certFile, keyFile, caFile, c.CAPEM
}

// TestStartServesTLS runs the server as the manager does.
func TestStartServesTLS(t *testing.T) {
	dir := t.TempDir()
	bin := writeBinary(t, dir, "hyperfleet-agent-linux-arm64", 4096)
	certFile, keyFile, caFile, caPEM := writeTLS(t)
	s, err := New(Options{Dir: dir, URL: "https://127.0.0.1:9443", CAFile: caFile, Addr: "127.0.0.1:0", CertFile: certFile, KeyFile: keyFile})
	if err != nil {
		t.Fatal(err)
	}
	if s.NeedLeaderElection() {
		t.Error("the agent server must run on every replica")
	}
	if strings.TrimSpace(s.CA()) != strings.TrimSpace(string(caPEM)) {
		t.Errorf("CA() = %q, want the CA file", s.CA())
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Start(ctx) }()
	defer func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Start returned %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Error("Start did not return after its context ended")
		}
	}()
	select {
	case <-s.Ready():
	case <-time.After(10 * time.Second):
		t.Fatal("the server did not become ready")
	}
	if s.Addr() == nil {
		t.Fatal("no listen address after Ready")
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM([]byte(s.CA()))
	c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}}}
	resp, err := c.Get("https://" + s.Addr().String() + PathPrefix + "hyperfleet-agent-linux-arm64")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK || string(body) != string(bin) {
		t.Errorf("GET over TLS: %s, %d bytes", resp.Status, len(body))
	}
}

func TestStartNeedsTLSFiles(t *testing.T) {
	dir := t.TempDir()
	writeBinary(t, dir, "hyperfleet-agent-linux-amd64", 10)
	s, err := New(Options{Dir: dir, URL: "https://127.0.0.1:9443", Addr: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(context.Background()); err == nil || !strings.Contains(err.Error(), "certificate file and key file are required") {
		t.Errorf("Start without certificate: %v", err)
	}
	select {
	case <-s.Ready():
	default:
		t.Error("Ready stays open after a failed Start")
	}
}

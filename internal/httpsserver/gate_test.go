package httpsserver

import (
	"bufio"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/hyperfleet/hyperfleet/internal/selfsigned"
)

// classifyForTest serves /download (general) and /proof (reserved).
func classifyForTest(_, path string) RequestClass {
	switch path {
	case "/download":
		return RequestGeneral
	case "/proof":
		return RequestReserved
	}
	return RequestUnknown
}

// answerOf reads what the server sends on c until it closes it, or until
// the deadline (a minute: the servers here wait that long for headers, so
// only an answer that comes without them comes before).
func answerOf(t *testing.T, c net.Conn) (answer string, closed bool) {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(time.Minute))
	b, err := io.ReadAll(c)
	return string(b), err == nil
}

// TestGateDropsUnknownClientsAtTheRequestLine: a connection whose first
// request line asks for nothing the server serves is answered 404 and
// closed at that line, without waiting for (or reading) its headers,
// which never come here; before the gate the server waited for them for
// its ReadHeaderTimeout (a minute here). Known requests are served as
// before, over keep-alive, with the TLS state (the client's certificate)
// in the handler's request.
func TestGateDropsUnknownClientsAtTheRequestLine(t *testing.T) {
	var sawPeer atomic.Value
	addr, tlsConfig := startGated(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.TLS != nil && r.TLS.HandshakeComplete && len(r.TLS.PeerCertificates) > 0 {
			sawPeer.Store(r.TLS.PeerCertificates[0].Subject.CommonName)
		}
		_, _ = io.WriteString(w, "served "+r.URL.Path)
	}), Limits{}, classifyForTest, func(srv *http.Server) {
		srv.ReadHeaderTimeout = time.Minute
		srv.TLSConfig = &tls.Config{ClientAuth: tls.RequestClientCert}
	})
	for _, line := range []string{
		"GET /unknown HTTP/1.1\r\n",
		"POST /proof/../unknown HTTP/1.1\r\n",
		"GET http://elsewhere.example/ HTTP/1.1\r\n",
		"nonsense\r\n",
		"GET / HTTP/1.1\r\n",
	} {
		conn, err := tls.Dial("tcp", addr, tlsConfig)
		if err != nil {
			t.Fatal(err)
		}
		// The request line alone: headers never follow.
		if _, err := io.WriteString(conn, line); err != nil {
			t.Fatal(err)
		}
		got, closed := answerOf(t, conn)
		_ = conn.Close()
		if !closed || !strings.HasPrefix(got, "HTTP/1.1 404 ") && !strings.HasPrefix(got, "HTTP/1.1 400 ") || !strings.Contains(got, "Connection: close") {
			t.Errorf("%q: answered %q (closed %v), want 404 or 400 and a close at the request line", line, got, closed)
		}
	}

	// A known request, twice on one connection, with a client certificate.
	cert, err := selfsigned.New("client")
	if err != nil {
		t.Fatal(err)
	}
	cfg := tlsConfig.Clone()
	cfg.Certificates = []tls.Certificate{cert.TLS}
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: cfg}}
	for range 2 {
		resp, err := client.Get("https://" + addr + "/download")
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusOK || string(body) != "served /download" {
			t.Fatalf("GET /download: %s %q", resp.Status, body)
		}
	}
	if got := sawPeer.Load(); got != cert.Leaf.Subject.CommonName {
		t.Errorf("the handler's request had client certificate %v in its TLS state, want %q", got, cert.Leaf.Subject.CommonName)
	}
}

// TestReservedConnections: once the general connections are held
// (downloads that take long), new connections go to the reserve, which
// serves reserved requests (the broker's, the enrollment's) only, one per
// connection, and of which one address holds at most its share: a held
// download cap does not keep a new VM from its credential. Before the
// reserve the same connection carried another download, and the cap held
// by one address's downloads refused the rest.
func TestReservedConnections(t *testing.T) {
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	server := "test-" + t.Name()
	addr, tlsConfig := startGated(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/download" {
			w.WriteHeader(http.StatusOK)
			_ = http.NewResponseController(w).Flush()
			<-release // a download in progress
			return
		}
		_, _ = io.WriteString(w, "served "+r.URL.Path)
	}), Limits{MaxConns: 4, MaxConnsPerAddress: 4, Reserved: 2, ReservedPerAddress: 1}, classifyForTest, nil)
	dialTLS := func(src string) *tls.Conn {
		t.Helper()
		c := tls.Client(dialFrom(t, src, addr), tlsConfig)
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		if err := c.Handshake(); err != nil {
			t.Fatalf("handshake from %s: %v", src, err)
		}
		return c
	}
	request := func(c *tls.Conn, method, path string) *http.Response {
		t.Helper()
		if _, err := fmt.Fprintf(c, "%s %s HTTP/1.1\r\nHost: test\r\nContent-Length: 0\r\n\r\n", method, path); err != nil {
			t.Fatal(err)
		}
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatalf("%s %s: %v", method, path, err)
		}
		return resp
	}
	// Two downloads from 127.0.0.2 hold the general connections.
	for range 2 {
		if resp := request(dialTLS("127.0.0.2"), http.MethodGet, "/download"); resp.StatusCode != http.StatusOK {
			t.Fatalf("a download: %s", resp.Status)
		}
	}
	// Another download, from 127.0.0.3, comes in over the reserve: 503,
	// retry, and closed.
	c := dialTLS("127.0.0.3")
	resp := request(c, http.MethodGet, "/download")
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("a download over the reserve: %s, Retry-After %q; want 503 with Retry-After", resp.Status, resp.Header.Get("Retry-After"))
	}
	if !refusedAtOnce(c) {
		t.Error("a download over the reserve left its connection open")
	}
	// The server gives the place back once it closed its side, a moment
	// after the client read the close (TLS's close_notify comes first): a
	// VM retries after Retry-After, the test once the place is free.
	open := connectionsOpen.WithLabelValues(server)
	for deadline := time.Now().Add(10 * time.Second); testutil.ToFloat64(open) != 2; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%v connections open after the refused one closed; want the 2 downloads", testutil.ToFloat64(open))
		}
	}
	// 127.0.0.3 holds a reserved connection: its next one is refused at
	// once, while 127.0.0.4's reserved request is served, once.
	idle := dialTLS("127.0.0.3")
	defer idle.Close()
	before := testutil.ToFloat64(connectionsRefused.WithLabelValues(server, ReasonReservedPerAddress))
	if !refusedAtOnce(dialFrom(t, "127.0.0.3", addr)) {
		t.Error("a second reserved connection from 127.0.0.3 was admitted")
	}
	if got := testutil.ToFloat64(connectionsRefused.WithLabelValues(server, ReasonReservedPerAddress)); got != before+1 {
		t.Errorf("reserved_per_address refusals %v, want %v", got, before+1)
	}
	c = dialTLS("127.0.0.4")
	resp = request(c, http.MethodPost, "/proof")
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK || string(body) != "served /proof" || !resp.Close {
		t.Errorf("a reserved request over the reserve: %s %q, close %v; want 200 and a close", resp.Status, body, resp.Close)
	}
}

// TestStallWriterUntil: a download whose client keeps reading, if slowly,
// so that no write ever stalls, is still cut at its end: before, each
// write moved the deadline on, and such a download held its connection
// for as long as the client liked.
func TestStallWriterUntil(t *testing.T) {
	const size = 32 << 20
	chunk := make([]byte, 32<<10)
	addr, tlsConfig := startServer(t, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		sw := NewStallWriter(w, time.Minute).Until(time.Now().Add(time.Second))
		for sent := 0; sent < size; sent += len(chunk) {
			if _, err := sw.Write(chunk); err != nil {
				return
			}
		}
	}), Limits{}, func(srv *http.Server) { srv.WriteTimeout = 10 * time.Minute })
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: tlsConfig}}
	resp, err := client.Get("https://" + addr + "/")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	// 64 KiB every 20 ms, about 3 MiB/s: the whole would take 10 s.
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
		t.Fatalf("a slow reader got all %d bytes of a download bounded to 1 s", n)
	}
}

// TestRefusalLog: a flood of refusals logs each at debug level and one
// Info line per 10 s, saying how many were refused since the last, by
// reason.
func TestRefusalLog(t *testing.T) {
	var info, debug []string
	log := funcr.NewJSON(func(obj string) {
		if strings.Contains(obj, `"level":0`) {
			info = append(info, obj)
		} else {
			debug = append(debug, obj)
		}
	}, funcr.Options{Verbosity: 1})
	now := time.Unix(1_700_000_000, 0)
	l := &RefusalLog{Message: "Refused requests", now: func() time.Time { return now }}
	for i := range 3000 {
		reason := "BadProof"
		if i%3 == 0 {
			reason = "NoProof"
		}
		l.Refused(log, reason, "Refused a request", "remote", "192.0.2.1:1234")
	}
	if len(debug) != 3000 || len(info) != 1 {
		t.Fatalf("3000 refusals: %d debug lines, %d Info lines; want 3000 and 1", len(debug), len(info))
	}
	now = now.Add(10 * time.Second)
	l.Refused(log, "BadProof", "Refused a request")
	if len(info) != 2 || !strings.Contains(info[1], `"refusedSinceLastLine":3000`) || !strings.Contains(info[1], `"NoProof":999`) {
		t.Fatalf("the Info line 10 s later: %v", info)
	}
}

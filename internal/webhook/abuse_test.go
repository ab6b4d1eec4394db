package webhook

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/metrics"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/hyperfleet/hyperfleet/internal/httpsserver"
	"github.com/hyperfleet/hyperfleet/pkg/workload"
	"github.com/hyperfleet/hyperfleet/pkg/workload/github"
)

// abuseServerEnv, set to a directory holding tls.crt and tls.key, makes
// TestWebhookAbuseServerProcess serve instead of skipping.
const abuseServerEnv = "HYPERFLEET_WEBHOOK_ABUSE_SERVER_DIR"

// Attack parameters of TestWebhookAbuse.
const (
	abuseConnections = 1000
	// abuseDialers bounds concurrent TLS handshakes, to stay kind to a
	// 2-core CI machine.
	abuseDialers = 50
	// abuseDeclared is the Content-Length each stalled request declares:
	// just under the default limit. Each sends all but its last byte and
	// then stalls.
	abuseDeclared = DefaultMaxBodyBytes - 1024
	// perConnectionOverhead is what one open TLS connection may cost the
	// server besides a body: its goroutine stack (grown by the handshake),
	// bufio reader and writer (4 KiB each), TLS record buffers and the
	// parsed request. Measured at about 25 KiB here; the bound allows more.
	perConnectionOverhead = 64 << 10
	// runtimeSlack covers the runtime's own growth under load (GC pacing
	// lets the heap reach twice the live data before collecting).
	runtimeSlack = 32 << 20
)

// abuseMemoryBound is the most the webhook server's memory may grow by
// while abuseConnections connections are open and every in-flight slot
// is held: the bodies the in-flight bound admits (each read into a buffer
// of its declared size), the connections' overhead, and runtime slack.
// Without the in-flight bound every stalled request would hold its body:
// 1,000 x 255 KiB, about 250 MiB.
func abuseMemoryBound() int64 {
	const largeSlots int64 = max(1, DefaultMaxInFlight/4)
	bodies := largeSlots*DefaultMaxBodyBytes + (DefaultMaxInFlight-largeSlots)*LargeBodyBytes
	return bodies + abuseConnections*perConnectionOverhead + runtimeSlack
}

// TestWebhookAbuse attacks a webhook server running in a process of its
// own (so that its memory is measured alone) with the receiver's default
// limits: 1,000 TLS connections each declaring a near-limit body, sending
// all but its last byte and stalling; forged deliveries; replayed ones.
// It asserts that the server's peak RSS and its live heap stay within
// abuseMemoryBound, that every refusal has the right status code, and that
// signed deliveries are still accepted and recorded while the attack holds
// every large in-flight slot.
func TestWebhookAbuse(t *testing.T) {
	dir := t.TempDir()
	_, _, roots := writeCert(t, dir)
	child := startAbuseServer(t, dir)
	tlsConfig := &tls.Config{RootCAs: roots, NextProtos: []string{"h2", "http/1.1"}}
	client := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{TLSClientConfig: tlsConfig.Clone(), ForceAttemptHTTP2: true}}
	url := "https://" + child.addr + github.WebhookFormat.Path

	// A first signed delivery, over a client that offers HTTP/2.
	if resp := post(t, client, url, "warm-1", jobBody(1, "queued"), testSecret); resp.StatusCode != http.StatusAccepted || resp.ProtoMajor != 1 {
		t.Fatalf("signed delivery: %d over %s, want 202 over HTTP/1.1", resp.StatusCode, resp.Proto)
	}
	child.waitRecorded(t, 1)
	base := child.mem(t)

	// The attack: every connection stays open until the end of the test.
	conns := make(chan net.Conn, abuseConnections)
	defer func() {
		close(conns)
		for c := range conns {
			c.Close()
		}
	}()
	filler := bytes.Repeat([]byte(" "), abuseDeclared-1)
	dialers := make(chan struct{}, abuseDialers)
	var wg sync.WaitGroup
	var h2Negotiated sync.Once
	var sawH2 bool
	for i := range abuseConnections {
		wg.Add(1)
		dialers <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-dialers }()
			conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 30 * time.Second}, "tcp", child.addr, tlsConfig)
			if err != nil {
				t.Errorf("attacker %d: %v", i, err)
				return
			}
			conns <- conn
			if conn.ConnectionState().NegotiatedProtocol == "h2" {
				h2Negotiated.Do(func() { sawH2 = true })
			}
			// Bounds a write the server never reads (it refused and
			// closed); not an assertion.
			_ = conn.SetWriteDeadline(time.Now().Add(30 * time.Second))
			head := fmt.Sprintf("POST %s HTTP/1.1\r\nHost: hyperfleet\r\nContent-Type: application/json\r\n"+
				"X-GitHub-Event: workflow_job\r\nX-GitHub-Delivery: stall-%d\r\nX-Hub-Signature-256: sha256=%s\r\n"+
				"Content-Length: %d\r\n\r\n", github.WebhookFormat.Path, i, strings.Repeat("0", 64), abuseDeclared)
			if _, err := io.WriteString(conn, head); err != nil {
				return
			}
			_, _ = conn.Write(filler) // refused ones are closed mid-write
		}()
	}
	wg.Wait()
	if sawH2 {
		t.Error("the server negotiated HTTP/2")
	}
	largeSlots := max(1, DefaultMaxInFlight/4)
	// Every attacker is either refused (503) or holds a large slot.
	var sat memStats
	for deadline := time.Now().Add(2 * time.Minute); ; {
		sat = child.mem(t)
		if sat.refused+sat.inFlightLarge == abuseConnections && sat.inFlightLarge == largeSlots {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the attack did not settle: %d refused with 503, %d large deliveries in flight (slots %d), want %d in all",
				sat.refused, sat.inFlightLarge, largeSlots, abuseConnections)
		}
		time.Sleep(100 * time.Millisecond)
	}

	// While every large slot is held: signed deliveries are accepted and
	// recorded, forged and replayed ones are refused.
	for i := int64(2); i <= 6; i++ {
		if resp := post(t, client, url, fmt.Sprintf("signed-%d", i), jobBody(i, "queued"), testSecret); resp.StatusCode != http.StatusAccepted {
			t.Fatalf("signed delivery %d during the attack: %d, want 202", i, resp.StatusCode)
		}
	}
	if resp := post(t, client, url, "forged-1", jobBody(100, "queued"), []byte("not-the-secret")); resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("forged delivery: %d, want 401", resp.StatusCode)
	}
	if resp := post(t, client, url, "signed-2", jobBody(2, "queued"), testSecret); resp.StatusCode != http.StatusOK {
		t.Fatalf("replayed delivery (same id): %d, want 200 (duplicate)", resp.StatusCode)
	}
	// Refusals by declared size come before the body is read, so these two
	// send their headers only: a client still writing a body the server
	// refused may see its write fail (broken pipe) before the answer.
	if resp := headersOnly(t, child.addr, tlsConfig, "large-1", LargeBodyBytes+1); resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("large delivery while the large slots are held: %d, want 503 with Retry-After", resp.StatusCode)
	}
	if resp := headersOnly(t, child.addr, tlsConfig, "huge-1", DefaultMaxBodyBytes+1); resp.StatusCode != http.StatusRequestEntityTooLarge {
		t.Fatalf("delivery over the limit: %d, want 413", resp.StatusCode)
	}
	for i := 2; i <= 6; i++ {
		child.waitRecorded(t, int64(i))
	}
	end := child.mem(t)
	if got := child.recordedJobs(); len(got) != 6 {
		t.Fatalf("recorded jobs %v, want 1..6 once each (no forged, replayed, large or huge one)", got)
	}

	bound := abuseMemoryBound()
	rssBound := bound
	if raceDetector {
		// Shadow memory for every connection's goroutine and buffers: 70 MiB
		// of growth measured under -race, 17 MiB without. The live heap
		// is not inflated and keeps the bound.
		rssBound *= 3
	}
	t.Logf("server memory: RSS %d MiB before the attack, peak %d MiB (bound on growth %d MiB); live heap %d MiB before, %d MiB with every slot held (bound on growth %d MiB)",
		base.rss>>20, end.peakRSS>>20, rssBound>>20, base.heap>>20, sat.heap>>20, bound>>20)
	if grew := end.peakRSS - base.rss; grew > rssBound {
		t.Errorf("peak RSS grew by %d MiB under the attack, more than the bound of %d MiB", grew>>20, rssBound>>20)
	}
	if grew := sat.heap - base.heap; grew > bound {
		t.Errorf("live heap grew by %d MiB with every slot held, more than the bound of %d MiB", grew>>20, bound>>20)
	}
}

func post(t *testing.T, c *http.Client, url, id string, body, secret []byte) *http.Response {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-GitHub-Event", "workflow_job")
	req.Header.Set("X-GitHub-Delivery", id)
	req.Header.Set("X-Hub-Signature-256", github.SignWebhook(secret, body))
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("delivery %s: %v", id, err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp
}

// headersOnly sends a delivery's headers, declaring a body of
// contentLength bytes, and reads the server's answer without sending the
// body: the answer a server that refuses by declared size gives before
// reading anything.
func headersOnly(t *testing.T, addr string, tlsConfig *tls.Config, id string, contentLength int) *http.Response {
	t.Helper()
	conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 30 * time.Second}, "tcp", addr, tlsConfig)
	if err != nil {
		t.Fatalf("delivery %s: %v", id, err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(30 * time.Second)) // bounds a hung server; the read below fails then
	head := fmt.Sprintf("POST %s HTTP/1.1\r\nHost: hyperfleet\r\nContent-Type: application/json\r\n"+
		"X-GitHub-Event: workflow_job\r\nX-GitHub-Delivery: %s\r\nX-Hub-Signature-256: sha256=%s\r\n"+
		"Content-Length: %d\r\n\r\n", github.WebhookFormat.Path, id, strings.Repeat("0", 64), contentLength)
	if _, err := io.WriteString(conn, head); err != nil {
		t.Fatalf("delivery %s: %v", id, err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("delivery %s: no answer before its body: %v", id, err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp
}

// memStats is what the server process reports about itself.
type memStats struct {
	rss, peakRSS, heap int64
	refused            int
	inFlightLarge      int
}

// abuseChild is the server process as the test sees it.
type abuseChild struct {
	addr  string
	stdin io.WriteCloser
	mems  chan memStats

	mu       sync.Mutex
	recorded map[int64]int
	changed  chan struct{}
}

// startAbuseServer runs this test binary again as the server process.
func startAbuseServer(t *testing.T, dir string) *abuseChild {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestWebhookAbuseServerProcess$", "-test.count=1")
	cmd.Env = append(os.Environ(), abuseServerEnv+"="+dir)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	c := &abuseChild{stdin: stdin, mems: make(chan memStats), recorded: map[int64]int{}, changed: make(chan struct{})}
	addr := make(chan string, 1)
	go c.readLines(stdout, addr)
	t.Cleanup(func() {
		stdin.Close() // the server stops at EOF
		if err := cmd.Wait(); err != nil {
			t.Errorf("server process: %v\n%s", err, stderr.String())
		}
	})
	select {
	case c.addr = <-addr:
	case <-time.After(time.Minute):
		t.Fatalf("the server process did not start:\n%s", stderr.String())
	}
	return c
}

// readLines dispatches the server process's lines: "addr A",
// "recorded ID", "mem RSS PEAK HEAP REFUSED LARGE".
func (c *abuseChild) readLines(r io.Reader, addr chan<- string) {
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		switch {
		case len(f) == 2 && f[0] == "addr":
			addr <- f[1]
		case len(f) == 2 && f[0] == "recorded":
			id, _ := strconv.ParseInt(f[1], 10, 64)
			c.mu.Lock()
			c.recorded[id]++
			close(c.changed)
			c.changed = make(chan struct{})
			c.mu.Unlock()
		case len(f) == 6 && f[0] == "mem":
			n := make([]int64, 5)
			for i := range n {
				n[i], _ = strconv.ParseInt(f[i+1], 10, 64)
			}
			c.mems <- memStats{rss: n[0], peakRSS: n[1], heap: n[2], refused: int(n[3]), inFlightLarge: int(n[4])}
		}
	}
	close(c.mems)
}

func (c *abuseChild) mem(t *testing.T) memStats {
	t.Helper()
	if _, err := io.WriteString(c.stdin, "mem\n"); err != nil {
		t.Fatal(err)
	}
	m, ok := <-c.mems
	if !ok {
		t.Fatal("the server process exited")
	}
	return m
}

func (c *abuseChild) waitRecorded(t *testing.T, id int64) {
	t.Helper()
	for {
		c.mu.Lock()
		n, changed := c.recorded[id], c.changed
		c.mu.Unlock()
		if n > 0 {
			return
		}
		select {
		case <-changed:
		case <-time.After(time.Minute):
			t.Fatalf("job %d was not recorded", id)
		}
	}
}

func (c *abuseChild) recordedJobs() map[int64]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make(map[int64]int, len(c.recorded))
	for k, v := range c.recorded {
		out[k] = v
	}
	return out
}

// printingRecorder tells the test process what was recorded.
type printingRecorder struct{ out *lockedWriter }

func (p printingRecorder) Record(_ context.Context, _ types.NamespacedName, ev workload.JobEvent, _ string) error {
	p.out.printf("recorded %s\n", ev.Job.ID)
	return nil
}

type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) printf(format string, args ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	fmt.Fprintf(l.w, format, args...)
}

// TestWebhookAbuseServerProcess is the server of TestWebhookAbuse, run in
// a process of its own; it skips unless abuseServerEnv is set. It serves
// with the receiver's and server's defaults, except a read timeout long
// enough that stalled requests keep their slots while the test measures
// (the in-flight bound, not the timeout, is what bounds memory).
func TestWebhookAbuseServerProcess(t *testing.T) {
	dir := os.Getenv(abuseServerEnv)
	if dir == "" {
		t.Skip("the server process of TestWebhookAbuse")
	}
	out := &lockedWriter{w: os.Stdout}
	recv, err := NewReceiver(Options{Format: github.WebhookFormat, Parser: github.WebhookParser{WebhookSecrets: workload.WebhookSecrets{Secret: testSecret}}, Router: routeTo("team", "gpu"), Recorder: printingRecorder{out}})
	if err != nil {
		t.Fatal(err)
	}
	srv, err := NewServer(ServerOptions{
		Addr: "127.0.0.1:0", CertFile: filepath.Join(dir, "tls.crt"), KeyFile: filepath.Join(dir, "tls.key"),
		Receivers: []*Receiver{recv}, ReadTimeout: 5 * time.Minute, WriteTimeout: 5 * time.Minute,
		// No connection caps: this test measures the in-flight bound
		// alone, its 1,000 connections from one address
		// (TestServerConnectionCaps and test/flood test the caps).
		Limits: httpsserver.Limits{MaxConns: -1, MaxConnsPerAddress: -1},
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Start(ctx) }()
	<-srv.Ready()
	if srv.Addr() == nil {
		cancel()
		t.Fatalf("not listening: %v", <-done)
	}
	out.printf("addr %s\n", srv.Addr())
	refused := deliveriesTotal.WithLabelValues("github-actions", "workflow_job", ResultTooManyInFlight)
	refusedBefore := metricValue(refused)
	sc := bufio.NewScanner(os.Stdin)
	for sc.Scan() {
		if sc.Text() != "mem" {
			continue
		}
		rss, peak := procStatus(t)
		_, large := recv.InFlight()
		out.printf("mem %d %d %d %d %d\n", rss, peak, liveHeap(), int(metricValue(refused)-refusedBefore), large)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// liveHeap is the heap in use by live objects, after a collection.
func liveHeap() int64 {
	runtime.GC()
	s := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
	metrics.Read(s)
	return int64(s[0].Value.Uint64())
}

// procStatus reads this process's resident set size and its peak.
func procStatus(t *testing.T) (rss, peak int64) {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) != 3 || f[2] != "kB" {
			continue
		}
		v, _ := strconv.ParseInt(f[1], 10, 64)
		switch f[0] {
		case "VmRSS:":
			rss = v << 10
		case "VmHWM:":
			peak = v << 10
		}
	}
	return rss, peak
}

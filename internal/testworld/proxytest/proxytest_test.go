package proxytest_test

import (
	"io"
	"net/http"
	"net/url"
	"testing"
	"time"

	"github.com/hyperfleet/hyperfleet/internal/testworld/proxytest"
)

// TestOnlyThroughTheProxy checks the harness itself: a server in the
// namespace answers through tinyproxy, which logs the request, and refuses
// a direct connection.
func TestOnlyThroughTheProxy(t *testing.T) {
	p := proxytest.Start(t)
	ln := p.Listen(t)
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "inside") }), ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })

	proxyURL, _ := url.Parse(p.URL)
	c := &http.Client{Transport: &http.Transport{Proxy: http.ProxyURL(proxyURL)}, Timeout: 10 * time.Second}
	resp, err := c.Get("http://" + ln.Addr().String() + "/x")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(body) != "inside" {
		t.Fatalf("body %q", body)
	}
	if !p.Proxied(t, ln.Addr().String()) {
		t.Errorf("tinyproxy's log lacks the request: %v", p.Requests(t))
	}
	proxytest.CheckDirectRefused(t, ln.Addr().String())
}

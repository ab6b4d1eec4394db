//go:build chaos

package netns

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"testing"
	"time"
)

// TestLinkPartition: a server listening in the namespace answers the host
// at the namespace end's address; cut, it answers nothing (a timeout, not
// a refusal); healed, it answers new connections again; closed, the
// namespace is gone.
func TestLinkPartition(t *testing.T) {
	name := fmt.Sprintf("hfnt%d", os.Getpid()%100000)
	l, err := Create(name, netip.MustParsePrefix("10.241.7.0/30"))
	if err != nil {
		t.Fatal(err)
	}
	closed := false
	t.Cleanup(func() {
		if !closed {
			_ = l.Close()
		}
	})
	ln, err := l.Listen("0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok")) }), ReadHeaderTimeout: time.Second}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	url := "http://" + ln.Addr().String()
	get := func() error {
		c := &http.Client{Timeout: time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
		res, err := c.Get(url)
		if err != nil {
			return err
		}
		return res.Body.Close()
	}
	if err := get(); err != nil {
		t.Fatalf("before the cut: %v", err)
	}
	if err := l.Cut(); err != nil {
		t.Fatal(err)
	}
	err = get()
	var ne net.Error
	if err == nil || !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("cut: %v; want a timeout", err)
	}
	if err := l.Heal(); err != nil {
		t.Fatal(err)
	}
	if err := get(); err != nil {
		t.Fatalf("healed: %v", err)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	closed = true
	if _, err := os.Stat("/run/netns/" + name); !os.IsNotExist(err) {
		t.Fatalf("closed: /run/netns/%s: %v; want it gone", name, err)
	}
}

package httpsserver

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/certwatcher"

	"github.com/hyperfleet/hyperfleet/internal/metrics"
)

// serverReady is 1 while a server serves, 0 while it waits for its
// certificate (or has not started, or stopped).
var serverReady = metrics.NewGaugeVec("https_server_ready",
	"1 while the operator's HTTPS server (server agent or webhook) serves; 0 while it waits for a TLS certificate it can load (the controllers keep running), or is stopped.",
	"server")

// The waits between two attempts to load a missing or unloadable
// certificate: doubling from certRetryFirst up to certRetryMax. Reading two
// small files every 10 s costs nothing, and a certificate cert-manager
// issues (or a Secret the kubelet mounts late) is picked up within that.
const (
	certRetryFirst = time.Second
	certRetryMax   = 10 * time.Second
)

// Status is whether a server serves, and why not: its Check is a
// readiness check (controller-runtime's healthz.Checker), so that a
// server waiting for its certificate fails /readyz without stopping
// anything else in the manager. The zero value is a server that has not
// started.
type Status struct {
	mu      sync.Mutex
	serving bool
	why     string
}

// Check implements healthz.Checker: nil while the server serves.
func (s *Status) Check(*http.Request) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.serving:
		return nil
	case s.why == "":
		return fmt.Errorf("not started")
	}
	return fmt.Errorf("%s", s.why)
}

func (s *Status) set(serving bool, why string) {
	if s == nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.serving, s.why = serving, why
}

// waitForCertificate loads o's certificate, retrying while it is missing
// or cannot be loaded (a key that does not match, a file that is not
// PEM): the server waits, says why in its Status, its log and
// hyperfleet_https_server_ready, and never makes the manager exit, whose
// controllers (VM cleanup among them) must keep running. It returns nil
// when ctx ends first.
func waitForCertificate(ctx context.Context, o Options) *certwatcher.CertWatcher {
	var watcher *certwatcher.CertWatcher
	waited := false
	loaded := WaitFor(ctx, func() error {
		w, err := certwatcher.New(o.CertFile, o.KeyFile)
		if err != nil {
			err = fmt.Errorf("%s: loading the TLS certificate %s and key %s: %w", o.Name, o.CertFile, o.KeyFile, err)
			o.Status.set(false, "waiting for its TLS certificate: "+err.Error())
			return err
		}
		watcher = w
		return nil
	}, func(err error) {
		waited = true
		o.Logger.Error(err, o.Name+": waiting for a TLS certificate it can load: it does not serve until then, and everything else keeps running; "+
			"put a PEM certificate and its key there (the Secret mounted there, such as the one cert-manager issues)", "retryEvery", certRetryMax.String())
	})
	if !loaded {
		return nil
	}
	if waited {
		o.Logger.Info(o.Name+": loaded its TLS certificate after waiting for it", "certFile", o.CertFile, "keyFile", o.KeyFile)
	}
	return watcher
}

// WaitFor calls load until it succeeds, after 1 s, 2 s, 4 s and then every
// 10 s, calling failed once per distinct error (not at every attempt, so
// that a file missing for hours is a few log lines). It reports whether
// load succeeded; false means ctx ended first. The servers wait for their
// files with it instead of failing, which would stop the whole manager.
func WaitFor(ctx context.Context, load func() error, failed func(error)) bool {
	delay, lastErr := certRetryFirst, ""
	for {
		err := load()
		if err == nil {
			return true
		}
		if err.Error() != lastErr {
			failed(err)
			lastErr = err.Error()
		}
		select {
		case <-ctx.Done():
			return false
		case <-time.After(delay):
		}
		delay = min(2*delay, certRetryMax)
	}
}

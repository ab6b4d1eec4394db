package webhook

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"sigs.k8s.io/controller-runtime/pkg/manager"

	"github.com/hyperfleet/hyperfleet/internal/httpsserver"
)

// ServerOptions configure a Server.
type ServerOptions struct {
	// Addr is the address to listen on, such as ":9292" (required).
	Addr string
	// CertFile and KeyFile are the PEM certificate (chain) and key served
	// (required). They are watched and reloaded when they change, so a
	// cert-manager renewal needs no restart.
	CertFile string
	KeyFile  string
	// Receivers are the platforms' receivers, each served at its
	// Format's path (at least one; no two at one path). Each bounds its
	// own deliveries in flight and queue, so one platform's flood cannot
	// take another's slots.
	Receivers []*Receiver
	// ReadHeaderTimeout, ReadTimeout, WriteTimeout and IdleTimeout bound
	// connections (defaults 10 s, 10 s, 30 s, 120 s). ReadTimeout is how
	// long a delivery may take to arrive in full, and so how long a
	// stalled sender holds an in-flight slot; GitHub sends a few kB at
	// once.
	ReadHeaderTimeout time.Duration
	ReadTimeout       time.Duration
	WriteTimeout      time.Duration
	IdleTimeout       time.Duration
	// ShutdownTimeout bounds the wait for in-flight requests when the
	// manager stops (default 10 s).
	ShutdownTimeout time.Duration
	// Limits cap the connections held open: a cap of 0 is the default
	// (DefaultLimits), a negative one no cap.
	Limits httpsserver.Limits
	// Logger logs; the zero value discards.
	Logger logr.Logger
}

// DefaultLimits are the receiver's connection caps (docs/security.md,
// "Webhook intake"). GitHub delivers from a few addresses, each delivery
// read and verified in milliseconds. 16 connections from one address are
// a quarter of the DefaultMaxInFlight slots, so that one address stalling
// its bodies cannot hold every slot; 256 in all bound what stalled or idle
// connections hold (each costs the process about 40 KiB). Behind an
// ingress every connection comes from the ingress: raise
// MaxConnsPerAddress to MaxConns there (the in-flight bound still holds).
// Kernel socket buffers are capped at 64 KiB per connection: a delivery is
// a few kB, and an upload that stalls then holds no more than that.
var DefaultLimits = httpsserver.Limits{MaxConns: 256, MaxConnsPerAddress: 16, SocketBuffer: 64 << 10}

// maxHeaderBytes bounds a delivery's request line and headers. GitHub
// sends about 2 KiB of headers; 16 KiB leaves room for a proxy's
// additions while a stalled header costs the server little.
const maxHeaderBytes = 16 << 10

// Server serves the Receiver over HTTPS and runs its workers. It is a
// controller-runtime manager.Runnable that runs on every replica
// (NeedLeaderElection is false): add it with mgr.Add.
type Server struct {
	opts ServerOptions

	// Listening answers Addr and Ready, and holds the Status Serve keeps.
	httpsserver.Listening
}

var (
	_ manager.Runnable               = (*Server)(nil)
	_ manager.LeaderElectionRunnable = (*Server)(nil)
)

// NewServer checks opts and fills in the defaults.
func NewServer(opts ServerOptions) (*Server, error) {
	if opts.Addr == "" || opts.CertFile == "" || opts.KeyFile == "" || len(opts.Receivers) == 0 {
		return nil, errors.New("webhook server: Addr, CertFile, KeyFile and a Receiver are required")
	}
	paths := map[string]bool{}
	for _, r := range opts.Receivers {
		if r == nil {
			return nil, errors.New("webhook server: a Receiver is nil")
		}
		if p := r.opts.Format.Path; paths[p] {
			return nil, fmt.Errorf("webhook server: two receivers at %s", p)
		}
		paths[r.opts.Format.Path] = true
	}
	opts.ReadHeaderTimeout = orDefault(opts.ReadHeaderTimeout, 10*time.Second)
	opts.ReadTimeout = orDefault(opts.ReadTimeout, 10*time.Second)
	opts.WriteTimeout = orDefault(opts.WriteTimeout, 30*time.Second)
	opts.IdleTimeout = orDefault(opts.IdleTimeout, 120*time.Second)
	opts.ShutdownTimeout = orDefault(opts.ShutdownTimeout, 10*time.Second)
	opts.Limits = opts.Limits.Or(DefaultLimits)
	return &Server{opts: opts}, nil
}

// NeedLeaderElection implements manager.LeaderElectionRunnable: every
// replica receives webhooks.
func (*Server) NeedLeaderElection() bool { return false }

// Check is a readiness check (controller-runtime's healthz.Checker): nil
// while the server serves, else why not, such as the certificate it waits
// for (httpsserver.Status).
func (s *Server) Check(r *http.Request) error { return s.Status.Check(r) }

// Handler is the server's HTTP handler: each Receiver at its path, 404
// elsewhere.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	for _, r := range s.opts.Receivers {
		mux.Handle(r.opts.Format.Path, r)
	}
	return mux
}

// Paths are the receivers' paths, for logs and docs.
func (s *Server) Paths() []string {
	paths := make([]string, 0, len(s.opts.Receivers))
	for _, r := range s.opts.Receivers {
		paths = append(paths, r.opts.Format.Path)
	}
	return paths
}

// Start implements manager.Runnable: it serves until ctx ends, then stops
// accepting deliveries, waits for in-flight requests and lets the workers
// drain the queue.
func (s *Server) Start(ctx context.Context) error {
	logger := s.opts.Logger
	defer s.MarkReady()

	srv := &http.Server{
		Handler:           s.Handler(),
		ReadHeaderTimeout: s.opts.ReadHeaderTimeout,
		ReadTimeout:       s.opts.ReadTimeout,
		WriteTimeout:      s.opts.WriteTimeout,
		IdleTimeout:       s.opts.IdleTimeout,
		MaxHeaderBytes:    maxHeaderBytes,
		// httpsserver.Serve serves HTTP/1.1 only: with HTTP/2 one
		// connection could carry many uploads that the server buffers
		// before the handler, and its in-flight bound, ever sees them.
	}

	var workersDone chan struct{}
	runCtx, stopWorkers := context.WithCancel(context.WithoutCancel(ctx))
	defer stopWorkers()
	err := httpsserver.Serve(ctx, httpsserver.Options{
		Name: "webhook server", Server: "webhook", Limits: s.opts.Limits, Addr: s.opts.Addr, CertFile: s.opts.CertFile, KeyFile: s.opts.KeyFile,
		ShutdownTimeout: s.opts.ShutdownTimeout, Status: &s.Status, Logger: logger,
	}, srv, func(addr net.Addr) {
		s.Listened(addr)
		workersDone = make(chan struct{})
		var wg sync.WaitGroup
		for _, r := range s.opts.Receivers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				_ = r.Run(runCtx)
			}()
		}
		go func() {
			wg.Wait()
			close(workersDone)
		}()
		logger.Info("serving CI platform webhooks", "address", addr.String(), "paths", s.Paths())
		s.MarkReady()
	})
	if workersDone != nil {
		stopWorkers()
		<-workersDone
	}
	return err
}

// ReadSecretFile reads a webhook secret from a file (a mounted Secret key),
// trimming one trailing newline. An empty secret is an error: a receiver
// without one would reject every delivery.
func ReadSecretFile(path string) ([]byte, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading the webhook secret: %w", err)
	}
	b = []byte(strings.TrimSuffix(strings.TrimSuffix(string(b), "\n"), "\r"))
	if len(b) == 0 {
		return nil, fmt.Errorf("the webhook secret in %s is empty", path)
	}
	return b, nil
}

package managerproc

import (
	"net"
	"sync"
	"testing"
	"time"

	"github.com/hyperfleet/hyperfleet/internal/testworld/netns"
)

// Service is a TCP front for the replicas' servers, as a Kubernetes
// Service with kube-proxy is: each connection goes to the next backend in
// turn that accepts it, skipping replicas that are down (refused or
// silent for a second), so a caller sees one address through failovers.
type Service struct {
	// Addr is the address callers use (loopback).
	Addr string

	ln       net.Listener
	mu       sync.Mutex
	backends []string
	next     int
	conns    map[net.Conn]bool
	wg       sync.WaitGroup
}

// NewService listens on a loopback port; it closes when the test ends.
func NewService(t testing.TB) *Service {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &Service{Addr: ln.Addr().String(), ln: ln, conns: map[net.Conn]bool{}}
	s.wg.Add(1)
	go s.serve()
	t.Cleanup(s.close)
	return s
}

// SetBackends replaces the addresses connections go to.
func (s *Service) SetBackends(addrs ...string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.backends = append([]string(nil), addrs...)
}

// AddBackend adds an address connections go to.
func (s *Service) AddBackend(addr string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.backends = append(s.backends, addr)
}

func (s *Service) serve() {
	defer s.wg.Done()
	for {
		c, err := s.ln.Accept()
		if err != nil {
			return
		}
		s.wg.Add(1)
		go s.forward(c)
	}
}

// forward connects c to the first backend, in turn, that accepts.
func (s *Service) forward(c net.Conn) {
	defer s.wg.Done()
	if !s.track(c) {
		return
	}
	defer s.untrack(c)
	s.mu.Lock()
	order := make([]string, 0, len(s.backends))
	for i := range s.backends {
		order = append(order, s.backends[(s.next+i)%len(s.backends)])
	}
	s.next++
	s.mu.Unlock()
	var up net.Conn
	for _, addr := range order {
		conn, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			up = conn
			break
		}
	}
	if up == nil || !s.track(up) {
		return
	}
	defer s.untrack(up)
	netns.Pipe(c, up)
}

func (s *Service) track(c net.Conn) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.conns == nil {
		_ = c.Close()
		return false
	}
	s.conns[c] = true
	return true
}

func (s *Service) untrack(c net.Conn) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.conns, c)
	_ = c.Close()
}

func (s *Service) close() {
	_ = s.ln.Close()
	s.mu.Lock()
	for c := range s.conns {
		_ = c.Close()
	}
	s.conns = nil
	s.mu.Unlock()
	s.wg.Wait()
}

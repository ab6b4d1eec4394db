package httpsserver

import (
	"net"
	"sync"
)

// Listening is the state a server run by Serve shows to the rest of the
// process: where it listens, whether its start has ended, and its Status.
// The webhook and agent servers embed it, so both answer Addr and Ready the
// same way. The zero value is ready to use.
type Listening struct {
	mu        sync.Mutex
	addr      net.Addr
	ready     chan struct{}
	readyOnce sync.Once

	// Status says whether the server serves, or why not (such as a
	// certificate it waits for); pass it as Options.Status.
	Status Status
}

// Addr is the address the server listens on once started (nil before),
// such as 127.0.0.1:40123 when the server asked for port 0.
func (l *Listening) Addr() net.Addr {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.addr
}

// Ready is closed once the server listens, or failed to start. A server
// waiting for its certificate is neither: Ready stays open.
func (l *Listening) Ready() <-chan struct{} { return l.readyChan() }

func (l *Listening) readyChan() chan struct{} {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.ready == nil {
		l.ready = make(chan struct{})
	}
	return l.ready
}

// Listened records the address Serve listens on (its listening callback
// calls it first).
func (l *Listening) Listened(addr net.Addr) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.addr = addr
}

// MarkReady closes Ready; later calls do nothing. A server's Start calls it
// once it listens and, deferred, when it returns, so that a start that
// failed ends the wait too.
func (l *Listening) MarkReady() {
	ready := l.readyChan()
	l.readyOnce.Do(func() { close(ready) })
}

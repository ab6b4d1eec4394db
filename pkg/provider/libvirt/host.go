package libvirt

import (
	"context"
	"fmt"
	"net/url"
	"sync"

	golibvirt "github.com/digitalocean/go-libvirt"
	"github.com/digitalocean/go-libvirt/socket"

	"github.com/hyperfleet/hyperfleet/pkg/provider"
)

// host is one configured libvirt host and its connection, made on first
// use and made again after it is lost (a libvirtd restart, a network
// failure). Each connection follows the host's domain lifecycle events.
type host struct {
	Host
	dial socket.Dialer
	p    *Provider

	mu   sync.Mutex
	conn *golibvirt.Libvirt
	// cancel stops the event loop of conn.
	cancel context.CancelFunc
	// closed is set by Close: the provider was replaced (its cluster's
	// configuration changed) or its cluster deleted, and a call that
	// still comes must not open a connection nobody would close.
	closed bool
}

// errClosed is a call on a closed provider: the caller's next pass gets
// the cluster's current one from the registry.
var errClosed = provider.Errorf(provider.ClassTransient, "Unreachable",
	"%w: this connection to the cluster was closed (its HypervisorCluster was changed or deleted); the next attempt uses the current one", provider.ErrUnreachable)

// client returns the host's connection, connecting when there is none or
// the last one is lost. A host that cannot be reached is ErrUnreachable.
func (h *host) client() (*golibvirt.Libvirt, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return nil, errClosed
	}
	if h.conn != nil && h.conn.IsConnected() {
		return h.conn, nil
	}
	if h.cancel != nil {
		h.cancel()
		h.cancel = nil
	}
	uri, err := url.Parse(h.URI)
	if err != nil {
		return nil, fmt.Errorf("host %s: URI %q: %w", h.Name, h.URI, err)
	}
	l := golibvirt.NewWithDialer(h.dial)
	if err := l.ConnectToURI(golibvirt.RemoteURI(uri)); err != nil {
		return nil, classify(fmt.Errorf("connect to libvirt host %s (%s): %w", h.Name, h.URI, err))
	}
	ctx, cancel := context.WithCancel(context.Background())
	events, err := l.LifecycleEvents(ctx)
	if err != nil {
		hangUp(l, cancel)
		return nil, classify(fmt.Errorf("follow the domain events of host %s: %w", h.Name, err))
	}
	agents, err := l.SubscribeEvents(ctx, golibvirt.DomainEventIDAgentLifecycle, golibvirt.OptDomain{})
	if err != nil {
		hangUp(l, cancel)
		return nil, classify(fmt.Errorf("follow the guest agent events of host %s: %w", h.Name, err))
	}
	h.conn, h.cancel = l, cancel
	go h.follow(events)
	go h.followAgents(agents)
	return l, nil
}

// follow feeds the provider's view with the host's lifecycle events until
// the connection ends.
func (h *host) follow(events <-chan golibvirt.DomainEventLifecycleMsg) {
	for ev := range events {
		h.p.lifecycle(h.Name, ev.Dom.Name, golibvirt.DomainEventType(ev.Event), ev.Detail)
	}
}

// followAgents issues the shutdowns kept for guest agents that connect
// (shutdown.go) until the connection ends. The call is made aside: this
// loop must keep draining events while it waits for libvirt.
func (h *host) followAgents(events <-chan any) {
	for ev := range events {
		msg, ok := ev.(*golibvirt.DomainEventCallbackAgentLifecycleMsg)
		if !ok || golibvirt.ConnectDomainEventAgentLifecycleState(msg.State) != golibvirt.ConnectDomainEventAgentLifecycleStateConnected {
			continue
		}
		if h.p.agentConnected(h.Name + "/" + msg.Dom.Name) {
			go h.reissueShutdown(msg.Dom)
		}
	}
}

// close drops the host's connection.
func (h *host) close() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.conn != nil {
		hangUp(h.conn, h.cancel)
	} else if h.cancel != nil {
		h.cancel()
	}
	h.conn, h.cancel, h.closed = nil, nil, true
}

// hangUp closes l and only then stops its event subscriptions (cancel).
// The order matters to the host: cancelling first makes go-libvirt send a
// deregistration of each event callback, and libvirtd 9.0 frees a
// client's callbacks on close without the lock its deregistration takes,
// so a deregistration that is still in a worker thread when the close is
// handled crashes the daemon (a NULL read in
// remoteClientFreePrivateCallbacks, reproduced under load in
// TestCloseDoesNotCrashLibvirtd). Closed first, the connection takes its
// callbacks with it and the cancelled subscriptions find nothing to send
// on.
func hangUp(l *golibvirt.Libvirt, cancel context.CancelFunc) {
	_ = l.Disconnect()
	if cancel != nil {
		cancel()
	}
}

// Close disconnects from every host for good: a call after it fails
// (errClosed) instead of connecting again.
func (p *Provider) Close() {
	for _, h := range p.hosts {
		h.close()
	}
}

// lifecycle records what a domain's lifecycle event says: a domain that
// stops (but for a failed start) has run (Stopped once configured), and
// the owner building it is woken to see so. A managed save (stopped,
// detail saved) is no power-off: the domain is suspended, which EnsureVM
// reads from its image, and it is not marked as having run; its owner is
// woken all the same, to see it suspended.
func (p *Provider) lifecycle(hostName, domain string, ev golibvirt.DomainEventType, detail int32) {
	key := hostName + "/" + domain
	p.mu.Lock()
	var wake []func()
	switch ev {
	case golibvirt.DomainEventStopped:
		how := golibvirt.DomainEventStoppedDetailType(detail)
		if how == golibvirt.DomainEventStoppedFailed {
			break // a start that did not happen
		}
		if how != golibvirt.DomainEventStoppedSaved {
			p.ran[key] = true
		}
		delete(p.shutdowns, key)
		if o, ok := p.builders[key]; ok && p.wake != nil {
			wake = append(wake, func() { p.wake(o) })
		}
	case golibvirt.DomainEventUndefined:
		delete(p.ran, key)
		delete(p.shutdowns, key)
		delete(p.powerJobs, key)
	}
	p.mu.Unlock()
	for _, w := range wake {
		w()
	}
}

// hasRun says whether the lifecycle events showed the domain stopping.
func (p *Provider) hasRun(hostName, domain string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.ran[hostName+"/"+domain]
}

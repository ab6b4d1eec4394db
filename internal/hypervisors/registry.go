// Package hypervisors is the registry of live hypervisors: one Provider per
// HypervisorCluster, its health and its latest VM listing, shared by every
// controller and the orphan sweeper, and the transitions (power-off hints)
// that make a claim read its VM directly.
//
// The HypervisorCluster controller is the only writer of connections and
// health: it builds the Provider from the cluster's spec and Secrets, probes
// it and polls one batch VM listing per interval (docs/architecture.md,
// "Polling O(clusters)"). Claim controllers and the orphan sweeper only
// read, so a cluster that is down pauses provisioning on it alone.
package hypervisors

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"sync"
	"time"

	"k8s.io/utils/clock"

	"github.com/hyperfleet/hyperfleet/pkg/provider"
)

// Health is what the last probe said about a cluster.
type Health struct {
	// Ready is true when the last probe succeeded.
	Ready bool
	// Reason and Message explain a cluster that is not Ready.
	Reason  string
	Message string
	// Since is when Ready last changed.
	Since time.Time
}

// Listing is the latest batch VM listing of a cluster.
type Listing struct {
	VMs []provider.VMSummary
	At  time.Time
	// byID indexes VMs by id.
	byID map[provider.ID]int
}

// VM returns the listed VM with id id.
func (l *Listing) VM(id provider.ID) (provider.VMSummary, bool) {
	if l == nil {
		return provider.VMSummary{}, false
	}
	i, ok := l.byID[id]
	if !ok {
		return provider.VMSummary{}, false
	}
	return l.VMs[i], true
}

type entry struct {
	provider   provider.Provider
	configHash string
	health     Health
	listing    *Listing
	failures   int
}

// entryLocked returns the cluster's entry, creating it; r.mu must be held
// for writing.
func (r *Registry) entryLocked(name string) *entry {
	e := r.entries[name]
	if e == nil {
		e = &entry{}
		r.entries[name] = e
	}
	return e
}

// Registry maps HypervisorCluster names to their connection. It is safe for
// concurrent use.
type Registry struct {
	mu      sync.RWMutex
	entries map[string]*entry
	// CloseGrace is how long a provider replaced by a new configuration,
	// or of a removed cluster, stays open before it is closed (a Provider
	// holding connections: libvirt's hosts, with their event
	// subscriptions): a pass that took it from the registry just before
	// may still be calling it, and every call ends within the hypervisor
	// API's request timeout (30 s). Zero closes it at once.
	CloseGrace time.Duration
	// Clock times CloseGrace; nil is the real clock.
	Clock clock.WithDelayedExecution
}

// DefaultCloseGrace is NewRegistry's CloseGrace: twice the request
// timeout.
const DefaultCloseGrace = time.Minute

// NewRegistry returns an empty Registry.
func NewRegistry() *Registry {
	return &Registry{entries: map[string]*entry{}, CloseGrace: DefaultCloseGrace}
}

// closer is a Provider that holds connections to close when nobody
// calls it any more.
type closer interface{ Close() }

// retire closes p, if it holds connections, CloseGrace from now. Called
// without r.mu: a close talks to the hypervisor.
func (r *Registry) retire(p provider.Provider) {
	c, ok := p.(closer)
	if !ok {
		return
	}
	if r.CloseGrace <= 0 {
		c.Close()
		return
	}
	clk := r.Clock
	if clk == nil {
		clk = clock.RealClock{}
	}
	clk.AfterFunc(r.CloseGrace, c.Close)
}

// ConfigHash fingerprints a ClusterConfig (secrets included) so a changed
// spec or rotated Secret rebuilds the connection. The hash never leaves the
// process.
func ConfigHash(cfg provider.ClusterConfig) string {
	raw, err := json.Marshal(cfg)
	if err != nil {
		// ClusterConfig holds only plain data; this cannot happen.
		panic(fmt.Sprintf("hash cluster config: %v", err))
	}
	sum := sha256.Sum256(raw)
	return hex.EncodeToString(sum[:])
}

// Connect returns the cluster's Provider, building a new one with build
// when none exists or cfg changed since it was built.
// The provider it replaces is closed after CloseGrace (retire).
func (r *Registry) Connect(name string, cfg provider.ClusterConfig, build func() (provider.Provider, error)) (provider.Provider, error) {
	hash := ConfigHash(cfg)
	r.mu.Lock()
	e := r.entries[name]
	if e != nil && e.provider != nil && e.configHash == hash {
		r.mu.Unlock()
		return e.provider, nil
	}
	p, err := build()
	if err != nil {
		r.mu.Unlock()
		return nil, err
	}
	if e == nil {
		e = r.entryLocked(name)
	}
	old := e.provider
	e.provider, e.configHash = p, hash
	r.mu.Unlock()
	if old != nil {
		r.retire(old)
	}
	return p, nil
}

// Provider returns the cluster's Provider and whether it is Ready. Callers
// must not start new VMs on a cluster that is not Ready.
func (r *Registry) Provider(name string) (provider.Provider, Health, bool) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	e := r.entries[name]
	if e == nil || e.provider == nil {
		return nil, Health{Reason: "NotConnected", Message: fmt.Sprintf("HypervisorCluster %s has not been connected yet", name)}, false
	}
	return e.provider, e.health, true
}

// SetHealth records a probe result and returns the number of failed probes
// since the cluster was last Ready (zero after a success), for the backoff
// of a cluster that is down: 1 at the probe that marks a Ready cluster
// down, whatever failures it absorbed before (RecordFailure: each was
// retried within a second), so that the backoff starts at its first step
// (docs/operations.md: 5 s, 10 s, 20 s ...) rather than at the step those
// absorbed failures would have reached.
func (r *Registry) SetHealth(name string, h Health, now time.Time) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	e := r.entryLocked(name)
	wasReady := e.health.Ready
	if e.health.Ready != h.Ready || e.health.Since.IsZero() {
		h.Since = now
	} else {
		h.Since = e.health.Since
	}
	e.health = h
	switch {
	case h.Ready:
		e.failures = 0
	case wasReady:
		e.failures = 1
	default:
		e.failures++
	}
	return e.failures
}

// RecordFailure counts a failed probe without changing the health, so a
// single dropped request does not pause provisioning; it returns the number
// of consecutive failures.
func (r *Registry) RecordFailure(name string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	e := r.entryLocked(name)
	e.failures++
	return e.failures
}

// Health returns the cluster's last probe result.
func (r *Registry) Health(name string) Health {
	r.mu.RLock()
	defer r.mu.RUnlock()
	if e := r.entries[name]; e != nil {
		return e.health
	}
	return Health{Reason: "NotConnected", Message: fmt.Sprintf("HypervisorCluster %s has not been connected yet", name)}
}

// SetListing stores a new VM listing and returns the previous one.
func (r *Registry) SetListing(name string, vms []provider.VMSummary, at time.Time) *Listing {
	l := &Listing{VMs: vms, At: at, byID: make(map[provider.ID]int, len(vms))}
	for i, vm := range vms {
		l.byID[vm.ID] = i
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	e := r.entryLocked(name)
	prev := e.listing
	e.listing = l
	return prev
}

// Listing returns the cluster's latest VM listing, nil before the first.
func (r *Registry) Listing(name string) *Listing {
	r.mu.RLock()
	defer r.mu.RUnlock()
	if e := r.entries[name]; e != nil {
		return e.listing
	}
	return nil
}

// Names returns the clusters the registry knows.
func (r *Registry) Names() []string {
	r.mu.RLock()
	defer r.mu.RUnlock()
	out := make([]string, 0, len(r.entries))
	for n := range r.entries {
		out = append(out, n)
	}
	return out
}

// Remove forgets a deleted cluster, and closes its provider after
// CloseGrace (retire).
func (r *Registry) Remove(name string) {
	r.mu.Lock()
	e := r.entries[name]
	delete(r.entries, name)
	r.mu.Unlock()
	if e != nil && e.provider != nil {
		r.retire(e.provider)
	}
}

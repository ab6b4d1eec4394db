package dnsreg

import (
	"context"
	"sort"
	"time"

	"github.com/hyperfleet/hyperfleet/internal/guardedmap"
)

// Checker is implemented by Registrars that can check their set-up without
// changing anything: that the server answers for every zone and accepts
// the key. The HypervisorCluster controller reports the result in the
// cluster's DNSReady condition.
type Checker interface {
	Check(ctx context.Context) error
}

// Cluster is one HypervisorCluster's DNS service as the cluster controller
// last built and checked it.
type Cluster struct {
	// Registrar writes the cluster's records.
	Registrar Registrar
	// Key names the configuration Registrar was built from (the cluster's
	// UID and generation and the Secret's version): a change rebuilds it.
	Key string
	// RegisterVMs is spec.dns.registerVMs: when false the service is
	// checked but no VM is registered.
	RegisterVMs bool
	// CheckedAt is when the service was last checked, and CheckErr what
	// the check found (nil: it answered).
	CheckedAt time.Time
	CheckErr  error
}

// Clusters holds the DNS service of every HypervisorCluster that has one,
// by cluster name: the cluster controller sets them, the claim controller
// registers VMs with them and the sweep lists them. It is safe for
// concurrent use.
type Clusters struct {
	m guardedmap.Map[string, Cluster]
}

// NewClusters returns an empty Clusters.
func NewClusters() *Clusters { return &Clusters{} }

// Set records cluster's DNS service.
func (c *Clusters) Set(cluster string, dc Cluster) { c.m.Swap(cluster, dc) }

// Get returns cluster's DNS service; false when it has none.
func (c *Clusters) Get(cluster string) (Cluster, bool) {
	if c == nil {
		return Cluster{}, false
	}
	return c.m.Get(cluster)
}

// Registering returns the Registrar VMs on cluster are registered with;
// false when the cluster does not register VMs (no dnsProvider, a provider
// that could not be built, or registerVMs false).
func (c *Clusters) Registering(cluster string) (Registrar, bool) {
	dc, ok := c.Get(cluster)
	if !ok || !dc.RegisterVMs || dc.Registrar == nil {
		return nil, false
	}
	return dc.Registrar, true
}

// Remove forgets cluster's DNS service.
func (c *Clusters) Remove(cluster string) { c.m.Delete(cluster) }

// Names returns the clusters that register VMs, sorted.
func (c *Clusters) Names() []string {
	if c == nil {
		return nil
	}
	out := c.m.Keys(func(dc Cluster) bool { return dc.Registrar != nil && dc.RegisterVMs })
	sort.Strings(out)
	return out
}

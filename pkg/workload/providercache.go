package workload

import (
	"sync"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
)

// ProviderCache keeps the providers a back-end built, one per template and
// scope, while the configuration each was built from stays the same
// (Backend.Provider's contract: a provider's tokens and rate-limit state
// carry over between calls). A configuration is known by its fingerprint,
// which the back-end computes from everything that makes a provider
// different, its credentials included: it stays in this process's memory,
// never in a status or a log. The zero value is ready to use; it is safe
// for concurrent use.
type ProviderCache[P Provider] struct {
	mu    sync.Mutex
	byKey map[string]cachedProvider[P]
}

type cachedProvider[P Provider] struct {
	fingerprint string
	provider    P
}

// Get returns the provider of tmpl's scope built from the configuration
// whose fingerprint is fp, building it with build when there is none or
// the configuration changed. build's error is returned as it is, and
// nothing is kept.
func (c *ProviderCache[P]) Get(tmpl *hfv1.HypervisorMachineTemplate, scope Scope, fp string, build func() (P, error)) (P, error) {
	key := tmpl.Namespace + "/" + tmpl.Name + "/" + scope.String()
	c.mu.Lock()
	defer c.mu.Unlock()
	if p, ok := c.byKey[key]; ok && p.fingerprint == fp {
		return p.provider, nil
	}
	p, err := build()
	if err != nil {
		return p, err
	}
	if c.byKey == nil {
		c.byKey = map[string]cachedProvider[P]{}
	}
	c.byKey[key] = cachedProvider[P]{fingerprint: fp, provider: p}
	return p, nil
}

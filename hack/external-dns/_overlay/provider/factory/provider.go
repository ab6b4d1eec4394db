// This file stands in for external-dns's provider/factory/provider.go in the
// test world's build (hack/external-dns/build.sh builds a copy of the
// module with it): the same Select, with only the rfc2136 provider the tests use
// linked in. The upstream table links every provider's SDK, half of the
// build's source. Any other --provider fails at start, naming the flag.

package factory

import (
	"context"
	"fmt"

	"sigs.k8s.io/external-dns/endpoint"
	"sigs.k8s.io/external-dns/pkg/apis/externaldns"
	"sigs.k8s.io/external-dns/provider"
	"sigs.k8s.io/external-dns/provider/rfc2136"
)

// ProviderConstructor makes a provider from the configuration, as upstream's.
type ProviderConstructor func(ctx context.Context, cfg *externaldns.Config, domainFilter *endpoint.DomainFilter) (provider.Provider, error)

// Select makes the provider --provider names, cached for
// --provider-cache-time when that is set, as upstream's Select does.
func Select(ctx context.Context, cfg *externaldns.Config, domainFilter *endpoint.DomainFilter) (provider.Provider, error) {
	if cfg.Provider != externaldns.ProviderRFC2136 {
		return nil, fmt.Errorf("--provider=%s: this build of external-dns (HyperFleet's hack/external-dns) links only the %s provider; use --provider=%s or the upstream binary",
			cfg.Provider, externaldns.ProviderRFC2136, externaldns.ProviderRFC2136)
	}
	p, err := rfc2136.New(ctx, cfg, domainFilter)
	if err != nil {
		return nil, err
	}
	if p != nil && cfg.ProviderCacheTime > 0 {
		return provider.NewCachedProvider(p, cfg.ProviderCacheTime), nil
	}
	return p, nil
}

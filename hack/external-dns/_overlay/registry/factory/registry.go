// This file stands in for external-dns's registry/factory/registry.go in the
// test world's build (hack/external-dns/build.sh builds a copy of the
// module with it): the same Select, with only the txt and noop registries linked
// in. The upstream table adds the dynamodb and aws-sd registries and with
// them the AWS SDK. Any other --registry fails at start, naming the flag.

package factory

import (
	"fmt"

	"sigs.k8s.io/external-dns/pkg/apis/externaldns"
	"sigs.k8s.io/external-dns/provider"
	"sigs.k8s.io/external-dns/registry"
	"sigs.k8s.io/external-dns/registry/noop"
	"sigs.k8s.io/external-dns/registry/txt"
)

// RegistryConstructor makes a registry over a provider, as upstream's.
type RegistryConstructor func(cfg *externaldns.Config, p provider.Provider) (registry.Registry, error)

// Select makes the registry --registry names.
func Select(cfg *externaldns.Config, p provider.Provider) (registry.Registry, error) {
	switch cfg.Registry {
	case externaldns.RegistryTXT:
		return txt.New(cfg, p)
	case externaldns.RegistryNoop:
		return noop.New(cfg, p)
	}
	return nil, fmt.Errorf("--registry=%s: this build of external-dns (HyperFleet's hack/external-dns) links only the %s and %s registries; use one of them or the upstream binary",
		cfg.Registry, externaldns.RegistryTXT, externaldns.RegistryNoop)
}

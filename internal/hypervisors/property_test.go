package hypervisors

import (
	"errors"
	"fmt"
	"testing"

	"pgregory.net/rapid"

	"github.com/hyperfleet/hyperfleet/internal/testworld/proptest"
	"github.com/hyperfleet/hyperfleet/pkg/provider"
)

// configs draws the ClusterConfig a HypervisorCluster resolves to, from a
// small set of values per field so that sequences repeat configurations
// as often as they change them: endpoint, token (a rotated Secret), TLS
// pinning, nodes, storages, bridge and VM id range.
var configs = rapid.Custom(func(t *rapid.T) provider.ClusterConfig {
	pick := func(label string, values ...string) string { return rapid.SampledFrom(values).Draw(t, label) }
	cfg := provider.ClusterConfig{
		Endpoint:       pick("endpoint", "https://pve-a:8006/api2/json", "https://pve-b:8006/api2/json"),
		TokenID:        "root@pam!hyperfleet",
		TokenSecret:    pick("token", "s1", "s2"),
		ISOStorage:     pick("isoStorage", "local", "isos"),
		DefaultStorage: pick("defaultStorage", "", "local-lvm"),
		DefaultBridge:  pick("bridge", "vmbr0", "vmbr1"),
		VMIDStart:      rapid.SampledFrom([]int{1000, 2000}).Draw(t, "vmidStart"),
	}
	cfg.VMIDEnd = cfg.VMIDStart + 999
	switch rapid.IntRange(0, 2).Draw(t, "tls") {
	case 0:
		cfg.FingerprintSHA256 = pick("fingerprint", "aa:bb", "cc:dd")
	case 1:
		cfg.CABundle = []byte(pick("ca", "ca-1", "ca-2"))
	}
	if rapid.Bool().Draw(t, "nodes") {
		cfg.Nodes = rapid.SliceOfNDistinct(rapid.SampledFrom([]string{"pve1", "pve2", "pve3"}), 1, 3, rapid.ID[string]).Draw(t, "node list")
	}
	return cfg
})

// Feature: hyperfleet-operator, Property 25: Provider Selection and Configuration
//
// TestProviderConfigurationProperty: over generated sequences of
// connections of up to three HypervisorClusters, each with a generated
// configuration (a changed spec, a rotated Secret, the same again), builds
// that fail (a bad CA), and removals, the registry hands every cluster the
// provider built from its current configuration: a new provider exactly
// when the configuration changed since the last one built, the same one
// otherwise, never another cluster's; a failed build keeps the last good
// provider (the reconciler reports the failure in the cluster's
// conditions); a removed cluster has none until it connects again.
func TestProviderConfigurationProperty(t *testing.T) {
	proptest.Check(t, 300, func(t *rapid.T) {
		r := NewRegistry()
		type built struct {
			cluster string
			cfg     provider.ClusterConfig
		}
		var builds []built
		// model: the provider each cluster has (index into builds) and
		// the configuration it was built from.
		model := map[string]int{}
		names := []string{"pve-a", "pve-b", "pve-c"}
		for step := range rapid.IntRange(1, 40).Draw(t, "steps") {
			name := rapid.SampledFrom(names).Draw(t, "cluster")
			if rapid.IntRange(0, 9).Draw(t, "remove") == 0 {
				r.Remove(name)
				delete(model, name)
				if _, _, ok := r.Provider(name); ok {
					t.Fatalf("step %d: removed cluster %s still has a provider", step, name)
				}
				continue
			}
			cfg := configs.Draw(t, "config")
			cfg.Name = name
			fail := rapid.IntRange(0, 7).Draw(t, "build fails") == 0
			calls := 0
			p, err := r.Connect(name, cfg, func() (provider.Provider, error) {
				calls++
				if fail {
					return nil, errors.New("spec.tls: the CA bundle holds no certificate")
				}
				builds = append(builds, built{name, cfg})
				return &stubProvider{id: len(builds) - 1}, nil
			})
			prev, had := model[name]
			unchanged := had && ConfigHash(builds[prev].cfg) == ConfigHash(cfg)
			switch {
			case unchanged:
				if calls != 0 || err != nil || p.(*stubProvider).id != prev {
					t.Fatalf("step %d: %s reconnected with its configuration unchanged: %d builds, provider %v, %v", step, name, calls, p, err)
				}
			case calls != 1:
				t.Fatalf("step %d: %s's configuration changed but %d builds ran", step, name, calls)
			case fail:
				if err == nil || p != nil {
					t.Fatalf("step %d: a failed build returned provider %v, error %v", step, p, err)
				}
			default:
				if err != nil || p.(*stubProvider).id != len(builds)-1 {
					t.Fatalf("step %d: %s: provider %v, error %v; want the one just built", step, name, p, err)
				}
				model[name] = len(builds) - 1
			}
			// Every cluster has the provider of its own last good build.
			for _, n := range names {
				got, _, ok := r.Provider(n)
				want, has := model[n]
				if ok != has {
					t.Fatalf("step %d: %s connected %v, want %v", step, n, ok, has)
				}
				if !has {
					continue
				}
				if id := got.(*stubProvider).id; id != want || builds[id].cluster != n {
					t.Fatalf("step %d: %s has provider %d (built for %s), want %d", step, n, id, builds[id].cluster, want)
				}
			}
		}
		if len(r.Names()) != len(model) {
			t.Fatalf("registry names %v, model %v", r.Names(), fmt.Sprint(model))
		}
	})
}

package clusterconfig

import (
	"context"
	"testing"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
)

// TestResolveCloneLimits: the operator's clone limits for a cluster
// without spec.limits are the API's defaults (which the CRD applies to a
// field left out of limits; api/v1alpha1's TestCloneLimitDefaults checks
// that side).
func TestResolveCloneLimits(t *testing.T) {
	for name, limits := range map[string]*hfv1.HypervisorLimits{"unset": nil, "empty": {}} {
		cfg, err := Resolve(context.Background(), nil, &hfv1.HypervisorCluster{Spec: hfv1.HypervisorClusterSpec{Limits: limits}})
		if err != nil {
			t.Fatal(err)
		}
		if cfg.ClonesPerNode != hfv1.DefaultClonesPerNode || cfg.ClonesPerStorage != hfv1.DefaultClonesPerStorage {
			t.Errorf("limits %s: clones per node %d, per storage %d; want the API defaults %d and %d",
				name, cfg.ClonesPerNode, cfg.ClonesPerStorage, hfv1.DefaultClonesPerNode, hfv1.DefaultClonesPerStorage)
		}
	}
	cfg, err := Resolve(context.Background(), nil, &hfv1.HypervisorCluster{Spec: hfv1.HypervisorClusterSpec{Limits: &hfv1.HypervisorLimits{ClonesPerNode: 1, ClonesPerStorage: 7}}})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.ClonesPerNode != 1 || cfg.ClonesPerStorage != 7 {
		t.Errorf("explicit limits 1 and 7 became %d and %d", cfg.ClonesPerNode, cfg.ClonesPerStorage)
	}
}

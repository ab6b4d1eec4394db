package clusterconfig

import (
	"context"
	"slices"
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

// TestProxmoxSettings: each Proxmox setting is read from spec.proxmox,
// else from its deprecated top-level field (clusters written before
// spec.proxmox keep working), else its default; a cluster is told about
// each deprecated field it sets and about no other.
func TestProxmoxSettings(t *testing.T) {
	legacyRange, newRange := &hfv1.VMIDRange{Start: 1000, End: 1999}, &hfv1.VMIDRange{Start: 5000, End: 5999}
	for _, tc := range []struct {
		name       string
		spec       hfv1.HypervisorClusterSpec
		start, end int
		iso        string
		deprecated []MovedField
	}{
		{name: "neither: the defaults", start: 100, end: 999999999, iso: hfv1.DefaultISOStorage},
		{name: "an empty proxmox section: the defaults", spec: hfv1.HypervisorClusterSpec{Proxmox: &hfv1.ProxmoxClusterSettings{}},
			start: 100, end: 999999999, iso: hfv1.DefaultISOStorage},
		{name: "the deprecated fields alone still work", spec: hfv1.HypervisorClusterSpec{VMIDRange: legacyRange, ISOStorage: "isos"}, //nolint:staticcheck // the deprecated fields under test
			start: 1000, end: 1999, iso: "isos",
			deprecated: []MovedField{{"spec.vmidRange", "spec.proxmox.vmidRange"}, {"spec.isoStorage", "spec.proxmox.isoStorage"}}},
		{name: "the proxmox section alone", spec: hfv1.HypervisorClusterSpec{Proxmox: &hfv1.ProxmoxClusterSettings{VMIDRange: newRange, ISOStorage: "cephfs"}},
			start: 5000, end: 5999, iso: "cephfs"},
		{name: "the section wins over a deprecated field (admission refuses both; the reader still picks one)",
			spec:  hfv1.HypervisorClusterSpec{VMIDRange: legacyRange, ISOStorage: "isos", Proxmox: &hfv1.ProxmoxClusterSettings{VMIDRange: newRange, ISOStorage: "cephfs"}}, //nolint:staticcheck // the deprecated fields under test
			start: 5000, end: 5999, iso: "cephfs",
			deprecated: []MovedField{{"spec.vmidRange", "spec.proxmox.vmidRange"}, {"spec.isoStorage", "spec.proxmox.isoStorage"}}},
		{name: "one setting moved, the other still deprecated", spec: hfv1.HypervisorClusterSpec{ISOStorage: "isos", Proxmox: &hfv1.ProxmoxClusterSettings{VMIDRange: newRange}}, //nolint:staticcheck // the deprecated fields under test
			start: 5000, end: 5999, iso: "isos", deprecated: []MovedField{{"spec.isoStorage", "spec.proxmox.isoStorage"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := &hfv1.HypervisorCluster{Spec: tc.spec}
			if start, end := VMIDRange(c); start != tc.start || end != tc.end {
				t.Errorf("VMIDRange = %d-%d, want %d-%d", start, end, tc.start, tc.end)
			}
			if got := ISOStorage(c); got != tc.iso {
				t.Errorf("ISOStorage = %q, want %q", got, tc.iso)
			}
			cfg, err := Resolve(context.Background(), nil, c)
			if err != nil {
				t.Fatal(err)
			}
			if cfg.VMIDStart != tc.start || cfg.VMIDEnd != tc.end || cfg.ISOStorage != tc.iso {
				t.Errorf("the provider is configured with VM ids %d-%d and ISO storage %q, want %d-%d and %q",
					cfg.VMIDStart, cfg.VMIDEnd, cfg.ISOStorage, tc.start, tc.end, tc.iso)
			}
			if got := Deprecated(c); !slices.Equal(got, tc.deprecated) {
				t.Errorf("Deprecated = %v, want %v", got, tc.deprecated)
			}
		})
	}
}

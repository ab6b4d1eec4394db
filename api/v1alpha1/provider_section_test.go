package v1alpha1_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/test/testenv"
)

// TestProxmoxSettingsPlaces: the Proxmox settings are accepted in
// spec.proxmox, and still in their deprecated top-level fields, so a
// cluster written before spec.proxmox existed is still valid; a cluster
// moves a setting by removing the old field and setting the new one in
// one update. Neither place gets a schema default (the operator's default
// applies, the Proxmox kind's ReadCluster): a default in either would set a
// moved setting twice. (The refusals are rows of TestInvalidObjectsAreRejected.)
func TestProxmoxSettingsPlaces(t *testing.T) {
	ctx := context.Background()
	vmids := map[string]any{"start": int64(1000), "end": int64(1999)}
	for name, tc := range map[string]struct {
		spec map[string]any
		// move, when set, is applied in an update that must be accepted.
		move mutation
	}{
		"the deprecated fields alone":       {spec: map[string]any{"vmidRange": vmids, "isoStorage": "isos"}},
		"the proxmox section alone":         {spec: map[string]any{"proxmox": map[string]any{"vmidRange": vmids, "isoStorage": "isos"}}},
		"one setting in each place":         {spec: map[string]any{"vmidRange": vmids, "proxmox": map[string]any{"isoStorage": "isos"}}},
		"neither (the operator's defaults)": {spec: map[string]any{}},
		"an empty proxmox section":          {spec: map[string]any{"proxmox": map[string]any{}}},
		"moved from the deprecated fields in one update": {spec: map[string]any{"vmidRange": vmids, "isoStorage": "isos"},
			move: all(del("spec", "vmidRange"), del("spec", "isoStorage"), set(map[string]any{"vmidRange": vmids, "isoStorage": "isos"}, "spec", "proxmox"))},
	} {
		t.Run(name, func(t *testing.T) {
			c := validCluster()
			c.SetName("proxmox-" + strings.NewReplacer(" ", "-", "(", "", ")", "", "'", "").Replace(name))
			for k, v := range tc.spec {
				set(v, "spec", k)(c)
			}
			want := runtime.DeepCopyJSONValue(c.Object["spec"]).(map[string]any)
			if err := env.Client.Create(ctx, c, client.FieldValidation("Strict")); err != nil {
				t.Fatalf("the API server rejected the cluster: %v", err)
			}
			t.Cleanup(func() { _ = env.Client.Delete(ctx, c) })
			for _, field := range []string{"vmidRange", "isoStorage", "proxmox"} {
				if got, _, _ := unstructured.NestedFieldNoCopy(c.Object, "spec", field); fmt.Sprint(got) != fmt.Sprint(want[field]) {
					t.Errorf("stored spec.%s is %v, want %v (what was written, no default)", field, got, want[field])
				}
			}
			if tc.move == nil {
				return
			}
			tc.move(c)
			if err := env.Client.Update(ctx, c, client.FieldValidation("Strict")); err != nil {
				t.Fatalf("the API server rejected the move to spec.proxmox: %v", err)
			}
			typed := &hfv1.HypervisorCluster{}
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(c.Object, typed); err != nil {
				t.Fatal(err)
			}
			if p := typed.Spec.Proxmox; p == nil || p.VMIDRange == nil || p.VMIDRange.Start != 1000 || p.ISOStorage != "isos" ||
				typed.Spec.VMIDRange != nil || typed.Spec.ISOStorage != "" { //nolint:staticcheck // the deprecated fields are gone
				t.Errorf("after the move: spec %+v", typed.Spec)
			}
		})
	}
}

// TestProxmoxSectionOnlyWithProxmox: spec.proxmox is refused on a cluster
// of another provider, by the rule a second provider's section copies.
// The provider enum has only proxmox today, and the API server checks no
// CEL rule of an object that breaks the enum, so the test installs the
// generated HypervisorCluster CRD a second time, under a test group and
// with a second provider in the enum: the rule it checks is the one
// config/crd/bases ships.
func TestProxmoxSectionOnlyWithProxmox(t *testing.T) {
	ctx := context.Background()
	const group = "secondprovider.test.hyperfleet.io"
	crd := hypervisorClusterCRD(t)
	crd.SetName("hypervisorclusters." + group)
	crd.SetResourceVersion("")
	if err := unstructured.SetNestedField(crd.Object, group, "spec", "group"); err != nil {
		t.Fatal(err)
	}
	versions, _, _ := unstructured.NestedSlice(crd.Object, "spec", "versions")
	for _, v := range versions {
		props := []string{"schema", "openAPIV3Schema", "properties", "spec", "properties", "provider", "enum"}
		values, found, err := unstructured.NestedSlice(v.(map[string]any), props...)
		if err != nil || !found {
			t.Fatalf("the CRD has no provider enum at %s: %v", strings.Join(props, "."), err)
		}
		if err := unstructured.SetNestedSlice(v.(map[string]any), append(values, "vsphere"), props...); err != nil {
			t.Fatal(err)
		}
	}
	if err := unstructured.SetNestedSlice(crd.Object, versions, "spec", "versions"); err != nil {
		t.Fatal(err)
	}
	if err := env.Client.Create(ctx, crd); err != nil {
		t.Fatalf("installing the test copy of the CRD: %v", err)
	}
	t.Cleanup(func() { _ = env.Client.Delete(ctx, crd) })

	cluster := func(name, provider string, proxmox map[string]any) *unstructured.Unstructured {
		c := validCluster()
		c.SetAPIVersion(group + "/v1alpha1")
		c.SetName(name)
		set(provider, "spec", "provider")(c)
		if proxmox != nil {
			set(proxmox, "spec", "proxmox")(c)
		}
		return c
	}
	// The new resource is served once the CRD is established; until then
	// a create fails with NotFound (no such resource).
	other := cluster("other", "vsphere", nil)
	deadline := time.Now().Add(30 * time.Second)
	for {
		err := env.Client.Create(ctx, other)
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a vsphere cluster without spec.proxmox was not accepted by the test CRD within 30s: %v", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Cleanup(func() { _ = env.Client.Delete(ctx, other) })

	err := env.Client.Create(ctx, cluster("other-with-proxmox", "vsphere", map[string]any{"isoStorage": "local"}))
	assertRejected(t, err, `spec.proxmox: Invalid value: "object": spec.proxmox holds Proxmox VE settings and is allowed only with provider proxmox: remove spec.proxmox or set provider: proxmox`)

	withProxmox := cluster("proxmox-with-proxmox", "proxmox", map[string]any{"isoStorage": "local"})
	if err := env.Client.Create(ctx, withProxmox); err != nil {
		t.Fatalf("a proxmox cluster with spec.proxmox was rejected by the test CRD: %v", err)
	}
	t.Cleanup(func() { _ = env.Client.Delete(ctx, withProxmox) })
}

// hypervisorClusterCRD is the generated HypervisorCluster CRD.
func hypervisorClusterCRD(t *testing.T) *unstructured.Unstructured {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(testenv.RepoRoot(), "config", "crd", "bases", "hyperfleet.io_hypervisorclusters.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	crd := &unstructured.Unstructured{}
	if err := utilyaml.Unmarshal(raw, &crd.Object); err != nil {
		t.Fatalf("parsing the CRD: %v", err)
	}
	return crd
}

package v1alpha1_test

import (
	"context"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
)

// TestVMReferenceConversion: a reference names its VM by providerID; one
// written before providerID existed (vmID only, always a Proxmox VM then)
// reads as proxmox://<vmID> and is Legacy; NewVMReference mirrors a
// Proxmox VM id into vmID and nothing else.
func TestVMReferenceConversion(t *testing.T) {
	for _, tc := range []struct {
		name       string
		ref        *hfv1.VMReference
		wantID     string
		wantLegacy bool
	}{
		{name: "nil", ref: nil},
		{name: "empty", ref: &hfv1.VMReference{HypervisorCluster: "pve"}},
		{name: "provider ID", ref: &hfv1.VMReference{HypervisorCluster: "pve", ProviderID: "proxmox://1234", VMID: 1234}, wantID: "proxmox://1234"},
		{name: "another hypervisor", ref: &hfv1.VMReference{HypervisorCluster: "vc", ProviderID: "vsphere://4211-aa"}, wantID: "vsphere://4211-aa"},
		{name: "written before provider IDs", ref: &hfv1.VMReference{HypervisorCluster: "pve", VMID: 1234, Node: "pve1"}, wantID: "proxmox://1234", wantLegacy: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.ref.ID(); got != tc.wantID {
				t.Errorf("ID() = %q, want %q", got, tc.wantID)
			}
			if got := tc.ref.Legacy(); got != tc.wantLegacy {
				t.Errorf("Legacy() = %v, want %v", got, tc.wantLegacy)
			}
		})
	}
	for id, wantVMID := range map[string]int32{
		"proxmox://1234":       1234,
		"proxmox://99":         0, // below Proxmox's ids
		"proxmox://01234":      0, // not the form the provider writes
		"proxmox://1234/x":     0,
		"proxmox://9999999999": 0, // beyond int32
		"vsphere://1234":       0,
	} {
		ref := hfv1.NewVMReference("pve", id, "pve1")
		if ref.ProviderID != id || ref.VMID != wantVMID || ref.Node != "pve1" || ref.HypervisorCluster != "pve" || ref.Legacy() {
			t.Errorf("NewVMReference(%q) = %+v, want vmID %d", id, *ref, wantVMID)
		}
	}
}

// TestVMReferenceFormsAccepted: the API server stores a vmRef with a
// providerID (with or without the vmID mirror) and one written before
// providerID existed (vmID only, or vmId as an earlier operator spelt it),
// so that existing claims keep validating.
func TestVMReferenceFormsAccepted(t *testing.T) {
	ctx := context.Background()
	ns := newNamespace(t)
	for name, ref := range map[string]map[string]any{
		"provider id":          {"hypervisorCluster": "pve", "providerID": "vsphere://4211-aa"},
		"provider id and vmID": {"hypervisorCluster": "pve", "providerID": "proxmox://1234", "vmID": int64(1234), "node": "pve1"},
		"legacy":               {"hypervisorCluster": "pve", "vmID": int64(1234), "node": "pve1"},
		"legacy, old spelling": {"hypervisorCluster": "pve", "vmId": int64(1234), "node": "pve1"},
	} {
		t.Run(name, func(t *testing.T) {
			obj := validClaim()
			obj.SetNamespace(ns)
			obj.SetName("")
			obj.SetGenerateName("vmref-")
			if err := env.Client.Create(ctx, obj, client.FieldValidation("Strict")); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = env.Client.Delete(ctx, obj) })
			if err := unstructured.SetNestedMap(obj.Object, ref, "status", "vmRef"); err != nil {
				t.Fatal(err)
			}
			if err := env.Client.Status().Update(ctx, obj); err != nil {
				t.Fatalf("status.vmRef %v refused: %v", ref, err)
			}
		})
	}
}

package proxmox

import (
	"testing"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/pkg/provider"
)

// TestIDRoundTrip: FormatID and ParseID are inverse on Proxmox's ids, and
// ParseID refuses everything FormatID never writes, as ClassPermanent.
func TestIDRoundTrip(t *testing.T) {
	for _, vmid := range []int{100, 1234, 999999999} {
		got, err := ParseID(FormatID(vmid))
		if err != nil || got != vmid {
			t.Errorf("ParseID(FormatID(%d)) = %d, %v", vmid, got, err)
		}
	}
	for _, bad := range []provider.ID{"", "1234", "proxmox://", "proxmox://x", "proxmox://-5", "proxmox://0", "proxmox://01234",
		"proxmox:// 1234", "proxmox://1234/", "proxmox://pve1/1234", "Proxmox://1234", "vsphere://1234"} {
		if vmid, err := ParseID(bad); err == nil || provider.Classify(err) != provider.ClassPermanent {
			t.Errorf("ParseID(%q) = %d, %v (class %s); want a permanent error", bad, vmid, err, provider.Classify(err))
		}
	}
}

// TestIDMatchesAPIConversion: the API package reads a claim written before
// providerID existed (vmID only) as the ID this provider writes for that
// id, and mirrors this provider's IDs into vmID: the two schemes agree.
func TestIDMatchesAPIConversion(t *testing.T) {
	legacy := &hfv1.VMReference{HypervisorCluster: "pve", VMID: 1234}
	if got := provider.ID(legacy.ID()); got != FormatID(1234) {
		t.Errorf("legacy vmRef reads as %q, the provider writes %q", got, FormatID(1234))
	}
	if ref := hfv1.NewVMReference("pve", string(FormatID(1234)), "pve1"); ref.VMID != 1234 {
		t.Errorf("NewVMReference(%q) mirrors vmID %d, want 1234", FormatID(1234), ref.VMID)
	}
}

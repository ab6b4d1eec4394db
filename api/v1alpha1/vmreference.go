package v1alpha1

import (
	"strconv"
	"strings"
)

// proxmoxIDScheme is the scheme of the provider IDs of Proxmox VMs, the
// one pkg/provider/proxmox.FormatID writes (its tests check that the two
// agree). The API package knows it for two reasons only: to mirror a
// Proxmox VM id into vmID for display, and to read references written
// before providerID existed, when every VM was a Proxmox VM.
const proxmoxIDScheme = "proxmox://"

// NewVMReference is the reference of the VM with provider ID id (and node
// hint) on HypervisorCluster cluster, vmID mirrored for a Proxmox VM.
func NewVMReference(cluster, id, node string) *VMReference {
	ref := &VMReference{HypervisorCluster: cluster, ProviderID: id, Node: node}
	if digits, ok := strings.CutPrefix(id, proxmoxIDScheme); ok {
		if vmid, err := strconv.ParseInt(digits, 10, 32); err == nil && vmid >= 100 && strconv.FormatInt(vmid, 10) == digits {
			ref.VMID = int32(vmid)
		}
	}
	return ref
}

// ID is the provider ID of the VM: providerID, or for a reference written
// before providerID existed (vmID only; every VM was a Proxmox VM then)
// proxmox://<vmID>. Empty for a reference that names no VM.
func (r *VMReference) ID() string {
	switch {
	case r == nil:
		return ""
	case r.ProviderID != "":
		return r.ProviderID
	case r.VMID != 0:
		return proxmoxIDScheme + strconv.Itoa(int(r.VMID))
	}
	return ""
}

// Legacy reports whether r was written before providerID existed: the
// operator writes it again with providerID.
func (r *VMReference) Legacy() bool {
	return r != nil && r.ProviderID == "" && r.VMID != 0
}

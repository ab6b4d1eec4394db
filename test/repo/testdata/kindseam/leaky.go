// Package leaky is shared code that names a hypervisor kind once by each
// rule (Proxmox in a comment is no leak).
package leaky

import (
	"example.com/pkg/provider/proxmox"
)

// VMID is the neutral machine number, no leak.
func leak(c cluster) (int, string) {
	var vmid int
	_ = proxmox.Kind.Proxmox
	_ = c.TemplateID
	return vmid, "set libvirt's pool"
}

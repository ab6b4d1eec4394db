package provider

import (
	"fmt"
	"strings"
)

// Hardware is what a VM gets beyond its CPU count, memory and boot disk: a
// CPU model and flags, host devices passed through and extra disks. The
// operator builds it from the template (internal/vmspec) and checks it
// against the cluster's tenancy rules before placement; the claim's signed
// placement record keeps it, so an edit of the template reaches only VMs
// placed after it. Each kind translates it (Proxmox VE: cpu, hostpciN,
// scsiN; libvirt: <cpu>, <hostdev>, extra volumes) or refuses what it
// cannot give (ClassConfiguration) rather than build a VM without it. nil
// in a VMSpec means the template's own CPU, no device and no extra disk.
type Hardware struct {
	// CPUType is the CPU model; empty keeps the template's.
	CPUType string `json:"cpuType,omitempty"`
	// CPUFlags turn features on (+flag) or off (-flag) on top of CPUType.
	CPUFlags []string `json:"cpuFlags,omitempty"`
	// NestedVirtualization exposes the host's virtualization extensions
	// to the guest.
	NestedVirtualization bool `json:"nested,omitempty"`
	// Devices are the device mappings the VM takes one device of each,
	// in order (a mapping named twice takes two of its devices).
	Devices []string `json:"devices,omitempty"`
	// ExtraDisks are empty disks added after the boot disk, in order.
	ExtraDisks []Disk `json:"extraDisks,omitempty"`
}

// Disk is an empty disk of a VM.
type Disk struct {
	// Bytes is its size.
	Bytes int64 `json:"bytes"`
	// Storage is where it is allocated; empty: the cluster's default.
	Storage string `json:"storage,omitempty"`
}

// IsZero reports whether h asks for nothing beyond the template.
func (h *Hardware) IsZero() bool {
	return h == nil || (h.CPUType == "" && len(h.CPUFlags) == 0 && !h.NestedVirtualization && len(h.Devices) == 0 && len(h.ExtraDisks) == 0)
}

// Check refuses a Hardware no operator builds: a flag without its sign,
// an empty mapping, a disk of no size. A placement record's is checked
// before a VM is built from it.
func (h *Hardware) Check() error {
	if h == nil {
		return nil
	}
	for _, f := range h.CPUFlags {
		if len(f) < 2 || (f[0] != '+' && f[0] != '-') || strings.ContainsAny(f, ",;= ") {
			return fmt.Errorf("CPU flag %q is not +name or -name", f)
		}
	}
	if strings.ContainsAny(h.CPUType, ",;= ") {
		return fmt.Errorf("CPU type %q holds a separator", h.CPUType)
	}
	for _, m := range h.Devices {
		if m == "" || strings.ContainsAny(m, ",;= ") {
			return fmt.Errorf("device mapping %q is not a name", m)
		}
	}
	for i, d := range h.ExtraDisks {
		if d.Bytes <= 0 {
			return fmt.Errorf("extra disk %d has no size", i)
		}
	}
	return nil
}

// ExtraDiskBytes is the size of h's extra disks together.
func (h *Hardware) ExtraDiskBytes() int64 {
	if h == nil {
		return 0
	}
	var n int64
	for _, d := range h.ExtraDisks {
		n += d.Bytes
	}
	return n
}

package libvirt

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	golibvirt "github.com/digitalocean/go-libvirt"
	"libvirt.org/go/libvirtxml"

	"github.com/hyperfleet/hyperfleet/pkg/provider"
)

// Reasons of the hardware a host cannot give.
const (
	reasonCPUTypeUnsupported = "CPUTypeUnsupported"
	// reasonInvalidHardware: a hardware no operator builds (a bad flag, a
	// disk of no size), or a VM with disks its spec does not name.
	reasonInvalidHardware = "InvalidHardware"
)

// cpuTypeHost is the CPU type that passes the host's CPU through.
const cpuTypeHost = "host"

// hostCPU is what a host says of the CPUs it gives its guests.
type hostCPU struct {
	host string
	// vendor is the host CPU's vendor as libvirt names it (Intel, AMD).
	vendor string
	// models are the named models of its custom CPU mode; nil when not
	// read (no model asked for).
	models []string
	// blockers are, by model the host's CPU cannot run as it is, the
	// features it lacks for it (none known: an empty list).
	blockers map[string][]string
}

// wantsCPU says whether hw sets anything on the CPU.
func wantsCPU(hw *provider.Hardware) bool {
	return hw != nil && (hw.CPUType != "" || len(hw.CPUFlags) > 0 || hw.NestedVirtualization)
}

// readHostCPU reads h's CPU vendor and, when the VM names a model, the
// models its custom mode offers for domains like x (domain capabilities
// for x's emulator, arch, machine and type): one or two calls, made only
// for a VM whose hardware sets its CPU.
func (p *Provider) readHostCPU(h *host, x *libvirtxml.Domain, hw *provider.Hardware) (hostCPU, error) {
	out := hostCPU{host: h.Name}
	l, err := h.client()
	if err != nil {
		return out, err
	}
	opt := func(s string) golibvirt.OptString {
		if s == "" {
			return nil
		}
		return golibvirt.OptString{s}
	}
	var emulator, arch, machine string
	if x.Devices != nil {
		emulator = x.Devices.Emulator
	}
	if x.OS != nil && x.OS.Type != nil {
		arch, machine = x.OS.Type.Arch, x.OS.Type.Machine
	}
	doc, err := l.ConnectGetDomainCapabilities(opt(emulator), opt(arch), opt(machine), opt(x.Type), 0)
	if err != nil {
		return out, classify(fmt.Errorf("read the domain capabilities of host %s: %w", h.Name, err))
	}
	var caps libvirtxml.DomainCaps
	if err := caps.Unmarshal(doc); err != nil {
		return out, fmt.Errorf("parse the domain capabilities of host %s: %w", h.Name, err)
	}
	custom := hw.CPUType != "" && hw.CPUType != cpuTypeHost
	if caps.CPU != nil {
		for _, m := range caps.CPU.Modes {
			switch m.Name {
			case "host-model":
				out.vendor = m.Vendor
			case "custom":
				if custom {
					out.models, out.blockers = []string{}, map[string][]string{}
					for _, model := range m.Models {
						out.models = append(out.models, model.Name)
						if model.Usable == "no" {
							out.blockers[model.Name] = []string{}
						}
					}
					for _, b := range m.Blockers {
						for _, f := range b.Features {
							out.blockers[b.Model] = append(out.blockers[b.Model], f.Name)
						}
					}
				}
			}
		}
	}
	if out.vendor == "" {
		// Under emulation the host-model mode names no vendor; the host's
		// own capabilities do.
		doc, err := l.ConnectGetCapabilities()
		if err != nil {
			return out, classify(fmt.Errorf("read the capabilities of host %s: %w", h.Name, err))
		}
		var c libvirtxml.Caps
		if err := c.Unmarshal(doc); err != nil {
			return out, fmt.Errorf("parse the capabilities of host %s: %w", h.Name, err)
		}
		if c.Host.CPU != nil {
			out.vendor = c.Host.CPU.Vendor
		}
	}
	return out, nil
}

// cpuRefusal is the error of a CPU a host cannot give.
func cpuRefusal(host, format string, args ...any) error {
	return provider.Errorf(provider.ClassConfiguration, reasonCPUTypeUnsupported, "spec.hardware on host %s: %s", host, fmt.Sprintf(format, args...))
}

// applyCPU sets hw's CPU on d, a clone's definition, as host hc gives it:
// type "host" (or nested virtualization without a type) passes the host's
// CPU through; another type is that model exactly, which the host must
// offer; +flag requires a feature, -flag disables it; nested
// virtualization on a model requires the host vendor's extension (vmx,
// svm). The template's topology stays. Flags alone go on the template's
// own CPU, which must then name a model or a host mode: libvirt takes no
// features without one.
func applyCPU(d *libvirtxml.Domain, hw *provider.Hardware, hc hostCPU) error {
	if !wantsCPU(hw) {
		return nil
	}
	cpu := &libvirtxml.DomainCPU{}
	if d.CPU != nil {
		*cpu = *d.CPU
		cpu.Features = slices.Clone(d.CPU.Features)
	}
	switch {
	case hw.CPUType == cpuTypeHost || hw.CPUType == "" && hw.NestedVirtualization:
		// A model means nothing to a passed-through CPU; features do.
		cpu.Mode, cpu.Match, cpu.Check, cpu.Model = "host-passthrough", "", "", nil
	case hw.CPUType != "":
		if hc.models != nil && !slices.Contains(hc.models, hw.CPUType) {
			return cpuRefusal(hc.host, "CPU type %q is not a CPU model libvirt offers there (virsh domcapabilities lists them)", hw.CPUType)
		}
		if err := checkUsable(hc, hw); err != nil {
			return err
		}
		cpu.Mode, cpu.Match, cpu.Check = "custom", "exact", ""
		cpu.Model = &libvirtxml.DomainCPUModel{Value: hw.CPUType, Fallback: "forbid"}
	case cpu.Mode != "host-passthrough" && cpu.Mode != "host-model" && (cpu.Model == nil || cpu.Model.Value == ""):
		return cpuRefusal(hc.host, "CPU flags %s need a CPU type: the template's CPU names no model", strings.Join(hw.CPUFlags, " "))
	}
	if hw.NestedVirtualization && cpu.Mode == "custom" {
		ext, err := virtualizationFlag(hc)
		if err != nil {
			return err
		}
		setFeature(cpu, ext, "require")
	}
	for _, f := range hw.CPUFlags {
		policy := "require"
		if f[0] == '-' {
			policy = "disable"
		}
		setFeature(cpu, f[1:], policy)
	}
	d.CPU = cpu
	return nil
}

// checkUsable refuses a model the host's CPU cannot run (libvirt lists
// it usable='no'), unless the flags disable every feature it lacks: such
// a domain is defined, but never starts.
func checkUsable(hc hostCPU, hw *provider.Hardware) error {
	blockers, unusable := hc.blockers[hw.CPUType]
	if !unusable {
		return nil
	}
	var missing []string
	for _, f := range blockers {
		if !slices.Contains(hw.CPUFlags, "-"+f) {
			missing = append(missing, f)
		}
	}
	switch {
	case len(blockers) == 0:
		return cpuRefusal(hc.host, "CPU type %q is a model its CPU cannot run", hw.CPUType)
	case len(missing) > 0:
		return cpuRefusal(hc.host, "CPU type %q needs features its CPU lacks: %s (disable them with cpuFlags -name, or choose another model)", hw.CPUType, strings.Join(missing, ", "))
	}
	return nil
}

// virtualizationFlag is the CPU feature of hc's virtualization
// extension.
func virtualizationFlag(hc hostCPU) (string, error) {
	switch strings.ToLower(hc.vendor) {
	case "intel":
		return "vmx", nil
	case "amd":
		return "svm", nil
	}
	return "", cpuRefusal(hc.host, "nested virtualization on a named CPU model needs an Intel (vmx) or AMD (svm) host; its CPU vendor is %q (use cpuType host)", hc.vendor)
}

// setFeature sets feature name of cpu to policy, replacing what the
// template said of it.
func setFeature(cpu *libvirtxml.DomainCPU, name, policy string) {
	for i := range cpu.Features {
		if cpu.Features[i].Name == name {
			cpu.Features[i].Policy = policy
			return
		}
	}
	cpu.Features = append(cpu.Features, libvirtxml.DomainCPUFeature{Policy: policy, Name: name})
}

// extraDisk is one extra disk of a VM's definition.
type extraDisk struct {
	pool, volume, format string
}

// extraDiskPrefix begins the volume names of VM vmid's extra disks: the
// install's name of the VM, as its boot disk's, so that a volume is
// known as the VM's from its name alone.
func (p *Provider) extraDiskPrefix(vmid int) string { return p.signer.VMName(vmid) + "-disk" }

// extraDiskName is the volume name of VM vmid's extra disk n (from 1).
func (p *Provider) extraDiskName(vmid, n int, format string) string {
	return fmt.Sprintf("%s%d.%s", p.extraDiskPrefix(vmid), n, format)
}

// extraDiskNumber is n of an extra disk volume of VM vmid, 0 for any
// other volume.
func (p *Provider) extraDiskNumber(vmid int, volume string) int {
	rest, ok := strings.CutPrefix(volume, p.extraDiskPrefix(vmid))
	if !ok {
		return 0
	}
	num, format, ok := strings.Cut(rest, ".")
	n, err := strconv.Atoi(num)
	if !ok || err != nil || n < 1 || format == "" || strconv.Itoa(n) != num {
		return 0
	}
	return n
}

// extraDisksOf are the extra disks d's definition holds, in order.
func (p *Provider) extraDisksOf(d *domain) []extraDisk {
	if d.xml.Devices == nil {
		return nil
	}
	var out []extraDisk
	for _, disk := range d.xml.Devices.Disks {
		if src := disk.Source; src != nil && src.Volume != nil && p.extraDiskNumber(d.meta.ID, src.Volume.Volume) > 0 {
			e := extraDisk{pool: src.Volume.Pool, volume: src.Volume.Volume}
			if disk.Driver != nil {
				e.format = disk.Driver.Type
			}
			out = append(out, e)
		}
	}
	return out
}

// volumeFormat is the format of the volumes HyperFleet writes to a pool
// of type poolType: qcow2 where the pool holds files, raw where it holds
// block devices (LVM, disk, iSCSI, RBD, ZFS), which know no qcow2.
func volumeFormat(poolType string) string {
	switch poolType {
	case "dir", "fs", "netfs", "gluster", "vstorage":
		return "qcow2"
	}
	return "raw"
}

// planExtraDisks names the extra disks of spec's VM vmid on h: each in
// its storage (the volume pool when it names none), of the format the
// pool's type allows. A pool h lacks is ClassConfiguration.
func (p *Provider) planExtraDisks(h *host, spec *provider.VMSpec, vmid int) ([]extraDisk, error) {
	if spec.Hardware == nil || len(spec.Hardware.ExtraDisks) == 0 {
		return nil, nil
	}
	l, err := h.client()
	if err != nil {
		return nil, err
	}
	formats := map[string]string{}
	var out []extraDisk
	for i, disk := range spec.Hardware.ExtraDisks {
		name := disk.Storage
		if name == "" {
			name = p.settings.VolumePool
		}
		format, ok := formats[name]
		if !ok {
			pool, err := l.StoragePoolLookupByName(name)
			if err != nil {
				return nil, provider.Errorf(provider.ClassConfiguration, "StorageNotFound",
					"spec.hardware.extraDisks[%d].storage: storage pool %q on host %s: %v", i, name, h.Name, classify(err))
			}
			doc, err := l.StoragePoolGetXMLDesc(pool, 0)
			if err != nil {
				return nil, classify(fmt.Errorf("read pool %s on host %s: %w", name, h.Name, err))
			}
			var sp libvirtxml.StoragePool
			if err := sp.Unmarshal(doc); err != nil {
				return nil, fmt.Errorf("parse pool %s on host %s: %w", name, h.Name, err)
			}
			format = volumeFormat(sp.Type)
			formats[name] = format
		}
		out = append(out, extraDisk{pool: name, volume: p.extraDiskName(vmid, i+1, format), format: format})
	}
	return out, nil
}

// addExtraDisks attaches disks to d as virtio disks at the first free
// vdX names (vdb, vdc... next to a vda boot disk).
func addExtraDisks(d *libvirtxml.Domain, disks []extraDisk) error {
	if len(disks) == 0 {
		return nil
	}
	if d.Devices == nil {
		d.Devices = &libvirtxml.DomainDeviceList{}
	}
	used := map[string]bool{}
	for _, disk := range d.Devices.Disks {
		if disk.Target != nil {
			used[disk.Target.Dev] = true
		}
	}
	next := 'a'
	for _, e := range disks {
		for ; next <= 'z' && used["vd"+string(next)]; next++ {
		}
		if next > 'z' {
			return provider.Errorf(provider.ClassConfiguration, reasonInvalidHardware, "spec.hardware.extraDisks: no free virtio disk name for %d extra disks", len(disks))
		}
		dev := "vd" + string(next)
		used[dev] = true
		d.Devices.Disks = append(d.Devices.Disks, libvirtxml.DomainDisk{Device: "disk",
			Driver: &libvirtxml.DomainDiskDriver{Name: "qemu", Type: e.format},
			Source: &libvirtxml.DomainDiskSource{Volume: &libvirtxml.DomainDiskSourceVolume{Pool: e.pool, Volume: e.volume}},
			Target: &libvirtxml.DomainDiskTarget{Dev: dev, Bus: "virtio"}})
	}
	return nil
}

// extraVolumeXML is an empty extra disk of capacity bytes.
func extraVolumeXML(e extraDisk, capacity int64) (string, error) {
	v := libvirtxml.StorageVolume{Name: e.volume,
		Capacity: &libvirtxml.StorageVolumeSize{Unit: "bytes", Value: uint64(capacity)},
		Target:   &libvirtxml.StorageVolumeTarget{Format: &libvirtxml.StorageVolumeTargetFormat{Type: e.format}}}
	return v.Marshal()
}

// ensureExtraDisks creates the first missing extra disk of d (one write)
// and reports done once all exist. The sizes are the spec's: the volume
// names say which of its disks each is.
func (p *Provider) ensureExtraDisks(spec *provider.VMSpec, d *domain, res *provider.EnsureResult) (bool, error) {
	vmid, h := d.meta.ID, d.host
	disks := p.extraDisksOf(d)
	if len(disks) == 0 {
		return true, nil
	}
	l, err := h.client()
	if err != nil {
		return false, err
	}
	for _, e := range disks {
		pool, err := l.StoragePoolLookupByName(e.pool)
		if err != nil {
			return false, provider.Errorf(provider.ClassConfiguration, "StorageNotFound", "storage pool %q of VM %d's extra disk on host %s: %v", e.pool, vmid, h.Name, classify(err))
		}
		_, err = l.StorageVolLookupByName(pool, e.volume)
		if err == nil {
			continue
		}
		if !isCode(err, golibvirt.ErrNoStorageVol) {
			return false, classify(fmt.Errorf("look up extra disk %s of VM %d on host %s: %w", e.volume, vmid, h.Name, err))
		}
		n := p.extraDiskNumber(vmid, e.volume)
		if spec.Hardware == nil || n > len(spec.Hardware.ExtraDisks) {
			return false, provider.Errorf(provider.ClassPermanent, reasonInvalidHardware, "VM %d has extra disk %s its spec does not ask for", vmid, e.volume)
		}
		capacity := spec.Hardware.ExtraDisks[n-1].Bytes
		need := int64(overlayAllocation)
		if e.format == "raw" {
			need = capacity // a block device is allocated whole
		}
		if err := p.checkRoom(l, pool, h, need); err != nil {
			return false, err
		}
		doc, err := extraVolumeXML(e, capacity)
		if err != nil {
			return false, err
		}
		if _, err := l.StorageVolCreateXML(pool, doc, 0); err != nil {
			return false, poolError(classify(fmt.Errorf("create extra disk %s of VM %d in pool %s on host %s: %w", e.volume, vmid, e.pool, h.Name, err)), e.pool)
		}
		p.did(res, d, provider.PhaseCloning, opExtraDisk, nextStep, "created extra disk %s of VM %d on host %s", e.volume, vmid, h.Name)
		return false, nil
	}
	return true, nil
}

// deleteExtraDisk deletes the first extra disk of d that exists; deleted
// says it did.
func (p *Provider) deleteExtraDisk(l *golibvirt.Libvirt, d *domain) (bool, error) {
	for _, e := range p.extraDisksOf(d) {
		pool, err := l.StoragePoolLookupByName(e.pool)
		if isCode(err, golibvirt.ErrNoStoragePool) {
			continue // its pool is gone, and the volume with it
		}
		if err != nil {
			return false, classify(fmt.Errorf("look up pool %s of VM %d's extra disk: %w", e.pool, d.meta.ID, err))
		}
		vol, err := l.StorageVolLookupByName(pool, e.volume)
		if isCode(err, golibvirt.ErrNoStorageVol) {
			continue
		}
		if err == nil {
			err = l.StorageVolDelete(vol, 0)
		}
		if err != nil {
			return false, classify(fmt.Errorf("delete extra disk %s of VM %d: %w", e.volume, d.meta.ID, err))
		}
		return true, nil
	}
	return false, nil
}

// applyHardware sets spec's hardware on x, the first definition of VM
// vmid on h, before anything of the VM is written: its CPU as h gives it,
// the devices its placement chose (or, after a restart, free ones of h)
// and its extra disks, to be created next. Only a lack of devices is
// ClassResource.
func (p *Provider) applyHardware(h *host, spec *provider.VMSpec, vmid int, x *libvirtxml.Domain) error {
	hw := spec.Hardware
	if hw.IsZero() {
		return nil
	}
	if err := hw.Check(); err != nil {
		return provider.Errorf(provider.ClassConfiguration, reasonInvalidHardware, "spec.hardware: %v", err)
	}
	if wantsCPU(hw) {
		hc, err := p.readHostCPU(h, x, hw)
		if err != nil {
			return err
		}
		if err := applyCPU(x, hw, hc); err != nil {
			return err
		}
	}
	if len(hw.Devices) > 0 {
		if err := p.checkMappings(hw.Devices); err != nil {
			return err
		}
		addrs, ok, err := p.claimDevices(h, spec.Owner, hw.Devices)
		if err != nil {
			return err
		}
		if !ok {
			return provider.Errorf(provider.ClassResource, "InsufficientCapacity",
				"host %s has no free device of each mapping %s for VM %d any more; placing again: %w", h.Name, strings.Join(hw.Devices, ", "), vmid, provider.ErrNoCapacity)
		}
		if err := addHostdevs(x, addrs); err != nil {
			return err
		}
	}
	disks, err := p.planExtraDisks(h, spec, vmid)
	if err != nil {
		return err
	}
	return addExtraDisks(x, disks)
}

package proxmox

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	"github.com/hyperfleet/hyperfleet/pkg/provider"
	"github.com/hyperfleet/hyperfleet/pkg/provider/proxmox/qemucpu"
)

// Fields of spec.hardware the messages point at.
const (
	fieldCPUType    = "spec.hardware.cpuType"
	fieldCPUFlags   = "spec.hardware.cpuFlags"
	fieldNested     = "spec.hardware.nestedVirtualization"
	fieldExtraDisks = "spec.hardware.extraDisks"
)

// checkHardware refuses the CPU a VM of hw cannot get on Proxmox VE major:
// a model or flag the version does not take (qemu-server refuses the
// config write; CPUConfig.pm validate_vm_cpu_conf), and nested
// virtualization on PVE 8 without cputype host, where no VM-specific flag
// passes vmx or svm through. templateCPU is the template's own cpu
// option, the model a VM keeps when hw names none.
func checkHardware(major int, hw *provider.Hardware, templateCPU string) error {
	if hw == nil {
		return nil
	}
	if t := hw.CPUType; t != "" && !qemucpu.KnownModel(major, t) {
		return configErr("CPUTypeUnsupported", fieldCPUType, "Proxmox VE %d has no CPU model %q; its built-in models: %s (or a custom model, custom-<name>)",
			major, t, strings.Join(qemucpu.Models(major), ", "))
	}
	for _, f := range hw.CPUFlags {
		if !qemucpu.KnownFlag(major, f) {
			return configErr("CPUFlagUnsupported", fieldCPUFlags, "Proxmox VE %d does not let a VM set CPU flag %s; the flags it allows (each as +flag or -flag): %s%s",
				major, f, strings.Join(qemucpu.Flags(major), ", "), flagAdvice(major, f))
		}
	}
	if hw.NestedVirtualization && major < 9 && cpuType(hw, templateCPU) != "host" {
		return configErr("NestedVirtualizationUnsupported", fieldNested, "Proxmox VE %d passes the virtualization extensions only with CPU model host, and the VM's would be %s; set hardware.cpuType: host, or upgrade the cluster to Proxmox VE 9 (its nested-virt flag works with other models)",
			major, cmp.Or(cpuType(hw, templateCPU), "kvm64 (Proxmox's default)"))
	}
	return nil
}

// flagAdvice points a flag asking for nested virtualization at the field
// that gives it.
func flagAdvice(major int, flag string) string {
	switch flag[1:] {
	case "vmx", "svm", qemucpu.NestedVirt:
		if major < 9 {
			return "; for nested virtualization set hardware.nestedVirtualization with hardware.cpuType: host"
		}
		return "; for nested virtualization set hardware.nestedVirtualization"
	}
	return ""
}

// cpuType is the model a VM of hw gets: hw's, else the template's.
func cpuType(hw *provider.Hardware, templateCPU string) string {
	return cmp.Or(hw.CPUType, qemucpu.Parse(templateCPU).Values["cputype"])
}

// cpuOption is the VM's cpu option for hw on Proxmox VE major, "" when hw
// leaves the template's: the template's option with hw's model and its
// flags added (a flag of hw replaces the template's of the same name), and
// on PVE 9 +nested-virt for nested virtualization (on PVE 8 cputype host,
// which checkHardware requires, passes the extensions already). A VM that
// names no model keeps the template's, or Proxmox's default kvm64 written
// out, since the option cannot carry flags without one.
func cpuOption(major int, hw *provider.Hardware, templateCPU string) string {
	if hw == nil || (hw.CPUType == "" && len(hw.CPUFlags) == 0 && !hw.NestedVirtualization) {
		return ""
	}
	o := qemucpu.Parse(templateCPU)
	o.Set("cputype", cmp.Or(cpuType(hw, templateCPU), "kvm64"))
	flags := slices.DeleteFunc(strings.Split(o.Values["flags"], ";"), func(f string) bool { return f == "" })
	add := slices.Clone(hw.CPUFlags)
	if hw.NestedVirtualization && major >= 9 {
		add = append(add, "+"+qemucpu.NestedVirt)
	}
	for _, f := range add {
		flags = slices.DeleteFunc(flags, func(old string) bool { return len(old) > 1 && old[1:] == f[1:] })
		flags = append(flags, f)
	}
	if len(flags) > 0 {
		o.Set("flags", strings.Join(flags, ";"))
	}
	return o.String()
}

// maxSCSI is the highest scsiN key qemu-server knows (scsi0-scsi30).
const maxSCSI = 30

// extraDiskKeys are the scsiN keys of hw's extra disks, in order: the
// free indexes after the highest scsi drive of the template, so that the
// same disk always gets the same key.
func extraDiskKeys(tmpl *templateInfo, n int) ([]string, error) {
	next := 0
	for _, d := range tmpl.drives {
		if i, ok := strings.CutPrefix(d, "scsi"); ok {
			if n, err := strconv.Atoi(i); err == nil && n >= next {
				next = n + 1
			}
		}
	}
	if next+n-1 > maxSCSI {
		return nil, configErr("NoFreeSCSISlot", fieldExtraDisks, "%s uses scsi drives up to scsi%d and Proxmox has scsi0-scsi%d: no room for %d extra disks; take drives off the template or ask for fewer disks",
			fmtTemplate(tmpl), next-1, maxSCSI, n)
	}
	keys := make([]string, n)
	for i := range keys {
		keys[i] = "scsi" + strconv.Itoa(next+i)
	}
	return keys, nil
}

// extraDiskStorage is where an extra disk goes: its storage (the
// cluster's defaultStorage when the template names none), else the VM's
// boot disk's, which holds VM images on the VM's node already.
func (p *Provider) extraDiskStorage(d provider.Disk, bootStorage string) string {
	return cmp.Or(d.Storage, p.cfg.DefaultStorage, bootStorage)
}

// bootStorage is the storage of the boot disk of a clone of tmpl for spec.
func (p *Provider) bootStorage(tmpl *templateInfo, spec *provider.VMSpec) string {
	if sids := p.vmDiskStorages(tmpl, spec); len(sids) > 0 {
		return sids[0]
	}
	return ""
}

// diskGiB is a disk's size in Proxmox's new-volume syntax: whole GiB,
// rounded up, so the disk is never smaller than asked.
func diskGiB(bytes int64) int64 {
	return (bytes + 1<<30 - 1) >> 30
}

// hardwareConfig adds hw's cpu option and extra disks to the configure
// step's update. An extra disk is "<storage>:<GiB>", Proxmox's syntax for
// a new volume it allocates in the update (and destroys with the VM: the
// volume is the VM's, vm-<vmid>-disk-N). A key the VM already holds is
// the disk from an update whose answer was lost: left as it is.
func (c *ensureCall) hardwareConfig(ctx context.Context, body map[string]any, cfg vmConfig) error {
	hw := c.spec.Hardware
	if hw.IsZero() {
		return nil
	}
	major, err := c.p.majorVersion(ctx)
	if err != nil {
		return err
	}
	if err := checkHardware(major, hw, cfg["cpu"]); err != nil {
		return err
	}
	if cpu := cpuOption(major, hw, cfg["cpu"]); cpu != "" {
		body["cpu"] = cpu
	}
	if len(hw.ExtraDisks) == 0 {
		return nil
	}
	tmpl, err := c.p.template(ctx, c.spec.Source)
	if err != nil {
		return err
	}
	keys, err := extraDiskKeys(tmpl, len(hw.ExtraDisks))
	if err != nil {
		return err
	}
	boot, _ := cfg.bootDisk()
	for i, d := range hw.ExtraDisks {
		if _, ok := cfg[keys[i]]; ok {
			continue
		}
		body[keys[i]] = fmt.Sprintf("%s:%d", c.p.extraDiskStorage(d, parseDrive(cfg[boot]).storage()), diskGiB(d.Bytes))
	}
	return nil
}

// checkSpecHardware refuses, before a VM is placed, the hardware a clone
// of tmpl could not get on the cluster's version: what ValidateTemplate
// checked of the template, again for a VM whose placement record was
// written before an edit, or before the cluster changed version.
func (p *Provider) checkSpecHardware(ctx context.Context, tmpl *templateInfo, hw *provider.Hardware) error {
	if hw.IsZero() {
		return nil
	}
	major, err := p.majorVersion(ctx)
	if err != nil {
		return err
	}
	if err := checkHardware(major, hw, tmpl.cpu); err != nil {
		return err
	}
	_, err = extraDiskKeys(tmpl, len(hw.ExtraDisks))
	return err
}

// checkTemplateHardware is ValidateTemplate's check of the hardware the
// template's VMs get: the CPU against the cluster's version, and each
// extra disk's storage on the template's node, holding VM images.
func (p *Provider) checkTemplateHardware(ctx context.Context, view *clusterView, t *templateInfo, src provider.TemplateSource) error {
	hw := src.Hardware
	if err := p.checkSpecHardware(ctx, t, hw); err != nil || hw == nil {
		return err
	}
	boot := p.bootStorage(t, &provider.VMSpec{Source: src})
	for i, d := range hw.ExtraDisks {
		sid := p.extraDiskStorage(d, boot)
		field := fmt.Sprintf("%s[%d].storage", fieldExtraDisks, i)
		st, ok := view.storages[t.node][sid]
		if !ok {
			return configErr("StorageNotFound", field, "storage %q does not exist on node %s, where template %d lives", sid, t.node, t.id)
		}
		if !strings.Contains(","+st.Content+",", ",images,") {
			return configErr("StorageNoImages", field, "storage %q does not allow VM disks (content %q); enable images on it or pick another", sid, st.Content)
		}
	}
	return nil
}

// extraDiskNeed is the space each storage needs on node for spec's extra
// disks, by storage id; placement adds it to the boot disk's need
// (storageShortLocked).
func (p *Provider) extraDiskNeed(tmpl *templateInfo, spec *provider.VMSpec) map[string]int64 {
	if spec.Hardware == nil || len(spec.Hardware.ExtraDisks) == 0 {
		return nil
	}
	boot := p.bootStorage(tmpl, spec)
	need := map[string]int64{}
	for _, d := range spec.Hardware.ExtraDisks {
		need[p.extraDiskStorage(d, boot)] += diskGiB(d.Bytes) << 30
	}
	return need
}

// extraDiskShortLocked says why node cannot hold the extra disks of need
// (extraDiskNeed), "" if it can: each storage must be on the node and
// have their size free, after the full clones placed there. A storage the
// boot disk uses too is checked again by storageShortLocked, against the
// sum of both.
func (p *Provider) extraDiskShortLocked(view *clusterView, node string, need map[string]int64) string {
	for _, sid := range slices.Sorted(maps.Keys(need)) {
		st, ok := view.storages[node][sid]
		if !ok {
			return fmt.Sprintf("storage %s of spec.hardware.extraDisks is not on this node", sid)
		}
		free := st.MaxDisk - st.Disk - p.reservedDisk[storageKey(view, node, sid)]
		if free < need[sid] {
			return fmt.Sprintf("storage %s has %d GiB free for %d GiB of extra disks (spec.hardware.extraDisks)", sid, max(free, 0)>>30, need[sid]>>30)
		}
	}
	return ""
}

// Package qemucpu is what Proxmox VE 8 and 9 accept in a VM's cpu option
// (qemu-server's pve-vm-cpu-conf format): the built-in CPU models and the
// VM-specific CPU flags of each version, read from qemu-server's
// src/PVE/QemuServer/CPUConfig.pm. PVE 8: branch stable-bookworm
// (qemu-server 8.4.10), $builtin_models line 42, $cpu_vendor_list line 80,
// @supported_cpu_flags line 164. PVE 9: branch master (qemu-server 9.2.6),
// $builtin_models_by_arch line 65, the hard-coded $cpu_models_by_arch of
// initialize_cpu_models line 133 (a host whose QEMU ships
// /usr/share/kvm/cpu-models-x86_64.json reads its models from there) and
// CPUFlags.pm's $supported_vm_specific_cpu_flags_by_arch line 19. The
// provider checks a template's hardware against it before a VM is cloned;
// the simulator (internal/testworld/simulator/proxmox) refuses a config
// write with it as validate_vm_cpu_conf does.
package qemucpu

import (
	"fmt"
	"slices"
	"strings"
)

// NestedVirt is PVE 9's VM-specific flag that passes the host's
// virtualization extensions (vmx on Intel, svm on AMD) to the guest.
const NestedVirt = "nested-virt"

// CustomPrefix starts the names of custom CPU models
// (/etc/pve/virtual-guest/cpu-models.conf): is_custom_model.
const CustomPrefix = "custom-"

// x86-64-v2 to v4 are $builtin_models (both versions), models Proxmox
// defines on top of qemu64.
var builtinModels = []string{"x86-64-v2", "x86-64-v2-AES", "x86-64-v3", "x86-64-v4"}

// The models of both versions' lists; host is in PVE 8's
// $cpu_vendor_list and added by PVE 9's initialize_cpu_models for the
// host's own architecture.
var commonModels = []string{
	"486", "pentium", "pentium2", "pentium3", "coreduo", "core2duo", "Conroe", "Penryn",
	"Nehalem", "Nehalem-IBRS", "Westmere", "Westmere-IBRS", "SandyBridge", "SandyBridge-IBRS",
	"IvyBridge", "IvyBridge-IBRS", "Haswell", "Haswell-IBRS", "Haswell-noTSX", "Haswell-noTSX-IBRS",
	"Broadwell", "Broadwell-IBRS", "Broadwell-noTSX", "Broadwell-noTSX-IBRS",
	"Skylake-Client", "Skylake-Client-IBRS", "Skylake-Client-noTSX-IBRS", "Skylake-Client-v4",
	"Skylake-Server", "Skylake-Server-IBRS", "Skylake-Server-noTSX-IBRS", "Skylake-Server-v4", "Skylake-Server-v5",
	"Cascadelake-Server", "Cascadelake-Server-v2", "Cascadelake-Server-noTSX", "Cascadelake-Server-v4", "Cascadelake-Server-v5",
	"Cooperlake", "Cooperlake-v2", "KnightsMill", "Icelake-Client", "Icelake-Client-noTSX",
	"Icelake-Server", "Icelake-Server-noTSX", "Icelake-Server-v3", "Icelake-Server-v4", "Icelake-Server-v5", "Icelake-Server-v6",
	"SapphireRapids", "SapphireRapids-v2", "GraniteRapids",
	"athlon", "phenom", "Opteron_G1", "Opteron_G2", "Opteron_G3", "Opteron_G4", "Opteron_G5",
	"EPYC", "EPYC-IBPB", "EPYC-v3", "EPYC-v4", "EPYC-Rome", "EPYC-Rome-v2", "EPYC-Rome-v3", "EPYC-Rome-v4",
	"EPYC-Milan", "EPYC-Milan-v2", "EPYC-Genoa",
	"host", "kvm32", "kvm64", "qemu32", "qemu64", "max",
}

// pve9Models are the x86_64 models qemu-server 9 added.
var pve9Models = []string{
	"Icelake-Server-v7", "SapphireRapids-v3", "SapphireRapids-v4", "GraniteRapids-v2", "GraniteRapids-v3",
	"SierraForest", "SierraForest-v2", "SierraForest-v3", "ClearwaterForest",
	"EPYC-v5", "EPYC-Rome-v5", "EPYC-Milan-v3", "EPYC-Genoa-v2", "EPYC-Turin",
}

// pve8Flags is PVE 8's @supported_cpu_flags.
var pve8Flags = []string{"pcid", "spec-ctrl", "ibpb", "ssbd", "virt-ssbd", "amd-ssbd", "amd-no-ssb", "pdpe1gb", "md-clear", "hv-tlbflush", "hv-evmcs", "aes"}

// Models are the built-in CPU models Proxmox VE major version major
// accepts (9 for any later one), sorted.
func Models(major int) []string {
	out := slices.Concat(commonModels, builtinModels)
	if major >= 9 {
		out = append(out, pve9Models...)
	}
	slices.Sort(out)
	return out
}

// Flags are the CPU flags a VM's own config may set on Proxmox VE major
// version major, sorted: PVE 9 adds nested-virt.
func Flags(major int) []string {
	out := slices.Clone(pve8Flags)
	if major >= 9 {
		out = append(out, NestedVirt)
	}
	slices.Sort(out)
	return out
}

// KnownModel reports whether model is one of the version's built-in
// models or names a custom one (whose existence only the cluster knows).
func KnownModel(major int, model string) bool {
	return strings.HasPrefix(model, CustomPrefix) || slices.Contains(Models(major), model)
}

// KnownFlag reports whether flag, with its + or -, is one a VM's config
// may set on the version.
func KnownFlag(major int, flag string) bool {
	return len(flag) > 1 && (flag[0] == '+' || flag[0] == '-') && slices.Contains(Flags(major), flag[1:])
}

// keys are the pve-vm-cpu-conf keys of each version ($cpu_fmt); PVE 9
// adds guest-phys-bits and level.
func keys(major int) []string {
	k := []string{"cputype", "reported-model", "hidden", "hv-vendor-id", "flags", "phys-bits"}
	if major >= 9 {
		k = append(k, "guest-phys-bits", "level")
	}
	return k
}

// Option is a parsed cpu option: its keys in order and their values
// (cputype is the default key: "host,flags=+aes" sets it).
type Option struct {
	Keys   []string
	Values map[string]string
}

// Parse reads a cpu option value; an empty value is an empty option.
func Parse(value string) Option {
	o := Option{Values: map[string]string{}}
	if value == "" {
		return o
	}
	for _, part := range strings.Split(value, ",") {
		k, v, ok := strings.Cut(part, "=")
		if !ok {
			k, v = "cputype", part
		}
		if _, dup := o.Values[k]; !dup {
			o.Keys = append(o.Keys, k)
		}
		o.Values[k] = v
	}
	return o
}

// Set sets key to value, keeping the key's place, or adds it at the end.
func (o *Option) Set(key, value string) {
	if _, ok := o.Values[key]; !ok {
		o.Keys = append(o.Keys, key)
	}
	o.Values[key] = value
}

// String writes the option as Proxmox prints it: cputype first, by its
// key.
func (o Option) String() string {
	parts := make([]string, 0, len(o.Keys))
	if t, ok := o.Values["cputype"]; ok {
		parts = append(parts, "cputype="+t)
	}
	for _, k := range o.Keys {
		if k != "cputype" {
			parts = append(parts, k+"="+o.Values[k])
		}
	}
	return strings.Join(parts, ",")
}

// Check is qemu-server's validate_vm_cpu_conf on a cpu option value for
// version major: an error with Proxmox's message for an unknown key, a
// missing or unknown cputype, a flag outside the VM-specific list or a
// reported-model. customExists says whether a custom model (without its
// prefix) is defined; nil: none is.
func Check(major int, value string, customExists func(name string) bool) error {
	o := Parse(value)
	for _, k := range o.Keys {
		if !slices.Contains(keys(major), k) {
			return fmt.Errorf("invalid format - property '%s' is not defined in schema", k)
		}
	}
	cputype := o.Values["cputype"]
	switch {
	case cputype == "":
		return fmt.Errorf("CPU is missing cputype")
	case strings.HasPrefix(cputype, CustomPrefix):
		if name := strings.TrimPrefix(cputype, CustomPrefix); customExists == nil || !customExists(name) {
			return fmt.Errorf("Custom cputype '%s' not found", name) //nolint:staticcheck // Proxmox's own message
		}
	case !slices.Contains(Models(major), cputype):
		return fmt.Errorf("Built-in cputype '%s' is not defined (missing 'custom-' prefix?)", cputype) //nolint:staticcheck // Proxmox's own message
	}
	if flags, ok := o.Values["flags"]; ok && flags != "" {
		for _, f := range strings.Split(flags, ";") {
			if !KnownFlag(major, f) {
				return fmt.Errorf("VM-specific CPU flags must be a subset of: %s", strings.Join(Flags(major), ", "))
			}
		}
	}
	if _, ok := o.Values["reported-model"]; ok {
		return fmt.Errorf("Property 'reported-model' not allowed in VM-specific CPU config.") //nolint:staticcheck,revive // Proxmox's own message
	}
	return nil
}

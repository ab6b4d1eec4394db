package proxmox

import (
	"strconv"
	"strings"
	"testing"

	proxmoxsim "github.com/hyperfleet/hyperfleet/internal/testworld/simulator/proxmox"
	"github.com/hyperfleet/hyperfleet/pkg/provider"
	"github.com/hyperfleet/hyperfleet/pkg/provider/proxmox/privileges"
)

// onVersion simulates Proxmox VE major version v.
func onVersion(v int) envOption {
	return func(c *proxmoxsim.Config, _ *provider.ClusterConfig) { c.PVEVersion = v }
}

// withScratch adds scratch, an image storage of capacity bytes on pve1.
func withScratch(capacity proxmoxsim.ByteSize) envOption {
	return func(c *proxmoxsim.Config, _ *provider.ClusterConfig) {
		c.Storages = append(c.Storages, proxmoxsim.StorageConfig{ID: "scratch", Type: "lvm", Content: []string{"images"}, Capacity: capacity})
	}
}

// hwSource is the test template's source with hardware hw, as the
// template controller hands it to ValidateTemplate.
func hwSource(hw *provider.Hardware) provider.TemplateSource {
	src := testSpec("x", "uid-x").Source
	src.Hardware = hw
	return src
}

// TestHardwareNestedVirtualization: a VM with cpuType host and nested
// virtualization runs on PVE 8 and PVE 9; its cpu option is host alone on
// PVE 8 (host passes vmx/svm already) and carries nested-virt on PVE 9.
func TestHardwareNestedVirtualization(t *testing.T) {
	for _, tc := range []struct {
		version int
		want    string
	}{{8, "cputype=host"}, {9, "cputype=host,flags=+nested-virt"}} {
		t.Run("PVE "+strconv.Itoa(tc.version), func(t *testing.T) {
			e := newEnv(t, onVersion(tc.version))
			hw := &provider.Hardware{CPUType: "host", NestedVirtualization: true}
			if _, err := e.p.ValidateTemplate(t.Context(), hwSource(hw)); err != nil {
				t.Fatalf("ValidateTemplate: %v", err)
			}
			spec := testSpec("runner-kvm", "uid-kvm")
			spec.Hardware = hw
			d := e.ensure(e.p, spec, provider.Progress{}, provider.PhaseRunning, 200)
			vmid, _ := progressOf(d.prog)
			if got := e.vm(vmid.VMID).Config["cpu"]; got != tc.want {
				t.Fatalf("cpu %q, want %q", got, tc.want)
			}
		})
	}
}

// TestHardwareRefusedBeforeClone: what a version does not take leaves the
// template invalid with a reason naming the value, the version and the
// allowed list, and a VM asking for it is refused before anything is
// cloned.
func TestHardwareRefusedBeforeClone(t *testing.T) {
	cases := []struct {
		version int
		name    string
		hw      *provider.Hardware
		reason  string
		want    []string
	}{
		{8, "vmx on PVE 8", &provider.Hardware{CPUType: "host", CPUFlags: []string{"+vmx"}}, "CPUFlagUnsupported",
			[]string{"spec.hardware.cpuFlags", "Proxmox VE 8", "+vmx", "aes, amd-no-ssb", "hardware.nestedVirtualization with hardware.cpuType: host"}},
		{8, "nested-virt on PVE 8", &provider.Hardware{CPUFlags: []string{"+nested-virt"}}, "CPUFlagUnsupported", []string{"Proxmox VE 8"}},
		{9, "svm on PVE 9", &provider.Hardware{CPUFlags: []string{"+svm"}}, "CPUFlagUnsupported", []string{"Proxmox VE 9", "nested-virt"}},
		{8, "nested without host on PVE 8", &provider.Hardware{CPUType: "x86-64-v2-AES", NestedVirtualization: true}, "NestedVirtualizationUnsupported",
			[]string{"spec.hardware.nestedVirtualization", "set hardware.cpuType: host", "upgrade"}},
		{8, "nested with the template's default model on PVE 8", &provider.Hardware{NestedVirtualization: true}, "NestedVirtualizationUnsupported",
			[]string{"kvm64"}},
		{8, "a model PVE 8 lacks", &provider.Hardware{CPUType: "EPYC-Turin"}, "CPUTypeUnsupported",
			[]string{"spec.hardware.cpuType", "Proxmox VE 8 has no CPU model \"EPYC-Turin\"", "x86-64-v2-AES"}},
		{9, "an unknown model", &provider.Hardware{CPUType: "Pentium-9"}, "CPUTypeUnsupported", []string{"Proxmox VE 9"}},
		{9, "an extra disk on a storage without images", &provider.Hardware{ExtraDisks: []provider.Disk{{Bytes: 1 << 30, Storage: "local"}}}, "StorageNoImages",
			[]string{"spec.hardware.extraDisks[0].storage", "local"}},
		{9, "an extra disk on no storage", &provider.Hardware{ExtraDisks: []provider.Disk{{Bytes: 1 << 30, Storage: "nowhere"}}}, "StorageNotFound",
			[]string{"spec.hardware.extraDisks[0].storage", "nowhere"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, onVersion(tc.version))
			check := func(what string, err error) {
				t.Helper()
				if err == nil {
					t.Fatalf("%s: accepted", what)
				}
				if provider.Classify(err) != provider.ClassConfiguration || provider.ReasonOf(err) != tc.reason {
					t.Fatalf("%s: %s error %s %q, want Configuration %s", what, provider.Classify(err), provider.ReasonOf(err), err, tc.reason)
				}
				for _, w := range tc.want {
					if !strings.Contains(err.Error(), w) {
						t.Fatalf("%s: error %q, want %q in it", what, err, w)
					}
				}
			}
			_, err := e.p.ValidateTemplate(t.Context(), hwSource(tc.hw))
			check("ValidateTemplate", err)
			if tc.reason == "StorageNoImages" || tc.reason == "StorageNotFound" {
				return // placement's storage check refuses these (TestHardwareExtraDiskPlacement)
			}
			spec := testSpec("runner-bad", "uid-bad")
			spec.Hardware = tc.hw
			_, err = e.p.EnsureVM(t.Context(), spec, provider.Progress{})
			check("EnsureVM", err)
			if n := e.nonTemplateVMs(); n != 0 {
				t.Fatalf("%d VMs cloned for a refused spec", n)
			}
		})
	}
}

// TestHardwareExtraDisks: extra disks are allocated on the named storage
// (and the cluster's default) at configure, as scsi1 and scsi2 after the
// template's scsi0, each rounded up to whole GiB, and are destroyed with
// the VM.
func TestHardwareExtraDisks(t *testing.T) {
	e := newEnv(t, withScratch(50<<30))
	spec := testSpec("runner-disks", "uid-disks")
	spec.Hardware = &provider.Hardware{ExtraDisks: []provider.Disk{{Bytes: 10 << 30, Storage: "scratch"}, {Bytes: 3<<30 + 1}}}
	d := e.ensure(e.p, spec, provider.Progress{}, provider.PhaseRunning, 200)
	prog, _ := progressOf(d.prog)
	conf := e.vm(prog.VMID).Config
	var vols []string
	for key, want := range map[string]string{"scsi1": "scratch:", "scsi2": "local-lvm:"} {
		dr := parseDrive(conf[key])
		if !strings.HasPrefix(dr.file, want) || !privileges.OwnedBy(dr.file, strconv.Itoa(prog.VMID)) {
			t.Fatalf("%s %q, want a volume of VM %d on %s", key, conf[key], prog.VMID, want)
		}
		vols = append(vols, dr.file)
	}
	if size := e.volume(parseDrive(conf["scsi1"]).file).Size; size != 10<<30 {
		t.Fatalf("scsi1 is %d bytes, want 10 GiB", size)
	}
	if size := e.volume(parseDrive(conf["scsi2"]).file).Size; size != 4<<30 {
		t.Fatalf("scsi2 is %d bytes, want 3 GiB and a byte rounded up to 4 GiB", size)
	}
	e.remove(e.p, spec.Owner, d.prog, 50)
	for _, v := range vols {
		if e.volume(v) != nil {
			t.Fatalf("extra disk %s outlived its VM", v)
		}
	}
}

// TestHardwareExtraDiskPlacement: placement counts the extra disks on
// their storage and refuses, naming it, a node whose storage cannot hold
// them, or that lacks the storage; a disk that fits is placed.
func TestHardwareExtraDiskPlacement(t *testing.T) {
	e := newEnv(t, withScratch(20<<30))
	refused := func(disk provider.Disk, want string) {
		t.Helper()
		spec := testSpec("runner-big", "uid-big")
		spec.Hardware = &provider.Hardware{ExtraDisks: []provider.Disk{disk}}
		_, err := e.p.EnsureVM(t.Context(), spec, provider.Progress{})
		if err == nil || provider.Classify(err) != provider.ClassResource || !strings.Contains(err.Error(), want) {
			t.Fatalf("error %v, want a Resource error containing %q", err, want)
		}
	}
	refused(provider.Disk{Bytes: 21 << 30, Storage: "scratch"}, "pve1: storage scratch has 20 GiB free for 21 GiB of extra disks (spec.hardware.extraDisks)")
	refused(provider.Disk{Bytes: 1 << 30, Storage: "elsewhere"}, "pve1: storage elsewhere of spec.hardware.extraDisks is not on this node")
	// On the boot disk's storage the extra disk counts with the boot disk:
	// local-lvm has under 468 GiB free for the 40 GiB boot disk.
	refused(provider.Disk{Bytes: 430 << 30, Storage: "local-lvm"}, "and 430 GiB of extra disks (spec.hardware.extraDisks)")
	spec := testSpec("runner-fits", "uid-fits")
	spec.Hardware = &provider.Hardware{ExtraDisks: []provider.Disk{{Bytes: 20 << 30, Storage: "scratch"}}}
	e.ensure(e.p, spec, provider.Progress{}, provider.PhasePlaced, 3)
}

// TestHardwareExtraDisksPromised: extra disks are promised at placement,
// so two VMs whose disks each fit a storage alone but not together are
// not both placed while neither is created; the promise goes with the
// placement that gives it up.
func TestHardwareExtraDisksPromised(t *testing.T) {
	e := newEnv(t, withScratch(30<<30))
	withDisk := func(name, uid string) *provider.VMSpec {
		spec := testSpec(name, uid)
		spec.Hardware = &provider.Hardware{ExtraDisks: []provider.Disk{{Bytes: 20 << 30, Storage: "scratch"}}}
		return spec
	}
	first := withDisk("runner-a", "uid-a")
	e.ensure(e.p, first, provider.Progress{}, provider.PhasePlaced, 3)
	_, err := e.p.EnsureVM(t.Context(), withDisk("runner-b", "uid-b"), provider.Progress{})
	if err == nil || provider.Classify(err) != provider.ClassResource || !strings.Contains(err.Error(), "storage scratch has 10 GiB free for 20 GiB of extra disks") {
		t.Fatalf("second VM: error %v, want the first VM's promised 20 GiB counted", err)
	}
	e.p.release(first.Owner.UID, 0, false)
	e.ensure(e.p, withDisk("runner-b", "uid-b"), provider.Progress{}, provider.PhasePlaced, 3)
}

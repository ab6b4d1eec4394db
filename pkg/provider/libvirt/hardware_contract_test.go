//go:build libvirtcontract

package libvirt

import (
	"errors"
	"slices"
	"strings"
	"testing"

	golibvirt "github.com/digitalocean/go-libvirt"
	"libvirt.org/go/libvirtxml"

	"github.com/hyperfleet/hyperfleet/pkg/provider"
)

// inactiveDomain reads back VM id's inactive definition.
func (w *world) inactiveDomain(t *testing.T, id provider.ID) *libvirtxml.Domain {
	t.Helper()
	doc, err := w.conn.DomainGetXMLDesc(w.domainOf(t, id), golibvirt.DomainXMLInactive)
	if err != nil {
		t.Fatal(err)
	}
	x, err := parseDomain(doc)
	if err != nil {
		t.Fatal(err)
	}
	return x
}

// TestHardwareDefined: spec.hardware as a real libvirtd takes it, with no
// guest started. A VM with a CPU model, flags, nested virtualization, a
// PCI device (none exists here: defining takes it, only a start would
// bind it) and an extra disk is defined with them and reads back so; the
// extra volume exists with its size. A new provider (a restart) reads the
// device as held from the definition and gives it to no second VM; a VM
// passing the host's CPU through takes flags too; a model libvirt does not
// offer is CPUTypeUnsupported, a mapping the cluster lacks
// DeviceMappingNotFound. DeleteVM leaves no extra volume.
func TestHardwareDefined(t *testing.T) {
	w := newWorld(t)
	cfg := w.cfg
	settings := *cfg.Settings.(*ClusterSettings)
	settings.Devices = []Device{{Mapping: "gpu", Host: worldHost, Address: "0000:af:00.0"}}
	cfg.Settings = &settings
	p := w.provider(t, cfg)

	spec := w.faultSpec()
	spec.Hardware = &provider.Hardware{CPUType: "qemu64", CPUFlags: []string{"+aes", "-hypervisor"}, NestedVirtualization: true,
		Devices: []string{"gpu"}, ExtraDisks: []provider.Disk{{Bytes: 96 << 20}}}
	prog := configured(t, p, spec) // defined, not started: no guest boots
	x := w.inactiveDomain(t, prog.ID)
	cpu := x.CPU
	if cpu == nil || cpu.Mode != "custom" || cpu.Match != "exact" || cpu.Model == nil || cpu.Model.Value != "qemu64" {
		t.Errorf("CPU read back: %+v", cpu)
	}
	features := map[string]string{}
	if cpu != nil {
		for _, f := range cpu.Features {
			features[f.Name] = f.Policy
		}
	}
	hc, err := p.readHostCPU(p.hosts[0], x, spec.Hardware)
	if err != nil {
		t.Fatal(err)
	}
	ext, err := virtualizationFlag(hc)
	if err != nil {
		t.Fatal(err)
	}
	if features["aes"] != "require" || features["hypervisor"] != "disable" || features[ext] != "require" {
		t.Errorf("CPU features read back: %v; want aes required, hypervisor disabled, %s required", features, ext)
	}
	if held := heldDevices([]*libvirtxml.Domain{x}); len(held) != 1 || !held["0000:af:00.0"] || x.Devices.Hostdevs[0].Managed != "yes" {
		t.Errorf("hostdevs read back: %+v", x.Devices.Hostdevs)
	}
	disks := p.extraDisksOf(&domain{xml: x, meta: vmMeta{ID: mustID(t, prog.ID)}})
	if len(disks) != 1 || disks[0].pool != worldImages || disks[0].format != "qcow2" {
		t.Fatalf("extra disks read back: %+v", disks)
	}
	pool, err := w.conn.StoragePoolLookupByName(worldImages)
	if err != nil {
		t.Fatal(err)
	}
	vol, err := w.conn.StorageVolLookupByName(pool, disks[0].volume)
	if err != nil {
		t.Fatalf("extra volume %s: %v", disks[0].volume, err)
	}
	if _, capacity, _, err := w.conn.StorageVolGetInfo(vol); err != nil || capacity != 96<<20 {
		t.Errorf("extra volume capacity %d, %v; want %d", capacity, err, 96<<20)
	}

	// A restart: the device is held by the definition alone.
	p = w.provider(t, cfg)
	second := w.faultSpec()
	second.Owner.UID, second.Name = "7d0f5b0e-0000-4000-8000-000000000002", "hf-second"
	second.Hardware = &provider.Hardware{Devices: []string{"gpu"}}
	if _, err := p.EnsureVM(t.Context(), second, provider.Progress{}); !errors.Is(err, provider.ErrNoCapacity) {
		t.Errorf("a second VM asking for the held device: %v, want ErrNoCapacity", err)
	}
	second.Hardware = &provider.Hardware{Devices: []string{"fpga"}}
	if _, err := p.EnsureVM(t.Context(), second, provider.Progress{}); provider.ReasonOf(err) != reasonDeviceMappingNotFound {
		t.Errorf("an unknown mapping: %v, want %s", err, reasonDeviceMappingNotFound)
	}
	second.Hardware = &provider.Hardware{CPUType: "Cray-1"}
	var prog2 provider.Progress
	if _, err := drive(t, p, second, &prog2, phaseIs(provider.PhaseRunning)); provider.ReasonOf(err) != reasonCPUTypeUnsupported || !strings.Contains(err.Error(), worldHost) {
		t.Errorf("an unknown CPU model: %v, want %s naming host %s", err, reasonCPUTypeUnsupported, worldHost)
	}
	p.forget(second.Owner)
	second.Hardware = &provider.Hardware{CPUType: "host", CPUFlags: []string{"-pdpe1gb"}}
	prog2 = configured(t, p, second)
	if cpu := w.inactiveDomain(t, prog2.ID).CPU; cpu == nil || cpu.Mode != "host-passthrough" ||
		!slices.Contains(cpu.Features, libvirtxml.DomainCPUFeature{Policy: "disable", Name: "pdpe1gb"}) {
		t.Errorf("passed-through CPU read back: %+v", cpu)
	}

	deleted(t, p, second.Owner, prog2)
	deleted(t, p, spec.Owner, prog)
	if _, err := w.conn.StorageVolLookupByName(pool, disks[0].volume); err == nil {
		t.Errorf("extra volume %s outlived DeleteVM", disks[0].volume)
	}
}

func mustID(t *testing.T, id provider.ID) int {
	t.Helper()
	n, err := ParseID(id)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

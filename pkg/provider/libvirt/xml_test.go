package libvirt

import (
	"bytes"
	"errors"
	"strings"
	"testing"
	"time"

	"libvirt.org/go/libvirtxml"

	"github.com/hyperfleet/hyperfleet/pkg/ownership"
)

// templateXML is a template as libvirt returns its inactive definition:
// a q35 machine with UEFI NVRAM, one disk, a CD-ROM, a NIC with its MAC,
// the guest agent channel and another application's metadata.
const templateXML = `<domain type='qemu'>
  <name>ci-template</name>
  <uuid>0b1d5f9e-6a43-4a2f-9a56-6f2c1ab1f5a1</uuid>
  <title>The CI template</title>
  <metadata>
    <app:info xmlns:app="https://example.com/app/1"><app:owner>ops</app:owner></app:info>
  </metadata>
  <memory unit='KiB'>524288</memory>
  <currentMemory unit='KiB'>524288</currentMemory>
  <vcpu placement='static'>1</vcpu>
  <os>
    <type arch='x86_64' machine='pc-q35-7.2'>hvm</type>
    <loader readonly='yes' type='pflash'>/usr/share/OVMF/OVMF_CODE.fd</loader>
    <nvram template='/usr/share/OVMF/OVMF_VARS.fd'>/var/lib/libvirt/qemu/nvram/ci-template_VARS.fd</nvram>
  </os>
  <cpu mode='custom'><topology sockets='1' dies='1' cores='1' threads='1'/></cpu>
  <devices>
    <disk type='volume' device='disk'>
      <driver name='qemu' type='qcow2'/>
      <source pool='templates' volume='ci.qcow2'/>
      <target dev='vda' bus='virtio'/>
    </disk>
    <disk type='file' device='cdrom'>
      <driver name='qemu' type='raw'/>
      <source file='/isos/installer.iso'/>
      <target dev='sda' bus='sata'/>
      <readonly/>
    </disk>
    <interface type='network'>
      <mac address='52:54:00:aa:bb:cc'/>
      <source network='default'/>
      <model type='virtio'/>
    </interface>
    <channel type='unix'>
      <target type='virtio' name='org.qemu.guest_agent.0'/>
    </channel>
  </devices>
</domain>`

func testSigner(t *testing.T) *ownership.Signer {
	t.Helper()
	s, err := ownership.NewSigner("unit", bytes.Repeat([]byte{7}, ownership.MinKeyLength))
	if err != nil {
		t.Fatal(err)
	}
	return s.ForCluster(ownership.ClusterIdentity{Name: "lab"})
}

func TestCloneDomain(t *testing.T) {
	meta := vmMeta{ID: 42, Description: "marker"}
	d, err := cloneDomain(templateXML, cloneSpec{name: "hf-unit-42-abc", pool: "vms", volume: "hf-unit-42-abc.qcow2", mac: "02:00:00:00:00:2a", meta: meta})
	if err != nil {
		t.Fatal(err)
	}
	if d.Name != "hf-unit-42-abc" || d.UUID == "" || d.UUID == "0b1d5f9e-6a43-4a2f-9a56-6f2c1ab1f5a1" || d.Title != "" {
		t.Errorf("name %q, uuid %q, title %q: want the clone's name, a new UUID and no title", d.Name, d.UUID, d.Title)
	}
	if len(d.Devices.Disks) != 2 || d.Devices.Disks[1].Device != "cdrom" || d.Devices.Disks[1].Source != nil {
		t.Fatalf("clone has disks %+v, want its boot disk and the template's CD-ROM, empty", d.Devices.Disks)
	}
	disk := d.Devices.Disks[0]
	if v := disk.Source.Volume; v == nil || v.Pool != "vms" || v.Volume != "hf-unit-42-abc.qcow2" || disk.Source.File != nil || disk.Driver.Type != "qcow2" {
		t.Errorf("boot disk %+v, want volume vms/hf-unit-42-abc.qcow2 of format qcow2", disk.Source)
	}
	if got := firstMAC(d); got != "02:00:00:00:00:2a" {
		t.Errorf("MAC %q", got)
	}
	if d.OS.NVRam.NVRam != "" || d.OS.NVRam.Template == "" {
		t.Errorf("NVRAM %+v: want the template's template and no path of its own", d.OS.NVRam)
	}
	got, err := parseMeta(d.Metadata)
	if err != nil || got.ID != 42 || got.Description != "marker" {
		t.Errorf("metadata %+v, %v", got, err)
	}
	if strings.Contains(d.Metadata.XML, "example.com") {
		t.Errorf("the clone keeps the template's metadata: %s", d.Metadata.XML)
	}
	// libvirt reads back what it is given.
	doc, err := d.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	again, err := parseDomain(doc)
	if err != nil {
		t.Fatal(err)
	}
	if m, err := parseMeta(again.Metadata); err != nil || m.ID != 42 {
		t.Errorf("metadata after a round trip: %+v, %v", m, err)
	}
}

func TestCloneDomainRefusesTemplatesWithoutOneDisk(t *testing.T) {
	two := strings.Replace(templateXML, "<disk type='file' device='cdrom'>", "<disk type='file' device='disk'>", 1)
	none := strings.Replace(strings.Replace(templateXML, "device='disk'", "device='floppy'", 1), "<disk type='file' device='cdrom'>", "<disk type='file' device='floppy'>", 1)
	for name, doc := range map[string]string{"two disks": two, "no disk": none} {
		if _, err := cloneDomain(doc, cloneSpec{name: "x", meta: vmMeta{ID: 1}}); err == nil {
			t.Errorf("%s: cloned", name)
		}
	}
}

func TestConfigureDomain(t *testing.T) {
	cases := []struct {
		name    string
		machine string
		wantBus string
		wantDev string
		addTPM  bool
		noCDROM bool
		// emptyFile: the template's tray is empty, as libvirt lists it.
		emptyFile bool
	}{
		{name: "the template's CD-ROM slot", machine: "pc-q35-7.2", wantBus: "sata", wantDev: "sda"},
		{name: "the template's empty CD-ROM slot, reread", machine: "pc-i440fx-7.2", emptyFile: true, wantBus: "sata", wantDev: "sda"},
		{name: "q35 without a CD-ROM takes SATA", machine: "pc-q35-7.2", noCDROM: true, wantBus: "sata", wantDev: "sdc"},
		{name: "pc without a CD-ROM takes IDE", machine: "pc-i440fx-7.2", noCDROM: true, wantBus: "ide", wantDev: "hdc", addTPM: true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			doc := strings.Replace(templateXML, "pc-q35-7.2", c.machine, 1)
			if c.emptyFile {
				// How libvirt lists an empty tray.
				doc = strings.Replace(doc, "<source file='/isos/installer.iso'/>", "", 1)
			}
			if c.noCDROM {
				doc = strings.Replace(doc, "device='cdrom'", "device='floppy'", 1)
			}
			d, err := cloneDomain(doc, cloneSpec{name: "vm", pool: "vms", volume: "vm.qcow2", meta: vmMeta{ID: 7}})
			if err != nil {
				t.Fatal(err)
			}
			// What configure starts from: the clone's definition as
			// libvirt lists it.
			if d, err = parseDomain(mustMarshal(t, d)); err != nil {
				t.Fatal(err)
			}
			meta := vmMeta{ID: 7, Description: "block", Tags: []string{"hyperfleet", "hf-unit"}, Medium: "seed.iso"}
			err = configureDomain(d, configSpec{title: "hf-ci-1", meta: meta, memoryBytes: 2 << 30, cores: 3, network: "ci", vlan: 12, model: "e1000",
				mediaPool: "media", medium: "seed.iso", addTPM: c.addTPM})
			if err != nil {
				t.Fatal(err)
			}
			if d.Title != "hf-ci-1" || memoryBytes(d) != 2<<30 || d.VCPU.Value != 3 || d.CPU.Topology.Cores != 3 {
				t.Errorf("title %q, memory %d, vcpus %d, topology %+v", d.Title, memoryBytes(d), d.VCPU.Value, d.CPU.Topology)
			}
			nic := d.Devices.Interfaces[0]
			if nic.Source.Network == nil || nic.Source.Network.Network != "ci" || nic.VLan.Tags[0].ID != 12 || nic.Model.Type != "e1000" {
				t.Errorf("interface %+v", nic)
			}
			cd := mediumDisk(d, "seed.iso")
			if cd == nil || cd.Target.Bus != c.wantBus || cd.Target.Dev != c.wantDev || cd.ReadOnly == nil || cd.Source.Volume.Pool != "media" {
				t.Fatalf("CD-ROM %+v, want bus %s dev %s", cd, c.wantBus, c.wantDev)
			}
			if hasTPM2(d) != c.addTPM {
				t.Errorf("TPM %v, want %v", hasTPM2(d), c.addTPM)
			}
			if !hasAgentChannel(d) {
				t.Error("the agent channel is gone")
			}
			got, err := parseMeta(d.Metadata)
			if err != nil || got.Medium != "seed.iso" || len(got.Tags) != 2 || got.Description != "block" {
				t.Errorf("metadata %+v, %v", got, err)
			}
		})
	}
}

// TestMarkerRoundTrip: the signed block written into the metadata, read
// back as libvirt rewrites it (its own prefix declaration, indentation),
// verifies for the VM id it was signed for and no other.
func TestMarkerRoundTrip(t *testing.T) {
	s := testSigner(t)
	rec := ownership.Record{Namespace: "ci", Name: "claim", UID: "uid-1", VMID: 42, CreatedAt: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)}
	el, err := marshalMeta(vmMeta{ID: 42, Description: s.Description("a CI VM", rec), Tags: s.Tags()})
	if err != nil {
		t.Fatal(err)
	}
	// libvirt's rendering: the element re-indented, its namespace
	// declared on it with the prefix it was given.
	rewritten := "\n    " + strings.ReplaceAll(el, "><hf:", ">\n      <hf:") + "\n  "
	for name, md := range map[string]string{"as written": el, "as libvirt returns it": rewritten} {
		m, err := parseMeta(&libvirtxml.DomainMetadata{XML: md})
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		got, err := s.Verify(m.Description, m.ID)
		if err != nil || got.UID != "uid-1" {
			t.Errorf("%s: verify %+v, %v", name, got, err)
		}
		if _, err := s.Verify(m.Description, 43); err == nil {
			t.Errorf("%s: the block verifies for another VM id", name)
		}
		if !s.HasOperatorTag(m.Tags) {
			t.Errorf("%s: tags %v", name, m.Tags)
		}
	}
}

func TestParseMeta(t *testing.T) {
	cases := []struct {
		name string
		md   *libvirtxml.DomainMetadata
		id   int
		err  bool
	}{
		{name: "none", md: nil, err: true},
		{name: "other applications only", md: &libvirtxml.DomainMetadata{XML: `<a:x xmlns:a="urn:a">1</a:x>`}, err: true},
		{name: "ours among others", md: &libvirtxml.DomainMetadata{XML: `<a:x xmlns:a="urn:a">1</a:x><v:vm xmlns:v="` + MetadataNamespace + `" id="9"><v:description>d</v:description></v:vm>`}, id: 9},
		{name: "default namespace", md: &libvirtxml.DomainMetadata{XML: `<vm xmlns="` + MetadataNamespace + `" id="3"/>`}, id: 3},
		{name: "no id", md: &libvirtxml.DomainMetadata{XML: `<vm xmlns="` + MetadataNamespace + `"/>`}, err: true},
		{name: "same local name, other namespace", md: &libvirtxml.DomainMetadata{XML: `<vm xmlns="urn:other" id="3"/>`}, err: true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			m, err := parseMeta(c.md)
			if (err != nil) != c.err || m.ID != c.id {
				t.Errorf("parseMeta: %+v, %v; want id %d, error %v", m, err, c.id, c.err)
			}
		})
	}
	if _, err := parseMeta(nil); !errors.Is(err, errNoMeta) {
		t.Errorf("no metadata: %v, want errNoMeta", err)
	}
}

func TestSetMetaKeepsOtherApplications(t *testing.T) {
	d, err := parseDomain(templateXML)
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range []int{1, 2} {
		if err := setMeta(d, vmMeta{ID: id}); err != nil {
			t.Fatal(err)
		}
	}
	if m, err := parseMeta(d.Metadata); err != nil || m.ID != 2 {
		t.Errorf("metadata %+v, %v", m, err)
	}
	if strings.Count(d.Metadata.XML, MetadataNamespace) != 1 || !strings.Contains(d.Metadata.XML, `<app:info xmlns:app="https://example.com/app/1"><app:owner>ops</app:owner></app:info>`) {
		t.Errorf("metadata %s: want one element of ours and the other application's kept", d.Metadata.XML)
	}
	if _, err := parseDomain(mustMarshal(t, d)); err != nil {
		t.Errorf("the domain does not parse again: %v", err)
	}
}

func mustMarshal(t *testing.T, d *libvirtxml.Domain) string {
	t.Helper()
	doc, err := d.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	return doc
}

func TestUnitBytes(t *testing.T) {
	for unit, want := range map[string]int64{"": 1 << 10, "KiB": 1 << 10, "MiB": 1 << 20, "G": 1 << 30, "bytes": 1, "KB": 1000} {
		if got := unitBytes(unit); got != want {
			t.Errorf("unitBytes(%q) = %d, want %d", unit, got, want)
		}
	}
}

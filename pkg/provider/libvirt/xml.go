package libvirt

import (
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/google/uuid"
	"libvirt.org/go/libvirtxml"
)

// vmMeta is what a VM's <metadata> element in MetadataNamespace holds.
type vmMeta struct {
	// ID is the VM's number in the cluster's id range.
	ID int
	// Description is the VM's description: free text and the signed
	// ownership block (ownership.Signer.Description), or the release
	// note once disowned.
	Description string
	// Tags are the install's and the spec's tags, set by the
	// configuration; none before.
	Tags []string
	// Medium is the name of the cloud-init ISO volume attached to the
	// domain, empty when none.
	Medium string
}

// metaXML is vmMeta as written: libvirt wants a prefixed element in its
// own namespace.
type metaXML struct {
	XMLName     xml.Name `xml:"hf:vm"`
	NS          string   `xml:"xmlns:hf,attr"`
	ID          int      `xml:"id,attr"`
	Description string   `xml:"hf:description"`
	Tags        []string `xml:"hf:tag"`
	Medium      string   `xml:"hf:medium,omitempty"`
}

// metaBare is vmMeta as DomainSetMetadata takes it: libvirt puts the
// element into the namespace it is given and declares it itself.
type metaBare struct {
	XMLName     xml.Name `xml:"vm"`
	ID          int      `xml:"id,attr"`
	Description string   `xml:"description"`
	Tags        []string `xml:"tag"`
	Medium      string   `xml:"medium,omitempty"`
}

// metaRead is vmMeta as read back: the decoder resolves the prefix.
type metaRead struct {
	ID          int      `xml:"id,attr"`
	Description string   `xml:"description"`
	Tags        []string `xml:"tag"`
	Medium      string   `xml:"medium"`
}

// marshalMeta renders m as the element to place into <metadata>.
func marshalMeta(m vmMeta) (string, error) {
	b, err := xml.Marshal(metaXML{NS: MetadataNamespace, ID: m.ID, Description: m.Description, Tags: m.Tags, Medium: m.Medium})
	return string(b), err
}

// errNoMeta says a domain carries no metadata element of this provider's
// namespace: it is no VM of any install's numbering.
var errNoMeta = errors.New("the domain carries no HyperFleet metadata")

// parseMeta finds this provider's element in a domain's <metadata>.
func parseMeta(md *libvirtxml.DomainMetadata) (vmMeta, error) {
	if md == nil {
		return vmMeta{}, errNoMeta
	}
	// A root element gives the inner XML's prefixes nothing to resolve
	// against but their own declarations, which libvirt writes.
	dec := xml.NewDecoder(strings.NewReader("<metadata>" + md.XML + "</metadata>"))
	for {
		tok, err := dec.Token()
		if errors.Is(err, io.EOF) {
			return vmMeta{}, errNoMeta
		}
		if err != nil {
			return vmMeta{}, fmt.Errorf("read the domain's metadata: %w", err)
		}
		se, ok := tok.(xml.StartElement)
		if !ok || se.Name.Space != MetadataNamespace || se.Name.Local != "vm" {
			continue
		}
		var r metaRead
		if err := dec.DecodeElement(&r, &se); err != nil {
			return vmMeta{}, fmt.Errorf("read the domain's HyperFleet metadata: %w", err)
		}
		if r.ID <= 0 {
			return vmMeta{}, fmt.Errorf("the domain's HyperFleet metadata names no VM id")
		}
		return vmMeta(r), nil
	}
}

// setMeta replaces every element of this provider's namespace in d's
// metadata by m, keeping other applications' elements.
func setMeta(d *libvirtxml.Domain, m vmMeta) error {
	el, err := marshalMeta(m)
	if err != nil {
		return err
	}
	kept, err := foreignMetadata(d.Metadata)
	if err != nil {
		return err
	}
	d.Metadata = &libvirtxml.DomainMetadata{XML: kept + el}
	return nil
}

// foreignMetadata returns the elements of md outside this provider's
// namespace as they are written: libvirt gives each its own namespace
// declaration, so its text stands alone.
func foreignMetadata(md *libvirtxml.DomainMetadata) (string, error) {
	if md == nil || strings.TrimSpace(md.XML) == "" {
		return "", nil
	}
	src := "<metadata>" + md.XML + "</metadata>"
	dec := xml.NewDecoder(strings.NewReader(src))
	if _, err := dec.Token(); err != nil { // <metadata>
		return "", fmt.Errorf("read the domain's metadata: %w", err)
	}
	var out strings.Builder
	for {
		start := dec.InputOffset()
		tok, err := dec.Token()
		if errors.Is(err, io.EOF) {
			return out.String(), nil
		}
		if err != nil {
			return "", fmt.Errorf("read the domain's metadata: %w", err)
		}
		se, ok := tok.(xml.StartElement)
		if !ok {
			continue
		}
		if err := dec.Skip(); err != nil {
			return "", fmt.Errorf("read the domain's metadata: %w", err)
		}
		if se.Name.Space != MetadataNamespace {
			out.WriteString(src[start:dec.InputOffset()])
		}
	}
}

// parseDomain reads a domain's XML.
func parseDomain(doc string) (*libvirtxml.Domain, error) {
	d := &libvirtxml.Domain{}
	if err := d.Unmarshal(doc); err != nil {
		return nil, fmt.Errorf("parse domain XML: %w", err)
	}
	return d, nil
}

// bootDisk returns the template's boot disk: its one disk of device
// "disk". A template with more is refused: their clones would share the
// other disks.
func bootDisk(d *libvirtxml.Domain) (*libvirtxml.DomainDisk, error) {
	var found *libvirtxml.DomainDisk
	if d.Devices == nil {
		return nil, fmt.Errorf("domain %s has no devices", d.Name)
	}
	for i := range d.Devices.Disks {
		disk := &d.Devices.Disks[i]
		if disk.Device != "" && disk.Device != "disk" {
			continue
		}
		if found != nil {
			return nil, fmt.Errorf("domain %s has more than one disk; a template has exactly one, its boot disk", d.Name)
		}
		found = disk
	}
	if found == nil {
		return nil, fmt.Errorf("domain %s has no disk", d.Name)
	}
	return found, nil
}

// cloneSpec is what a clone's first definition changes in its template's
// XML.
type cloneSpec struct {
	name string
	meta vmMeta
	// pool and volume are the clone's own disk, created next.
	pool, volume string
	mac          string
}

// cloneDomain returns the definition of a clone of the template whose
// inactive XML is tmplXML: a new name, UUID and MAC, the marker, and one
// disk, its own volume (qcow2); the template's other removable media,
// title, description and metadata are dropped, and its NVRAM path, so
// that libvirt makes the clone its own from the template's. Its first
// CD-ROM stays, empty: the seed's slot.
func cloneDomain(tmplXML string, c cloneSpec) (*libvirtxml.Domain, error) {
	d, err := parseDomain(tmplXML)
	if err != nil {
		return nil, err
	}
	disk, err := bootDisk(d)
	if err != nil {
		return nil, err
	}
	boot := *disk
	boot.Source = &libvirtxml.DomainDiskSource{Volume: &libvirtxml.DomainDiskSourceVolume{Pool: c.pool, Volume: c.volume}}
	boot.BackingStore = nil
	if boot.Driver == nil {
		boot.Driver = &libvirtxml.DomainDiskDriver{Name: "qemu"}
	}
	boot.Driver.Type = "qcow2"
	disks := []libvirtxml.DomainDisk{boot}
	// The template's first CD-ROM, emptied, is the slot the seed goes
	// into: the guest's kernel knows that bus.
	for _, disk := range d.Devices.Disks {
		if disk.Device == "cdrom" {
			disk.Source = nil
			disks = append(disks, disk)
			break
		}
	}
	d.Devices.Disks = disks
	d.ID, d.Name, d.UUID, d.Title, d.Description, d.Metadata = nil, c.name, uuid.NewString(), "", "", nil
	if d.OS != nil && d.OS.NVRam != nil {
		d.OS.NVRam.NVRam, d.OS.NVRam.Source = "", nil
	}
	for i := range d.Devices.Interfaces {
		d.Devices.Interfaces[i].MAC = nil
		d.Devices.Interfaces[i].Target = nil
	}
	if len(d.Devices.Interfaces) > 0 && c.mac != "" {
		d.Devices.Interfaces[0].MAC = &libvirtxml.DomainInterfaceMAC{Address: c.mac}
	}
	if err := setMeta(d, c.meta); err != nil {
		return nil, err
	}
	return d, nil
}

// configSpec is what the configuration of a clone sets.
type configSpec struct {
	title       string
	meta        vmMeta
	memoryBytes int64
	cores       int
	network     string // a libvirt network; empty keeps the source
	bridge      string // a bridge; wins over network
	vlan        int
	model       string
	// mediaPool and medium are the cloud-init ISO to attach; empty
	// medium attaches none.
	mediaPool, medium string
	addTPM            bool
}

// configureDomain applies c to d, a clone's definition.
func configureDomain(d *libvirtxml.Domain, c configSpec) error {
	d.Title = c.title
	if c.memoryBytes > 0 {
		kib := uint(c.memoryBytes >> 10)
		d.Memory = &libvirtxml.DomainMemory{Value: kib, Unit: "KiB"}
		d.CurrentMemory = &libvirtxml.DomainCurrentMemory{Value: kib, Unit: "KiB"}
	}
	if c.cores > 0 {
		d.VCPU = &libvirtxml.DomainVCPU{Placement: "static", Value: uint(c.cores)}
		if d.CPU != nil && d.CPU.Topology != nil {
			d.CPU.Topology = &libvirtxml.DomainCPUTopology{Sockets: 1, Dies: 1, Cores: c.cores, Threads: 1}
		}
	}
	if d.Devices == nil {
		d.Devices = &libvirtxml.DomainDeviceList{}
	}
	if len(d.Devices.Interfaces) > 0 {
		configureInterface(&d.Devices.Interfaces[0], c)
	}
	if c.medium != "" {
		insertMedium(d, c.mediaPool, c.medium)
	}
	if c.addTPM && !hasTPM2(d) {
		d.Devices.TPMs = append(d.Devices.TPMs, libvirtxml.DomainTPM{Model: "tpm-crb",
			Backend: &libvirtxml.DomainTPMBackend{Emulator: &libvirtxml.DomainTPMBackendEmulator{Version: "2.0"}}})
	}
	return setMeta(d, c.meta)
}

func configureInterface(nic *libvirtxml.DomainInterface, c configSpec) {
	switch {
	case c.bridge != "":
		nic.Source = &libvirtxml.DomainInterfaceSource{Bridge: &libvirtxml.DomainInterfaceSourceBridge{Bridge: c.bridge}}
	case c.network != "":
		nic.Source = &libvirtxml.DomainInterfaceSource{Network: &libvirtxml.DomainInterfaceSourceNetwork{Network: c.network}}
	}
	if c.vlan > 0 {
		nic.VLan = &libvirtxml.DomainInterfaceVLan{Tags: []libvirtxml.DomainInterfaceVLanTag{{ID: uint(c.vlan)}}}
	}
	if c.model != "" {
		nic.Model = &libvirtxml.DomainInterfaceModel{Type: c.model}
	}
}

// insertMedium puts volume of pool into d's empty CD-ROM slot, or into a
// new CD-ROM when it has none.
func insertMedium(d *libvirtxml.Domain, pool, volume string) {
	src := &libvirtxml.DomainDiskSource{Volume: &libvirtxml.DomainDiskSourceVolume{Pool: pool, Volume: volume}}
	for i, disk := range d.Devices.Disks {
		if disk.Device == "cdrom" && emptySource(disk.Source) {
			d.Devices.Disks[i].Source = src
			d.Devices.Disks[i].ReadOnly = &libvirtxml.DomainDiskReadOnly{}
			return
		}
	}
	d.Devices.Disks = append(d.Devices.Disks, cdrom(d, pool, volume))
}

// emptySource says a disk source names nothing: libvirt lists an empty
// CD-ROM tray as a file disk without a source, which libvirtxml reads as
// a file source without a path.
func emptySource(src *libvirtxml.DomainDiskSource) bool {
	return src == nil || (src.File == nil || src.File.File == "") && (src.Volume == nil || src.Volume.Volume == "") &&
		(src.Block == nil || src.Block.Dev == "") && src.Network == nil
}

// cdrom is a read-only CD-ROM holding volume of pool, on the bus the
// machine has (SATA on q35, IDE on the PC machine) and at a target name
// no other disk uses.
func cdrom(d *libvirtxml.Domain, pool, volume string) libvirtxml.DomainDisk {
	bus, prefix := "ide", "hd"
	if d.OS != nil && d.OS.Type != nil && strings.Contains(d.OS.Type.Machine, "q35") {
		bus, prefix = "sata", "sd"
	}
	var used []string
	for _, disk := range d.Devices.Disks {
		if disk.Target != nil {
			used = append(used, disk.Target.Dev)
		}
	}
	dev := prefix + "c"
	for c := 'c'; c <= 'z'; c++ {
		if dev = prefix + string(c); !slices.Contains(used, dev) {
			break
		}
	}
	return libvirtxml.DomainDisk{Device: "cdrom", Driver: &libvirtxml.DomainDiskDriver{Name: "qemu", Type: "raw"},
		Source:   &libvirtxml.DomainDiskSource{Volume: &libvirtxml.DomainDiskSourceVolume{Pool: pool, Volume: volume}},
		Target:   &libvirtxml.DomainDiskTarget{Dev: dev, Bus: bus},
		ReadOnly: &libvirtxml.DomainDiskReadOnly{}}
}

// mediumDisk returns the CD-ROM of d holding volume, nil if none.
func mediumDisk(d *libvirtxml.Domain, volume string) *libvirtxml.DomainDisk {
	if d.Devices == nil || volume == "" {
		return nil
	}
	for i, disk := range d.Devices.Disks {
		if disk.Device == "cdrom" && disk.Source != nil && disk.Source.Volume != nil && disk.Source.Volume.Volume == volume {
			return &d.Devices.Disks[i]
		}
	}
	return nil
}

// hasTPM2 says whether d has a TPM 2.0 (an emulated one of version 2.0,
// the emulator's default, or the host's own).
func hasTPM2(d *libvirtxml.Domain) bool {
	if d.Devices == nil {
		return false
	}
	for _, t := range d.Devices.TPMs {
		if t.Backend == nil {
			continue
		}
		if e := t.Backend.Emulator; e != nil && (e.Version == "2.0" || e.Version == "") || t.Backend.Passthrough != nil {
			return true
		}
	}
	return false
}

// hasAgentChannel says whether d has the QEMU guest agent's channel.
func hasAgentChannel(d *libvirtxml.Domain) bool {
	if d.Devices == nil {
		return false
	}
	for _, c := range d.Devices.Channels {
		if c.Target != nil && c.Target.VirtIO != nil && c.Target.VirtIO.Name == agentChannel {
			return true
		}
	}
	return false
}

// agentChannel is the name of the QEMU guest agent's virtio channel.
const agentChannel = "org.qemu.guest_agent.0"

// memoryBytes is d's memory.
func memoryBytes(d *libvirtxml.Domain) int64 {
	if d.Memory == nil {
		return 0
	}
	return int64(d.Memory.Value) * unitBytes(d.Memory.Unit)
}

// unitBytes is the size of a libvirt memory unit.
func unitBytes(unit string) int64 {
	switch strings.ToLower(unit) {
	case "b", "bytes":
		return 1
	case "k", "kib", "":
		return 1 << 10
	case "kb":
		return 1000
	case "m", "mib":
		return 1 << 20
	case "mb":
		return 1000 * 1000
	case "g", "gib":
		return 1 << 30
	case "gb":
		return 1000 * 1000 * 1000
	case "t", "tib":
		return 1 << 40
	}
	return 1 << 10
}

// macOf is the MAC of VM n when its spec asks for none: locally
// administered, in QEMU's 52:54:00 range.
func macOf(n int) string {
	return fmt.Sprintf("52:54:00:%02x:%02x:%02x", n>>16&0xff, n>>8&0xff, n&0xff)
}

// firstMAC is the MAC of d's first interface, empty if none.
func firstMAC(d *libvirtxml.Domain) string {
	if d.Devices == nil || len(d.Devices.Interfaces) == 0 || d.Devices.Interfaces[0].MAC == nil {
		return ""
	}
	return strings.ToLower(d.Devices.Interfaces[0].MAC.Address)
}

package libvirt

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	"libvirt.org/go/libvirtxml"

	"github.com/hyperfleet/hyperfleet/pkg/provider"
)

// reasonDeviceMappingNotFound is the reason of a VM asking for a device
// mapping the cluster does not define.
const reasonDeviceMappingNotFound = "DeviceMappingNotFound"

// Device is one host PCI device of a device mapping
// (spec.libvirt.devices).
type Device struct {
	// Mapping is the mapping's name, as VMs ask for it
	// (provider.Hardware.Devices).
	Mapping string
	// Host is the name of the host holding the device.
	Host string
	// Address is its PCI address, domain:bus:slot.function in hex
	// (0000:01:00.0).
	Address string
}

// pciAddress is a PCI address as libvirt writes it in a <hostdev>.
type pciAddress struct {
	domain, bus, slot, function uint
}

// parsePCI reads domain:bus:slot.function.
func parsePCI(s string) (pciAddress, error) {
	var a pciAddress
	n, err := fmt.Sscanf(strings.ToLower(s), "%04x:%02x:%02x.%1x", &a.domain, &a.bus, &a.slot, &a.function)
	if err != nil || n != 4 || a.function > 7 || a.String() != strings.ToLower(s) {
		return pciAddress{}, fmt.Errorf("PCI address %q is not domain:bus:slot.function (0000:01:00.0)", s)
	}
	return a, nil
}

// String is the address as lspci -D writes it.
func (a pciAddress) String() string {
	return fmt.Sprintf("%04x:%02x:%02x.%x", a.domain, a.bus, a.slot, a.function)
}

// hostdev is the managed <hostdev> passing the device at a through:
// libvirt binds it to vfio-pci for the guest's life.
func (a pciAddress) hostdev() libvirtxml.DomainHostdev {
	u := func(v uint) *uint { return &v }
	return libvirtxml.DomainHostdev{Managed: "yes", SubsysPCI: &libvirtxml.DomainHostdevSubsysPCI{
		Source: &libvirtxml.DomainHostdevSubsysPCISource{Address: &libvirtxml.DomainAddressPCI{
			Domain: u(a.domain), Bus: u(a.bus), Slot: u(a.slot), Function: u(a.function)}}}}
}

// checkDevices refuses device entries placement could not use: a host
// the cluster lacks, a bad address, a device listed twice.
func checkDevices(devices []Device, hosts []Host) error {
	seen := map[string]bool{}
	for _, d := range devices {
		if d.Mapping == "" {
			return fmt.Errorf("device %s on host %s has no mapping name", d.Address, d.Host)
		}
		if !slices.ContainsFunc(hosts, func(h Host) bool { return h.Name == d.Host }) {
			return fmt.Errorf("device %s of mapping %s is on host %q, which is not in spec.libvirt.hosts", d.Address, d.Mapping, d.Host)
		}
		a, err := parsePCI(d.Address)
		if err != nil {
			return fmt.Errorf("device of mapping %s on host %s: %w", d.Mapping, d.Host, err)
		}
		key := d.Host + "/" + a.String()
		if seen[key] {
			return fmt.Errorf("device %s on host %s is listed twice", a, d.Host)
		}
		seen[key] = true
	}
	return nil
}

// heldDevices are the PCI addresses the <hostdev> elements of doms pass
// through: a domain's definition keeps them across restarts of anyone.
func heldDevices(doms []*libvirtxml.Domain) map[string]bool {
	out := map[string]bool{}
	for _, d := range doms {
		if d == nil || d.Devices == nil {
			continue
		}
		for _, hd := range d.Devices.Hostdevs {
			pci := hd.SubsysPCI
			if pci == nil || pci.Source == nil || pci.Source.Address == nil {
				continue
			}
			a, val := pci.Source.Address, func(p *uint) uint {
				if p == nil {
					return 0
				}
				return *p
			}
			out[pciAddress{val(a.Domain), val(a.Bus), val(a.Slot), val(a.Function)}.String()] = true
		}
	}
	return out
}

// missingMappings are the mappings of want no device of devices belongs
// to, sorted.
func missingMappings(devices []Device, want []string) []string {
	var out []string
	for _, m := range want {
		if !slices.ContainsFunc(devices, func(d Device) bool { return d.Mapping == m }) && !slices.Contains(out, m) {
			out = append(out, m)
		}
	}
	slices.Sort(out)
	return out
}

// pickDevices chooses on host a device of each mapping of want (a
// mapping named twice takes two) that held does not name, in the order
// of devices; ok is false when a mapping has none left there.
func pickDevices(devices []Device, host string, want []string, held map[string]bool) (addrs []string, ok bool) {
	taken := maps.Clone(held)
	if taken == nil {
		taken = map[string]bool{}
	}
	for _, m := range want {
		found := ""
		for _, d := range devices {
			if d.Mapping != m || d.Host != host {
				continue
			}
			if a, err := parsePCI(d.Address); err == nil && !taken[a.String()] {
				found = a.String()
				break
			}
		}
		if found == "" {
			return nil, false
		}
		taken[found] = true
		addrs = append(addrs, found)
	}
	return addrs, true
}

// wantedDevices are the device mappings spec's VM asks for.
func wantedDevices(spec *provider.VMSpec) []string {
	if spec.Hardware == nil {
		return nil
	}
	return spec.Hardware.Devices
}

// checkMappings refuses a VM asking for a mapping the cluster does not
// define.
func (p *Provider) checkMappings(want []string) error {
	if missing := missingMappings(p.settings.Devices, want); len(missing) > 0 {
		return provider.Errorf(provider.ClassConfiguration, reasonDeviceMappingNotFound,
			"spec.hardware.devices: mapping %s is not defined on HypervisorCluster %q (spec.libvirt.devices)", strings.Join(missing, ", "), p.cfg.Name)
	}
	return nil
}

// reservedDevicesLocked are the devices placements of this process hold
// on host, but owner's own. p.mu is held.
func (p *Provider) reservedDevicesLocked(host, ownerUID string) map[string]bool {
	out := map[string]bool{}
	for uid, r := range p.reservations {
		if r.host == host && uid != ownerUID {
			for _, a := range r.devices {
				out[a] = true
			}
		}
	}
	return out
}

// claimDevices chooses o's devices on h for a clone whose placement this
// process no longer holds (it restarted since): the devices of h's
// domains and of the placements in flight are taken. They are recorded
// in o's reservation. ok is false when h has none left.
func (p *Provider) claimDevices(h *host, o provider.Owner, want []string) (addrs []string, ok bool, err error) {
	p.mu.Lock()
	r := p.reservations[o.UID]
	if r != nil && r.host == h.Name && len(r.devices) == len(want) {
		p.mu.Unlock()
		return r.devices, true, nil
	}
	p.mu.Unlock()
	doms, err := h.list()
	if err != nil {
		return nil, false, err
	}
	xmls := make([]*libvirtxml.Domain, 0, len(doms))
	for _, d := range doms {
		xmls = append(xmls, d.xml)
	}
	held := heldDevices(xmls)
	p.mu.Lock()
	defer p.mu.Unlock()
	r = p.reservations[o.UID]
	maps.Copy(held, p.reservedDevicesLocked(h.Name, o.UID))
	addrs, ok = pickDevices(p.settings.Devices, h.Name, want, held)
	if ok && r != nil {
		r.devices = addrs
	}
	return addrs, ok, nil
}

// addHostdevs passes the devices at addrs through to d.
func addHostdevs(d *libvirtxml.Domain, addrs []string) error {
	if len(addrs) == 0 {
		return nil
	}
	if d.Devices == nil {
		d.Devices = &libvirtxml.DomainDeviceList{}
	}
	for _, s := range addrs {
		a, err := parsePCI(s)
		if err != nil {
			return err
		}
		d.Devices.Hostdevs = append(d.Devices.Hostdevs, a.hostdev())
	}
	return nil
}

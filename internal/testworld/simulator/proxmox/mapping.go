package proxmoxsim

import (
	"fmt"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
)

// PCI resource mappings (Datacenter -> Resource Mappings, pve-guest-common
// src/PVE/Mapping/PCI.pm): a cluster-wide name for PCI devices, each entry
// one device on one node. A VM's hostpciN: mapping=<id> takes one device
// of the mapping on the node the VM starts on (qemu-server
// src/PVE/QemuServer/PCI.pm parse_hostpci and choose_hostpci_devices), and
// a device stays the VM's while it runs (reserve_pci_usage).

// PCIMapping is one cluster/mapping/pci entry as a test defines it.
type PCIMapping struct {
	// ID is the mapping's name (a pve-configid).
	ID          string
	Description string
	// Devices are its entries, in the order of the mapping's map list.
	Devices []PCIDevice
}

// PCIDevice is one entry of a mapping: a device on a node.
type PCIDevice struct {
	Node string
	// Path is the device's PCI address, such as 0000:01:00.0.
	Path string
	// VendorDevice is the "id" of the entry (vendor:device), such as
	// 10de:2230; empty: 10de:2230.
	VendorDevice string
	IOMMUGroup   int
}

var (
	configIDRE = regexp.MustCompile(`^[a-z][a-z0-9_-]+$`)
	pciPathRE  = regexp.MustCompile(`^[a-f0-9]{4,}:[a-f0-9]{2}:[a-f0-9]{2}(?:\.[a-f0-9])?$`)
	hostpciRE  = regexp.MustCompile(`^hostpci([0-9]|1[0-5])$`)
)

// SetPCIMapping creates or replaces a PCI resource mapping, as
// `pvesh create /cluster/mapping/pci` or its set would. Running VMs keep
// the devices they hold.
func (s *Simulator) SetPCIMapping(m PCIMapping) error {
	if !configIDRE.MatchString(strings.ToLower(m.ID)) {
		return fmt.Errorf("mapping id %q is not a pve-configid", m.ID)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	seen := map[string]bool{}
	for _, d := range m.Devices {
		if s.nodes[d.Node] == nil {
			return fmt.Errorf("mapping %s: unknown node %q", m.ID, d.Node)
		}
		if !pciPathRE.MatchString(d.Path) {
			return fmt.Errorf("mapping %s: path %q is not a PCI address", m.ID, d.Path)
		}
		if seen[d.Node+"/"+d.Path] {
			return fmt.Errorf("mapping %s: %s on %s twice", m.ID, d.Path, d.Node)
		}
		seen[d.Node+"/"+d.Path] = true
	}
	if s.pciMaps == nil {
		s.pciMaps = map[string]PCIMapping{}
	}
	m.Devices = slices.Clone(m.Devices)
	s.pciMaps[m.ID] = m
	return nil
}

// DeletePCIMapping removes a mapping (pvesh delete /cluster/mapping/pci/<id>).
func (s *Simulator) DeletePCIMapping(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.pciMaps, id)
}

// PCIDevicesInUse returns the devices running VMs hold, "<node>/<path>"
// to the VM ids holding it: more than one id is a device given twice,
// which Proxmox never does.
func (s *Simulator) PCIDevicesInUse() map[string][]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[string][]int{}
	for _, id := range s.sortedVMIDsLocked() {
		v := s.vms[id]
		if !v.running {
			continue
		}
		for _, path := range v.pciDevices {
			key := v.node + "/" + path
			out[key] = append(out[key], id)
		}
	}
	return out
}

// mapEntry is an entry as the map list of the API shows it (PCI.pm's
// $map_fmt as a property string).
func (d PCIDevice) mapEntry() string {
	id := d.VendorDevice
	if id == "" {
		id = "10de:2230"
	}
	return fmt.Sprintf("id=%s,iommugroup=%d,node=%s,path=%s", id, d.IOMMUGroup, d.Node, d.Path)
}

// handleMappingPCI is GET /cluster/mapping/pci (pve-manager
// PVE/API2/Cluster/Mapping/PCI.pm index): the mappings the caller has
// Mapping.Modify, Mapping.Use or Mapping.Audit on, each with the
// cluster config's digest.
func (s *Simulator) handleMappingPCI(q *apiRequest) (any, error) {
	if n := q.str("check-node"); n != "" && s.nodes[n] == nil {
		return nil, serverError("wrong node to check - %s != %s", n, s.nodeOrder[0])
	}
	ids := make([]string, 0, len(s.pciMaps))
	for id := range s.pciMaps {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	digest := s.mappingDigestLocked()
	out := []map[string]any{}
	for _, id := range ids {
		if !s.allowedLocked(q, "mapping", map[string]string{"id": id}) {
			continue
		}
		m := s.pciMaps[id]
		entries := make([]string, 0, len(m.Devices))
		for _, d := range m.Devices {
			entries = append(entries, d.mapEntry())
		}
		e := map[string]any{"id": id, "map": entries, "digest": digest}
		if m.Description != "" {
			e["description"] = m.Description
		}
		if n := q.str("check-node"); n != "" {
			checks := []map[string]string{}
			if !slices.ContainsFunc(m.Devices, func(d PCIDevice) bool { return d.Node == n }) {
				checks = append(checks, map[string]string{"severity": "warning", "message": "No mapping for node " + n + "."})
			}
			e["checks"] = checks
		}
		out = append(out, e)
	}
	return out, nil
}

// mappingDigestLocked stands for the SHA-1 of mapping/pci.cfg: it changes
// whenever a mapping does.
func (s *Simulator) mappingDigestLocked() string {
	var b strings.Builder
	ids := make([]string, 0, len(s.pciMaps))
	for id := range s.pciMaps {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	for _, id := range ids {
		b.WriteString(id + "\n")
		for _, d := range s.pciMaps[id].Devices {
			b.WriteString("\tmap " + d.mapEntry() + "\n")
		}
	}
	return configDigest(map[string]string{"pci.cfg": b.String()})
}

// verifyHostPCI is the pve-qm-hostpci format ($hostpci_fmt): a host
// device list or a mapping, and the options HyperFleet may send. A config
// write does not look the mapping up; the start does.
func verifyHostPCI(v string) error {
	p, err := propertyString(v, "host")
	if err != nil {
		return err
	}
	for k, val := range p {
		switch k {
		case "host":
			for _, id := range strings.Split(val, ";") {
				if !regexp.MustCompile(`^(?:[a-f0-9]{4,}:)?[a-f0-9]{2}:[a-f0-9]{2}(?:\.[a-f0-9])?$`).MatchString(id) {
					return fmtErr("format error\nhost: value does not match the regex pattern")
				}
			}
		case "mapping":
			if !configIDRE.MatchString(strings.ToLower(val)) {
				return fmtErr("format error\nmapping: invalid format - invalid configuration ID '%s'", val)
			}
		case "pcie", "x-vga", "rombar", "legacy-igd":
			if val != "0" && val != "1" {
				return fmtErr("format error\n%s: type check ('boolean') failed - got '%s'", k, val)
			}
		case "mdev", "romfile", "device-id", "vendor-id", "sub-device-id", "sub-vendor-id":
		default:
			return fmtErr("format error\n%s: property is not defined in schema and the schema does not allow additional properties", k)
		}
	}
	return nil
}

// claimPCIDevicesLocked is what vm_start does with v's hostpciN before
// QEMU runs: parse_hostpci_devices (the mapping on this node, pcie only
// on q35), choose_hostpci_devices (of a mapping with several entries here
// the first the VM does not use already and no running VM holds) and
// reserve_pci_usage (a device a running VM holds fails the start). The
// devices are v's until it stops.
func (s *Simulator) claimPCIDevicesLocked(v *vm) error {
	keys := make([]int, 0)
	for k := range v.conf {
		if m := hostpciRE.FindStringSubmatch(k); m != nil {
			n, _ := strconv.Atoi(m[1])
			keys = append(keys, n)
		}
	}
	sort.Ints(keys)
	holder := map[string]int{}
	for _, o := range s.vms {
		if o != v && o.running {
			for _, path := range o.pciDevices {
				holder[o.node+"/"+path] = o.vmid
			}
		}
	}
	var chosen []string
	for _, i := range keys {
		key := fmt.Sprintf("hostpci%d", i)
		p, err := propertyString(v.conf[key], "host")
		if err != nil {
			return err
		}
		if p["host"] != "" {
			return fmt.Errorf("no PCI device found for '%s'", p["host"])
		}
		var entries []PCIDevice
		if m, ok := s.pciMaps[p["mapping"]]; ok {
			for _, d := range m.Devices {
				if d.Node == v.node {
					entries = append(entries, d)
				}
			}
		}
		if len(entries) == 0 {
			return fmt.Errorf("PCI device mapping not found for '%s'", p["mapping"])
		}
		if p["pcie"] == "1" && !strings.Contains(v.conf["machine"], "q35") {
			return fmt.Errorf("q35 machine model is not enabled")
		}
		if len(entries) == 1 {
			// One alternative: taken as is, a second use by this VM is
			// an error of its own, a running VM's is reserve_pci_usage's.
			path := entries[0].Path
			if slices.Contains(chosen, path) {
				return fmt.Errorf("device '%s' assigned more than once", path)
			}
			if id, held := holder[v.node+"/"+path]; held {
				return fmt.Errorf("PCI device '%s' already in use by VMID '%d'", path, id)
			}
			chosen = append(chosen, path)
			continue
		}
		found := false
		for _, d := range entries {
			if slices.Contains(chosen, d.Path) {
				continue
			}
			if _, held := holder[v.node+"/"+d.Path]; held {
				continue
			}
			chosen, found = append(chosen, d.Path), true
			break
		}
		if !found {
			return fmt.Errorf("could not find a free device for '%s'", key)
		}
	}
	v.pciDevices = chosen
	return nil
}

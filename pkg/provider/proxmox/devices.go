package proxmox

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/hyperfleet/hyperfleet/pkg/provider"
	"github.com/hyperfleet/hyperfleet/pkg/provider/proxmox/privileges"
)

// PCI passthrough through Proxmox VE resource mappings
// (cluster/mapping/pci). A VM's Hardware.Devices name mappings, one device
// each; the VM gets hostpciN: mapping=<id> and, at its start, qemu-server
// takes a device of the mapping on the VM's node that no running VM holds
// (src/PVE/QemuServer/PCI.pm choose_hostpci_devices, reserve_pci_usage),
// or fails the start. So placement counts devices as capacity: a node
// qualifies only while each mapping has more entries there than this
// install's VMs on the node hold, placed or built, running or not (a
// stopped VM starts again and takes its device back).

// fieldDevices is the template field the device messages point at.
const fieldDevices = "spec.hardware.devices"

// mappingView is one read of GET /cluster/mapping/pci. It is never
// modified once built.
type mappingView struct {
	at time.Time
	// entries[mapping][node] counts the mapping's entries on the node:
	// each one device a VM may take.
	entries map[string]map[string]int
}

// deviceState is what placement knows of the devices, guarded by p.mu.
type deviceState struct {
	mappings *mappingView
	// held are the mappings of the devices each VM of this install holds,
	// by VM id, read from its config or written by this process; a VM's
	// hostpciN never changes after the configure step, so an entry stays
	// until the VM is gone.
	held map[int]deviceHold
}

// deviceHold is what one VM holds: a mapping per device, on its node.
type deviceHold struct {
	node     string
	mappings []string
	// at is when it was learned; an entry older than a listing that no
	// longer shows its VM is dropped (deleted behind this process's back).
	at time.Time
}

// specDevices are the mappings spec's VM takes a device of, one entry per
// device.
func specDevices(spec *provider.VMSpec) []string {
	if spec.Hardware == nil {
		return nil
	}
	return spec.Hardware.Devices
}

// parseMappings reads the listing: each map entry is a property string
// node=...,path=...,id=... (pve-guest-common src/PVE/Mapping/PCI.pm
// $map_fmt).
func parseMappings(at time.Time, list []pciMapping) *mappingView {
	v := &mappingView{at: at, entries: map[string]map[string]int{}}
	for _, m := range list {
		perNode := map[string]int{}
		for _, e := range m.Map {
			for _, kv := range strings.Split(e, ",") {
				if k, node, _ := strings.Cut(kv, "="); k == "node" {
					perNode[node]++
				}
			}
		}
		v.entries[m.ID] = perNode
	}
	return v
}

// pciMapping is one entry of GET /cluster/mapping/pci.
type pciMapping struct {
	ID  string   `json:"id"`
	Map []string `json:"map"`
}

// mappingView returns a mapping listing at most maxAge old, reading one if
// needed. The listing holds only the mappings the token has a Mapping
// privilege on (pve-manager PVE/API2/Cluster/Mapping/PCI.pm index).
func (p *Provider) mappingView(ctx context.Context, maxAge time.Duration) (*mappingView, error) {
	p.mu.Lock()
	v := p.devices.mappings
	p.mu.Unlock()
	if v != nil && p.clock.Since(v.at) < maxAge {
		return v, nil
	}
	var list []pciMapping
	if err := p.api.call(ctx, http.MethodGet, "/cluster/mapping/pci", nil, nil, &list); err != nil {
		return nil, withoutNotFound(err, "the cluster's PCI resource mappings could not be listed")
	}
	v = parseMappings(p.clock.Now(), list)
	p.mu.Lock()
	if p.devices.mappings == nil || !p.devices.mappings.at.After(v.at) {
		p.devices.mappings = v
	}
	p.mu.Unlock()
	return v, nil
}

// checkMappings refuses devices naming a mapping the cluster does not
// list (ValidateTemplate), reading the listing afresh: the platform team
// may just have created it.
func (p *Provider) checkMappings(ctx context.Context, devices []string) error {
	if len(devices) == 0 {
		return nil
	}
	v, err := p.mappingView(ctx, 0)
	if err != nil {
		return err
	}
	for _, m := range devices {
		if _, ok := v.entries[m]; !ok {
			return configErr("DeviceMappingNotFound", fieldDevices,
				"PCI resource mapping %q does not exist, or the operator's Proxmox token lacks Mapping.Use on /mapping/pci/%s to see it; create it in Datacenter -> Resource Mappings (pvesh create /cluster/mapping/pci --id %s --map node=<node>,path=<address>,id=<vendor:device>), or grant the privilege: %s",
				m, m, m, privileges.Fix("Mapping.Use"))
		}
	}
	return nil
}

// readDevices brings the device state up to date before spec's VM is
// placed: the mapping listing, and the devices of every VM of this
// install the view shows that this process has not learned yet (after a
// restart: all of them, once). Only a VM the configure step has tagged
// is read, its config being whole by then; VMs being built are counted by
// their reservations. Nothing is read for a VM that takes no device.
func (p *Provider) readDevices(ctx context.Context, view *clusterView, spec *provider.VMSpec) error {
	if len(specDevices(spec)) == 0 {
		return nil
	}
	if _, err := p.mappingView(ctx, viewTTL); err != nil {
		return err
	}
	p.mu.Lock()
	if p.devices.held == nil {
		p.devices.held = map[int]deviceHold{}
	}
	for id, h := range p.devices.held {
		if _, listed := view.vms[id]; !listed && h.at.Before(view.at) {
			delete(p.devices.held, id)
		}
	}
	var unread []resource
	for id, r := range view.vms {
		if _, known := p.devices.held[id]; known || r.Template == 1 || !p.signer.HasOperatorTag(splitTags(r.Tags)) {
			continue
		}
		if freed, ok := p.freed[id]; ok && !freed.Before(view.at) {
			continue
		}
		unread = append(unread, r)
	}
	p.mu.Unlock()
	sort.Slice(unread, func(i, j int) bool { return unread[i].VMID < unread[j].VMID })
	for _, r := range unread {
		cfg, err := p.api.config(ctx, r.Node, r.VMID)
		switch {
		case isNotFound(err):
			continue // gone since the listing
		case err != nil:
			return fmt.Errorf("read the devices of VM %d: %w", r.VMID, err)
		}
		p.noteDevices(r.VMID, r.Node, hostpciMappings(cfg), false)
	}
	return nil
}

// noteDevices records that VM vmid on node holds a device of each of
// mappings; replace overwrites what is known (the configure step wrote
// them), otherwise a read never replaces a newer entry.
func (p *Provider) noteDevices(vmid int, node string, mappings []string, replace bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.devices.held == nil {
		p.devices.held = map[int]deviceHold{}
	}
	if _, known := p.devices.held[vmid]; known && !replace {
		return
	}
	p.devices.held[vmid] = deviceHold{node: node, mappings: slices.Clone(mappings), at: p.clock.Now()}
}

// hostpciMappings are the mappings of a config's hostpciN, one per device.
func hostpciMappings(cfg vmConfig) []string {
	var out []string
	for i := range maxHostPCI {
		for _, kv := range strings.Split(cfg["hostpci"+strconv.Itoa(i)], ",") {
			if k, m, _ := strings.Cut(kv, "="); k == "mapping" {
				out = append(out, m)
			}
		}
	}
	return out
}

// maxHostPCI is qemu-server's $MAX_HOSTPCI_DEVICES.
const maxHostPCI = 16

// heldOnLocked counts the devices of each mapping this install's VMs hold
// on node: those learned per VM, and the reservations of VMs placed whose
// devices are not learned yet.
func (p *Provider) heldOnLocked(node string) map[string]int {
	held := map[string]int{}
	for _, h := range p.devices.held {
		if h.node == node {
			for _, m := range h.mappings {
				held[m]++
			}
		}
	}
	for _, r := range p.reservations {
		if _, known := p.devices.held[r.vmid]; known || r.node != node {
			continue
		}
		for _, m := range r.devices {
			held[m]++
		}
	}
	return held
}

// devicesShortLocked says why node cannot give spec's VM its devices, ""
// if it can: for each mapping the VM names, the node's entries must
// exceed the devices held there by as many as the VM takes.
func (p *Provider) devicesShortLocked(node string, spec *provider.VMSpec) string {
	want := map[string]int{}
	for _, m := range specDevices(spec) {
		want[m]++
	}
	if len(want) == 0 {
		return ""
	}
	var entries map[string]map[string]int
	if mv := p.devices.mappings; mv != nil {
		entries = mv.entries
	}
	held := p.heldOnLocked(node)
	names := make([]string, 0, len(want))
	for m := range want {
		names = append(names, m)
	}
	sort.Strings(names)
	for _, m := range names {
		have := entries[m][node]
		switch {
		case have == 0:
			return fmt.Sprintf("no device of mapping %s", m)
		case held[m]+want[m] > have && want[m] > 1:
			return fmt.Sprintf("no %d free devices of mapping %s (%d of %d held)", want[m], m, held[m], have)
		case held[m]+want[m] > have:
			return fmt.Sprintf("no free device of mapping %s (%d of %d held)", m, held[m], have)
		}
	}
	return ""
}

// deviceConfig adds hostpci0.. for the spec's devices to the configure
// step's update: mapping=<id>, with pcie=1 on a q35 machine (qemu-server
// refuses pcie on i440fx at start: "q35 machine model is not enabled";
// the template's machine is kept, a guest image may not boot on another).
func (c *ensureCall) deviceConfig(body map[string]any, cfg vmConfig) {
	pcie := ""
	if strings.Contains(cfg["machine"], "q35") {
		pcie = ",pcie=1"
	}
	for i, m := range specDevices(c.spec) {
		body["hostpci"+strconv.Itoa(i)] = "mapping=" + m + pcie
	}
}

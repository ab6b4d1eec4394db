package libvirt

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	golibvirt "github.com/digitalocean/go-libvirt"
	"libvirt.org/go/libvirtxml"

	"github.com/hyperfleet/hyperfleet/pkg/provider"
)

// hostState is what placement knows of one host.
type hostState struct {
	name string
	// availableBytes is memory the host can give: free, buffers and page
	// cache, minus what it keeps for itself (Host.ReservedMemoryBytes).
	availableBytes int64
	// template says the host holds the template.
	template bool
}

// clusterScan is one reading of every reachable host: what placement
// decides on.
type clusterScan struct {
	hosts []hostState
	// used are the VM ids domains carry; machines counts this install's
	// VMs (tagged or carrying its clone name).
	used     map[int]bool
	machines map[int]bool
	// unreachable names hosts that did not answer, with why.
	unreachable map[string]error
	// devices are the PCI addresses the domains of each host pass
	// through, by host name.
	devices map[string]map[string]bool
}

// scan reads every allowed host: its memory, whether it holds the
// template (tmpl names its domain; empty skips the check) and its domains.
// Hosts that do not answer are left out, so placement skips them.
func (p *Provider) scan(tmpl *TemplateRef) *clusterScan {
	s := &clusterScan{used: map[int]bool{}, machines: map[int]bool{}, unreachable: map[string]error{}, devices: map[string]map[string]bool{}}
	for _, h := range p.hosts {
		doms, err := h.list()
		if err == nil && p.allowed(h.Name) {
			var st hostState
			st, err = p.hostState(h, tmpl)
			if err == nil {
				s.hosts = append(s.hosts, st)
			}
		}
		if err != nil {
			s.unreachable[h.Name] = err
			p.log.V(1).Info("Host skipped by placement", "host", h.Name, "error", err.Error())
		}
		xmls := make([]*libvirtxml.Domain, 0, len(doms))
		for _, d := range doms {
			s.used[d.number()] = true
			if sum := p.summary(d); sum.OperatorTagged || sum.InstallNamed {
				s.machines[d.number()] = true
			}
			xmls = append(xmls, d.xml)
		}
		// Every domain's devices count, not only this install's: a
		// device is passed through to one guest at a time.
		s.devices[h.Name] = heldDevices(xmls)
	}
	return s
}

// hostState reads h's memory and whether it holds tmpl.
func (p *Provider) hostState(h *host, tmpl *TemplateRef) (hostState, error) {
	l, err := h.client()
	if err != nil {
		return hostState{}, err
	}
	avail, err := availableMemory(l)
	if err != nil {
		return hostState{}, classify(fmt.Errorf("read the free memory of host %s: %w", h.Name, err))
	}
	st := hostState{name: h.Name, availableBytes: avail - h.ReservedMemoryBytes, template: tmpl == nil}
	if tmpl != nil && (tmpl.Host == "" || tmpl.Host == h.Name) {
		_, err := lookupTemplate(l, tmpl)
		switch {
		case err == nil:
			st.template = true
		case !isCode(err, golibvirt.ErrNoDomain):
			return hostState{}, classify(fmt.Errorf("look up template %s on host %s: %w", tmpl, h.Name, err))
		}
	}
	return st, nil
}

// availableMemory is the memory a host can give to new guests: free
// memory, buffers and page cache (NodeGetMemoryStats), or free memory
// alone where the statistics are missing.
func availableMemory(l *golibvirt.Libvirt) (int64, error) {
	stats, _, err := l.NodeGetMemoryStats(4, int32(golibvirt.NodeMemoryStatsAllCells), 0)
	if err == nil {
		var kib uint64
		for _, s := range stats {
			if s.Field == "free" || s.Field == "buffers" || s.Field == "cached" {
				kib += s.Value
			}
		}
		if kib > 0 {
			return int64(kib) << 10, nil
		}
	}
	free, err := l.NodeGetFreeMemory()
	return int64(free), err
}

// chooseHost picks, among the hosts of s that hold the template, the one
// with the most memory left after this process's reservations on it, if
// memory fits there.
func chooseHost(hosts []hostState, reserved map[string]int64, memory int64) (string, bool) {
	best, bestFree := "", int64(-1)
	for _, h := range hosts {
		free := h.availableBytes - reserved[h.name]
		if h.template && free >= memory && free > bestFree {
			best, bestFree = h.name, free
		}
	}
	return best, best != ""
}

// freeID returns the lowest id of [start, end] that is neither used nor
// reserved, zero when none.
func freeID(start, end int, used, reserved map[int]bool) int {
	for id := start; id <= end; id++ {
		if !used[id] && !reserved[id] {
			return id
		}
	}
	return 0
}

// place reserves a VM id and a host for spec's owner, in-process: a
// second call returns the same reservation.
func (p *Provider) place(spec *provider.VMSpec, tmpl *TemplateRef, memory int64) (*provider.EnsureResult, error) {
	o := spec.Owner
	p.mu.Lock()
	r := p.reservations[o.UID]
	p.mu.Unlock()
	if r == nil {
		want := wantedDevices(spec)
		if err := p.checkMappings(want); err != nil {
			return nil, err
		}
		s := p.scan(tmpl)
		var err error
		if r, err = p.reserve(s, o, memory, want); err != nil {
			return nil, err
		}
	}
	h := p.hostNamed(r.host)
	res := &provider.EnsureResult{Progress: provider.Progress{ID: FormatID(r.vmid), Node: r.host}, Phase: provider.PhasePlaced,
		Message: fmt.Sprintf("VM id %d reserved on host %s", r.vmid, r.host)}
	if pool := p.diskPool(spec); !p.holdSlot(h, pool, r.vmid) {
		res.Waits = slotWait(h.Name, pool)
	}
	return res, nil
}

// reserve chooses a host, an id and the devices of the mappings of want
// from s and records them for o, under the lock so that concurrent
// placements of this process never share an id or a device or overbook a
// host.
func (p *Provider) reserve(s *clusterScan, o provider.Owner, memory int64, want []string) (*reservation, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if r := p.reservations[o.UID]; r != nil {
		return r, nil
	}
	reservedIDs, reservedMem := map[int]bool{}, map[string]int64{}
	for _, r := range p.reservations {
		reservedIDs[r.vmid] = true
		reservedMem[r.host] += r.memory
	}
	if limit := p.cfg.MaxMachines; limit > 0 {
		machines := maps.Clone(s.machines)
		maps.Copy(machines, reservedIDs)
		if len(machines) >= limit {
			return nil, provider.Errorf(provider.ClassResource, "MaxMachinesReached",
				"the HypervisorCluster's spec.limits.maxMachines (%d) is reached: %d VMs of this install exist or are being created; the VM is created when one of them is deleted (or raise spec.limits.maxMachines)",
				limit, len(machines))
		}
	}
	if len(s.hosts) == 0 && len(s.unreachable) > 0 {
		// Not a lack of capacity: nothing is known of any host, and the
		// claim waits for one to answer, not for room.
		return nil, provider.Errorf(provider.ClassTransient, "Unreachable",
			"no allowed libvirt host of cluster %q answers%s: %w", p.cfg.Name, unreachableNote(s.unreachable), provider.ErrUnreachable)
	}
	hosts, picks := p.hostsWithDevices(s, o, want)
	if len(hosts) == 0 && len(s.hosts) > 0 {
		return nil, provider.Errorf(provider.ClassResource, "InsufficientCapacity",
			"no allowed reachable host of cluster %q that holds the template has a free device of each mapping %s for %s/%s (spec.libvirt.devices; each device goes to one VM at a time)%s: %w",
			p.cfg.Name, strings.Join(want, ", "), o.Namespace, o.Name, unreachableNote(s.unreachable), provider.ErrNoCapacity)
	}
	name, ok := chooseHost(hosts, reservedMem, memory)
	if !ok {
		return nil, provider.Errorf(provider.ClassResource, "InsufficientCapacity",
			"no allowed reachable host of cluster %q that holds the template has %d bytes of memory free for %s/%s%s: %w",
			p.cfg.Name, memory, o.Namespace, o.Name, unreachableNote(s.unreachable), provider.ErrNoCapacity)
	}
	vmid := freeID(p.cfg.VMIDStart, p.cfg.VMIDEnd, s.used, reservedIDs)
	if vmid == 0 {
		return nil, provider.Errorf(provider.ClassResource, "VMIDRangeExhausted",
			"cluster %q: VM ids %d-%d are all in use: %w", p.cfg.Name, p.cfg.VMIDStart, p.cfg.VMIDEnd, provider.ErrIDRangeExhausted)
	}
	r := &reservation{vmid: vmid, host: name, memory: memory, devices: picks[name]}
	p.reservations[o.UID] = r
	return r, nil
}

// hostsWithDevices are the hosts of s that hold the template and have a
// free device of each mapping of want, with the devices each would give:
// free of the host's domains and of this process's placements in flight.
// p.mu is held.
func (p *Provider) hostsWithDevices(s *clusterScan, o provider.Owner, want []string) ([]hostState, map[string][]string) {
	if len(want) == 0 {
		return s.hosts, nil
	}
	var out []hostState
	picks := map[string][]string{}
	for _, h := range s.hosts {
		if !h.template {
			continue
		}
		held := maps.Clone(s.devices[h.name])
		if held == nil {
			held = map[string]bool{}
		}
		maps.Copy(held, p.reservedDevicesLocked(h.name, o.UID))
		if addrs, ok := pickDevices(p.settings.Devices, h.name, want, held); ok {
			out = append(out, h)
			picks[h.name] = addrs
		}
	}
	return out, picks
}

func unreachableNote(unreachable map[string]error) string {
	if len(unreachable) == 0 {
		return ""
	}
	return fmt.Sprintf(" (hosts %s did not answer)", strings.Join(slices.Sorted(maps.Keys(unreachable)), ", "))
}

// forget drops o's reservation and its place in the queue for a clone
// slot.
func (p *Provider) forget(o provider.Owner) {
	p.mu.Lock()
	delete(p.reservations, o.UID)
	delete(p.filters, o.UID)
	p.mu.Unlock()
	p.slots.Leave(o.UID)
}

// reservedOn is the memory this process promised on host name.
func (p *Provider) reservedOn(name string) int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	var sum int64
	for _, r := range p.reservations {
		if r.host == name {
			sum += r.memory
		}
	}
	return sum
}

// slotWait is the message of a VM waiting for a clone slot.
func slotWait(hostName, pool string) string {
	return fmt.Sprintf("waiting for a clone slot on host %s (pool %s)", hostName, pool)
}

// cloneHoldLimit bounds how long a clone counts against the limits after
// it begins without its owner coming back to see its disk, unless a full
// copy of this process runs for it (startCopy): its Slots' StaleAfter.
const cloneHoldLimit = 5 * time.Minute

// holdLimit bounds how long a placement holds a clone slot for a clone
// that does not begin (its claim's reservation was not stored, or the
// claim went away), and how long an owner stays queued for a slot without
// asking again: its Slots' Lapse.
const holdLimit = 30 * time.Second

// poolKey names pool of host hostName for the per-storage clone limit: a
// pool is a host's, each host's pool of a name its own storage.
func poolKey(hostName, pool string) string { return hostName + "/" + pool }

// holdSlot takes a clone slot onto pool on h for VM vmid, just placed,
// when its clone could begin now, and reports whether it holds one. The
// slot is taken at placement, not when the clone begins, so that what the
// placement says (provider.EnsureResult.Waits) holds in a burst:
// concurrent claims begin their clones in any order, and a slot free at
// placement could be taken by another's clone before this one's, which
// then waited after saying it would not (a status write more).
func (p *Provider) holdSlot(h *host, pool string, vmid int) bool {
	return p.slots.Hold(vmid, h.Name, []string{poolKey(h.Name, pool)})
}

// takeSlot takes a clone slot onto pool on h for o's VM vmid (the one its
// placement holds, if any), or queues o and returns false.
func (p *Provider) takeSlot(h *host, pool string, vmid int, o provider.Owner) bool {
	return p.slots.Take(vmid, o, h.Name, []string{poolKey(h.Name, pool)})
}

// releaseSlot frees VM vmid's clone slot, if it holds one, with the full
// copy this process ran for it, and wakes the owners waiting for a slot
// that would get one now.
func (p *Provider) releaseSlot(vmid int) {
	p.mu.Lock()
	delete(p.copies, vmid)
	p.mu.Unlock()
	p.slots.Release(vmid)
}

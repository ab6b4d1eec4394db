package fake

import (
	"fmt"
	"slices"

	"github.com/hyperfleet/hyperfleet/pkg/provider"
)

// placeLocked reserves a VM id and a node for the owner, in-process: a
// second call returns the same reservation. The node is the allowed online
// one with the most free memory, counting this instance's reservations.
func (p *Provider) placeLocked(spec *provider.VMSpec, tmpl *provider.TemplateInfo) (*provider.EnsureResult, error) {
	o := spec.Owner
	r, ok := p.reservations[o.UID]
	if !ok {
		r.memory = memoryHint(spec, tmpl)
		best := int64(-1)
		for _, n := range p.c.opts.Nodes {
			free := n.MemoryBytes - p.c.memoryUsedLocked(n) - p.reservedLocked(n.Name)
			if n.Online && p.allowed(n.Name) && free >= r.memory && free > best {
				r.node, best = n.Name, free
			}
		}
		if r.node == "" {
			return nil, provider.Errorf(provider.ClassResource, "InsufficientCapacity",
				"no allowed online node of cluster %q has %d bytes of memory free for %s/%s: %w", p.cfg.Name, r.memory, o.Namespace, o.Name, provider.ErrNoCapacity)
		}
		if r.vmid = p.freeIDLocked(); r.vmid == 0 {
			return nil, provider.Errorf(provider.ClassResource, "VMIDRangeExhausted",
				"cluster %q: VM ids %d-%d are all in use: %w", p.cfg.Name, p.cfg.VMIDStart, p.cfg.VMIDEnd, provider.ErrIDRangeExhausted)
		}
		p.reservations[o.UID] = r
	}
	res := &provider.EnsureResult{Progress: provider.Progress{ID: FormatID(r.vmid), Node: r.node}, Phase: provider.PhasePlaced,
		Message: fmt.Sprintf("VM id %d reserved on node %s", r.vmid, r.node)}
	if storage := cloneStorage(spec, tmpl); !p.cloneSlotFreeLocked(r.node, storage) {
		res.Waits = slotWait(r.node, storage)
	}
	return res, nil
}

// cloneStorage is the storage a clone of tmpl for spec writes to.
func cloneStorage(spec *provider.VMSpec, tmpl *provider.TemplateInfo) string {
	if storage := provider.RecordSource(spec.Source).Storage; !spec.Source.Linked && storage != "" {
		return storage
	}
	return tmpl.Storages[0]
}

// slotWait is the message of a VM waiting for a clone slot.
func slotWait(node, storage string) string {
	return fmt.Sprintf("waiting for a clone slot on node %s and storage %s", node, storage)
}

// memoryHint is the memory placement reserves for spec's VM.
func memoryHint(spec *provider.VMSpec, tmpl *provider.TemplateInfo) int64 {
	switch {
	case spec.MemoryHint > 0:
		return spec.MemoryHint
	case spec.MemoryBytes > 0:
		return spec.MemoryBytes
	}
	return tmpl.MemoryBytes
}

// freeIDLocked returns the lowest id of the configured range that no VM
// uses and this instance has not reserved, zero when there is none.
func (p *Provider) freeIDLocked() int {
	for id := p.cfg.VMIDStart; id <= p.cfg.VMIDEnd; id++ {
		if p.c.vms[id] != nil {
			continue
		}
		taken := false
		for _, r := range p.reservations {
			taken = taken || r.vmid == id
		}
		if !taken {
			return id
		}
	}
	return 0
}

// allowed says whether the configuration lets VMs be placed on node.
func (p *Provider) allowed(node string) bool {
	return len(p.cfg.Nodes) == 0 || slices.Contains(p.cfg.Nodes, node)
}

// reservedLocked is the memory this instance promised on node.
func (p *Provider) reservedLocked(node string) int64 {
	var sum int64
	for _, r := range p.reservations {
		if r.node == node {
			sum += r.memory
		}
	}
	return sum
}

// memoryUsedLocked is what node n uses: its own use and its running VMs.
func (c *Cluster) memoryUsedLocked(n provider.NodeInfo) int64 {
	used := n.MemoryUsedBytes
	for _, v := range c.vms {
		if v.node == n.Name && v.running {
			used += v.memory
		}
	}
	return used
}

// cloneSlotFreeLocked says whether another clone may start on node and to
// storage under the configured limits.
func (p *Provider) cloneSlotFreeLocked(node, storage string) bool {
	onNode, onStorage := 0, 0
	for _, v := range p.c.vms {
		if v.op == nil || v.op.task.Operation != opClone {
			continue
		}
		if v.node == node {
			onNode++
		}
		if v.storage == storage {
			onStorage++
		}
	}
	return (p.cfg.ClonesPerNode <= 0 || onNode < p.cfg.ClonesPerNode) && (p.cfg.ClonesPerStorage <= 0 || onStorage < p.cfg.ClonesPerStorage)
}

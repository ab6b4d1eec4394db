package fake

import (
	"fmt"

	"github.com/hyperfleet/hyperfleet/pkg/provider"
)

// templateRef is a resolved template.
type templateRef struct {
	vmid    int
	node    string
	name    string
	storage string
	disk    int64
	memory  int64
	// shared and linkedOK describe the template's storage; known only
	// when findTemplate was asked for it.
	shared   bool
	linkedOK bool
}

// findTemplate resolves src with the batch listing and the template's
// config (and, withStorage, its storage's status).
func (p *Provider) findTemplate(s *session, src provider.TemplateSource, withStorage bool) (*templateRef, error) {
	list, err := s.resources()
	if err != nil {
		return nil, classify(err, "list VMs of cluster %q", p.cfg.Name)
	}
	var hit *resource
	switch {
	case src.ID != 0:
		for i := range list {
			if list[i].vmid == src.ID {
				hit = &list[i]
			}
		}
		if hit == nil {
			return nil, provider.Errorf(provider.ClassConfiguration, "TemplateNotFound",
				"template %d does not exist on cluster %q; name an existing template: %w", src.ID, p.cfg.Name, provider.ErrNotFound)
		}
	case src.Name != "":
		var hits []*resource
		for i := range list {
			if list[i].template && list[i].name == src.Name {
				hits = append(hits, &list[i])
			}
		}
		switch len(hits) {
		case 0:
			return nil, provider.Errorf(provider.ClassConfiguration, "TemplateNotFound",
				"no template named %q on cluster %q; name an existing template: %w", src.Name, p.cfg.Name, provider.ErrNotFound)
		case 1:
			hit = hits[0]
		default:
			return nil, provider.Errorf(provider.ClassConfiguration, "AmbiguousTemplate",
				"%d templates are named %q on cluster %q; name the template by id", len(hits), src.Name, p.cfg.Name)
		}
	default:
		return nil, provider.Errorf(provider.ClassConfiguration, "TemplateUnset", "the template source names neither an id nor a name")
	}
	conf, err := s.config(hit.node, hit.vmid)
	switch {
	case isNotExist(err):
		return nil, provider.Errorf(provider.ClassConfiguration, "TemplateNotFound",
			"template %d vanished from cluster %q: %w", hit.vmid, p.cfg.Name, provider.ErrNotFound)
	case err != nil:
		return nil, classify(err, "read template %d", hit.vmid)
	case !conf.template:
		return nil, provider.Errorf(provider.ClassConfiguration, "NotATemplate",
			"VM %d on cluster %q is not a template; convert it or name a template: %w", hit.vmid, p.cfg.Name, provider.ErrNotFound)
	}
	t := &templateRef{vmid: hit.vmid, node: hit.node, name: conf.name, storage: conf.diskStorage, disk: conf.disk, memory: conf.memory}
	if withStorage {
		st, err := s.storageStatus(hit.node, conf.diskStorage)
		if err != nil {
			return nil, classify(err, "read storage %q of template %d", conf.diskStorage, hit.vmid)
		}
		t.shared, t.linkedOK = st.shared, st.typ != "lvm"
	}
	return t, nil
}

// targetStorage is the storage a clone's disk lands on ("" = the
// template's, as for linked clones).
func (p *Provider) targetStorage(src provider.TemplateSource) string {
	if src.Linked {
		return ""
	}
	if src.Storage != "" {
		return src.Storage
	}
	return p.cfg.DefaultStorage
}

// place reserves a VM id and a node for spec.Owner (in-process, under p.mu)
// and reports PhasePlaced. avoid is an id known to be taken by someone else.
func (p *Provider) place(s *session, spec *provider.VMSpec, avoid int, why string) (*provider.EnsureResult, error) {
	tmpl, err := p.findTemplate(s, spec.Source, true)
	if err != nil {
		return nil, err
	}
	// A clone of a template on local storage to local storage stays on
	// the template's node.
	anyNode := tmpl.shared
	if ts := p.targetStorage(spec.Source); ts != "" && ts != tmpl.storage {
		st, err := s.storageStatus(tmpl.node, ts)
		if isNotExist(err) {
			return nil, provider.Errorf(provider.ClassConfiguration, "StorageNotFound",
				"clone target storage %q does not exist on node %s of cluster %q", ts, tmpl.node, p.cfg.Name)
		}
		if err != nil {
			return nil, classify(err, "read storage %q", ts)
		}
		anyNode = st.shared
	}
	nodes, err := s.nodes()
	if err != nil {
		return nil, classify(err, "list nodes of cluster %q", p.cfg.Name)
	}
	list, err := s.resources()
	if err != nil {
		return nil, classify(err, "list VMs of cluster %q", p.cfg.Name)
	}
	hint := spec.MemoryHint
	if hint <= 0 {
		hint = spec.MemoryBytes
	}
	if hint <= 0 {
		hint = tmpl.memory
	}

	p.mu.Lock()
	defer p.mu.Unlock()
	now := p.clock.Now()
	p.expireLocked()
	if r := p.reservations[spec.Owner.UID]; r != nil && r.vmid != avoid && r.node != "" {
		r.at = now
		return &provider.EnsureResult{
			Progress: provider.Progress{VMID: r.vmid, Node: r.node}, Phase: provider.PhasePlaced,
			Message: fmt.Sprintf("VM id %d on node %s reserved", r.vmid, r.node),
		}, nil
	}
	delete(p.reservations, spec.Owner.UID)

	best, bestFree := "", int64(0)
	for _, n := range nodes {
		if !n.online || !p.allowed(n.name) || (!anyNode && n.name != tmpl.node) {
			continue
		}
		free := n.mem - n.memUsed - p.reservedLocked(n.name)
		if free >= hint && (best == "" || free > bestFree) {
			best, bestFree = n.name, free
		}
	}
	if best == "" {
		return nil, provider.Errorf(provider.ClassResource, "InsufficientCapacity",
			"no online allowed node of cluster %q has %d MiB free for %s/%s: %w", p.cfg.Name, hint>>20, spec.Owner.Namespace, spec.Owner.Name, provider.ErrNoCapacity)
	}
	used := map[int]bool{avoid: true}
	for _, r := range list {
		used[r.vmid] = true
	}
	for _, r := range p.reservations {
		used[r.vmid] = true
	}
	vmid := 0
	for id := p.cfg.VMIDStart; id <= p.cfg.VMIDEnd; id++ {
		if !used[id] {
			vmid = id
			break
		}
	}
	if vmid == 0 {
		return nil, provider.Errorf(provider.ClassResource, "VMIDRangeExhausted",
			"every VM id in %d-%d of cluster %q is taken or reserved; widen the range or delete VMs: %w", p.cfg.VMIDStart, p.cfg.VMIDEnd, p.cfg.Name, provider.ErrIDRangeExhausted)
	}
	p.reservations[spec.Owner.UID] = &reservation{vmid: vmid, node: best, memory: hint, at: now}
	msg := fmt.Sprintf("VM id %d on node %s reserved", vmid, best)
	if why != "" {
		msg = why + "; " + msg
	}
	return &provider.EnsureResult{Progress: provider.Progress{VMID: vmid, Node: best}, Phase: provider.PhasePlaced, Message: msg}, nil
}

// replace drops owner's placement, whose id turned out to be taken by a VM
// the owner does not own, and places it again elsewhere.
func (p *Provider) replace(s *session, spec *provider.VMSpec, taken int, why string) (*provider.EnsureResult, error) {
	p.mu.Lock()
	delete(p.reservations, spec.Owner.UID)
	p.mu.Unlock()
	s.forget()
	return p.place(s, spec, taken, why)
}

// adopt records the placement of a caller that continues from persisted
// progress this instance did not create (after a restart), so that its id
// is not handed to someone else.
func (p *Provider) adopt(spec *provider.VMSpec, prog provider.Progress) {
	hint := spec.MemoryHint
	if hint <= 0 {
		hint = spec.MemoryBytes
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if r := p.reservations[spec.Owner.UID]; r != nil && r.vmid == prog.VMID {
		r.at = p.clock.Now()
		return
	}
	p.reservations[spec.Owner.UID] = &reservation{vmid: prog.VMID, node: prog.Node, memory: hint, at: p.clock.Now()}
}

// release forgets owner's placement once its VM runs (the node counts its
// memory) or is gone.
func (p *Provider) release(uid string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.reservations, uid)
	delete(p.queued, uid)
}

func (p *Provider) expireLocked() {
	if p.hv.o.ReservationTTL <= 0 {
		return
	}
	now := p.clock.Now()
	for uid, r := range p.reservations {
		if now.Sub(r.at) > p.hv.o.ReservationTTL {
			delete(p.reservations, uid)
		}
	}
}

func (p *Provider) reservedLocked(node string) int64 {
	var sum int64
	for _, r := range p.reservations {
		if r.node == node {
			sum += r.memory
		}
	}
	return sum
}

func (p *Provider) allowed(node string) bool {
	if len(p.cfg.Nodes) == 0 {
		return true
	}
	for _, n := range p.cfg.Nodes {
		if n == node {
			return true
		}
	}
	return false
}

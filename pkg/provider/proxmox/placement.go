package proxmox

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/hyperfleet/hyperfleet/pkg/provider"
)

// clusterView is what one GET /cluster/resources says about the cluster.
// It is never modified once built, so callers read it without the lock.
type clusterView struct {
	at time.Time
	// ids are every VM and container id in use.
	ids map[int]bool
	// vms are QEMU VMs by id.
	vms   map[int]resource
	nodes map[string]resource
	// storages are per node: storages[node][id].
	storages map[string]map[string]resource
}

func newView(at time.Time, rs []resource) *clusterView {
	v := &clusterView{at: at, ids: map[int]bool{}, vms: map[int]resource{}, nodes: map[string]resource{},
		storages: map[string]map[string]resource{}}
	for _, r := range rs {
		switch r.Type {
		case "qemu", "lxc":
			v.ids[r.VMID] = true
			if r.Type == "qemu" {
				v.vms[r.VMID] = r
			}
		case "node":
			v.nodes[r.Node] = r
		case "storage":
			if v.storages[r.Node] == nil {
				v.storages[r.Node] = map[string]resource{}
			}
			v.storages[r.Node][r.Storage] = r
		}
	}
	return v
}

// clusterView returns a view at most maxAge old, reading one if needed.
func (p *Provider) clusterView(ctx context.Context, maxAge time.Duration) (*clusterView, error) {
	p.mu.Lock()
	v := p.view
	p.mu.Unlock()
	if v != nil && p.clock.Since(v.at) < maxAge {
		return v, nil
	}
	rs, err := p.api.resources(ctx, "")
	if err != nil {
		return nil, err
	}
	v = newView(p.clock.Now(), rs)
	p.setView(v)
	return v, nil
}

// setView keeps v unless a newer view is already kept.
func (p *Provider) setView(v *clusterView) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.view == nil || !p.view.at.After(v.at) {
		p.view = v
	}
}

// noteListing records the ids of a VM listing (ListVMs, the poll the
// controllers run every interval), so that placement skips them even when
// its own view is older.
func (p *Provider) noteListing(rs []resource) {
	ids := make(map[int]bool, len(rs))
	for _, r := range rs {
		if r.Type == "qemu" || r.Type == "lxc" {
			ids[r.VMID] = true
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.listed, p.listedAt = ids, p.clock.Now()
}

// noteFreed records that vmid's VM is gone, so that listings taken before
// do not hold the id back.
func (p *Provider) noteFreed(vmid int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.freed[vmid] = p.clock.Now()
	delete(p.devices.held, vmid)
}

// inUseLocked reports whether a listing shows vmid, unless the id was
// freed after that listing was taken.
func (p *Provider) inUseLocked(view *clusterView, vmid int) bool {
	freed, ok := p.freed[vmid]
	if view.ids[vmid] && (!ok || freed.Before(view.at)) {
		return true
	}
	return p.listed[vmid] && (!ok || freed.Before(p.listedAt))
}

// reservation is a VM id and memory promised to one owner whose VM is not
// running yet.
type reservation struct {
	owner  string
	vmid   int
	node   string
	memory int64
	// disks is the space promised on each storage (by storageKey): a
	// full clone's disk, and the extra disks of spec.hardware (a linked
	// clone's own disk is thin and promised nothing). Extra disks are
	// promised too, so that VMs placed at once do not overfill a storage
	// each fits alone.
	disks map[string]int64
	touch time.Time
	// devices are the mappings the VM takes a device of (devices.go),
	// counted on node until its devices are learned.
	devices []string
	// unsent: this process placed the VM and has sent no clone request
	// for it yet, so nothing can exist at its id that is the owner's, and
	// EnsureVM clones without reading the id back first (a VM someone
	// else made there meanwhile makes the clone fail, and cloneFailed
	// reads it then).
	unsent bool
}

// reservationLocked returns the owner's reservation, touching it. Expired
// reservations and blocked ids are swept at most once a minute, so the
// cost per call does not grow with the number of VMs in flight.
func (p *Provider) reservationLocked(owner string) *reservation {
	now := p.clock.Now()
	if now.Sub(p.swept) > time.Minute {
		p.swept = now
		for k, r := range p.reservations {
			if now.Sub(r.touch) > reservationTTL {
				p.unreserveLocked(k)
			}
		}
		for id, at := range p.blocked {
			if now.Sub(at) > blockedTTL {
				delete(p.blocked, id)
			}
		}
		for id, at := range p.freed {
			if now.Sub(at) > blockedTTL {
				delete(p.freed, id)
			}
		}
	}
	r := p.reservations[owner]
	if r != nil {
		r.touch = now
	}
	return r
}

func (p *Provider) reserveLocked(r *reservation) {
	p.unreserveLocked(r.owner)
	p.reservations[r.owner] = r
	p.reservedIDs[r.vmid] = r.owner
	p.reservedMem[r.node] += r.memory
	for k, n := range r.disks {
		p.reservedDisk[k] += n
	}
}

func (p *Provider) unreserveLocked(owner string) {
	if r := p.reservations[owner]; r != nil {
		if p.reservedIDs[r.vmid] == owner {
			delete(p.reservedIDs, r.vmid)
		}
		p.freeMemoryLocked(r)
		delete(p.reservations, owner)
	}
}

// freeMemoryLocked drops r's memory from its node's reservations, and its
// disk space from its storages' (the running VM's disks are in the
// storages' usage by then).
func (p *Provider) freeMemoryLocked(r *reservation) {
	if p.reservedMem[r.node] -= r.memory; p.reservedMem[r.node] <= 0 {
		delete(p.reservedMem, r.node)
	}
	r.memory = 0
	for k, n := range r.disks {
		if p.reservedDisk[k] -= n; p.reservedDisk[k] <= 0 {
			delete(p.reservedDisk, k)
		}
	}
	r.disks = nil
}

// adopt re-creates the reservation of a VM this process did not place (after
// a restart), so that no other owner is given its id; a reservation of the
// id by someone else is left alone (whoever clones first keeps the id).
func (p *Provider) adopt(spec *provider.VMSpec, prog progress) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if r := p.reservationLocked(spec.Owner.UID); r != nil {
		if r.vmid == prog.VMID {
			return
		}
		p.unreserveLocked(spec.Owner.UID)
	}
	if _, held := p.reservedIDs[prog.VMID]; held {
		return
	}
	p.reserveLocked(&reservation{owner: spec.Owner.UID, vmid: prog.VMID, node: prog.Node,
		memory: memoryHint(spec, nil), devices: specDevices(spec), touch: p.clock.Now()})
}

// unsentClone reports whether this process placed owner's VM at vmid and
// has not sent its clone request yet (reservation.unsent).
func (p *Provider) unsentClone(owner string, vmid int) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	r := p.reservations[owner]
	return r != nil && r.vmid == vmid && r.unsent
}

// cloneSent records that owner's clone request to vmid has been sent
// (whatever its answer): from now on the id is read back before acting.
func (p *Provider) cloneSent(owner string, vmid int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if r := p.reservations[owner]; r != nil && r.vmid == vmid {
		r.unsent = false
	}
}

// release forgets everything in flight for owner's VM vmid. keepID keeps the
// VM id reserved but frees its memory (the VM runs and the node counts it,
// or the attempt failed).
func (p *Provider) release(owner string, vmid int, keepID bool) {
	if vmid != 0 && !keepID {
		// Before the reservation goes: once it has, another placement may
		// take the id and hold a slot for it, which this must not drop.
		p.slots.Forget(vmid)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if r := p.reservations[owner]; r != nil && (vmid == 0 || r.vmid == vmid) {
		if keepID {
			p.freeMemoryLocked(r)
		} else {
			p.unreserveLocked(owner)
		}
	}
	if vmid != 0 && !keepID {
		p.dropCloneStateLocked(vmid)
	}
}

// dropCloneStateLocked forgets the clone task and backoff of vmid; its
// clone slot is the caller's to forget (Slots.Forget), before it takes
// p.mu: the slots have their own lock.
func (p *Provider) dropCloneStateLocked(vmid int) {
	delete(p.inflight, vmid)
	delete(p.backoff, vmid)
}

// reservedMemoryLocked returns a copy of the memory reserved per node.
func (p *Provider) reservedMemoryLocked() map[string]int64 { return maps.Clone(p.reservedMem) }

func memoryHint(spec *provider.VMSpec, t *templateInfo) int64 {
	switch {
	case spec.MemoryHint > 0:
		return spec.MemoryHint
	case spec.MemoryBytes > 0:
		return spec.MemoryBytes
	case t != nil:
		return t.memoryBytes
	}
	return 0
}

// placement is where a VM goes.
type placement struct {
	vmid int
	node string
}

// place reserves a VM id and a node for spec's owner. exclude is a VM id
// the owner must not get again (found taken by someone else).
func (p *Provider) place(ctx context.Context, spec *provider.VMSpec, exclude int) (placement, error) {
	p.mu.Lock()
	if r := p.reservationLocked(spec.Owner.UID); r != nil && r.vmid != exclude {
		p.mu.Unlock()
		return placement{vmid: r.vmid, node: r.node}, nil
	}
	p.mu.Unlock()
	copies, err := p.templateCopies(ctx, spec.Source)
	if err != nil {
		return placement{}, err
	}
	for _, node := range copies.nodes() {
		if err := p.checkSpecHardware(ctx, copies.on(node), spec.Hardware); err != nil {
			return placement{}, err
		}
	}
	view, err := p.clusterView(ctx, viewTTL)
	if err != nil {
		return placement{}, err
	}
	if err := p.readDevices(ctx, view, spec); err != nil {
		return placement{}, err
	}
	mem := memoryHint(spec, copies.first())
	if exclude != 0 {
		// Its slot goes before p.mu is taken (the slots have their own
		// lock): the id stays reserved until it is blocked below, so no
		// other placement holds a slot for it in between.
		p.slots.Forget(exclude)
	}

	p.mu.Lock()
	defer p.mu.Unlock()
	if exclude != 0 {
		p.blocked[exclude] = p.clock.Now()
		if r := p.reservations[spec.Owner.UID]; r != nil && r.vmid == exclude {
			p.unreserveLocked(spec.Owner.UID)
		}
		p.dropCloneStateLocked(exclude)
	}
	if err := p.checkMaxMachinesLocked(view, spec.Owner); err != nil {
		return placement{}, err
	}
	node, err := p.chooseNodeLocked(view, copies, spec, mem)
	if err != nil {
		return placement{}, err
	}
	tmpl := p.cloneSource(view, copies, node)
	vmid, err := p.allocateLocked(view)
	if err != nil {
		return placement{}, err
	}
	r := &reservation{owner: spec.Owner.UID, vmid: vmid, node: node, memory: mem, devices: specDevices(spec), touch: p.clock.Now(), unsent: true}
	r.disks = map[string]int64{}
	if !spec.Source.Linked {
		for _, sid := range p.vmDiskStorages(tmpl, spec) {
			r.disks[storageKey(view, node, sid)] += diskNeed(spec, tmpl)
		}
	}
	for sid, n := range p.extraDiskNeed(tmpl, spec) {
		r.disks[storageKey(view, node, sid)] += n
	}
	p.reserveLocked(r)
	return placement{vmid: vmid, node: node}, nil
}

// checkMaxMachinesLocked refuses a new VM while the install has
// cfg.MaxMachines VMs on the cluster. Reservations count too: VMs being
// cloned are not in the view yet, and counting them under the same lock
// that reserves keeps concurrent placements from overshooting the cap.
func (p *Provider) checkMaxMachinesLocked(view *clusterView, owner provider.Owner) error {
	if p.cfg.MaxMachines <= 0 {
		return nil
	}
	n := p.machinesLocked(view)
	if n < p.cfg.MaxMachines {
		delete(p.atCap, owner.UID)
		return nil
	}
	p.atCap[owner.UID] = owner
	return provider.Errorf(provider.ClassResource, "MaxMachinesReached",
		"the HypervisorCluster's spec.limits.maxMachines (%d) is reached: %d VMs of this install exist or are being created; the VM is created when one of them is deleted (or raise spec.limits.maxMachines)",
		p.cfg.MaxMachines, n)
}

// machinesLocked counts this install's VMs: those the view shows with its
// tag, except ones deleted since the view was read, and every VM id
// reserved for a VM being placed or created.
func (p *Provider) machinesLocked(view *clusterView) int {
	ids := make(map[int]bool, len(p.reservedIDs))
	for id := range p.reservedIDs {
		ids[id] = true
	}
	for id, r := range view.vms {
		if r.Template == 1 || ids[id] {
			continue
		}
		if freed, ok := p.freed[id]; ok && !freed.Before(view.at) {
			continue
		}
		if p.signer.HasOperatorTag(splitTags(r.Tags)) {
			ids[id] = true
		}
	}
	return len(ids)
}

// wakeAtCap wakes the owners that waited for a VM below cfg.MaxMachines,
// after one of this install's VMs was deleted.
func (p *Provider) wakeAtCap() {
	p.mu.Lock()
	waiting := make([]provider.Owner, 0, len(p.atCap))
	for uid, o := range p.atCap {
		waiting = append(waiting, o)
		delete(p.atCap, uid)
	}
	p.mu.Unlock()
	if p.wake == nil {
		return
	}
	for _, o := range waiting {
		p.wake(o)
	}
}

// chooseNodeLocked picks the allowed online node with the most free memory
// (minus reservations) that can receive a clone of copies (each node
// judged with the template it clones from) and holds the ISO storage.
func (p *Provider) chooseNodeLocked(view *clusterView, copies templateCopies, spec *provider.VMSpec, mem int64) (string, error) {
	candidates, why := p.cloneCandidates(view, copies)
	reserved := p.reservedMemoryLocked()
	best, bestFree := "", int64(-1)
	for _, name := range candidates {
		n, ok := view.nodes[name]
		switch {
		case !p.allowed(name):
			why = append(why, name+": not in nodes")
			continue
		case !ok || n.Status != "online":
			why = append(why, name+": offline")
			continue
		}
		if _, ok := view.storages[name][p.isoStorage]; !ok {
			why = append(why, fmt.Sprintf("%s: isoStorage %q not available", name, p.isoStorage))
			continue
		}
		free := n.MaxMem - n.Mem - reserved[name]
		if free < mem {
			why = append(why, fmt.Sprintf("%s: %d MiB free", name, free>>20))
			continue
		}
		if short := p.storageShortLocked(view, name, p.cloneSource(view, copies, name), spec, mem); short != "" {
			why = append(why, name+": "+short)
			continue
		}
		if short := p.devicesShortLocked(name, spec); short != "" {
			why = append(why, name+": "+short)
			continue
		}
		if free > bestFree {
			best, bestFree = name, free
		}
	}
	if best != "" {
		return best, nil
	}
	if tmpl := copies.one; tmpl != nil && len(candidates) == 1 && !p.crossNodeClone(view, tmpl) && !p.allowed(tmpl.node) {
		return "", provider.Errorf(provider.ClassConfiguration, "TemplateNodeNotAllowed",
			"template %d is on node %s, which is not in the cluster's nodes, and its disks are on local storage: add the node or move the template to shared storage", tmpl.id, tmpl.node)
	}
	return "", provider.Errorf(provider.ClassResource, "InsufficientCapacity", "%w for %d MiB (%s)", provider.ErrNoCapacity, mem>>20, strings.Join(why, "; "))
}

// diskNeed is the size of the VM's boot disk: the size it is grown to,
// or the template's.
func diskNeed(spec *provider.VMSpec, tmpl *templateInfo) int64 {
	return max(spec.DiskBytes, tmpl.diskBytes)
}

// vmDiskStorages are the storages the VM's disks are written to: the
// target of a full clone, else the template's own (cloud-init drives
// aside: the operator attaches its own ISO).
func (p *Provider) vmDiskStorages(tmpl *templateInfo, spec *provider.VMSpec) []string {
	if target := p.fullCloneStorage(spec); target != "" {
		return []string{target}
	}
	var out []string
	for _, d := range tmpl.disks {
		if !d.copied && !slices.Contains(out, d.storage) {
			out = append(out, d.storage)
		}
	}
	return out
}

// storageShortLocked says why node's storages cannot hold the VM's boot
// disk, "" if they can: each storage its disks go to needs the disk's
// size free, after the full clones already placed there. Linked clones
// are thin and grow as the guest writes, so this bounds each VM by its
// own disk, not the sum of every VM's. A VM that will be suspended to
// disk (spec.SuspendsToDisk) also needs its saved memory (of a VM of mem
// bytes) free where Proxmox will write it; that too is each VM's own
// need: standby VMs built at once may together outgrow the storage, and
// the suspends that find no room fail and are placed again, now against
// the states already written.
func (p *Provider) storageShortLocked(view *clusterView, node string, tmpl *templateInfo, spec *provider.VMSpec, mem int64) string {
	sids := p.vmDiskStorages(tmpl, spec)
	need := map[string]int64{}
	for _, sid := range sids {
		need[sid] = diskNeed(spec, tmpl)
	}
	state := ""
	if spec.SuspendsToDisk {
		state = vmstateStorage(view.storages[node], sids)
		need[state] += vmstateBytes(mem)
	}
	extra := p.extraDiskNeed(tmpl, spec)
	if short := p.extraDiskShortLocked(view, node, extra); short != "" {
		return short
	}
	for _, sid := range append(sids, state) {
		st, ok := view.storages[node][sid]
		if sid == "" || !ok {
			continue // not on this node: the clone request reports it
		}
		free := st.MaxDisk - st.Disk - p.reservedDisk[storageKey(view, node, sid)]
		if free >= need[sid]+extra[sid] {
			continue
		}
		what := fmt.Sprintf("a %d GiB disk", diskNeed(spec, tmpl)>>30)
		if extra[sid] > 0 {
			what += fmt.Sprintf(" and %d GiB of extra disks (spec.hardware.extraDisks)", extra[sid]>>30)
		}
		switch {
		case sid == state && !slices.Contains(sids, sid):
			what = fmt.Sprintf("the VM's saved memory (%d GiB, it is a standby VM)", vmstateBytes(mem)>>30)
		case sid == state:
			what += fmt.Sprintf(" and the VM's saved memory (%d GiB, it is a standby VM)", vmstateBytes(mem)>>30)
		}
		return fmt.Sprintf("storage %s has %d GiB free for %s", sid, max(free, 0)>>30, what)
	}
	return ""
}

// vmstateDriverBytes is what qemu-server reserves for a suspended VM's
// device state beyond twice its memory (QemuConfig.pm
// __snapshot_save_vmstate: "assume 500MB is enough to safe all driver
// state").
const vmstateDriverBytes = 500 << 20

// vmstateBytes is the size of the state volume a suspend to disk
// allocates for a VM of mem bytes (__snapshot_save_vmstate: twice the
// memory plus the driver state).
func vmstateBytes(mem int64) int64 { return 2*mem + vmstateDriverBytes }

// vmstateStorage is where Proxmox puts a VM's saved memory when the VM
// sets no vmstatestorage (QemuConfig.pm find_vmstate_storage): a shared
// storage among those of its disks, else a local one, each preferring a
// file-based storage, by id.
func vmstateStorage(stores map[string]resource, disks []string) string {
	sorted := slices.Sorted(slices.Values(disks))
	var shared, local string
	for _, sid := range sorted {
		st, ok := stores[sid]
		if !ok {
			continue
		}
		dst := &local
		if st.Shared == 1 {
			dst = &shared
		}
		if *dst == "" || fileBased(st.PluginType) {
			*dst = sid
		}
	}
	return cmp.Or(shared, local)
}

// fileBased reports whether a storage of plugin type typ keeps volumes as
// files (where qemu-server prefers to write a VM's state).
func fileBased(typ string) bool {
	switch typ {
	case "dir", "nfs", "cifs", "cephfs", "btrfs", "glusterfs":
		return true
	}
	return false
}

// availableStorageLocked is the free space of the storages that hold VM
// disks (content images) on online allowed nodes, a shared storage
// counted once, minus the space promised to full clones in flight: what
// HypervisorCluster status.availableResources.storage reports.
func (p *Provider) availableStorageLocked(online map[string]bool, stores []resource) int64 {
	var free int64
	seen := map[string]bool{}
	for _, s := range stores {
		if !online[s.Node] || !p.allowed(s.Node) || !strings.Contains(","+s.Content+",", ",images,") {
			continue
		}
		key := s.Node + "/" + s.Storage
		if s.Shared == 1 {
			key = s.Storage
		}
		if seen[key] {
			continue
		}
		seen[key] = true
		free += max(s.MaxDisk-s.Disk-p.reservedDisk[key], 0)
	}
	return free
}

// crossNodeClone reports whether clones may target any node: only when
// every volume of the template lives on shared storage. Proxmox decides
// by the source's volumes whatever a full clone's target storage
// (qemu-server's clone_vm: "can't clone VM to node '$target' (VM uses
// local storage)" when check_storage_access_clone finds one volume of
// the template on a storage that is not shared).
func (p *Provider) crossNodeClone(view *clusterView, tmpl *templateInfo) bool {
	for _, d := range tmpl.disks {
		st, ok := view.storages[tmpl.node][d.storage]
		if !ok || st.Shared != 1 {
			return false
		}
	}
	return true
}

// fullCloneStorage is the target storage of a full clone, "" for linked
// clones or when the source's storages are kept.
func (p *Provider) fullCloneStorage(spec *provider.VMSpec) string {
	if spec.Source.Linked {
		return ""
	}
	if storage := templateRefOf(spec.Source).Storage; storage != "" {
		return storage
	}
	return p.cfg.DefaultStorage
}

// allocateLocked returns the next VM id of the range that no listing shows,
// nobody here has reserved and nobody was found holding.
func (p *Provider) allocateLocked(view *clusterView) (int, error) {
	start, end := p.cfg.VMIDStart, p.cfg.VMIDEnd
	size := end - start + 1
	if p.cursor < start || p.cursor > end {
		p.cursor = start
	}
	for i := 0; i < size; i++ {
		id := start + (p.cursor-start+i)%size
		if _, taken := p.reservedIDs[id]; taken || p.inUseLocked(view, id) {
			continue
		}
		if _, ok := p.blocked[id]; ok {
			continue
		}
		// Start the next search after this id: recently freed ids are
		// reused last, which keeps stale listings from handing out an id
		// whose VM is still being destroyed.
		p.cursor = id + 1
		return id, nil
	}
	return 0, provider.Errorf(provider.ClassResource, "VMIDRangeExhausted", "%w (vmidRange %d-%d)", provider.ErrIDRangeExhausted, start, end)
}

// holdCloneSlot takes a clone slot for spec's VM vmid, just placed on
// node, when its clone would start now, and otherwise says why it would
// wait (provider.EnsureResult.Waits): the clones in flight, the slots
// held for VMs placed before it and every VM already queued go first.
// The slot is taken here, not when the clone request comes, so that the
// answer holds in a burst: concurrent claims send their clone requests in
// any order, and a slot free at placement was taken by another claim's
// request before this one's, which then waited after saying it would not
// (a status write more: found by test/e2e's TestKubernetesRequestsPerJob,
// under load). Empty, holding nothing, when the template or the
// cluster's view cannot be read (the clone request then finds out).
func (p *Provider) holdCloneSlot(ctx context.Context, spec *provider.VMSpec, node string, vmid int) string {
	copies, err := p.templateCopies(ctx, spec.Source)
	if err != nil {
		return ""
	}
	view, err := p.clusterView(ctx, time.Hour)
	if err != nil {
		return ""
	}
	tmpl := p.cloneSource(view, copies, node)
	if tmpl == nil {
		return ""
	}
	if !p.slots.Hold(vmid, node, p.cloneStorageKeys(view, tmpl, spec, node)) {
		return p.slotWait(node)
	}
	return ""
}

// slotWait is the message of a VM waiting for a clone slot on node.
func (p *Provider) slotWait(node string) string {
	return fmt.Sprintf("waiting for a clone slot on node %s (clonesPerNode %d, clonesPerStorage %d)", node, p.cfg.ClonesPerNode, p.cfg.ClonesPerStorage)
}

// inflightTask returns the task this process last started for owner's VM
// vmid and has not seen finish, nil if none. A task started for another
// owner at the same id (an id one owner lost to another) is not owner's
// to follow.
func (p *Provider) inflightTask(vmid int, owner string) *provider.Task {
	p.mu.Lock()
	defer p.mu.Unlock()
	if t, ok := p.inflight[vmid]; ok && t.owner == owner {
		task := t.task
		return &task
	}
	return nil
}

func (p *Provider) setInflight(vmid int, owner string, t *provider.Task) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.inflight[vmid] = inflight{owner: owner, task: *t}
}

// clearInflight forgets vmid's task if it is upid.
func (p *Provider) clearInflight(vmid int, upid string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if t, ok := p.inflight[vmid]; ok && t.task.ID == upid {
		delete(p.inflight, vmid)
	}
}

// backoffState is the retry schedule of a VM after lock timeouts.
type backoffState struct {
	attempts int
	next     time.Time
	// cause is the last failure's message: the claim's condition quotes
	// it for as long as the wait lasts, not only in the pass that failed.
	cause string
}

// Backoff after lock timeouts: 2 s, 4 s, 8 s ... up to a minute, plus a
// per-VM offset so that VMs that failed together do not retry together.
const (
	backoffBase = 2 * time.Second
	backoffMax  = time.Minute
)

// backoffAfterFailure records a failure worth retrying, and why, and
// returns the wait.
func (p *Provider) backoffAfterFailure(vmid int, cause string) time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	b := p.backoff[vmid]
	if b == nil {
		b = &backoffState{}
		p.backoff[vmid] = b
	}
	b.attempts++
	b.cause = cause
	d := backoffBase << min(b.attempts-1, 5)
	if d > backoffMax {
		d = backoffMax
	}
	d += time.Duration(vmid%7) * 150 * time.Millisecond
	b.next = p.clock.Now().Add(d)
	return d
}

// backoffWait returns how long vmid must still wait before its next try,
// when that is, and the failure it waits after.
func (p *Provider) backoffWait(vmid int) (time.Duration, time.Time, string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if b := p.backoff[vmid]; b != nil {
		if d := b.next.Sub(p.clock.Now()); d > 0 {
			return d, b.next, b.cause
		}
	}
	return 0, time.Time{}, ""
}

// retryTime formats when a backoff ends for a message that stays the same
// while it is waited for: a message with the time left in it would change
// on every call, and every change is a status write of the claim that
// wakes it for another call.
func retryTime(t time.Time) string { return t.UTC().Format("15:04:05.000") + " UTC" }

func (p *Provider) resetBackoff(vmid int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.backoff, vmid)
}

// storageKey names a storage for the clone limit: local storages are
// separate on every node.
func storageKey(view *clusterView, node, sid string) string {
	if view != nil {
		if st, ok := view.storages[node][sid]; ok && st.Shared == 1 {
			return sid
		}
	}
	return node + "/" + sid
}

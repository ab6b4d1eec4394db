package fake

import (
	"fmt"
	"sort"
	"strings"

	"github.com/hyperfleet/hyperfleet/pkg/provider"
)

// The methods in this file are test controls. They act on the simulated
// cluster directly (no API-like call is counted) and affect every Provider
// instance that shares it.

// VMState is one VM as the simulated cluster holds it.
type VMState struct {
	VMID        int
	Node        string
	Name        string
	Template    bool
	Lock        string
	Description string
	Tags        []string
	Cores       int
	MemoryBytes int64
	DiskBytes   int64
	Storage     string
	Linked      bool
	NetModel    string
	MACAddress  string // lower-case
	Bridge      string
	VLAN        int
	// CDROM is the drive the provider attaches its cloud-init ISO to: ""
	// (no drive), "none" (empty) or a volume id.
	CDROM   string
	Pool    string
	Power   provider.PowerState
	AgentUp bool
	// Address is the guest's IPv4 address, once it has one.
	Address string
}

func (h *hypervisor) stateLocked(v *hvVM) VMState {
	st := VMState{
		VMID: v.vmid, Node: v.node, Name: v.name, Template: v.template, Lock: v.lock, Description: v.description,
		Tags: append([]string(nil), v.tags...), Cores: v.cores, MemoryBytes: v.memory, DiskBytes: v.disk,
		Storage: v.diskStorage, Linked: v.linked, NetModel: v.net.model, MACAddress: strings.ToLower(v.net.mac),
		Bridge: v.net.bridge, VLAN: v.net.vlan, CDROM: v.cdrom, Pool: v.pool, Power: provider.PowerStopped, AgentUp: v.agentUp,
	}
	if v.running {
		st.Power = provider.PowerRunning
	}
	if a, ok := h.addrByVM[v.vmid]; ok {
		st.Address = addrString(a)
	}
	return st
}

// settled locks the simulated cluster and brings it up to the clock's
// time; the caller defers the returned unlock.
func (p *Provider) settled() (*hypervisor, func()) {
	h := p.hv
	h.mu.Lock()
	h.settleLocked()
	return h, h.mu.Unlock
}

// VM returns the state of one VM.
func (p *Provider) VM(vmid int) (VMState, bool) {
	h, unlock := p.settled()
	defer unlock()
	v := h.vms[vmid]
	if v == nil {
		return VMState{}, false
	}
	return h.stateLocked(v), true
}

// VMs returns every VM and template, by id.
func (p *Provider) VMs() []VMState {
	h, unlock := p.settled()
	defer unlock()
	var out []VMState
	for _, id := range h.sortedVMIDsLocked() {
		out = append(out, h.stateLocked(h.vms[id]))
	}
	return out
}

// GuestPowerOff powers a running VM off from inside, as when the agent
// finishes its job: no task, the VM simply stops.
func (p *Provider) GuestPowerOff(vmid int) error {
	h, unlock := p.settled()
	defer unlock()
	v := h.vms[vmid]
	switch {
	case v == nil:
		return fmt.Errorf("VM %d does not exist", vmid)
	case !v.running:
		return fmt.Errorf("VM %d is not running", vmid)
	}
	h.powerOffLocked(v)
	return nil
}

// ForeignVM describes a VM made outside the provider.
type ForeignVM struct {
	// VMID zero takes the lowest free id from 100 up, as /cluster/nextid
	// does.
	VMID int
	// Node empty means the first node.
	Node        string
	Name        string
	Description string
	Tags        []string
	Running     bool
	// Cores, MemoryBytes, DiskBytes: zero means 1 core, 1 GiB, 8 GiB.
	Cores       int
	MemoryBytes int64
	DiskBytes   int64
}

// AddForeignVM creates a VM as someone else would (the web UI, another
// tool), with whatever description and tags, and returns its id. A running
// foreign VM's guest agent answers at once.
func (p *Provider) AddForeignVM(f ForeignVM) (int, error) {
	h, unlock := p.settled()
	defer unlock()
	if f.Node == "" {
		f.Node = h.nodeOrder[0]
	}
	if h.nodes[f.Node] == nil {
		return 0, fmt.Errorf("no node %q", f.Node)
	}
	if f.VMID == 0 {
		for id := minVMID; id <= maxVMID; id++ {
			if h.vms[id] == nil {
				f.VMID = id
				break
			}
		}
	}
	if f.VMID < minVMID || f.VMID > maxVMID {
		return 0, fmt.Errorf("VM id %d outside %d-%d", f.VMID, minVMID, maxVMID)
	}
	if h.vms[f.VMID] != nil {
		return 0, fmt.Errorf("unable to create VM %d: config file already exists", f.VMID)
	}
	if f.Name != "" && !dnsNameRE.MatchString(f.Name) {
		return 0, fmt.Errorf("name %q is not a DNS name", f.Name)
	}
	if len(f.Description) > maxDescription {
		return 0, fmt.Errorf("description longer than %d characters", maxDescription)
	}
	tags, err := normalizeTags(f.Tags)
	if err != nil {
		return 0, err
	}
	storage := ""
	for _, sid := range h.storeOrder {
		if st := h.storages[sid]; st.has("images") && st.availableOn(f.Node) {
			storage = sid
			break
		}
	}
	v := &hvVM{
		vmid: f.VMID, node: f.Node, name: f.Name, description: f.Description, tags: tags,
		cores: f.Cores, memory: f.MemoryBytes, disk: f.DiskBytes, diskStorage: storage, agent: true,
		net: hvNet{model: "virtio", mac: h.newMACLocked(), bridge: "vmbr0"},
	}
	if v.cores == 0 {
		v.cores = 1
	}
	if v.memory == 0 {
		v.memory = 1 << 30
	}
	if v.disk == 0 {
		v.disk = 8 << 30
	}
	h.vms[f.VMID] = v
	if f.Running {
		now := h.clock.Now()
		v.running, v.startedAt, v.agentUp = true, now, true
		h.allocateAddressLocked(f.VMID)
	}
	return f.VMID, nil
}

// SetDescription overwrites a VM's description, as an admin editing it
// would (ownership marker included).
func (p *Provider) SetDescription(vmid int, description string) error {
	h, unlock := p.settled()
	defer unlock()
	v := h.vms[vmid]
	if v == nil || v.lock == "clone" {
		return fmt.Errorf("VM %d does not exist or is being cloned", vmid)
	}
	if len(description) > maxDescription {
		return fmt.Errorf("description longer than %d characters", maxDescription)
	}
	v.description = description
	return nil
}

// SetTags overwrites a VM's tags (validated and normalized like Proxmox).
func (p *Provider) SetTags(vmid int, tags []string) error {
	h, unlock := p.settled()
	defer unlock()
	v := h.vms[vmid]
	if v == nil || v.lock == "clone" {
		return fmt.Errorf("VM %d does not exist or is being cloned", vmid)
	}
	norm, err := normalizeTags(tags)
	if err != nil {
		return err
	}
	v.tags = norm
	return nil
}

// RemoveVM deletes a VM at once, as an admin destroying it by hand would.
func (p *Provider) RemoveVM(vmid int) error {
	h, unlock := p.settled()
	defer unlock()
	if h.vms[vmid] == nil {
		return fmt.Errorf("VM %d does not exist", vmid)
	}
	h.powerOffLocked(h.vms[vmid])
	delete(h.vms, vmid)
	h.releaseAddressLocked(vmid)
	return nil
}

// AddTemplate adds a template. It is in the status sample at once, so it
// can be found by name right away.
func (p *Provider) AddTemplate(t Template) error {
	h, unlock := p.settled()
	defer unlock()
	if err := h.addTemplateLocked(t); err != nil {
		return err
	}
	v := h.vms[t.VMID]
	h.sample[t.VMID] = vmSample{name: v.name, template: true}
	return nil
}

// SetNodeOnline makes a node reachable or not. Calls that need an
// unreachable node fail like Proxmox's 595 "No route to host"; its VMs keep
// their state and list as PowerUnknown.
func (p *Provider) SetNodeOnline(node string, online bool) error {
	h, unlock := p.settled()
	defer unlock()
	n := h.nodes[node]
	if n == nil {
		return fmt.Errorf("no node %q", node)
	}
	n.Offline = !online
	return nil
}

// FailNext makes the next n calls of method m fail with a classified error
// of class, before they do anything.
func (p *Provider) FailNext(m Method, n int, class provider.Class) {
	h := p.hv
	h.mu.Lock()
	defer h.mu.Unlock()
	for i := 0; i < n; i++ {
		h.failMethod[m] = append(h.failMethod[m], injectedError(class, string(m)))
	}
}

// FailNextOp makes the next n API-like calls op fail with a classified
// error of class, before they take effect, whichever method makes them.
func (p *Provider) FailNextOp(op Op, n int, class provider.Class) {
	p.failOps(op, n, func() error { return injectedError(class, string(op)) })
}

// FailNextOpWith makes the next n API-like calls op fail, before they take
// effect, the way Proxmox answers: an HTTP status and a message, such as
// 500 "unable to create VM 101: config file already exists" or 500 "VM is
// locked (backup)". The provider classifies it as it would a real answer.
func (p *Provider) FailNextOpWith(op Op, n int, code int, message string) {
	p.failOps(op, n, func() error { return &apiError{code: code, msg: message} })
}

func (p *Provider) failOps(op Op, n int, mk func() error) {
	h := p.hv
	h.mu.Lock()
	defer h.mu.Unlock()
	for i := 0; i < n; i++ {
		h.failOp[op] = append(h.failOp[op], mk())
	}
}

// FailNextTasks makes the next n tasks started by op (clone, update-config,
// resize, start, stop, shutdown, destroy, upload, delete-volume) run their
// normal time and then fail with exit, such as "clone failed: can't lock
// file '/var/lock/pve-manager/pve-storage-local-lvm' - got timeout",
// without their effect (a failed clone leaves no VM, a failed destroy
// unlocks the VM).
func (p *Provider) FailNextTasks(op Op, n int, exit string) {
	h := p.hv
	h.mu.Lock()
	defer h.mu.Unlock()
	for i := 0; i < n; i++ {
		h.failTask[op] = append(h.failTask[op], exit)
	}
}

// ClearFailures drops every failure queued by FailNext, FailNextOp,
// FailNextOpWith and FailNextTasks that has not happened yet.
func (p *Provider) ClearFailures() {
	h := p.hv
	h.mu.Lock()
	defer h.mu.Unlock()
	h.failMethod = map[Method][]error{}
	h.failOp = map[Op][]error{}
	h.failTask = map[Op][]string{}
}

// Calls returns how many API-like calls method m has made (failed ones
// included) since the cluster was built or ResetCalls.
func (p *Provider) Calls(m Method) int {
	h := p.hv
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.calls[m]
}

// OpCalls returns how many times the API-like call op was made.
func (p *Provider) OpCalls(op Op) int {
	h := p.hv
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.opCalls[op]
}

// ResetCalls sets every call counter to zero.
func (p *Provider) ResetCalls() {
	h := p.hv
	h.mu.Lock()
	defer h.mu.Unlock()
	h.calls = map[Method]int{}
	h.opCalls = map[Op]int{}
}

// StoredCloudInit is one cloud-init ISO at rest on a storage.
type StoredCloudInit struct {
	Storage string
	// Node is the node whose local storage holds it, empty on shared
	// storage.
	Node    string
	VolID   string
	Payload provider.CloudInit
}

// StoredCloudInit lists every cloud-init ISO currently on the cluster's
// storages, so that tests can check what is at rest (and for how long).
func (p *Provider) StoredCloudInit() []StoredCloudInit {
	h, unlock := p.settled()
	defer unlock()
	out := []StoredCloudInit{}
	for _, vol := range h.volumes {
		out = append(out, StoredCloudInit{Storage: vol.storage, Node: vol.scope, VolID: vol.volid, Payload: copyCloudInit(vol.payload)})
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].VolID == out[j].VolID {
			return out[i].Node < out[j].Node
		}
		return out[i].VolID < out[j].VolID
	})
	return out
}

// DeliveredCloudInit returns what the guest of vmid read from its attached
// ISO at its last start.
func (p *Provider) DeliveredCloudInit(vmid int) (provider.CloudInit, bool) {
	h, unlock := p.settled()
	defer unlock()
	c, ok := h.delivered[vmid]
	if !ok {
		return provider.CloudInit{}, false
	}
	return copyCloudInit(c), true
}

// RefreshResources takes a status sample now, as if the hypervisor's
// status daemon had just run.
func (p *Provider) RefreshResources() {
	h, unlock := p.settled()
	defer unlock()
	h.takeSampleLocked(h.clock.Now())
}

// SetDurations changes how long tasks started from now on take.
func (p *Provider) SetDurations(d Durations) {
	h, unlock := p.settled()
	defer unlock()
	h.o.Durations = d
}

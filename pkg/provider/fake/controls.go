package fake

import (
	"fmt"
	"slices"
	"strings"

	"github.com/hyperfleet/hyperfleet/pkg/provider"
)

// The methods in this file are test controls: they act on the cluster as
// someone other than the operator would (an admin, a guest), or show what
// it holds.

// VMState is one VM or template as the cluster holds it.
type VMState struct {
	VMID        int
	Node        string
	Name        string
	Description string
	Tags        []string
	Template    bool
	Power       provider.PowerState
	// SavedState is what a VM suspended to disk has at rest of its
	// guest's memory: its tmpfs files, as path=content.
	SavedState []string
}

// VM returns the state of one VM or template.
func (c *Cluster) VM(vmid int) (VMState, bool) {
	defer c.lock()()
	v := c.vms[vmid]
	if v == nil {
		return VMState{}, false
	}
	return stateOf(v), true
}

// VMs returns every VM and template, by id.
func (c *Cluster) VMs() []VMState {
	defer c.lock()()
	var out []VMState
	for _, id := range c.sortedIDsLocked() {
		out = append(out, stateOf(c.vms[id]))
	}
	return out
}

func stateOf(v *vm) VMState {
	s := VMState{VMID: v.id, Node: v.node, Name: v.name, Description: v.description, Tags: slices.Clone(v.tags),
		Template: v.template != nil, Power: provider.PowerStopped}
	switch {
	case v.running:
		s.Power = provider.PowerRunning
	case v.suspended:
		s.Power = provider.PowerSuspended
	}
	for path, content := range v.saved {
		s.SavedState = append(s.SavedState, path+"="+string(content))
	}
	slices.Sort(s.SavedState)
	return s
}

// Medium is one cloud-init medium at rest, with its data.
type Medium struct {
	provider.CloudInitMedium
	Data provider.CloudInit
}

// Media returns every cloud-init medium at rest, by id, whichever install
// wrote it.
func (c *Cluster) Media() []Medium {
	defer c.lock()()
	var out []Medium
	for _, m := range c.media {
		out = append(out, Medium{CloudInitMedium: provider.CloudInitMedium{ID: m.id, Node: m.node, VM: FormatID(m.vmid), OwnerDigest: m.digest}, Data: m.data})
	}
	slices.SortFunc(out, func(a, b Medium) int { return strings.Compare(a.ID, b.ID) })
	return out
}

// DeliveredCloudInit returns the cloud-init the guest of vmid read at its
// last start.
func (c *Cluster) DeliveredCloudInit(vmid int) (provider.CloudInit, bool) {
	defer c.lock()()
	data, ok := c.delivered[vmid]
	return data, ok
}

// NativeCloudInit returns the hypervisor's own cloud-init VM vmid was
// configured with (a spec with Native), false for a VM configured with a
// medium or not configured.
func (c *Cluster) NativeCloudInit(vmid int) (provider.NativeCloudInit, bool) {
	defer c.lock()()
	v := c.vms[vmid]
	if v == nil || v.native == nil {
		return provider.NativeCloudInit{}, false
	}
	return *cloneNative(v.native), true
}

// ForeignVM is a VM made outside HyperFleet, on the first node.
type ForeignVM struct {
	// VMID zero takes the lowest free id.
	VMID              int
	Name, Description string
	Tags              []string
}

// AddForeignVM creates a stopped VM as an admin or another tool would,
// with whatever name, description and tags, and returns its id.
func (c *Cluster) AddForeignVM(f ForeignVM) (int, error) {
	defer c.lock()()
	if f.VMID == 0 {
		for f.VMID = 1; c.vms[f.VMID] != nil; f.VMID++ {
		}
	}
	if f.VMID < 0 || c.vms[f.VMID] != nil {
		return 0, fmt.Errorf("VM id %d is negative or taken", f.VMID)
	}
	c.vms[f.VMID] = &vm{id: f.VMID, node: c.opts.Nodes[0].Name, name: f.Name, description: f.Description, tags: slices.Clone(f.Tags),
		memory: 1 << 30, mac: macOf(f.VMID), configured: true}
	return f.VMID, nil
}

// SetDescription overwrites a VM's description, ownership marker included,
// as an admin editing it would.
func (c *Cluster) SetDescription(vmid int, description string) error {
	return c.editVM(vmid, func(v *vm) { v.description = description })
}

// RemoveVM deletes a VM at once, as an admin destroying it by hand would;
// its cloud-init medium stays.
func (c *Cluster) RemoveVM(vmid int) error {
	return c.editVM(vmid, func(*vm) { delete(c.vms, vmid) })
}

// GuestPowerOff powers a running VM off from inside, as a guest whose job
// is done does.
func (c *Cluster) GuestPowerOff(vmid int) error {
	defer c.lock()()
	v := c.vms[vmid]
	if v == nil || !v.running {
		return fmt.Errorf("VM %d does not exist or is not running", vmid)
	}
	v.running, v.guestFiles = false, nil
	return nil
}

// GuestFile returns the file at path in the guest of vmid as
// PlaceGuestFile left it; ok is false when there is none (none written
// since the VM last started).
func (c *Cluster) GuestFile(vmid int, path string) (content []byte, ok bool) {
	defer c.lock()()
	v := c.vms[vmid]
	if v == nil {
		return nil, false
	}
	content, ok = v.guestFiles[path]
	return slices.Clone(content), ok
}

// RemoveGuestAgent takes the guest channel away from a VM, as an admin
// disabling its guest agent would.
func (c *Cluster) RemoveGuestAgent(vmid int) error {
	return c.editVM(vmid, func(v *vm) { v.guestAgent = false })
}

// SetGuestAddress makes VM vmid's guest report addr from now on, as a
// guest whose DHCP server gave it another address would.
func (c *Cluster) SetGuestAddress(vmid int, addr string) error {
	return c.editVM(vmid, func(v *vm) { v.address = addr })
}

// editVM makes an admin's change to VM vmid, under the cluster's lock; an
// error when there is no such VM.
func (c *Cluster) editVM(vmid int, change func(v *vm)) error {
	defer c.lock()()
	v := c.vms[vmid]
	if v == nil {
		return fmt.Errorf("VM %d does not exist", vmid)
	}
	change(v)
	return nil
}

// FailDestroys makes every destroy of a VM fail with err, leaving the VM
// as it is, until the returned func is called: what a hypervisor answers
// when something other than the VM (a disk's storage, a volume) is missing.
func (c *Cluster) FailDestroys(err error) (stop func()) {
	defer c.lock()()
	c.destroyErr = err
	return func() {
		defer c.lock()()
		c.destroyErr = nil
	}
}

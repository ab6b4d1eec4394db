package libvirt

import (
	"fmt"
	"strings"

	golibvirt "github.com/digitalocean/go-libvirt"
	"libvirt.org/go/libvirtxml"

	"github.com/hyperfleet/hyperfleet/pkg/provider"
)

// diskPool is the pool a clone's disk goes to: a full clone's own target
// (its TemplateRef's Storage), else the cluster's volume pool.
func (p *Provider) diskPool(spec *provider.VMSpec) string {
	if storage := provider.RecordSource(spec.Source).Storage; !spec.Source.Linked && storage != "" {
		return storage
	}
	return p.settings.VolumePool
}

// diskOf is the pool and volume of the VM's own disk, as its definition
// names them.
func (p *Provider) diskOf(d *domain) (pool, volume string) {
	if d.xml.Devices != nil {
		// Its first disk that is not an extra disk (hardware.go): the
		// template had one, and its clone keeps it first.
		for _, disk := range d.xml.Devices.Disks {
			if disk.Device != "" && disk.Device != "disk" || disk.Source == nil || disk.Source.Volume == nil {
				continue
			}
			if p.extraDiskNumber(d.meta.ID, disk.Source.Volume.Volume) == 0 {
				return disk.Source.Volume.Pool, disk.Source.Volume.Volume
			}
		}
	}
	return p.settings.VolumePool, p.diskName(d.meta.ID)
}

// diskName is the volume name of VM vmid's disk: the install's name of
// the VM, so that it is as unique as the domain's.
func (p *Provider) diskName(vmid int) string { return p.signer.VMName(vmid) + ".qcow2" }

// overlayXML is the volume of a linked clone: a qcow2 file whose backing
// store is the template's volume, of the template's size or the spec's
// when larger.
func overlayXML(name string, t *templateDomain, capacity int64) (string, error) {
	v := libvirtxml.StorageVolume{Name: name,
		Capacity:     &libvirtxml.StorageVolumeSize{Unit: "bytes", Value: uint64(capacity)},
		Target:       &libvirtxml.StorageVolumeTarget{Format: &libvirtxml.StorageVolumeTargetFormat{Type: "qcow2"}},
		BackingStore: &libvirtxml.StorageVolumeBackingStore{Path: t.path, Format: &libvirtxml.StorageVolumeTargetFormat{Type: t.format}}}
	return v.Marshal()
}

// copyXML is the volume of a full clone: a qcow2 copy of the template's
// volume.
func copyXML(name string, capacity int64) (string, error) {
	v := libvirtxml.StorageVolume{Name: name,
		Capacity: &libvirtxml.StorageVolumeSize{Unit: "bytes", Value: uint64(capacity)},
		Target:   &libvirtxml.StorageVolumeTarget{Format: &libvirtxml.StorageVolumeTargetFormat{Type: "qcow2"}}}
	return v.Marshal()
}

// overlayAllocation is what a fresh overlay takes in its pool: its
// metadata, and room for the guest's first writes.
const overlayAllocation = 64 << 20

// ensureDisk makes sure the clone's disk exists: it creates it (one
// write) when it does not, or waits for a full copy in flight. done says
// the disk is there; otherwise res says why the caller waits.
func (p *Provider) ensureDisk(spec *provider.VMSpec, ref *TemplateRef, d *domain, res *provider.EnsureResult) (bool, error) {
	vmid, h := d.meta.ID, d.host
	l, err := h.client()
	if err != nil {
		return false, err
	}
	poolName, volName := p.diskOf(d)
	pool, err := l.StoragePoolLookupByName(poolName)
	if err != nil {
		return false, provider.Errorf(provider.ClassConfiguration, "StorageNotFound", "storage pool %q of VM %d on host %s (spec.libvirt.volumePool or source.storage): %v", poolName, vmid, h.Name, classify(err))
	}
	full := p.settings.FullCopies || !spec.Source.Linked
	_, err = l.StorageVolLookupByName(pool, volName)
	if err == nil {
		if p.copyInFlight(vmid) {
			res.Phase, res.RetryAfter, res.Message = provider.PhaseCloning, copyPoll, fmt.Sprintf("copying the template's disk to VM %d", vmid)
			return false, nil
		}
		if cerr := p.copyFailed(vmid, poolName); cerr != nil {
			return false, cerr
		}
		if full && !p.copySeen(vmid) && !p.diskTaken(spec.Owner, vmid) && !p.signer.HasOperatorTag(d.meta.Tags) {
			// A full copy this process did not see end (it started before a
			// restart): libvirt creates the volume before it writes it, and
			// refuses to refresh a pool while one of its volumes is being
			// written, so the disk is taken only once the pool refreshes.
			building, err := poolBuilding(l, pool)
			if err != nil {
				return false, classify(fmt.Errorf("refresh pool %s on host %s: %w", poolName, h.Name, err))
			}
			if building {
				res.Phase, res.RetryAfter = provider.PhaseCloning, copyPoll
				res.Message = fmt.Sprintf("waiting for the copy of VM %d's disk into pool %s on host %s to end (it began before a restart)", vmid, poolName, h.Name)
				return false, nil
			}
		}
		p.takeDisk(spec.Owner, vmid)
		p.releaseSlot(vmid)
		return true, nil
	}
	if !isCode(err, golibvirt.ErrNoStorageVol) {
		return false, classify(fmt.Errorf("look up the disk of VM %d on host %s: %w", vmid, h.Name, err))
	}
	if p.copyInFlight(vmid) {
		res.Phase, res.RetryAfter, res.Message = provider.PhaseCloning, copyPoll, fmt.Sprintf("copying the template's disk to VM %d", vmid)
		return false, nil
	}
	if cerr := p.copyFailed(vmid, poolName); cerr != nil {
		p.releaseSlot(vmid)
		return false, cerr
	}
	if !p.takeSlot(h, poolName, vmid, spec.Owner) {
		// A slot taken by others since this VM's domain was defined (a
		// restart forgot it held one).
		res.Phase, res.RetryAfter, res.Message = provider.PhaseQueued, queuedRetry, slotWait(h.Name, poolName)
		res.Waits = res.Message
		return false, nil
	}
	t, err := p.template(h, ref)
	if err != nil {
		return false, err
	}
	capacity := max(t.capacity, spec.DiskBytes)
	need := int64(overlayAllocation)
	if full {
		need = capacity
	}
	if err := p.checkRoom(l, pool, h, need); err != nil {
		p.releaseSlot(vmid)
		return false, err
	}
	if full {
		doc, err := copyXML(volName, capacity)
		if err != nil {
			return false, err
		}
		p.startCopy(l, pool, doc, t.vol, vmid)
		p.did(res, d, provider.PhaseCloning, opDisk, copyPoll, "copying the disk of template %s to VM %d on host %s", ref, vmid, h.Name)
		return false, nil
	}
	doc, err := overlayXML(volName, t, capacity)
	if err != nil {
		return false, err
	}
	if _, err := l.StorageVolCreateXML(pool, doc, 0); err != nil {
		return false, poolError(classify(fmt.Errorf("create the disk of VM %d in pool %s on host %s: %w", vmid, poolName, h.Name, err)), poolName)
	}
	p.did(res, d, provider.PhaseCloning, opDisk, nextStep, "created the disk of VM %d on template %s on host %s", vmid, ref.Domain, h.Name)
	return false, nil
}

// checkRoom refuses a disk its pool has no room for, naming the pool.
func (p *Provider) checkRoom(l *golibvirt.Libvirt, pool golibvirt.StoragePool, h *host, need int64) error {
	_, _, _, available, err := l.StoragePoolGetInfo(pool)
	if err != nil {
		return classify(fmt.Errorf("read pool %s on host %s: %w", pool.Name, h.Name, err))
	}
	if int64(available) < need {
		return provider.Errorf(provider.ClassResource, "InsufficientStorage",
			"storage pool %s on host %s has %d bytes free, a clone needs %d; free space in the pool or set spec.libvirt.volumePool to a larger one: %w",
			pool.Name, h.Name, available, need, provider.ErrNoCapacity)
	}
	return nil
}

// poolError names the pool in a capacity error.
func poolError(err error, pool string) error {
	if provider.Classify(err) == provider.ClassResource {
		return provider.Errorf(provider.ClassResource, "InsufficientStorage", "storage pool %s is full: %w", pool, err)
	}
	return err
}

// startCopy runs a full copy in the background: libvirt's call returns
// only when the copy is written. copies[vmid] holds its result, and the
// clone slot of vmid counts for as long as the copy is known (Watch).
func (p *Provider) startCopy(l *golibvirt.Libvirt, pool golibvirt.StoragePool, doc string, from golibvirt.StorageVol, vmid int) {
	c := &fullCopy{done: make(chan struct{})}
	p.mu.Lock()
	p.copies[vmid] = c
	p.mu.Unlock()
	p.slots.Watch(vmid, true)
	go func() {
		_, err := l.StorageVolCreateXMLFrom(pool, doc, from, 0)
		p.mu.Lock()
		c.err = err
		p.mu.Unlock()
		close(c.done)
	}()
}

// copyInFlight says whether a full copy of this process for vmid runs.
func (p *Provider) copyInFlight(vmid int) bool {
	p.mu.Lock()
	c := p.copies[vmid]
	p.mu.Unlock()
	if c == nil {
		return false
	}
	select {
	case <-c.done:
		return false
	default:
		return true
	}
}

// copySeen says whether this process saw vmid's full copy end.
func (p *Provider) copySeen(vmid int) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.copies[vmid] != nil
}

// diskTaken says whether this process took o's VM vmid's disk as written.
func (p *Provider) diskTaken(o provider.Owner, vmid int) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	r := p.reservations[o.UID]
	return r != nil && r.vmid == vmid && r.diskWritten
}

// takeDisk records that o's VM vmid's disk is taken as written, so that
// the steps after it (configuring, which may take several calls) do not
// look again.
func (p *Provider) takeDisk(o provider.Owner, vmid int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if r := p.reservations[o.UID]; r != nil && r.vmid == vmid {
		r.diskWritten = true
	}
}

// poolBuilding says whether a volume of pool is being written: libvirt
// refuses to refresh a pool with asynchronous jobs (a volume created from
// another, a volume built) running.
func poolBuilding(l *golibvirt.Libvirt, pool golibvirt.StoragePool) (bool, error) {
	err := l.StoragePoolRefresh(pool, 0)
	if err != nil && strings.Contains(err.Error(), "asynchronous jobs running") {
		return true, nil
	}
	return false, err
}

// copyFailed returns the error of vmid's finished full copy, nil if none.
// The copy is forgotten then, and vmid's clone slot no longer counts as a
// copy's.
func (p *Provider) copyFailed(vmid int, pool string) error {
	p.mu.Lock()
	var err error
	if c := p.copies[vmid]; c != nil && c.err != nil {
		err = c.err
		delete(p.copies, vmid)
	}
	p.mu.Unlock()
	if err == nil {
		return nil
	}
	p.slots.Watch(vmid, false)
	return poolError(classify(fmt.Errorf("copy the template's disk to VM %d: %w", vmid, err)), pool)
}

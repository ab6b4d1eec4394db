package libvirt

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	golibvirt "github.com/digitalocean/go-libvirt"

	"github.com/hyperfleet/hyperfleet/pkg/ownership"
	"github.com/hyperfleet/hyperfleet/pkg/provider"
)

// DeleteVM implements provider.Provider, one write per call while the
// domain exists and verifies: stop it, delete its managed save image when
// it is suspended (the guest's memory), delete its cloud-init ISO, delete
// its extra disks, its disk, then undefine it with its NVRAM and TPM state (and a managed
// save image made since). The volumes go before the domain, while its
// marker still proves they are the owner's: once the domain is gone its
// VM id, and with it the names of its volumes, may be taken by another
// VM. Done once libvirt says the domain does not exist.
func (p *Provider) DeleteVM(_ context.Context, owner provider.Owner, prev provider.Progress) (*provider.DeleteResult, error) {
	vmid, out, err := ids.ParseDeletion(prev)
	if err != nil {
		return nil, err
	}
	if vmid == 0 {
		p.forget(owner)
		out.Done = true
		return out, nil
	}
	d, err := p.find(vmid, prev.Node)
	if isNotFound(err) {
		p.forget(owner)
		p.releaseSlot(vmid)
		out.Done, out.Message = true, fmt.Sprintf("VM %d is gone", vmid)
		return out, nil
	}
	if err != nil {
		return nil, err
	}
	if _, err := p.owned(d, owner); err != nil {
		return nil, err
	}
	out.Progress.Node = d.host.Name
	op, err := p.deleteStep(d, owner)
	if err != nil {
		return nil, err
	}
	out.Progress.Task = p.task(d.host, vmid, op)
	out.Message = fmt.Sprintf("%s of VM %d on host %s", op, vmid, d.host.Name)
	return out, nil
}

// deleteStep makes the next write of a deletion and names it.
func (p *Provider) deleteStep(d *domain, owner provider.Owner) (string, error) {
	vmid := d.meta.ID
	l, err := d.host.client()
	if err != nil {
		return "", err
	}
	if d.running() {
		if err := l.DomainDestroyFlags(d.dom, golibvirt.DomainDestroyDefault); err != nil && !isCode(err, golibvirt.ErrOperationInvalid) {
			return "", classify(fmt.Errorf("stop VM %d: %w", vmid, err))
		}
		return "stop", nil
	}
	if d.saved {
		// The guest's memory at rest goes first, before anything that
		// would let the deletion stall with it still on the host.
		if err := l.DomainManagedSaveRemove(d.dom, 0); err != nil {
			return "", classify(fmt.Errorf("delete the saved state of VM %d: %w", vmid, err))
		}
		return opDeleteSaved, nil
	}
	for _, name := range p.mediaOf(d, owner) {
		deleted, err := p.deleteVolume(d.host, name)
		if err != nil {
			return "", err
		}
		if deleted {
			return opDeleteISO, nil
		}
	}
	if deleted, err := p.deleteExtraDisk(l, d); err != nil || deleted {
		return opDeleteExtraDisk, err
	}
	poolName, volName := p.diskOf(d)
	pool, err := l.StoragePoolLookupByName(poolName)
	if err != nil {
		return "", classify(fmt.Errorf("look up pool %s to delete the disk of VM %d: %w", poolName, vmid, err))
	}
	if vol, err := l.StorageVolLookupByName(pool, volName); err == nil {
		if err := l.StorageVolDelete(vol, 0); err != nil {
			return "", classify(fmt.Errorf("delete the disk of VM %d: %w", vmid, err))
		}
		return "delete-disk", nil
	} else if !isCode(err, golibvirt.ErrNoStorageVol) {
		return "", classify(fmt.Errorf("look up the disk of VM %d: %w", vmid, err))
	}
	if err := l.DomainUndefineFlags(d.dom, golibvirt.DomainUndefineNvram|golibvirt.DomainUndefineTpm|golibvirt.DomainUndefineManagedSave); err != nil {
		return "", classify(fmt.Errorf("undefine VM %d: %w", vmid, err))
	}
	// The VM was deleted; a filter it leaves unused is only clutter, so
	// a failed sweep fails nothing (the next deletion sweeps again).
	p.mu.Lock()
	delete(p.filters, owner.UID)
	p.mu.Unlock()
	if err := p.sweepFilters(d.host); err != nil {
		p.log.Error(err, "Sweeping unused network filters failed", "host", d.host.Name)
	}
	return "undefine", nil
}

// DisownVM implements provider.Provider: one write replaces the ownership
// block by the release note and drops the install's tags; a clone that
// still shows the install's name gets the title "disowned-<n>" with it.
// A suspended VM takes one write more, first, and so one call more: its
// managed save image gets the same release (releaseSavedState); it stays
// suspended.
func (p *Provider) DisownVM(_ context.Context, owner provider.Owner, ref provider.VMRef) (*provider.DisownResult, error) {
	d, err := p.lookup(ref)
	if err != nil {
		return nil, err
	}
	vmid := d.meta.ID
	rec, err := p.owned(d, owner)
	if err != nil {
		var verr error
		if _, verr = p.verify(d); errors.Is(verr, ownership.ErrNoMarker) && d.metaErr == nil && p.signer.Released(d.meta.Description, owner.UID, vmid) {
			return &provider.DisownResult{Done: true, Message: fmt.Sprintf("VM %d was already released", vmid)}, nil
		}
		return nil, err
	}
	if d.saved {
		released, err := p.releaseSavedState(d, owner)
		if err != nil {
			return nil, err
		}
		if released {
			return &provider.DisownResult{RetryAfter: nextStep, Removed: []string{"the ownership block of its saved state"},
				Message: fmt.Sprintf("released the saved state of the suspended VM %d; its definition next", vmid)}, nil
		}
	}
	meta := p.releasedMeta(d.meta, rec)
	var removed []string
	if len(meta.Tags) != len(d.meta.Tags) {
		removed = append(removed, "tags "+strings.Join(p.signer.Tags(), ", "))
	}
	removed = append(removed, "the ownership block")
	if d.xml.Title == "" {
		removed = append(removed, "the clone name "+d.dom.Name)
		if err := p.retitle(d, meta, disownedTitle(vmid)); err != nil {
			return nil, err
		}
	} else if err := d.setMetadata(meta); err != nil {
		return nil, err
	}
	p.forget(owner)
	return &provider.DisownResult{Done: true, Removed: removed, Message: fmt.Sprintf("VM %d is no longer this install's", vmid)}, nil
}

// disownedTitle is the title DisownVM gives VM vmid when it has none.
func disownedTitle(vmid int) string { return fmt.Sprintf("disowned-%d", vmid) }

// withoutInstallTags is tags without the install's own.
func withoutInstallTags(s *ownership.Signer, tags []string) []string {
	return slices.DeleteFunc(slices.Clone(tags), func(t string) bool { return slices.Contains(s.Tags(), strings.ToLower(t)) })
}

// retitle writes meta and a title: one definition for an inactive
// domain; a running one takes the metadata, then the title.
func (p *Provider) retitle(d *domain, meta vmMeta, title string) error {
	if !d.running() {
		x, err := d.inactiveXML()
		if err != nil {
			return err
		}
		x.Title = title
		if err := setMeta(x, meta); err != nil {
			return err
		}
		return d.host.redefine(x)
	}
	if err := d.setMetadata(meta); err != nil {
		return err
	}
	l, err := d.host.client()
	if err != nil {
		return err
	}
	err = l.DomainSetMetadata(d.dom, int32(golibvirt.DomainMetadataTitle), golibvirt.OptString{title}, nil, nil,
		golibvirt.DomainAffectConfig|golibvirt.DomainAffectLive)
	return classify(err)
}

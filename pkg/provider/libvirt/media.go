package libvirt

import (
	"bytes"
	"context"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"

	golibvirt "github.com/digitalocean/go-libvirt"
	"libvirt.org/go/libvirtxml"

	"github.com/hyperfleet/hyperfleet/pkg/provider"
	"github.com/hyperfleet/hyperfleet/pkg/provider/nocloud"
)

// isoName is the cloud-init ISO's volume name: deterministic from the
// install, the VM id and the claim, so deletion finds it without any
// state, two installs sharing a pool never collide, and the orphan sweep
// can tell whose it is.
func (p *Provider) isoName(vmid int, uid string) string {
	return fmt.Sprintf("hf-%s-%d-%s.iso", p.signer.OperatorID(), vmid, provider.OwnerDigest(uid))
}

// nativeSeedName is the volume name of the seed a VM under native
// delivery boots from: no medium of the install's scheme (it holds no
// secret), named for the VM.
func (p *Provider) nativeSeedName(vmid int) string { return p.signer.VMName(vmid) + "-seed.iso" }

var isoNamePattern = regexp.MustCompile(`^hf-([a-z0-9][a-z0-9-]*)-([1-9][0-9]*)-([0-9a-f]{12})\.iso$`)

// parseISOName returns the VM id and owner digest of an ISO name this
// install wrote; ok is false for any other name.
func (p *Provider) parseISOName(name string) (vmid int, digest string, ok bool) {
	m := isoNamePattern.FindStringSubmatch(name)
	if m == nil || m[1] != p.signer.OperatorID() {
		return 0, "", false
	}
	vmid, err := strconv.Atoi(m[2])
	return vmid, m[3], err == nil
}

// mediumID is a CloudInitMedium's ID: "<pool>/<volume>".
func mediumID(pool, name string) string { return pool + "/" + name }

// mediaPool looks up the media pool on h.
func (p *Provider) mediaPool(l *golibvirt.Libvirt, h *host) (golibvirt.StoragePool, error) {
	pool, err := l.StoragePoolLookupByName(p.settings.MediaPool)
	if err != nil {
		return pool, provider.Errorf(provider.ClassConfiguration, "StorageNotFound", "spec.libvirt.mediaPool %q on host %s: %v", p.settings.MediaPool, h.Name, classify(err))
	}
	return pool, nil
}

// writeMedium writes the VM's seed ISO into the media pool in one
// operation (create the volume, upload its bytes). done says it is there
// already; a volume found empty (an upload cut short) is deleted first.
func (p *Provider) writeMedium(ctx context.Context, spec *provider.VMSpec, d *domain, name string) (done bool, op string, err error) {
	vmid, h := d.meta.ID, d.host
	l, err := h.client()
	if err != nil {
		return false, "", err
	}
	pool, err := p.mediaPool(l, h)
	if err != nil {
		return false, "", err
	}
	vol, err := l.StorageVolLookupByName(pool, name)
	if err == nil {
		_, _, allocation, ierr := l.StorageVolGetInfo(vol)
		if ierr != nil {
			return false, "", classify(fmt.Errorf("read cloud-init ISO %s of VM %d: %w", name, vmid, ierr))
		}
		if allocation > 0 {
			return true, "", nil
		}
		if err := l.StorageVolDelete(vol, 0); err != nil {
			return false, "", classify(fmt.Errorf("delete the incomplete cloud-init ISO %s of VM %d: %w", name, vmid, err))
		}
		return false, opDeleteISO, nil
	}
	if !isCode(err, golibvirt.ErrNoStorageVol) {
		return false, "", classify(fmt.Errorf("look up cloud-init ISO %s of VM %d: %w", name, vmid, err))
	}
	iso, err := p.seed(ctx, spec, vmid)
	if err != nil {
		return false, "", err
	}
	doc, err := (&libvirtxml.StorageVolume{Name: name, Allocation: &libvirtxml.StorageVolumeSize{Unit: "bytes", Value: 0},
		Capacity: &libvirtxml.StorageVolumeSize{Unit: "bytes", Value: uint64(len(iso))},
		Target:   &libvirtxml.StorageVolumeTarget{Format: &libvirtxml.StorageVolumeTargetFormat{Type: "raw"}}}).Marshal()
	if err != nil {
		return false, "", err
	}
	vol, err = l.StorageVolCreateXML(pool, doc, 0)
	if err != nil {
		return false, "", poolError(classify(fmt.Errorf("create cloud-init ISO %s of VM %d: %w", name, vmid, err)), p.settings.MediaPool)
	}
	if err := l.StorageVolUpload(vol, bytes.NewReader(iso), 0, uint64(len(iso)), 0); err != nil {
		_ = l.StorageVolDelete(vol, 0)
		return false, "", classify(fmt.Errorf("upload cloud-init ISO %s of VM %d: %w", name, vmid, err))
	}
	return false, opWrite, nil
}

// seed renders the VM's seed ISO: the spec's cloud-init, rendered only
// now that it is delivered, or under native delivery the seed built from
// the native fields.
func (p *Provider) seed(ctx context.Context, spec *provider.VMSpec, vmid int) ([]byte, error) {
	var ci provider.CloudInit
	if spec.Native != nil {
		var err error
		if ci, err = nativeSeed(spec, vmid); err != nil {
			return nil, err
		}
	} else {
		var err error
		if ci, err = provider.RenderCloudInit(ctx, spec); err != nil {
			return nil, fmt.Errorf("render the cloud-init of VM %d: %w", vmid, err)
		}
	}
	iso, err := nocloud.ISO(nocloud.Files(spec, ci, vmid))
	if err != nil {
		return nil, fmt.Errorf("build the cloud-init ISO of VM %d: %w", vmid, err)
	}
	return iso, nil
}

// mediaOf names the seed volumes VM d of owner may have: the install's
// ISO for the owner, the native seed, and what its metadata names.
func (p *Provider) mediaOf(d *domain, owner provider.Owner) []string {
	names := []string{p.isoName(d.meta.ID, owner.UID), p.nativeSeedName(d.meta.ID)}
	if m := d.meta.Medium; m != "" && !slices.Contains(names, m) {
		names = append(names, m)
	}
	return names
}

// removeMedium takes the VM's seed away, one write per call: eject it
// (from the running guest too), then delete its volume, whether or not the
// VM's configuration attached it yet. gone says nothing is left.
func (p *Provider) removeMedium(d *domain, owner provider.Owner, res *provider.EnsureResult) (gone bool, err error) {
	names := p.mediaOf(d, owner)
	for _, name := range names {
		disk := mediumDisk(d.xml, name)
		if disk == nil {
			continue
		}
		if err := d.eject(disk); err != nil {
			return false, err
		}
		p.did(res, d, res.Phase, opEject, nextStep, "ejected the cloud-init ISO of VM %d", d.meta.ID)
		return false, nil
	}
	for _, name := range names {
		deleted, err := p.deleteVolume(d.host, name)
		if err != nil {
			return false, err
		}
		if deleted {
			p.did(res, d, res.Phase, opDeleteISO, nextStep, "deleted the cloud-init ISO of VM %d", d.meta.ID)
			return false, nil
		}
	}
	return true, nil
}

// eject empties the CD-ROM disk of d, in its definition and, when it
// runs, in the guest.
func (d *domain) eject(disk *libvirtxml.DomainDisk) error {
	l, err := d.host.client()
	if err != nil {
		return err
	}
	empty := *disk
	empty.Source = nil
	doc, err := empty.Marshal()
	if err != nil {
		return err
	}
	flags := golibvirt.DomainDeviceModifyConfig
	if d.running() {
		flags |= golibvirt.DomainDeviceModifyLive
	}
	if err := l.DomainUpdateDeviceFlags(d.dom, doc, flags); err != nil {
		return classify(fmt.Errorf("eject the cloud-init ISO of VM %d: %w", d.meta.ID, err))
	}
	return nil
}

// deleteVolume deletes volume name of the media pool of h if it exists;
// deleted says it did.
func (p *Provider) deleteVolume(h *host, name string) (deleted bool, err error) {
	l, err := h.client()
	if err != nil {
		return false, err
	}
	pool, err := p.mediaPool(l, h)
	if err != nil {
		return false, err
	}
	vol, err := l.StorageVolLookupByName(pool, name)
	if isCode(err, golibvirt.ErrNoStorageVol) {
		return false, nil
	}
	if err == nil {
		err = l.StorageVolDelete(vol, 0)
	}
	if err != nil && !isCode(err, golibvirt.ErrNoStorageVol) {
		return false, classify(fmt.Errorf("delete volume %s on host %s: %w", name, h.Name, err))
	}
	return err == nil, nil
}

// RemoveCloudInitMedia implements provider.Provider.
func (p *Provider) RemoveCloudInitMedia(_ context.Context, owner provider.Owner, prev provider.Progress) (*provider.DeleteResult, error) {
	vmid, out, err := ids.ParseDeletion(prev)
	if err != nil {
		return nil, err
	}
	if vmid == 0 {
		out.Done = true
		return out, nil
	}
	d, err := p.find(vmid, prev.Node)
	if err != nil && !isNotFound(err) {
		return nil, err
	}
	if d == nil {
		return p.deleteOrphanISO(owner, vmid, prev.Node, out)
	}
	if _, err := p.owned(d, owner); err != nil {
		return nil, err
	}
	out.Progress.Node = d.host.Name
	res := &provider.EnsureResult{}
	gone, err := p.removeMedium(d, owner, res)
	if err != nil {
		return nil, err
	}
	out.Progress.Task, out.Message, out.Done = res.Progress.Task, res.Message, gone
	if gone {
		out.Progress.Task, out.Message = nil, fmt.Sprintf("the cloud-init ISO of VM %d is gone", vmid)
	}
	return out, nil
}

// deleteOrphanISO deletes the ISO written for owner's VM vmid, whose
// domain is gone, on the hosts it may be on; Done once none is left.
func (p *Provider) deleteOrphanISO(owner provider.Owner, vmid int, hint string, out *provider.DeleteResult) (*provider.DeleteResult, error) {
	name := p.isoName(vmid, owner.UID)
	for _, h := range p.hosts {
		if hint != "" && h.Name != hint {
			continue
		}
		deleted, err := p.deleteVolume(h, name)
		if err != nil {
			return nil, err
		}
		if deleted {
			out.Message = fmt.Sprintf("deleted cloud-init ISO %s of VM %d", name, vmid)
			return out, nil
		}
	}
	out.Done, out.Message = true, fmt.Sprintf("VM %d and its cloud-init ISO are gone", vmid)
	return out, nil
}

// ListCloudInitMedia implements provider.Provider.
func (p *Provider) ListCloudInitMedia(_ context.Context) ([]provider.CloudInitMedium, error) {
	var out []provider.CloudInitMedium
	for _, h := range p.hosts {
		l, err := h.client()
		if err != nil {
			continue // offline hosts are not listed
		}
		pool, err := p.mediaPool(l, h)
		if err != nil {
			return nil, err
		}
		vols, _, err := l.StoragePoolListAllVolumes(pool, 1, 0)
		if err != nil {
			return nil, classify(fmt.Errorf("list pool %s on host %s: %w", p.settings.MediaPool, h.Name, err))
		}
		for _, v := range vols {
			if vmid, digest, ok := p.parseISOName(v.Name); ok {
				out = append(out, provider.CloudInitMedium{ID: mediumID(p.settings.MediaPool, v.Name), Node: h.Name, VM: FormatID(vmid), OwnerDigest: digest})
			}
		}
	}
	return out, nil
}

// DeleteCloudInitMedium implements provider.Provider: one deletion, and
// Done only from a call that finds the medium gone.
func (p *Provider) DeleteCloudInitMedium(_ context.Context, m provider.CloudInitMedium) (*provider.DeleteResult, error) {
	pool, name, _ := strings.Cut(m.ID, "/")
	vmid, digest, ok := p.parseISOName(name)
	if !ok || pool != p.settings.MediaPool || FormatID(vmid) != m.VM || digest != m.OwnerDigest {
		return nil, provider.Errorf(provider.ClassPermanent, "NotOwned", "%w: %q is not a cloud-init medium of this install", provider.ErrNotOwned, m.ID)
	}
	h := p.hostNamed(m.Node)
	if h == nil {
		return nil, provider.Errorf(provider.ClassConfiguration, "InvalidVMRef", "host %q of medium %s is not a host of the cluster", m.Node, m.ID)
	}
	out := &provider.DeleteResult{Progress: provider.Progress{ID: FormatID(vmid), Node: h.Name}}
	if err := p.mediumInUse(vmid, digest, name, h); err != nil {
		return nil, err
	}
	deleted, err := p.deleteVolume(h, name)
	if err != nil {
		return nil, err
	}
	out.Done = !deleted
	out.Message = fmt.Sprintf("cloud-init medium %s is gone", m.ID)
	if deleted {
		out.Message = fmt.Sprintf("deleted cloud-init medium %s", m.ID)
	}
	return out, nil
}

// mediumInUse returns ErrInUse when the medium's VM still needs it: it is
// being cloned here, has it attached, or verifies for its owner.
func (p *Provider) mediumInUse(vmid int, digest, name string, h *host) error {
	if p.slots.InUse(vmid) {
		return fmt.Errorf("%w: VM %d is being cloned", provider.ErrInUse, vmid)
	}
	d, err := p.find(vmid, h.Name)
	if isNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	if d.host == h && mediumDisk(d.xml, name) != nil {
		return fmt.Errorf("%w: VM %d has %s attached", provider.ErrInUse, vmid, name)
	}
	if rec, err := p.verify(d); err == nil && provider.OwnerDigest(rec.UID) == digest {
		return fmt.Errorf("%w: VM %d belongs to its claim %s/%s", provider.ErrInUse, vmid, rec.Namespace, rec.Name)
	}
	return nil
}

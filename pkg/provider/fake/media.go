package fake

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/hyperfleet/hyperfleet/pkg/provider"
)

// RemoveCloudInitMedia implements provider.Provider: wait for a task in
// flight, detach owner's cloud-init ISO from the VM, delete the ISO, Done.
// The VM itself is left as it is.
func (p *Provider) RemoveCloudInitMedia(ctx context.Context, owner provider.Owner, prev provider.Progress) (*provider.DeleteResult, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("remove cloud-init media: %w", err)
	}
	s := p.session(MethodRemoveCloudInit)
	if err := s.injected(); err != nil {
		return nil, err
	}
	res := &provider.DeleteResult{Progress: provider.Progress{VMID: prev.VMID, Node: prev.Node}}
	if prev.VMID == 0 {
		res.Done, res.Message = true, "no VM was ever placed"
		return res, nil
	}
	vmid := prev.VMID
	if prev.Task != nil {
		out, err := p.pollTask(s, prev.Task)
		if err != nil {
			return nil, err
		}
		if out.running {
			task := *prev.Task
			res.Progress.Task = &task
			return p.deleting(res, fmt.Sprintf("%s task of VM %d is running", task.Operation, vmid)), nil
		}
		// A finished task, failed or not: what is left is read back below.
	}
	node, conf, err := p.locate(s, res.Progress.VMRef())
	switch {
	case errors.Is(err, errNoVM):
		if res.Progress.Node == "" {
			res.Done, res.Message = true, fmt.Sprintf("VM %d does not exist", vmid)
			return res, nil
		}
		return p.deleteMediaFile(s, owner, res, res.Progress.Node)
	case err != nil:
		return nil, err
	}
	res.Progress.Node = node
	if conf.lock != "" {
		return p.deleting(res, fmt.Sprintf("VM %d is locked (%s); waiting to remove its cloud-init ISO", vmid, conf.lock)), nil
	}
	if err := p.owns(conf.description, vmid, owner); err != nil {
		return nil, notOwned(vmid, owner, err)
	}
	if conf.cdrom == p.isoVolume(vmid, owner.UID) {
		none := "none"
		if _, err := s.updateConfig(node, vmid, configChange{cdrom: &none}, false); err != nil {
			return nil, classify(err, "detach the cloud-init ISO of VM %d", vmid)
		}
	}
	return p.deleteMediaFile(s, owner, res, node)
}

// deleteMediaFile deletes owner's ISO of the VM on node if it is there,
// else reports Done.
func (p *Provider) deleteMediaFile(s *session, owner provider.Owner, res *provider.DeleteResult, node string) (*provider.DeleteResult, error) {
	vmid := res.Progress.VMID
	iso := p.isoVolume(vmid, owner.UID)
	present, err := p.isoPresent(s, node, iso)
	if err != nil {
		return nil, err
	}
	if present {
		sid, _, _ := strings.Cut(iso, ":")
		upid, err := s.deleteVolume(node, sid, iso)
		if err != nil {
			return nil, classify(err, "delete the cloud-init ISO of VM %d", vmid)
		}
		return p.deleteTask(res, upid, "delete-iso", fmt.Sprintf("deleting the cloud-init ISO of VM %d", vmid)), nil
	}
	res.Done, res.Message = true, fmt.Sprintf("VM %d has no cloud-init ISO left", vmid)
	return res, nil
}

var isoNameRE = regexp.MustCompile(`^hf-([a-z0-9][a-z0-9-]{0,29})-([0-9]+)-([0-9a-f]{12})\.iso$`)

// parseISOVolid returns the VM id and owner digest of one of this
// install's ISO volume ids.
func (p *Provider) parseISOVolid(volid string) (int, string, bool) {
	file, ok := strings.CutPrefix(volid, p.cfg.ISOStorage+":iso/")
	if !ok {
		return 0, "", false
	}
	m := isoNameRE.FindStringSubmatch(file)
	if m == nil || m[1] != p.signer.OperatorID() {
		return 0, "", false
	}
	vmid, err := strconv.Atoi(m[2])
	if err != nil || vmid <= 0 {
		return 0, "", false
	}
	return vmid, m[3], true
}

// ListCloudInitMedia implements provider.Provider.
func (p *Provider) ListCloudInitMedia(ctx context.Context) ([]provider.CloudInitMedium, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("list cloud-init media: %w", err)
	}
	s := p.session(MethodListMedia)
	if err := s.injected(); err != nil {
		return nil, err
	}
	if p.cfg.ISOStorage == "" {
		return nil, nil
	}
	nodes, err := s.nodes()
	if err != nil {
		return nil, classify(err, "list nodes of cluster %q", p.cfg.Name)
	}
	seen := map[string]bool{}
	var out []provider.CloudInitMedium
	for _, n := range nodes {
		if !n.online {
			continue
		}
		vols, err := s.storageContent(n.name, p.cfg.ISOStorage)
		if isNotExist(err) {
			continue
		}
		if err != nil {
			return nil, classify(err, "list storage %q on node %s", p.cfg.ISOStorage, n.name)
		}
		for _, volid := range vols {
			vmid, digest, ok := p.parseISOVolid(volid)
			if !ok || seen[volid] {
				continue
			}
			seen[volid] = true
			out = append(out, provider.CloudInitMedium{ID: volid, Node: n.name, VMID: vmid, OwnerDigest: digest})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out, nil
}

// DeleteCloudInitMedium implements provider.Provider with the checks of
// the Proxmox provider: not this install's name -> ErrNotOwned; gone ->
// Done; VM id being cloned, its VM the medium's owner's or having it
// attached -> ErrInUse; otherwise one volume deletion (a task).
func (p *Provider) DeleteCloudInitMedium(ctx context.Context, m provider.CloudInitMedium) (*provider.DeleteResult, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("delete cloud-init medium: %w", err)
	}
	s := p.session(MethodDeleteMedium)
	if err := s.injected(); err != nil {
		return nil, err
	}
	vmid, digest, ok := p.parseISOVolid(m.ID)
	if !ok || vmid != m.VMID || digest != m.OwnerDigest || m.Node == "" {
		return nil, provider.Errorf(provider.ClassPermanent, "NotOwned", "%w: %q on node %q is not a cloud-init ISO of this install", provider.ErrNotOwned, m.ID, m.Node)
	}
	res := &provider.DeleteResult{Progress: provider.Progress{VMID: vmid, Node: m.Node}}
	vols, err := s.storageContent(m.Node, p.cfg.ISOStorage)
	if err != nil && !isNotExist(err) {
		return nil, classify(err, "list storage %q on node %s", p.cfg.ISOStorage, m.Node)
	}
	if !slices.Contains(vols, m.ID) {
		res.Done, res.Message = true, fmt.Sprintf("cloud-init ISO %s is gone", m.ID)
		return res, nil
	}
	_, conf, err := p.locate(s, provider.VMRef{VMID: vmid})
	switch {
	case errors.Is(err, errNoVM):
	case err != nil:
		return nil, err
	default:
		inUse := func(why string) error {
			return provider.Errorf(provider.ClassPermanent, "InUse", "%w: %s: VM %d %s", provider.ErrInUse, m.ID, vmid, why)
		}
		if conf.lock == "clone" {
			return nil, inUse("is being cloned")
		}
		if conf.cdrom == m.ID {
			return nil, inUse("has it attached")
		}
		if rec, verr := p.signer.Verify(conf.description, vmid); verr == nil && provider.OwnerDigest(rec.UID) == m.OwnerDigest {
			return nil, inUse(fmt.Sprintf("belongs to its claim %s/%s", rec.Namespace, rec.Name))
		}
	}
	upid, err := s.deleteVolume(m.Node, p.cfg.ISOStorage, m.ID)
	if err != nil {
		return nil, classify(err, "delete the cloud-init ISO %s", m.ID)
	}
	return p.deleteTask(res, upid, "delete-iso", fmt.Sprintf("deleting cloud-init ISO %s", m.ID)), nil
}

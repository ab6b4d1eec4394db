package fake

import (
	"context"
	"errors"
	"fmt"
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

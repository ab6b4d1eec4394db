package fake

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/hyperfleet/hyperfleet/pkg/provider"
)

// DeleteVM implements provider.Provider: wait for a task in flight, stop
// the VM if it runs, destroy it, delete owner's cloud-init ISO, Done.
func (p *Provider) DeleteVM(ctx context.Context, owner provider.Owner, prev provider.Progress) (*provider.DeleteResult, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("delete VM: %w", err)
	}
	s := p.session(MethodDeleteVM)
	if err := s.injected(); err != nil {
		return nil, err
	}
	res := &provider.DeleteResult{Progress: provider.Progress{VMID: prev.VMID, Node: prev.Node}}
	if prev.VMID == 0 {
		p.release(owner.UID)
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
		if out.failed {
			res.RetryAfter = p.hv.o.RetryBackoff
			res.Message = fmt.Sprintf("%s task of VM %d failed (%s); retrying", prev.Task.Operation, vmid, out.exit)
			return res, nil
		}
	}
	node, conf, err := p.locate(s, res.Progress.VMRef())
	if errors.Is(err, errNoVM) {
		return p.deleteISO(s, owner, res)
	}
	if err != nil {
		return nil, err
	}
	res.Progress.Node = node
	switch conf.lock {
	case "clone":
		return p.deleting(res, fmt.Sprintf("VM %d is being cloned; it can be judged once the clone is done", vmid)), nil
	case "destroyed":
		return p.deleting(res, fmt.Sprintf("VM %d is being destroyed", vmid)), nil
	}
	if err := p.owns(conf.description, vmid, owner); err != nil {
		p.mu.Lock()
		if r := p.reservations[owner.UID]; r != nil && r.vmid == vmid {
			delete(p.reservations, owner.UID)
		}
		p.mu.Unlock()
		return nil, notOwned(vmid, owner, err)
	}
	st, err := s.status(node, vmid)
	if err != nil {
		return nil, classify(err, "read the status of VM %d", vmid)
	}
	if st.running {
		upid, err := s.power(node, vmid, OpStop)
		if err != nil {
			return nil, classify(err, "stop VM %d", vmid)
		}
		return p.deleteTask(res, upid, "stop", fmt.Sprintf("stopping VM %d", vmid)), nil
	}
	upid, err := s.destroy(node, vmid)
	if err != nil {
		return nil, classify(err, "destroy VM %d", vmid)
	}
	return p.deleteTask(res, upid, "destroy", fmt.Sprintf("destroying VM %d and its disks", vmid)), nil
}

// deleteISO deletes owner's ISO for the (gone) VM, then reports Done.
func (p *Provider) deleteISO(s *session, owner provider.Owner, res *provider.DeleteResult) (*provider.DeleteResult, error) {
	vmid := res.Progress.VMID
	if p.cfg.ISOStorage != "" {
		iso := p.isoVolume(vmid, owner.UID)
		nodes := []string{res.Progress.Node}
		if res.Progress.Node == "" {
			// Where the VM was is unknown: look on every allowed node.
			all, err := s.nodes()
			if err != nil {
				return nil, classify(err, "list nodes of cluster %q", p.cfg.Name)
			}
			nodes = nodes[:0]
			for _, n := range all {
				if n.online && p.allowed(n.name) {
					nodes = append(nodes, n.name)
				}
			}
		}
		for _, node := range nodes {
			vols, err := s.storageContent(node, p.cfg.ISOStorage)
			if isNotExist(err) {
				continue // the storage is not on this node
			}
			if err != nil {
				return nil, classify(err, "list storage %q on node %s", p.cfg.ISOStorage, node)
			}
			if !slices.Contains(vols, iso) {
				continue
			}
			upid, err := s.deleteVolume(node, p.cfg.ISOStorage, iso)
			if err != nil {
				return nil, classify(err, "delete the cloud-init ISO of VM %d", vmid)
			}
			res.Progress.Node = node
			return p.deleteTask(res, upid, "delete-iso", fmt.Sprintf("deleting the cloud-init ISO of VM %d", vmid)), nil
		}
	}
	p.release(owner.UID)
	res.Done, res.Message = true, fmt.Sprintf("VM %d and its cloud-init ISO are gone", vmid)
	return res, nil
}

func (p *Provider) deleting(res *provider.DeleteResult, msg string) *provider.DeleteResult {
	res.RetryAfter, res.Message = p.hv.o.PollInterval, msg
	return res
}

func (p *Provider) deleteTask(res *provider.DeleteResult, upid, op, msg string) *provider.DeleteResult {
	res.Progress.Task = &provider.Task{ID: upid, Operation: op, StartTime: p.clock.Now()}
	return p.deleting(res, msg)
}

// SetPower implements provider.Provider.
func (p *Provider) SetPower(ctx context.Context, owner provider.Owner, ref provider.VMRef, action provider.PowerAction) (*provider.Task, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("set power: %w", err)
	}
	s := p.session(MethodSetPower)
	if err := s.injected(); err != nil {
		return nil, err
	}
	var op Op
	switch action {
	case provider.PowerOn:
		op = OpStart
	case provider.PowerOff:
		op = OpStop
	case provider.PowerShutdown:
		op = OpShutdown
	default:
		return nil, provider.Errorf(provider.ClassPermanent, "InvalidPowerAction", "power action %q is none of on, off, shutdown", action)
	}
	node, conf, err := p.locate(s, ref)
	if errors.Is(err, errNoVM) {
		return nil, provider.Errorf(provider.ClassPermanent, "NotFound", "VM %d does not exist on cluster %q: %w", ref.VMID, p.cfg.Name, provider.ErrNotFound)
	}
	if err != nil {
		return nil, err
	}
	if conf.lock == "clone" {
		return nil, provider.Errorf(provider.ClassTransient, "Locked", "VM %d is being cloned; try again once the clone is done", ref.VMID)
	}
	if err := p.owns(conf.description, ref.VMID, owner); err != nil {
		return nil, notOwned(ref.VMID, owner, err)
	}
	st, err := s.status(node, ref.VMID)
	if err != nil {
		return nil, classify(err, "read the status of VM %d", ref.VMID)
	}
	if st.running == (action == provider.PowerOn) {
		return nil, nil
	}
	upid, err := s.power(node, ref.VMID, op)
	if err != nil {
		return nil, classify(err, "%s VM %d", op, ref.VMID)
	}
	return &provider.Task{ID: upid, Operation: string(op), StartTime: p.clock.Now()}, nil
}

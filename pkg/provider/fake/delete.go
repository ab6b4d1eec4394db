package fake

import (
	"context"
	"fmt"
	"time"

	"github.com/hyperfleet/hyperfleet/pkg/provider"
)

// DeleteVM implements provider.Provider: wait for an operation in flight,
// stop the VM if it runs, destroy it, and once it is gone delete its
// cloud-init medium and drop its placement.
func (p *Provider) DeleteVM(_ context.Context, owner provider.Owner, prev provider.Progress) (*provider.DeleteResult, error) {
	vmid, res, err := ids.ParseDeletion(prev)
	if err != nil {
		return nil, err
	}
	defer p.c.lock()()
	if v := p.c.vms[vmid]; v != nil {
		if err := p.ownedLocked(v, owner); err != nil {
			return nil, err
		}
		res.Progress.Node = v.node
		switch {
		case v.op != nil:
			return p.waitLocked(res, v), nil
		case v.running:
			res.Progress.Task = p.c.powerOffLocked(v, "stop")
		case p.c.destroyErr != nil:
			return nil, fmt.Errorf("destroy VM %d: %w", v.id, p.c.destroyErr)
		default:
			res.Progress.Task = p.c.startLocked(v, "destroy", func(time.Time) { delete(p.c.vms, v.id) })
		}
		res.RetryAfter, res.Message = p.c.opts.OperationTime, fmt.Sprintf("%s VM %d", res.Progress.Task.Operation, v.id)
		return res, nil
	}
	delete(p.c.media, p.mediumID(vmid, owner.UID))
	delete(p.reservations, owner.UID)
	res.Done, res.Message = true, fmt.Sprintf("VM %d and its cloud-init medium are gone", vmid)
	return res, nil
}

// RemoveCloudInitMedia implements provider.Provider: wait for an operation
// in flight, then detach and delete the medium in one operation that takes
// no time.
func (p *Provider) RemoveCloudInitMedia(_ context.Context, owner provider.Owner, prev provider.Progress) (*provider.DeleteResult, error) {
	vmid, res, err := ids.ParseDeletion(prev)
	if err != nil {
		return nil, err
	}
	defer p.c.lock()()
	id := p.mediumID(vmid, owner.UID)
	if v := p.c.vms[vmid]; v != nil {
		if err := p.ownedLocked(v, owner); err != nil {
			return nil, err
		}
		if v.op != nil {
			return p.waitLocked(res, v), nil
		}
		if v.attached == id {
			v.attached = ""
		}
	}
	delete(p.c.media, id)
	res.Done, res.Message = true, fmt.Sprintf("the cloud-init medium of VM %d is gone", vmid)
	return res, nil
}

// waitLocked reports the operation in flight on v.
func (p *Provider) waitLocked(res *provider.DeleteResult, v *vm) *provider.DeleteResult {
	res.Progress.Task, res.RetryAfter = p.c.inFlightLocked(v)
	res.Message = fmt.Sprintf("waiting for the %s of VM %d", v.op.task.Operation, v.id)
	return res
}

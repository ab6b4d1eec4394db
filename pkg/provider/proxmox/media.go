package proxmox

import (
	"context"
	"fmt"
	"net/http"

	"github.com/hyperfleet/hyperfleet/pkg/provider"
)

// RemoveCloudInitMedia implements provider.Provider. Each call issues at
// most one write:
//
//	task in flight (an upload, an ISO deletion)   -> wait for it
//	VM present, marker not the owner's            -> ErrNotOwned, touch nothing
//	VM locked                                     -> wait
//	ISO in a drive of the VM                      -> eject it (synchronous config change)
//	ISO file present                              -> delete it (task)
//	neither                                       -> Done; the VM is left as it is
//
// It is what a failed VM kept for debugging goes through: the NoCloud ISO
// holds the VM's single-use runner credential, and nothing may keep it on
// storage past the VM's useful life (docs/security.md).
func (p *Provider) RemoveCloudInitMedia(ctx context.Context, owner provider.Owner, prev provider.Progress) (*provider.DeleteResult, error) {
	prog := provider.Progress{VMID: prev.VMID, Node: prev.Node, Task: prev.Task}
	if prog.VMID == 0 {
		return &provider.DeleteResult{Done: true, Message: "no VM was created"}, nil
	}
	wait := func(format string, args ...any) *provider.DeleteResult {
		r := &provider.DeleteResult{Progress: prog, Message: fmt.Sprintf(format, args...)}
		r.RetryAfter = lockedVM
		if prog.Task != nil {
			t := *prog.Task
			r.Progress.Task = &t
			r.RetryAfter = pollDelay(p, prog.Task)
		}
		return r
	}
	if prog.Task == nil || prog.Task.Operation == opBoot {
		// An upload this process started may still run; its file would
		// appear after this call found none.
		prog.Task = p.inflightTask(prog.VMID)
	}
	if t := prog.Task; t != nil && t.Operation != opBoot && t.ID != "" {
		st, err := p.api.task(ctx, t.ID)
		switch {
		case isNotFound(err):
		case err != nil:
			return nil, err
		case st.running():
			return wait("waiting for the %s task of VM %d before removing its cloud-init ISO", t.Operation, prog.VMID), nil
		default:
			if t.Operation == opClone {
				p.releaseCloneSlot(prog.VMID)
			}
			if t.Operation == opISODelete && st.ok() {
				p.noteISOGone(prog.VMID)
			}
		}
		p.clearInflight(prog.VMID, t.ID)
	}
	prog.Task = nil
	if prog.Node == "" {
		node, err := p.locate(ctx, prog.VMID)
		if err != nil && !isNotFound(err) {
			return nil, err
		}
		prog.Node = node
	}
	if prog.Node == "" {
		// Never created anywhere: no file was ever uploaded for it.
		return &provider.DeleteResult{Progress: prog, Done: true, Message: fmt.Sprintf("VM %d does not exist", prog.VMID)}, nil
	}
	if res, err := p.ejectForRemoval(ctx, owner, &prog); res != nil || err != nil {
		return res, err
	}
	present, err := p.isoPresent(ctx, prog.Node, prog.VMID, owner.UID)
	if err != nil {
		return nil, err
	}
	if present {
		upid, err := p.deleteISO(ctx, prog.Node, prog.VMID, owner.UID)
		if err != nil {
			return nil, err
		}
		prog.Task = &provider.Task{ID: upid, Operation: opISODelete, StartTime: p.clock.Now()}
		p.setInflight(prog.VMID, prog.Task)
		return wait("deleting the cloud-init ISO of VM %d", prog.VMID), nil
	}
	return &provider.DeleteResult{Progress: prog, Done: true, Message: fmt.Sprintf("VM %d has no cloud-init ISO left", prog.VMID)}, nil
}

// ejectForRemoval detaches the owner's ISO from its VM if a drive holds
// it. It returns (nil, nil) when no drive holds it (or the VM is gone), a
// result to wait, or ErrNotOwned.
func (p *Provider) ejectForRemoval(ctx context.Context, owner provider.Owner, prog *provider.Progress) (*provider.DeleteResult, error) {
	cfg, err := p.api.config(ctx, prog.Node, prog.VMID)
	if isNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	if l := cfg["lock"]; l != "" {
		return &provider.DeleteResult{Progress: *prog, RetryAfter: lockedVM, Message: fmt.Sprintf("VM %d is locked (%s); waiting to remove its cloud-init ISO", prog.VMID, l)}, nil
	}
	marker, err := p.marker(ctx)
	if err != nil {
		return nil, err
	}
	if _, err := p.verifyOwner(marker, cfg, prog.VMID, owner); err != nil {
		return nil, err
	}
	slot := cfg.isoSlot(p.isoVolid(prog.VMID, owner.UID))
	if slot == "" {
		return nil, nil
	}
	err = p.api.call(ctx, http.MethodPut, fmt.Sprintf("/nodes/%s/qemu/%d/config", prog.Node, prog.VMID), nil,
		map[string]any{slot: "none,media=cdrom"}, nil)
	if isLock(err) {
		return &provider.DeleteResult{Progress: *prog, RetryAfter: lockedVM, Message: fmt.Sprintf("VM %d is locked; retrying to eject its cloud-init ISO", prog.VMID)}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("eject the cloud-init ISO of VM %d: %w", prog.VMID, err)
	}
	return nil, nil
}

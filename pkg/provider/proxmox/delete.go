package proxmox

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/hyperfleet/hyperfleet/pkg/provider"
)

// DeleteVM implements provider.Provider. Each call issues at most one write:
//
//	task of EnsureVM in flight (clone, upload ...) -> wait for it
//	VM present, marker not the owner's             -> ErrNotOwned, touch nothing
//	VM locked (clone, destroyed, backup ...)       -> wait
//	VM running                                     -> stop (task)
//	VM stopped, or suspended to disk               -> destroy with purge and unreferenced disks (task;
//	                                                  a suspended VM's saved state goes with its disks)
//	VM gone, ISO file present                      -> delete the ISO (task)
//	VM and ISO gone                                -> Done
//
// The ISO is named after the install, the VM id and the claim, so the file
// of that name is the claim's to delete once its VM is gone (or is being
// deleted). When a VM that is not the owner's holds the id, nothing is
// deleted, not even that file: DeleteVM then only reports ErrNotOwned, and
// a stray file (possible only if the owner's VM was destroyed by hand and
// its id reused) is left to the orphan sweep, which recognises the
// install's prefix.
func (p *Provider) DeleteVM(ctx context.Context, owner provider.Owner, prev provider.Progress) (*provider.DeleteResult, error) {
	prog, err := progressOf(prev)
	if err != nil {
		return nil, err
	}
	log := p.log.WithValues("MachineClaim", owner.Namespace+"/"+owner.Name, "vmid", prog.VMID, "node", prog.Node)
	if prog.VMID == 0 {
		p.release(owner.UID, 0, false)
		return &provider.DeleteResult{Done: true, Message: "no VM was created"}, nil
	}
	result := func(done bool, format string, args ...any) *provider.DeleteResult {
		r := &provider.DeleteResult{Progress: prog.public(), Done: done, Message: fmt.Sprintf(format, args...)}
		if prog.Task != nil {
			t := *prog.Task
			r.Progress.Task = &t
			r.RetryAfter = pollDelay(p, prog.Task)
		}
		return r
	}
	if prog.Node == "" {
		node, err := p.locate(ctx, prog.VMID)
		if err != nil && !isNotFound(err) {
			return nil, err
		}
		prog.Node = node
	}
	// A VM deleted between its placement and its clone request gives
	// back the slot its placement held.
	p.slots.ReleaseHold(prog.VMID)
	if prog.Task == nil || prog.Task.Operation == opBoot {
		// A lost Progress: an upload this process started may still run,
		// and its file would outlive a deletion that did not wait for it.
		if t := p.inflightTask(prog.VMID, owner.UID); t != nil {
			prog.Task = t
		}
	}
	after := ""
	if t := prog.Task; t != nil && t.Operation != opBoot && t.ID != "" {
		st, err := p.api.task(ctx, t.ID)
		switch {
		case isNotFound(err):
			prog.Task = nil
		case err != nil:
			return nil, err
		case st.running():
			// A clone or upload must finish before its VM or file can go.
			return result(false, "waiting for the %s task before deleting VM %d", t.Operation, prog.VMID), nil
		default:
			if t.Operation == opClone {
				p.slots.Release(prog.VMID)
			}
			p.clearInflight(prog.VMID, t.ID)
			if st.ok() {
				p.pace.Observe(t.Operation, p.clock.Since(t.StartTime))
				after = t.Operation
			} else {
				log.V(1).Info("Task failed; continuing the deletion", "operation", t.Operation, "exitStatus", st.ExitStatus)
			}
			prog.Task = nil
		}
	} else {
		prog.Task = nil
	}

	if after == opISODelete {
		p.noteISOGone(prog.VMID)
	}
	// The VM is read back even after a destroy task reported OK: absence is
	// confirmed by the hypervisor's own answer about this VM (deleteStep),
	// never assumed. An ISO deletion may come from EnsureVM: the VM may
	// still exist.
	if prog.Node != "" {
		res, err := p.deleteStep(ctx, owner, &prog)
		if res != nil || err != nil {
			if err != nil {
				return nil, err
			}
			r := result(false, "%s", res.Message)
			if prog.Task == nil {
				r.RetryAfter = res.RetryAfter
			}
			return r, nil
		}
	}
	// The VM is gone: its ISO next.
	if prog.Node != "" {
		started, err := p.startISODelete(ctx, owner.UID, &prog)
		if err != nil {
			return nil, err
		}
		if started {
			return result(false, "deleting the cloud-init ISO of VM %d", prog.VMID), nil
		}
	}
	p.release(owner.UID, prog.VMID, false)
	p.mu.Lock()
	delete(p.isoGone, prog.VMID)
	p.mu.Unlock()
	p.forgetLeased(prog.VMID)
	// The id is free now; cached listings must not hold it back.
	p.noteFreed(prog.VMID)
	p.wakeAtCap()
	log.V(1).Info("VM deleted")
	return &provider.DeleteResult{Progress: progress{VMID: prog.VMID, Node: prog.Node}.public(), Done: true,
		Message: fmt.Sprintf("VM %d and its cloud-init ISO are gone", prog.VMID)}, nil
}

// deleteStep stops or destroys the VM. It returns (nil, nil) only when the
// VM is confirmed gone (see confirmGone), a result while something runs or
// an answer must be read back, or ErrNotOwned.
func (p *Provider) deleteStep(ctx context.Context, owner provider.Owner, prog *progress) (*provider.DeleteResult, error) {
	cfg, err := p.api.config(ctx, prog.Node, prog.VMID)
	if isNotFound(err) {
		gone, cerr := p.confirmGone(ctx, prog)
		if gone || cerr != nil {
			return nil, cerr
		}
		// Migrated: read it where the listing says it is.
		if cfg, err = p.api.config(ctx, prog.Node, prog.VMID); isNotFound(err) {
			return readBack(prog.VMID, "its config is not on node "+prog.Node+" yet"), nil
		}
	}
	if err != nil {
		return nil, err
	}
	if cfg["lock"] == "clone" {
		// A placeholder carries no marker yet; if the clone is ours it
		// completes and is destroyed on a later call.
		return &provider.DeleteResult{RetryAfter: cloneWait, Message: fmt.Sprintf("VM %d is being cloned; waiting to delete it", prog.VMID)}, nil
	}
	marker, err := p.marker(ctx)
	if err != nil {
		return nil, err
	}
	if _, err := p.verifyOwner(marker, cfg, prog.VMID, owner); err != nil {
		// The VM at this id is not the owner's: drop the owner's in-process
		// reservation of the id (placement memory only). The caller keeps
		// whatever the claim holds (addresses, finalizer) while this VM
		// exists (docs/security.md, "Absence and release").
		p.mu.Lock()
		if r := p.reservations[owner.UID]; r != nil && r.vmid == prog.VMID {
			p.unreserveLocked(owner.UID)
		}
		p.mu.Unlock()
		return nil, err
	}
	if res := suspendLockWait(cfg, prog.VMID, "delete it"); res != nil {
		return res, nil
	}
	// A suspended VM is destroyed as it is: destroy_vm ignores its lock
	// and frees the saved state with the disks.
	if l := cfg["lock"]; l != "" && l != lockSuspended {
		return &provider.DeleteResult{RetryAfter: lockedVM, Message: fmt.Sprintf("VM %d is locked (%s); waiting to delete it", prog.VMID, l)}, nil
	}
	// No status read first: Proxmox refuses to destroy a running (or
	// paused) VM, and that refusal is what sends it to be stopped.
	q := url.Values{"purge": {"1"}, "destroy-unreferenced-disks": {"1"}}
	upid, err := p.api.upid(ctx, http.MethodDelete, fmt.Sprintf("/nodes/%s/qemu/%d", prog.Node, prog.VMID), q, nil)
	// A destroy can fail on a missing storage or volume: only the VM's own
	// missing config counts, and even that is read back first.
	err = aboutVM(err, prog.VMID)
	switch {
	case err == nil:
	case strings.Contains(apiMessage(err), "is running"):
		// Running or paused ("VM N is running - destroy failed"): stop it.
		return p.stopForDelete(ctx, prog)
	case isLock(err):
		return &provider.DeleteResult{RetryAfter: lockedVM, Message: fmt.Sprintf("VM %d is locked; retrying the destroy", prog.VMID)}, nil
	case isNotFound(err):
		return readBack(prog.VMID, "the destroy request says it is missing"), nil
	default:
		return nil, fmt.Errorf("destroy VM %d on node %s: %w", prog.VMID, prog.Node, err)
	}
	prog.Task = &provider.Task{ID: upid, Operation: opDestroy, StartTime: p.clock.Now()}
	return &provider.DeleteResult{Message: fmt.Sprintf("destroying VM %d", prog.VMID)}, nil
}

func (p *Provider) stopForDelete(ctx context.Context, prog *progress) (*provider.DeleteResult, error) {
	upid, err := p.api.upid(ctx, http.MethodPost, fmt.Sprintf("/nodes/%s/qemu/%d/status/stop", prog.Node, prog.VMID), nil, nil)
	err = aboutVM(err, prog.VMID)
	if isNotFound(err) {
		return readBack(prog.VMID, "the stop request says it is missing"), nil
	}
	if isLock(err) {
		return &provider.DeleteResult{RetryAfter: lockedVM, Message: fmt.Sprintf("VM %d is locked; retrying the stop", prog.VMID)}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("stop VM %d on node %s: %w", prog.VMID, prog.Node, err)
	}
	prog.Task = &provider.Task{ID: upid, Operation: opStop, StartTime: p.clock.Now()}
	return &provider.DeleteResult{Message: fmt.Sprintf("stopping VM %d", prog.VMID)}, nil
}

// confirmGone reads the VM back after Proxmox said its config file is
// missing on prog.Node. Config files are per node, so the cluster's VM
// list, read now, decides: the VM is gone only when the list succeeded and
// no longer holds its id. Listed on another node it has migrated
// (prog.Node follows it); listed on the node whose config read said
// missing, the two answers disagree and the VM counts as present.
func (p *Provider) confirmGone(ctx context.Context, prog *progress) (bool, error) {
	node, err := p.locate(ctx, prog.VMID)
	switch {
	case isNotFound(err):
		return true, nil
	case err != nil:
		return false, fmt.Errorf("confirm that VM %d is gone: %w", prog.VMID, err)
	case node == prog.Node:
		return false, provider.Errorf(provider.ClassTransient, "VMStillListed",
			"VM %d: its config on node %s reads as missing but the cluster still lists it there; it is not called gone until both agree", prog.VMID, node)
	}
	p.log.Info("VM moved to another node", "vmid", prog.VMID, "from", prog.Node, "to", node)
	prog.Node = node
	return false, nil
}

// readBackDelay spaces the read-backs of a VM whose answers disagree, so
// that a disagreement that lasts cannot turn into a tight loop.
const readBackDelay = 500 * time.Millisecond

// readBack is the result for an answer that says the VM is missing but
// has not been confirmed: the next call reads the VM back.
func readBack(vmid int, why string) *provider.DeleteResult {
	return &provider.DeleteResult{RetryAfter: readBackDelay, Message: fmt.Sprintf("VM %d: %s; reading it back before calling it gone", vmid, why)}
}

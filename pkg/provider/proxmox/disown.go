package proxmox

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"

	"github.com/hyperfleet/hyperfleet/pkg/ownership"
	"github.com/hyperfleet/hyperfleet/pkg/provider"
)

// DisownVM implements provider.Provider with a config read and, unless the
// VM is locked or already released, one synchronous config update:
//
//	VM locked (a clone, a backup ...)        -> wait
//	VM suspended to disk (its own, verified) -> error (Suspended): Proxmox
//	                                            writes no config of it
//	marker not the owner's, no release note  -> ErrNotOwned, touch nothing
//	release note for the owner, no marker    -> Done (released before)
//	otherwise                                -> PUT config: tags without the
//	                                            install's (delete=tags when
//	                                            none is left), the released
//	                                            description, a neutral name
//	                                            for a never-configured clone
//
// The PUT carries the digest of the config it was computed from, so a
// config changed in between (by an admin, a task) is refused rather than
// overwritten, and read again on the next call.
func (p *Provider) DisownVM(ctx context.Context, owner provider.Owner, at provider.VMRef) (*provider.DisownResult, error) {
	ref, node, cfg, err := p.resolveConfig(ctx, at, "before releasing it")
	if err != nil {
		return nil, err
	}
	if w := suspendLockWait(cfg, ref.VMID, "release it"); w != nil {
		return &provider.DisownResult{RetryAfter: w.RetryAfter, Message: w.Message}, nil
	}
	if l := cfg["lock"]; l != "" && l != lockSuspended {
		return &provider.DisownResult{RetryAfter: lockedVM, Message: fmt.Sprintf("VM %d is locked (%s); waiting to release it", ref.VMID, l)}, nil
	}
	marker, err := p.marker(ctx)
	if err != nil {
		return nil, err
	}
	rec, err := p.verifyOwner(marker, cfg, ref.VMID, owner)
	if err != nil {
		if _, _, perr := ownership.Parse(cfg["description"]); errors.Is(perr, ownership.ErrNoMarker) && marker.Released(cfg["description"], owner.UID, ref.VMID) {
			return &provider.DisownResult{Done: true, Message: fmt.Sprintf("VM %d was already released", ref.VMID)}, nil
		}
		return nil, err
	}
	if cfg["lock"] == lockSuspended {
		// update_vm refuses every change to a suspended VM but deleting
		// its saved state, which would throw away the power state a
		// release keeps.
		return nil, provider.Errorf(provider.ClassPermanent, "Suspended",
			"VM %d is suspended to disk: Proxmox changes no config of a suspended VM (lock suspended) but to discard its saved state; resume it (or delete it) to release it", ref.VMID)
	}
	body, removed := p.disownBody(marker, cfg, rec, ref.VMID)
	err = p.api.call(ctx, http.MethodPut, fmt.Sprintf("/nodes/%s/qemu/%d/config", node, ref.VMID), nil, body, nil)
	switch {
	case err == nil:
	case isLock(err):
		return &provider.DisownResult{RetryAfter: lockedVM, Message: fmt.Sprintf("VM %d is locked; retrying its release", ref.VMID)}, nil
	case strings.Contains(apiMessage(err), "detected modified configuration"):
		// Changed since the read: read it again rather than overwrite.
		return &provider.DisownResult{RetryAfter: readBackDelay, Message: fmt.Sprintf("the config of VM %d changed while it was being released; reading it again", ref.VMID)}, nil
	default:
		return nil, fmt.Errorf("release VM %d on node %s: %w", ref.VMID, node, aboutVM(err, ref.VMID))
	}
	// Nothing of the VM is this process's to place or clone any more.
	p.release(owner.UID, ref.VMID, false)
	p.log.Info("Released VM from this install's management", "vmid", ref.VMID, "node", node,
		"MachineClaim", owner.Namespace+"/"+owner.Name, "removed", strings.Join(removed, "; "))
	return &provider.DisownResult{Done: true, Removed: removed, Message: fmt.Sprintf("VM %d on node %s is no longer this install's", ref.VMID, node)}, nil
}

// disownBody is the config update that releases a verified VM, and what it
// removes, in words.
func (p *Provider) disownBody(marker *ownership.Signer, cfg vmConfig, rec ownership.Record, vmid int) (map[string]any, []string) {
	body := map[string]any{"description": marker.ReleasedDescription(cfg["description"], rec, p.clock.Now())}
	removed := []string{}
	tags := cfg.tags()
	kept := slices.DeleteFunc(slices.Clone(tags), func(t string) bool {
		return slices.Contains(p.signer.Tags(), strings.ToLower(strings.TrimSpace(t)))
	})
	if len(kept) != len(tags) {
		removed = append(removed, "tags "+strings.Join(p.signer.Tags(), ", "))
	}
	if len(kept) == 0 {
		body["delete"] = "tags"
	} else {
		body["tags"] = strings.Join(kept, ";")
	}
	removed = append(removed, "the ownership block")
	if p.signer.VerifyVMName(cfg["name"], vmid) {
		// The install's keyed clone name marks a clone as this install's
		// for the orphan sweep as much as a tag does.
		body["name"] = fmt.Sprintf("disowned-%d", vmid)
		removed = append(removed, "the clone name "+cfg["name"])
	}
	if d := cfg["digest"]; d != "" {
		body["digest"] = d
	}
	return body, removed
}

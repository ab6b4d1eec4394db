package proxmox

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"regexp"
	"sort"
	"strconv"
	"strings"

	proxmox "github.com/luthermonson/go-proxmox"

	"github.com/hyperfleet/hyperfleet/pkg/provider"
)

// RemoveCloudInitMedia implements provider.Provider. Each call issues at
// most one write:
//
//	task in flight (an upload, an ISO deletion)   -> wait for it
//	VM present, marker not the owner's            -> ErrNotOwned, touch nothing
//	VM locked (not suspended)                     -> wait
//	VM suspended to disk with the ISO in a drive  -> error (Suspended): no config change is possible
//	ISO in a drive of the VM                      -> eject it (synchronous config change)
//	ISO file present                              -> delete it (task)
//	neither                                       -> Done; the VM is left as it is
//
// It is what a failed VM kept for debugging goes through: the NoCloud ISO
// holds the VM's single-use runner credential, and nothing may keep it on
// storage past the VM's useful life (docs/security.md).
func (p *Provider) RemoveCloudInitMedia(ctx context.Context, owner provider.Owner, prev provider.Progress) (*provider.DeleteResult, error) {
	prog, err := progressOf(prev)
	if err != nil {
		return nil, err
	}
	if prog.VMID == 0 {
		return &provider.DeleteResult{Done: true, Message: "no VM was created"}, nil
	}
	wait := func(format string, args ...any) *provider.DeleteResult {
		r := &provider.DeleteResult{Progress: prog.public(), Message: fmt.Sprintf(format, args...)}
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
		prog.Task = p.inflightTask(prog.VMID, owner.UID)
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
				p.slots.Release(prog.VMID)
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
		return &provider.DeleteResult{Progress: prog.public(), Done: true, Message: fmt.Sprintf("VM %d does not exist", prog.VMID)}, nil
	}
	if res, err := p.ejectForRemoval(ctx, owner, &prog); res != nil || err != nil {
		return res, err
	}
	started, err := p.startISODelete(ctx, owner.UID, &prog)
	if err != nil {
		return nil, err
	}
	if started {
		p.setInflight(prog.VMID, owner.UID, prog.Task)
		return wait("deleting the cloud-init ISO of VM %d", prog.VMID), nil
	}
	return &provider.DeleteResult{Progress: prog.public(), Done: true, Message: fmt.Sprintf("VM %d has no cloud-init ISO left", prog.VMID)}, nil
}

// ejectForRemoval detaches the owner's ISO from its VM if a drive holds
// it. It returns (nil, nil) when no drive holds it (or the VM is gone), a
// result to wait, or ErrNotOwned.
func (p *Provider) ejectForRemoval(ctx context.Context, owner provider.Owner, prog *progress) (*provider.DeleteResult, error) {
	cfg, err := p.api.config(ctx, prog.Node, prog.VMID)
	if isNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	if res := suspendLockWait(cfg, prog.VMID, "remove its cloud-init ISO"); res != nil {
		res.Progress = prog.public()
		return res, nil
	}
	if l := cfg["lock"]; l != "" && l != lockSuspended {
		return &provider.DeleteResult{Progress: prog.public(), RetryAfter: lockedVM, Message: fmt.Sprintf("VM %d is locked (%s); waiting to remove its cloud-init ISO", prog.VMID, l)}, nil
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
		// A suspended VM that ran to Running has its ISO ejected: only
		// the file may be left, and deleting it leaves the VM alone.
		return nil, nil
	}
	if cfg["lock"] == lockSuspended {
		// Suspended before its ISO was ejected: Proxmox changes no config
		// of a suspended VM, and deleting the file under the saved state
		// would make its resume fail.
		return nil, provider.Errorf(provider.ClassPermanent, "Suspended",
			"VM %d is suspended to disk with its cloud-init ISO in %s: Proxmox changes no config of a suspended VM (lock suspended); resume the VM, or delete it, to remove the ISO", prog.VMID, slot)
	}
	err = p.api.call(ctx, http.MethodPut, fmt.Sprintf("/nodes/%s/qemu/%d/config", prog.Node, prog.VMID), nil,
		map[string]any{slot: "none,media=cdrom"}, nil)
	if isLock(err) {
		return &provider.DeleteResult{Progress: prog.public(), RetryAfter: lockedVM, Message: fmt.Sprintf("VM %d is locked; retrying to eject its cloud-init ISO", prog.VMID)}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("eject the cloud-init ISO of VM %d: %w", prog.VMID, err)
	}
	return nil, nil
}

// isoNameRE matches the ISO names isoName gives, for any install; media
// checks that the install part is this one's.
var isoNameRE = regexp.MustCompile(`^hf-([a-z0-9][a-z0-9-]{0,29})-([0-9]+)-([0-9a-f]{12})\.iso$`)

// parseISOVolid returns the VM id and owner digest of a volume id on the
// ISO storage whose file name isoName gave for this install.
func (p *Provider) parseISOVolid(volid string) (int, string, bool) {
	file, ok := strings.CutPrefix(volid, p.isoStorage+":iso/")
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

// contentEntry is one entry of GET /nodes/{node}/storage/{storage}/content.
type contentEntry struct {
	Volid string `json:"volid"`
}

// ListCloudInitMedia implements provider.Provider: GET /nodes, then the
// ISO storage's content on every online node that has it. A shared storage lists the
// same files on every node; each is reported once.
func (p *Provider) ListCloudInitMedia(ctx context.Context) ([]provider.CloudInitMedium, error) {
	if p.isoStorage == "" {
		return nil, nil
	}
	var nodes proxmox.NodeStatuses
	if err := p.api.call(ctx, http.MethodGet, "/nodes", nil, nil, &nodes); err != nil {
		return nil, fmt.Errorf("list the nodes of cluster %q: %w", p.cfg.Name, err)
	}
	seen := map[string]bool{}
	var out []provider.CloudInitMedium
	for _, n := range nodes {
		// Every online node, not only those VMs may be placed on now: the
		// placement list may have changed since an ISO was written.
		if n == nil || n.Status != "online" {
			continue
		}
		var entries []contentEntry
		err := p.api.call(ctx, http.MethodGet, fmt.Sprintf("/nodes/%s/storage/%s/content", n.Node, p.isoStorage),
			url.Values{"content": {"iso"}}, nil, &entries)
		if isNotFound(err) || strings.Contains(apiMessage(err), "is not available on node") {
			continue // the storage is not on that node
		}
		if err != nil {
			return nil, fmt.Errorf("list the ISO storage %q on node %s: %w", p.isoStorage, n.Node, err)
		}
		for _, e := range entries {
			vmid, digest, ok := p.parseISOVolid(e.Volid)
			if !ok || seen[e.Volid] {
				continue
			}
			seen[e.Volid] = true
			out = append(out, provider.CloudInitMedium{ID: e.Volid, Node: n.Node, VM: FormatID(vmid), OwnerDigest: digest})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out, nil
}

// DeleteCloudInitMedium implements provider.Provider:
//
//	name not this install's              -> ErrNotOwned
//	file gone                            -> Done
//	deletion task of this process runs   -> wait
//	VM id being cloned, or its VM is the
//	medium's owner's or has it attached  -> ErrInUse
//	otherwise                            -> delete the file (task)
func (p *Provider) DeleteCloudInitMedium(ctx context.Context, m provider.CloudInitMedium) (*provider.DeleteResult, error) {
	vmid, digest, ok := p.parseISOVolid(m.ID)
	if !ok || FormatID(vmid) != m.VM || digest != m.OwnerDigest || m.Node == "" {
		return nil, provider.Errorf(provider.ClassPermanent, "NotOwned", "%w: %q on node %q is not a cloud-init ISO of this install", provider.ErrNotOwned, m.ID, m.Node)
	}
	prog := progress{VMID: vmid, Node: m.Node}
	present, err := p.api.volumeExists(ctx, m.Node, p.isoStorage, m.ID)
	if err != nil {
		return nil, fmt.Errorf("read the cloud-init ISO %s on node %s: %w", m.ID, m.Node, err)
	}
	if !present {
		p.setMediumTask(m.ID, nil)
		return &provider.DeleteResult{Progress: prog.public(), Done: true, Message: fmt.Sprintf("cloud-init ISO %s is gone", m.ID)}, nil
	}
	if t := p.mediumTask(m.ID); t != nil {
		st, err := p.api.task(ctx, t.ID)
		switch {
		case err == nil && st.running():
			prog.Task = t
			return &provider.DeleteResult{Progress: prog.public(), RetryAfter: pollDelay(p, t), Message: fmt.Sprintf("deleting cloud-init ISO %s", m.ID)}, nil
		case err != nil && !isNotFound(err):
			return nil, err
		}
		p.setMediumTask(m.ID, nil)
	}
	if err := p.mediumInUse(ctx, m, vmid); err != nil {
		return nil, err
	}
	upid, err := p.api.upid(ctx, http.MethodDelete, fmt.Sprintf("/nodes/%s/storage/%s/content/%s", m.Node, p.isoStorage, m.ID), nil, nil)
	if err != nil {
		return nil, fmt.Errorf("delete the cloud-init ISO %s on node %s: %w", m.ID, m.Node, err)
	}
	t := &provider.Task{ID: upid, Operation: opISODelete, StartTime: p.clock.Now()}
	p.setMediumTask(m.ID, t)
	p.log.Info("Deleting a stray cloud-init ISO", "volume", m.ID, "node", m.Node, "vmid", vmid)
	prog.Task = t
	return &provider.DeleteResult{Progress: prog.public(), RetryAfter: minPoll, Message: fmt.Sprintf("deleting cloud-init ISO %s", m.ID)}, nil
}

// mediumInUse returns ErrInUse when the VM the medium was written for
// exists and may still need it: being cloned (no marker to read yet),
// carrying a marker that verifies for the medium's owner, or having the
// file attached.
func (p *Provider) mediumInUse(ctx context.Context, m provider.CloudInitMedium, vmid int) error {
	node, err := p.locate(ctx, vmid)
	if isNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	cfg, err := p.api.config(ctx, node, vmid)
	if isNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("read VM %d on node %s: %w", vmid, node, err)
	}
	inUse := func(why string) error {
		return provider.Errorf(provider.ClassPermanent, "InUse", "%w: %s: VM %d %s", provider.ErrInUse, m.ID, vmid, why)
	}
	if cfg["lock"] == "clone" {
		return inUse("is being cloned")
	}
	if cfg.isoSlot(m.ID) != "" {
		return inUse("has it attached")
	}
	marker, err := p.marker(ctx)
	if err != nil {
		return err
	}
	if rec, err := marker.Verify(cfg["description"], vmid); err == nil && provider.OwnerDigest(rec.UID) == m.OwnerDigest {
		return inUse(fmt.Sprintf("belongs to its claim %s/%s", rec.Namespace, rec.Name))
	}
	return nil
}

func (p *Provider) mediumTask(volid string) *provider.Task {
	p.mu.Lock()
	defer p.mu.Unlock()
	if t, ok := p.mediaTasks[volid]; ok {
		return &t
	}
	return nil
}

func (p *Provider) setMediumTask(volid string, t *provider.Task) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if t == nil {
		delete(p.mediaTasks, volid)
		return
	}
	if p.mediaTasks == nil {
		p.mediaTasks = map[string]provider.Task{}
	}
	p.mediaTasks[volid] = *t
}

package fake

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/hyperfleet/hyperfleet/pkg/provider"
)

// mediumID names the cloud-init medium of owner uid's VM vmid
// "cloud-init/<operator id>/<vmid>/<owner digest>": the name says which
// install wrote it, and for which VM and owner.
func (p *Provider) mediumID(vmid int, uid string) string {
	return fmt.Sprintf("cloud-init/%s/%d/%s", p.signer.OperatorID(), vmid, provider.OwnerDigest(uid))
}

// parseMediumID returns the VM id and owner digest in the name of a medium
// this install wrote; ok is false for any other name.
func (p *Provider) parseMediumID(id string) (vmid int, digest string, ok bool) {
	f := strings.Split(id, "/")
	if len(f) != 4 || f[0] != "cloud-init" || f[1] != p.signer.OperatorID() || f[3] == "" {
		return 0, "", false
	}
	vmid, err := strconv.Atoi(f[2])
	return vmid, f[3], err == nil && vmid > 0
}

// ListCloudInitMedia implements provider.Provider.
func (p *Provider) ListCloudInitMedia(_ context.Context) ([]provider.CloudInitMedium, error) {
	defer p.c.lock()()
	var out []provider.CloudInitMedium
	for _, m := range p.c.media {
		if vmid, digest, ok := p.parseMediumID(m.id); ok {
			out = append(out, provider.CloudInitMedium{ID: m.id, Node: m.node, VM: FormatID(vmid), OwnerDigest: digest})
		}
	}
	slices.SortFunc(out, func(a, b provider.CloudInitMedium) int { return strings.Compare(a.ID, b.ID) })
	return out, nil
}

// DeleteCloudInitMedium implements provider.Provider. The deletion takes no
// time, but only a call that finds the medium gone reports Done, as for a
// VM: so the caller can tell a deletion it made from one made before.
func (p *Provider) DeleteCloudInitMedium(_ context.Context, m provider.CloudInitMedium) (*provider.DeleteResult, error) {
	defer p.c.lock()()
	vmid, digest, ok := p.parseMediumID(m.ID)
	if !ok || FormatID(vmid) != m.VM || digest != m.OwnerDigest {
		return nil, provider.Errorf(provider.ClassPermanent, "NotOwned", "%w: %q is not a cloud-init medium of this install", provider.ErrNotOwned, m.ID)
	}
	res := &provider.DeleteResult{Progress: provider.Progress{ID: FormatID(vmid), Node: m.Node}, Done: true, Message: fmt.Sprintf("cloud-init medium %s is gone", m.ID)}
	if p.c.media[m.ID] == nil {
		return res, nil
	}
	if why := p.inUseLocked(m.ID, vmid, digest); why != "" {
		return nil, provider.Errorf(provider.ClassPermanent, "InUse", "%w: %s: VM %d %s", provider.ErrInUse, m.ID, vmid, why)
	}
	delete(p.c.media, m.ID)
	res.Done, res.Message = false, fmt.Sprintf("deleted cloud-init medium %s", m.ID)
	return res, nil
}

// inUseLocked says why the VM the medium was written for still needs it,
// "" when it does not.
func (p *Provider) inUseLocked(id string, vmid int, digest string) string {
	v := p.c.vms[vmid]
	switch {
	case v == nil:
		return ""
	case v.op != nil && v.op.task.Operation == opClone:
		return "is being cloned"
	case v.attached == id:
		return "has it attached"
	}
	if rec, err := p.signer.Verify(v.description, vmid); err == nil && provider.OwnerDigest(rec.UID) == digest {
		return fmt.Sprintf("belongs to its claim %s/%s", rec.Namespace, rec.Name)
	}
	return ""
}

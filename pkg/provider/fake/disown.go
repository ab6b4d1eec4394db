package fake

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/hyperfleet/hyperfleet/pkg/ownership"
	"github.com/hyperfleet/hyperfleet/pkg/provider"
)

// DisownVM implements provider.Provider: once no operation is in flight,
// one write that drops the install's tags, replaces the ownership block by
// the release note and renames a VM that still has the install's clone
// name. The VM's power state and its medium stay as they are.
func (p *Provider) DisownVM(_ context.Context, owner provider.Owner, ref provider.VMRef) (*provider.DisownResult, error) {
	defer p.c.lock()()
	v, err := p.vmLocked(ref)
	if err != nil {
		return nil, err
	}
	rec, err := p.signer.Verify(v.description, v.id)
	if err == nil && rec.UID != owner.UID {
		err = fmt.Errorf("it belongs to claim %s/%s (uid %s)", rec.Namespace, rec.Name, rec.UID)
	}
	if err != nil {
		if errors.Is(err, ownership.ErrNoMarker) && p.signer.Released(v.description, owner.UID, v.id) {
			return &provider.DisownResult{Done: true, Message: fmt.Sprintf("VM %d was already released", v.id)}, nil
		}
		return nil, p.ownedLocked(v, owner)
	}
	if v.op != nil {
		_, left := p.c.inFlightLocked(v)
		return &provider.DisownResult{RetryAfter: left, Message: fmt.Sprintf("waiting for the %s of VM %d", v.op.task.Operation, v.id)}, nil
	}
	var removed []string
	kept := slices.DeleteFunc(slices.Clone(v.tags), func(t string) bool { return slices.Contains(p.signer.Tags(), strings.ToLower(t)) })
	if len(kept) != len(v.tags) {
		removed = append(removed, "tags "+strings.Join(p.signer.Tags(), ", "))
	}
	v.tags = kept
	v.description = p.signer.ReleasedDescription(v.description, rec, p.c.clock.Now())
	removed = append(removed, "the ownership block")
	if p.signer.VerifyVMName(v.name, v.id) {
		removed = append(removed, "the clone name "+v.name)
		v.name = fmt.Sprintf("disowned-%d", v.id)
	}
	delete(p.reservations, owner.UID)
	return &provider.DisownResult{Done: true, Removed: removed, Message: fmt.Sprintf("VM %d is no longer this install's", v.id)}, nil
}

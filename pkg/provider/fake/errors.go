package fake

import (
	"errors"
	"fmt"
	"strings"

	"github.com/hyperfleet/hyperfleet/internal/ownership"
	"github.com/hyperfleet/hyperfleet/pkg/provider"
)

// errNoVM says a VM id exists on no node.
var errNoVM = errors.New("no such VM")

// classify turns an API-like error into a classified provider error the
// way a real provider reads HTTP status and message.
func classify(err error, format string, args ...any) error {
	what := fmt.Sprintf(format, args...)
	var pe *provider.Error
	if errors.As(err, &pe) {
		return fmt.Errorf("%s: %w", what, err)
	}
	var ae *apiError
	if !errors.As(err, &ae) {
		return provider.Errorf(provider.ClassTransient, "ProviderError", "%s: %w", what, err)
	}
	switch {
	case ae.code == 595:
		return provider.Errorf(provider.ClassTransient, "NodeUnreachable", "%s: %s: %w", what, ae.msg, provider.ErrUnreachable)
	case ae.code == 401 || ae.code == 403:
		return provider.Errorf(provider.ClassConfiguration, "Unauthorized", "%s: %s: %w", what, ae.msg, provider.ErrUnauthorized)
	case ae.code == 400:
		return provider.Errorf(provider.ClassConfiguration, "InvalidParameter", "%s: %s", what, ae.msg)
	case isVMMissing(err):
		return provider.Errorf(provider.ClassPermanent, "NotFound", "%s: %s: %w", what, ae.msg, provider.ErrNotFound)
	case isNotExist(err):
		// A storage, volume or pool: not the VM's absence
		// (docs/security.md, "Absence and release").
		return provider.Errorf(provider.ClassTransient, "MissingReference", "%s: %s", what, ae.msg)
	case isLocked(ae.msg):
		return provider.Errorf(provider.ClassTransient, "Locked", "%s: %s", what, ae.msg)
	default:
		return provider.Errorf(provider.ClassTransient, "ProviderError", "%s: %s", what, ae.msg)
	}
}

func isNotExist(err error) bool {
	var ae *apiError
	return errors.As(err, &ae) && ae.code == 500 && strings.Contains(ae.msg, "does not exist")
}

// isVMMissing says whether err is the answer for a VM whose config file
// does not exist, the only "does not exist" that is about a VM itself.
func isVMMissing(err error) bool {
	var ae *apiError
	return isNotExist(err) && errors.As(err, &ae) && strings.Contains(ae.msg, "/qemu-server/")
}

func isAlreadyExists(msg string) bool { return strings.Contains(msg, "already exists") }

func isLocked(msg string) bool {
	return strings.Contains(msg, "is locked") || strings.Contains(msg, "got timeout") || strings.Contains(msg, "lock request timeout")
}

// retryableTaskFailure says whether a task that ended with exit failed in
// a way that trying again can fix.
func retryableTaskFailure(exit string) bool { return isLocked(exit) || isAlreadyExists(exit) }

// benignTaskFailure says whether a failed task left things as wanted, e.g.
// a second start of a VM that an earlier, lost start already booted.
func benignTaskFailure(exit string) bool { return strings.Contains(exit, "already running") }

// notOwned is the error for a VM whose marker does not verify for owner.
func notOwned(vmid int, owner provider.Owner, why error) error {
	return provider.Errorf(provider.ClassPermanent, "NotOwned",
		"VM %d is not owned by claim %s/%s (uid %s); leaving it alone: %w: %w", vmid, owner.Namespace, owner.Name, owner.UID, provider.ErrNotOwned, why)
}

// errWrongOwner says a valid marker names another claim.
var errWrongOwner = errors.New("ownership block names another claim")

// owns verifies description's marker for vmid and owner.
func (p *Provider) owns(description string, vmid int, owner provider.Owner) error {
	if owner.UID == "" {
		return fmt.Errorf("%w: the caller named no claim UID", errWrongOwner)
	}
	rec, err := p.signer.Verify(description, vmid)
	if err != nil {
		return err
	}
	if rec.UID != owner.UID || rec.Namespace != owner.Namespace || rec.Name != owner.Name {
		return fmt.Errorf("%w: %s/%s (uid %s)", errWrongOwner, rec.Namespace, rec.Name, rec.UID)
	}
	return nil
}

// record is the ownership record written for a new VM. The marker carries
// the Owner's CreatedAt, as the provider.Owner doc says; when the caller
// left it zero, the VM's creation time.
func (p *Provider) record(owner provider.Owner, vmid int) ownership.Record {
	created := owner.CreatedAt
	if created.IsZero() {
		created = p.clock.Now()
	}
	return ownership.Record{
		Namespace: owner.Namespace, Name: owner.Name, UID: owner.UID, Pool: owner.Pool,
		VMID: vmid, CreatedAt: created,
	}
}

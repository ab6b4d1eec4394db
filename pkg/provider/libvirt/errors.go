package libvirt

import (
	"errors"
	"strings"

	golibvirt "github.com/digitalocean/go-libvirt"

	"github.com/hyperfleet/hyperfleet/pkg/provider"
)

// classify gives err, the result of a libvirt call wrapped with what the
// call was for, its class (provider.Classify) by libvirt's error code.
// Only VIR_ERR_NO_DOMAIN wraps provider.ErrNotFound: a missing volume,
// pool or network says nothing about whether a VM exists, and callers
// release what a VM held when it is not found. Errors already classified,
// and nil, are returned unchanged.
func classify(err error) error {
	var pe *provider.Error
	if err == nil || errors.As(err, &pe) {
		return err
	}
	var le golibvirt.Error
	if !errors.As(err, &le) {
		if errors.Is(err, golibvirt.ErrUnsupported) {
			return provider.Errorf(provider.ClassConfiguration, "Unsupported", "%w; the host's libvirt is too old for this call", err)
		}
		// No answer: the connection failed or was lost (a libvirtd
		// restart, a network failure).
		return provider.Errorf(provider.ClassTransient, "Unreachable", "%w: %w", provider.ErrUnreachable, err)
	}
	msg := strings.ToLower(le.Message)
	switch code := golibvirt.ErrorNumber(le.Code); {
	case code == golibvirt.ErrNoDomain:
		return provider.Errorf(provider.ClassTransient, "NotFound", "%w: %w", err, provider.ErrNotFound)
	case code == golibvirt.ErrNoStorageVol, code == golibvirt.ErrNoStoragePool, code == golibvirt.ErrNoNetwork:
		return provider.Errorf(provider.ClassTransient, "MissingReference", "%w; something the VM refers to is missing, the VM itself may exist", err)
	case code == golibvirt.ErrAuthFailed, code == golibvirt.ErrAccessDenied, code == golibvirt.ErrAuthUnavailable, code == golibvirt.ErrAuthCancelled:
		return provider.Errorf(provider.ClassConfiguration, "Unauthorized", "%w: %w", err, provider.ErrUnauthorized)
	case code == golibvirt.ErrAgentUnresponsive, code == golibvirt.ErrAgentUnsynced:
		return provider.Errorf(provider.ClassTransient, "GuestNotReady", "%w: %w", err, provider.ErrGuestNotReady)
	case code == golibvirt.ErrOperationTimeout, code == golibvirt.ErrRPC, code == golibvirt.ErrNoConnect, code == golibvirt.ErrInvalidConn:
		return provider.Errorf(provider.ClassTransient, "Unreachable", "%w: %w", provider.ErrUnreachable, err)
	case code == golibvirt.ErrDomExist, code == golibvirt.ErrStorageVolExist, strings.Contains(msg, "already exists"):
		return provider.Errorf(provider.ClassTransient, "AlreadyExists", "%w", err)
	case strings.Contains(msg, "no space left"), strings.Contains(msg, "not enough space"), strings.Contains(msg, "insufficient space"),
		strings.Contains(msg, "exceeds available"), strings.Contains(msg, "cannot allocate memory"):
		return provider.Errorf(provider.ClassResource, "InsufficientCapacity", "%w: %w", err, provider.ErrNoCapacity)
	case code == golibvirt.ErrXMLError, code == golibvirt.ErrConfigUnsupported, code == golibvirt.ErrNoSupport,
		code == golibvirt.ErrOperationUnsupported, code == golibvirt.ErrArgumentUnsupported, code == golibvirt.ErrXMLDetail:
		return provider.Errorf(provider.ClassConfiguration, "Unsupported", "%w; the host cannot run the template's configuration", err)
	}
	return provider.Errorf(provider.ClassTransient, "LibvirtError", "%w", err)
}

// libvirtCode returns the libvirt error code err carries, -1 for none.
func libvirtCode(err error) golibvirt.ErrorNumber {
	var le golibvirt.Error
	if errors.As(err, &le) {
		return golibvirt.ErrorNumber(le.Code)
	}
	return -1
}

// isCode says whether err carries libvirt error code code.
func isCode(err error, code golibvirt.ErrorNumber) bool { return libvirtCode(err) == code }

// notOwned is the error of a call refused because the VM's marker does
// not verify for owner.
func notOwned(vmid int, o provider.Owner, why error) error {
	return provider.Errorf(provider.ClassPermanent, "NotOwned", "%w: VM %d, for claim %s/%s: %w", provider.ErrNotOwned, vmid, o.Namespace, o.Name, why)
}

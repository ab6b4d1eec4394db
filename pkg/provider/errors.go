package provider

import (
	"github.com/hyperfleet/hyperfleet/pkg/errclass"
)

// Sentinel errors. Implementations wrap them so callers test with errors.Is;
// each carries the class and reason an error wrapping it has unless the
// implementation classifies it otherwise (pkg/errclass).
var (
	// ErrNotFound: the VM (or template) does not exist. Providers wrap it
	// only when the hypervisor said so about the VM itself: a missing
	// storage, volume or file the VM refers to is another error, because
	// callers release what a VM held when it is not found.
	ErrNotFound = errclass.NewSentinel("not found on the hypervisor", ClassTransient, "NotFound")
	// ErrNotOwned: the VM's ownership marker does not verify for the
	// caller; the VM must not be touched.
	ErrNotOwned = errclass.NewSentinel("VM is not owned by this HyperFleet install", ClassPermanent, "NotOwned")
	// ErrUnreachable: the hypervisor API cannot be reached.
	ErrUnreachable = errclass.NewSentinel("hypervisor API unreachable", ClassTransient, "Unreachable")
	// ErrUnauthorized: credentials were rejected or lack a privilege.
	ErrUnauthorized = errclass.NewSentinel("hypervisor rejected the credentials", ClassConfiguration, "Unauthorized")
	// ErrNoCapacity: no allowed node has room for the VM.
	ErrNoCapacity = errclass.NewSentinel("no allowed node has enough free capacity", ClassResource, "InsufficientCapacity")
	// ErrIDRangeExhausted: every VM id of the cluster's range is taken.
	ErrIDRangeExhausted = errclass.NewSentinel("every VM id in the cluster's range is in use", ClassResource, "VMIDRangeExhausted")
	// ErrTaskFailed: a hypervisor task ended with an error.
	ErrTaskFailed = errclass.NewSentinel("hypervisor task failed", ClassTransient, "TaskFailed")
	// ErrGuestNotReady: the VM's guest cannot take a file now: the VM is
	// not running, its guest agent does not answer yet, or the directory
	// of the file does not exist in the guest yet. Call again later.
	ErrGuestNotReady = errclass.NewSentinel("the VM's guest cannot take a file yet", ClassTransient, "GuestNotReady")
	// ErrInUse: the cloud-init medium belongs to a VM that exists (or is
	// being cloned) and goes with that VM; it was not deleted.
	ErrInUse = errclass.NewSentinel("cloud-init medium is in use by its VM", ClassTransient, "")
)

// Class says how a caller reacts to an error (docs/architecture.md,
// "Classified errors"). The classes are errclass's, shared with the CI
// platform side; the names here keep the provider implementations' code
// in the terms of this package.
type Class = errclass.Class

// The classes (see errclass).
const (
	ClassTransient     = errclass.ClassTransient
	ClassPermanent     = errclass.ClassPermanent
	ClassConfiguration = errclass.ClassConfiguration
	ClassResource      = errclass.ClassResource
)

// Error is a classified error (errclass.Error).
type Error = errclass.Error

// Errorf builds a classified error; format may wrap with %w.
func Errorf(class Class, reason, format string, args ...any) error {
	return errclass.Errorf(class, reason, format, args...)
}

// Classify returns the class of err: the Class of the outermost *Error, else
// that of the first sentinel it wraps; unknown errors are transient.
func Classify(err error) Class { return errclass.Classify(err) }

// ReasonOf returns the Reason of the outermost *Error, else that of the
// first sentinel it wraps, else "ProviderError".
func ReasonOf(err error) string {
	if r := errclass.ReasonOf(err); r != "" {
		return r
	}
	return "ProviderError"
}

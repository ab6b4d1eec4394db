package provider

import (
	"context"
	"errors"
	"fmt"
)

// Sentinel errors. Implementations wrap them so callers test with errors.Is.
var (
	// ErrNotFound: the VM (or template) does not exist. Providers wrap it
	// only when the hypervisor said so about the VM itself: a missing
	// storage, volume or file the VM refers to is another error, because
	// callers release what a VM held when it is not found.
	ErrNotFound = errors.New("not found on the hypervisor")
	// ErrNotOwned: the VM's ownership marker does not verify for the
	// caller; the VM must not be touched.
	ErrNotOwned = errors.New("VM is not owned by this HyperFleet install")
	// ErrUnreachable: the hypervisor API cannot be reached.
	ErrUnreachable = errors.New("hypervisor API unreachable")
	// ErrUnauthorized: credentials were rejected or lack a privilege.
	ErrUnauthorized = errors.New("hypervisor rejected the credentials")
	// ErrNoCapacity: no allowed node has room for the VM.
	ErrNoCapacity = errors.New("no allowed node has enough free capacity")
	// ErrIDRangeExhausted: every VM id of the cluster's range is taken.
	ErrIDRangeExhausted = errors.New("every VM id in the cluster's range is in use")
	// ErrTaskFailed: a hypervisor task ended with an error.
	ErrTaskFailed = errors.New("hypervisor task failed")
	// ErrInUse: the cloud-init medium belongs to a VM that exists (or is
	// being cloned) and goes with that VM; it was not deleted.
	ErrInUse = errors.New("cloud-init medium is in use by its VM")
)

// Class says how a caller reacts to an error (docs/architecture.md,
// "Classified errors").
type Class string

const (
	// ClassTransient: retry with backoff (timeouts, 5xx, locks).
	ClassTransient Class = "Transient"
	// ClassPermanent: this attempt cannot succeed; fail it, maybe replace.
	ClassPermanent Class = "Permanent"
	// ClassConfiguration: the user must fix a spec, secret or permission.
	ClassConfiguration Class = "Configuration"
	// ClassResource: wait until capacity frees up.
	ClassResource Class = "Resource"
)

// Error is a classified error. Reason is a short UpperCamel word for
// condition reasons and metrics.
type Error struct {
	Class  Class
	Reason string
	Err    error
}

func (e *Error) Error() string { return e.Err.Error() }

func (e *Error) Unwrap() error { return e.Err }

// Errorf builds a classified error; format may wrap with %w.
func Errorf(class Class, reason, format string, args ...any) error {
	return &Error{Class: class, Reason: reason, Err: fmt.Errorf(format, args...)}
}

// Classify returns the class of err: the Class of the outermost *Error, else
// one derived from the sentinels; unknown errors are transient.
func Classify(err error) Class {
	var e *Error
	switch {
	case err == nil:
		return ""
	case errors.As(err, &e):
		return e.Class
	case errors.Is(err, ErrUnauthorized):
		return ClassConfiguration
	case errors.Is(err, ErrNoCapacity), errors.Is(err, ErrIDRangeExhausted):
		return ClassResource
	case errors.Is(err, ErrNotOwned):
		return ClassPermanent
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return ClassTransient
	default:
		return ClassTransient
	}
}

// ReasonOf returns the Reason of the outermost *Error, else one derived from
// the sentinels, else "ProviderError".
func ReasonOf(err error) string {
	var e *Error
	switch {
	case errors.As(err, &e) && e.Reason != "":
		return e.Reason
	case errors.Is(err, ErrNotFound):
		return "NotFound"
	case errors.Is(err, ErrNotOwned):
		return "NotOwned"
	case errors.Is(err, ErrUnreachable):
		return "Unreachable"
	case errors.Is(err, ErrUnauthorized):
		return "Unauthorized"
	case errors.Is(err, ErrNoCapacity):
		return "InsufficientCapacity"
	case errors.Is(err, ErrIDRangeExhausted):
		return "VMIDRangeExhausted"
	case errors.Is(err, ErrTaskFailed):
		return "TaskFailed"
	default:
		return "ProviderError"
	}
}

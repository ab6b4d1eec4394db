// Package errclass is how HyperFleet says what an error means to the
// controller that meets it: retry, give up, wait for the user, or wait for
// capacity (docs/architecture.md, "Classified errors"). The hypervisor side
// (pkg/provider) and the CI platform side (pkg/workload) both classify with
// it, so a controller reacts to a CI platform's refusal exactly as it does to
// a hypervisor's, and neither side's errors pose as the other's.
//
// An error is classified in one of two ways: a *Error names its class and
// reason outright, and a Sentinel (the errors a package declares for its
// callers to test with errors.Is) carries the class and reason every error
// wrapping it has unless a *Error says otherwise. The package that declares
// a sentinel therefore classifies it once, where it is declared, and no
// caller keeps its own table.
package errclass

import (
	"errors"
	"fmt"
)

// Class says how a caller reacts to an error.
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

// Sentinel is a sentinel error that knows its class and reason. Compare
// with errors.Is, as with any sentinel.
type Sentinel struct {
	msg    string
	class  Class
	reason string
}

// NewSentinel declares a sentinel error with the class and reason of the
// errors that wrap it; an empty reason leaves the reason to the caller's
// fallback (see ReasonOf).
func NewSentinel(msg string, class Class, reason string) *Sentinel {
	return &Sentinel{msg: msg, class: class, reason: reason}
}

func (s *Sentinel) Error() string { return s.msg }

// Class is the class of the errors that wrap s.
func (s *Sentinel) Class() Class { return s.class }

// Reason is the reason of the errors that wrap s; empty when s names none.
func (s *Sentinel) Reason() string { return s.reason }

// Classify returns the class of err: the Class of the outermost *Error,
// else that of the first Sentinel err wraps; other errors (timeouts and
// cancellations included) are transient, and nil has no class.
func Classify(err error) Class {
	var e *Error
	var s *Sentinel
	switch {
	case err == nil:
		return ""
	case errors.As(err, &e):
		return e.Class
	case errors.As(err, &s):
		return s.class
	}
	return ClassTransient
}

// ReasonOf returns the Reason of the outermost *Error, else that of the
// first Sentinel err wraps; empty when neither names one, so that each
// side can say what it falls back to.
func ReasonOf(err error) string {
	var e *Error
	if errors.As(err, &e) && e.Reason != "" {
		return e.Reason
	}
	var s *Sentinel
	if errors.As(err, &s) {
		return s.reason
	}
	return ""
}

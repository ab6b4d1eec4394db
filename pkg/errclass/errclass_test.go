package errclass_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/hyperfleet/hyperfleet/pkg/errclass"
)

// TestClassify: an *Error decides over the sentinels it wraps, a sentinel
// classifies what wraps it, and anything else is transient without a
// reason.
func TestClassify(t *testing.T) {
	busy := errclass.NewSentinel("busy", errclass.ClassResource, "Busy")
	quiet := errclass.NewSentinel("quiet", errclass.ClassPermanent, "")
	for _, tc := range []struct {
		name   string
		err    error
		class  errclass.Class
		reason string
	}{
		{"nil", nil, "", ""},
		{"plain", fmt.Errorf("boom"), errclass.ClassTransient, ""},
		{"deadline", fmt.Errorf("call: %w", context.DeadlineExceeded), errclass.ClassTransient, ""},
		{"sentinel", fmt.Errorf("node 1: %w", busy), errclass.ClassResource, "Busy"},
		{"sentinel without reason", quiet, errclass.ClassPermanent, ""},
		{"error over sentinel", errclass.Errorf(errclass.ClassConfiguration, "Fix", "node 1: %w", busy), errclass.ClassConfiguration, "Fix"},
		{"error without reason over sentinel", errclass.Errorf(errclass.ClassConfiguration, "", "node 1: %w", busy), errclass.ClassConfiguration, "Busy"},
		{"outermost error", fmt.Errorf("a: %w", errclass.Errorf(errclass.ClassPermanent, "Outer", "b: %w", errclass.Errorf(errclass.ClassTransient, "Inner", "c"))), errclass.ClassPermanent, "Outer"},
	} {
		if got := errclass.Classify(tc.err); got != tc.class {
			t.Errorf("%s: Classify = %q, want %q", tc.name, got, tc.class)
		}
		if got := errclass.ReasonOf(tc.err); got != tc.reason {
			t.Errorf("%s: ReasonOf = %q, want %q", tc.name, got, tc.reason)
		}
	}
}

package workload_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/hyperfleet/hyperfleet/pkg/errclass"
	"github.com/hyperfleet/hyperfleet/pkg/workload"
)

// TestClassified: the platform's refusals become configuration errors whose
// reason names the platform; everything else keeps its own class.
func TestClassified(t *testing.T) {
	for _, tc := range []struct {
		err    error
		class  errclass.Class
		reason string
	}{
		{fmt.Errorf("token: %w", workload.ErrUnauthorized), errclass.ClassConfiguration, "AcmeUnauthorized"},
		{fmt.Errorf("group: %w", workload.ErrInvalidRequest), errclass.ClassConfiguration, "AcmeRequestRefused"},
		{fmt.Errorf("scope: %w", workload.ErrNotFound), errclass.ClassConfiguration, "AcmeRequestRefused"},
		{fmt.Errorf("5xx: %w", workload.ErrUnavailable), errclass.ClassTransient, ""},
		{&workload.RateLimitError{}, errclass.ClassTransient, ""},
		{errclass.Errorf(errclass.ClassPermanent, "Mine", "kept: %w", workload.ErrUnauthorized), errclass.ClassPermanent, "Mine"},
		{errors.New("other"), errclass.ClassTransient, ""},
	} {
		got := workload.Classified("Acme", tc.err)
		if errclass.Classify(got) != tc.class || errclass.ReasonOf(got) != tc.reason || !errors.Is(got, tc.err) {
			t.Errorf("Classified(%v) = %v (class %q, reason %q), want class %q, reason %q, wrapping the error",
				tc.err, got, errclass.Classify(got), errclass.ReasonOf(got), tc.class, tc.reason)
		}
	}
}

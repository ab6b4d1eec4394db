package machineclaim

import (
	"testing"
	"time"
)

// TestClaimBackoff: transient failures double the wait from 2s (or the
// configured first wait) up to the configured cap (5 minutes unless set),
// and a success starts over.
func TestClaimBackoff(t *testing.T) {
	for _, tc := range []struct {
		name  string
		first time.Duration
		limit time.Duration
		want  []time.Duration
	}{
		{"default cap", 0, 0, []time.Duration{2 * time.Second, 4 * time.Second, 8 * time.Second, 16 * time.Second, 32 * time.Second, 64 * time.Second, 128 * time.Second, 256 * time.Second, 5 * time.Minute, 5 * time.Minute}},
		{"lowered cap", 0, 10 * time.Second, []time.Duration{2 * time.Second, 4 * time.Second, 8 * time.Second, 10 * time.Second, 10 * time.Second}},
		{"shortened first wait", 50 * time.Millisecond, 300 * time.Millisecond, []time.Duration{50 * time.Millisecond, 100 * time.Millisecond, 200 * time.Millisecond, 300 * time.Millisecond, 300 * time.Millisecond}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := &Reconciler{Retry: RetryDelays{First: tc.first, Max: tc.limit}}
			claim := unitClaim("c", 0)
			for i, want := range tc.want {
				if got := r.newClaimScope(&claim).backoff(); got != want {
					t.Fatalf("failure %d: backoff %s, want %s", i+1, got, want)
				}
			}
			r.memory.succeeded(claim.UID)
			if got := r.newClaimScope(&claim).backoff(); got != tc.want[0] {
				t.Errorf("after a success: backoff %s, want %s", got, tc.want[0])
			}
		})
	}
}

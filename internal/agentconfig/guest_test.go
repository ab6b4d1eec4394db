package agentconfig

import "testing"

// TestSingleJob: which credentials serve one job only, on their
// platform's side.
func TestSingleJob(t *testing.T) {
	for m, want := range map[BootstrapMethod]bool{
		BootstrapJITConfig: true, BootstrapJobToken: true, "": true,
		BootstrapRunnerToken: false, BootstrapRunnerAuthToken: false, BootstrapAgentToken: false,
	} {
		if got := m.SingleJob(); got != want {
			t.Errorf("%q.SingleJob() = %v, want %v", m, got, want)
		}
	}
}

package broker

import (
	"testing"

	"github.com/hyperfleet/hyperfleet/internal/testworld/credmethods"
	"github.com/hyperfleet/hyperfleet/pkg/workload"
)

// TestResponseCarriesEachMethod: the broker's answer carries every
// credential method in the field the agent reads (internal/agent's
// parseBrokerCredential): GitHub's JIT configuration in jitConfig; a
// registration token, a Buildkite agent token and a GitLab runner
// authentication token in registrationToken.
func TestResponseCarriesEachMethod(t *testing.T) {
	for method, wantJIT := range map[workload.Method]bool{
		credmethods.MethodJIT: true, credmethods.MethodRegistrationToken: false, credmethods.MethodAgentToken: false, credmethods.MethodRunnerAuthToken: false,
	} {
		c := workload.Credential{Method: method, Secret: workload.NewSecret("s3cret")}
		j, r := jit(c), regToken(c)
		if wantJIT && (j != "s3cret" || r != "") || !wantJIT && (r != "s3cret" || j != "") {
			t.Errorf("%s: jitConfig %q, registrationToken %q", method, j, r)
		}
	}
	if c := (workload.Credential{Method: "password", Secret: workload.NewSecret("s3cret")}); jit(c)+regToken(c) != "" {
		t.Error("a credential of an unknown method is handed out")
	}
}

package agentconfig

import (
	"strings"
	"testing"
)

// TestStoredRunnerAuthToken: a GitLab runner authentication token is kept
// in the secret store as registrationToken, and nothing else.
func TestStoredRunnerAuthToken(t *testing.T) {
	if err := (StoredCredential{Method: BootstrapRunnerAuthToken, RegistrationToken: "glrt-x"}).Validate(); err != nil {
		t.Errorf("a runner-auth-token credential: %v", err)
	}
	for want, c := range map[string]StoredCredential{
		"registrationToken: is empty; method runner-auth-token": {Method: BootstrapRunnerAuthToken},
		"jitConfig: is set but method is runner-auth-token":     {Method: BootstrapRunnerAuthToken, RegistrationToken: "glrt-x", JITConfig: "j"},
	} {
		if err := c.Validate(); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v", want, err)
		}
	}
}

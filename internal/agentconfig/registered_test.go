// The platforms' specs are registered by their packages, which import
// this one: an external test package links them into this package's test
// binary, so that the package's own tests validate configs of every
// platform the product ships.
package agentconfig_test

import (
	"testing"

	"github.com/hyperfleet/hyperfleet/internal/agentconfig"
	"github.com/hyperfleet/hyperfleet/pkg/workload/buildkite/buildkitevm"
	"github.com/hyperfleet/hyperfleet/pkg/workload/github/githubvm"
	"github.com/hyperfleet/hyperfleet/pkg/workload/gitlab/gitlabvm"
)

// TestTheTestsNamesAreTheRegisteredOnes fails when a name the internal
// tests use (platformnames_test.go) is not the platform's own.
func TestTheTestsNamesAreTheRegisteredOnes(t *testing.T) {
	for got, want := range map[agentconfig.Platform]agentconfig.Platform{
		agentconfig.PlatformGitHubActions: githubvm.Platform, agentconfig.PlatformGitLabCI: gitlabvm.Platform, agentconfig.PlatformBuildkite: buildkitevm.Platform,
	} {
		if _, ok := agentconfig.LookupPlatform(want); got != want || !ok {
			t.Errorf("the tests' platform %q, the registered %q (registered: %t)", got, want, ok)
		}
	}
	for got, want := range map[agentconfig.BootstrapMethod]agentconfig.BootstrapMethod{
		agentconfig.BootstrapJITConfig: githubvm.MethodJIT, agentconfig.BootstrapRunnerToken: githubvm.MethodRegistrationToken,
		agentconfig.BootstrapRunnerAuthToken: gitlabvm.MethodRunnerAuthToken,
		agentconfig.BootstrapAgentToken:      buildkitevm.MethodAgentToken, agentconfig.BootstrapJobToken: buildkitevm.MethodJobToken,
	} {
		if _, ok := agentconfig.LookupMethod(want); got != want || !ok {
			t.Errorf("the tests' method %q, the registered %q (registered: %t)", got, want, ok)
		}
	}
}

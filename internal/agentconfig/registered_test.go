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

// TestRegisterPlatformRefusesClashes: a platform is registered once, and a
// method is one platform's, or the API's shared with the same spec.
func TestRegisterPlatformRefusesClashes(t *testing.T) {
	validate := func(*agentconfig.Config, agentconfig.Reporter) {}
	for name, spec := range map[string]agentconfig.PlatformSpec{
		"GitLab CI again":            {Platform: gitlabvm.Platform, Methods: []agentconfig.MethodSpec{{Method: "other-token"}}, Validate: validate},
		"Buildkite's method":         {Platform: "other-ci", Methods: []agentconfig.MethodSpec{{Method: buildkitevm.MethodJobToken}}, Validate: validate},
		"the API's method otherwise": {Platform: "other-ci", Methods: []agentconfig.MethodSpec{{Method: githubvm.MethodJIT}}, Validate: validate},
		"generic":                    {Platform: agentconfig.PlatformGeneric, Methods: []agentconfig.MethodSpec{{Method: "other-token"}}, Validate: validate},
		"no methods":                 {Platform: "other-ci", Validate: validate},
	} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("%s: registered", name)
				}
			}()
			agentconfig.RegisterPlatform(spec)
		}()
	}
	if _, ok := agentconfig.LookupPlatform("other-ci"); ok {
		t.Error("a refused platform is registered")
	}
	if _, ok := agentconfig.LookupMethod("other-token"); ok {
		t.Error("a refused platform's method is registered")
	}
}

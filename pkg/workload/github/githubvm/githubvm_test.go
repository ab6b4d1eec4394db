package githubvm_test

import (
	"testing"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/agentconfig"
	"github.com/hyperfleet/hyperfleet/pkg/workload/buildkite/buildkitevm"
	"github.com/hyperfleet/hyperfleet/pkg/workload/github/githubvm"
	"github.com/hyperfleet/hyperfleet/pkg/workload/gitlab/gitlabvm"
)

// TestEachPlatformIsItsWorkloadType: the platform an agent config carries
// is the platform's workload type (spec.workload.type), and its methods
// are registered with it; GitHub's are the API's spec.bootstrap.method
// values and the default platform's.
func TestEachPlatformIsItsWorkloadType(t *testing.T) {
	for platform, typ := range map[agentconfig.Platform]hfv1.WorkloadType{
		githubvm.Platform: hfv1.WorkloadGitHubActions, gitlabvm.Platform: hfv1.WorkloadGitLabCI, buildkitevm.Platform: hfv1.WorkloadBuildkite,
	} {
		spec, ok := agentconfig.LookupPlatform(platform)
		if string(platform) != string(typ) || !ok || spec.Platform != platform {
			t.Errorf("platform %q: workload type %q, registered %v", platform, typ, ok)
		}
		for _, m := range spec.Methods {
			if got, ok := agentconfig.LookupMethod(m.Method); !ok || got != m {
				t.Errorf("platform %s: method %s is registered as %+v", platform, m.Method, got)
			}
		}
	}
	if githubvm.MethodJIT != agentconfig.BootstrapMethod(hfv1.BootstrapJITConfig) || githubvm.MethodRegistrationToken != agentconfig.BootstrapMethod(hfv1.BootstrapRunnerToken) {
		t.Error("GitHub's methods are not the API's spec.bootstrap.method values")
	}
	if agentconfig.DefaultPlatform() != githubvm.Platform {
		t.Errorf("the default platform is %q, want GitHub Actions", agentconfig.DefaultPlatform())
	}
}

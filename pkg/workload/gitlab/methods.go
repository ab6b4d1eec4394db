package gitlab

import (
	"github.com/hyperfleet/hyperfleet/pkg/workload"
	"github.com/hyperfleet/hyperfleet/pkg/workload/gitlab/gitlabvm"
)

// MethodRunnerAuthToken is GitLab's runner credential
// (workload.RunnerSpec.Method): a runner authentication token (glrt-) of a
// runner the operator creates for one VM, which runs with it for one job;
// the runner is deleted afterwards. The agent config carries it by
// gitlabvm's name.
const MethodRunnerAuthToken = workload.Method(gitlabvm.MethodRunnerAuthToken)

package github

import (
	"github.com/hyperfleet/hyperfleet/pkg/workload"
	"github.com/hyperfleet/hyperfleet/pkg/workload/github/githubvm"
)

// GitHub's runner credentials (workload.RunnerSpec.Method), the
// template's spec.bootstrap.method values, by the names the agent config
// carries (githubvm).
const (
	// MethodJIT is a just-in-time runner configuration: the runner is
	// registered by the operator and the VM only runs it, for one job.
	MethodJIT = workload.Method(githubvm.MethodJIT)
	// MethodRegistrationToken is a short-lived registration token the
	// VM's runner registers itself with, as an ephemeral runner.
	MethodRegistrationToken = workload.Method(githubvm.MethodRegistrationToken)
)

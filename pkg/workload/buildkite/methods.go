package buildkite

import (
	"github.com/hyperfleet/hyperfleet/pkg/workload"
	"github.com/hyperfleet/hyperfleet/pkg/workload/buildkite/buildkitevm"
)

// Buildkite's agent credentials (workload.RunnerSpec.Method), by the names
// the agent config carries (buildkitevm).
const (
	// MethodAgentToken is a cluster agent token made for one VM: its
	// agent registers with it, and the token expires soon and is deleted
	// when the VM goes.
	MethodAgentToken = workload.Method(buildkitevm.MethodAgentToken)
	// MethodJobToken is a job acquisition token: the VM's agent registers
	// with it and may acquire only the job the claim was made for
	// (workload.Credential.Job), once, within minutes.
	MethodJobToken = workload.Method(buildkitevm.MethodJobToken)
)

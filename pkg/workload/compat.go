package workload

import (
	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/pkg/workload/buildkite/buildkitevm"
	"github.com/hyperfleet/hyperfleet/pkg/workload/gitlab/gitlabvm"
)

// The platforms' credential methods under the names the credential broker
// (internal/broker) and the claim's guest secrets and secrets store
// (internal/controller/machineclaim) still switch on. Each is the
// platform's own name, not a second spelling of it.
//
// Deprecated: a credential's Method is the platform's; how it travels is
// its agentconfig.MethodSpec (JITConfig or a token), which these switches
// should ask instead.
const (
	MethodJIT               = Method(hfv1.BootstrapJITConfig)
	MethodRegistrationToken = Method(hfv1.BootstrapRunnerToken)
	MethodRunnerAuthToken   = Method(gitlabvm.MethodRunnerAuthToken)
	MethodAgentToken        = Method(buildkitevm.MethodAgentToken)
	MethodJobToken          = Method(buildkitevm.MethodJobToken)
)

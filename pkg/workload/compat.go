package workload

import (
	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/pkg/workload/buildkite/buildkitevm"
	"github.com/hyperfleet/hyperfleet/pkg/workload/gitlab/gitlabvm"
)

// The platforms' credential methods under the names the credential broker
// (internal/broker) and the claim's guest secrets and secrets store
// (internal/controller/machineclaim) still switch on, and the neutral
// packages' tests use (they may not import a platform's package). Each is
// the platform's own name, not a second spelling of it. The switches
// should rather ask how a credential travels (agentconfig.MethodSpec:
// a JIT configuration or a token), so that a new platform's method needs
// no case there.
const (
	MethodJIT               = Method(hfv1.BootstrapJITConfig)
	MethodRegistrationToken = Method(hfv1.BootstrapRunnerToken)
	MethodRunnerAuthToken   = Method(gitlabvm.MethodRunnerAuthToken)
	MethodAgentToken        = Method(buildkitevm.MethodAgentToken)
	MethodJobToken          = Method(buildkitevm.MethodJobToken)
)

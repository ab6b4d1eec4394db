package workload

import (
	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/pkg/workload/buildkite/buildkitevm"
	"github.com/hyperfleet/hyperfleet/pkg/workload/gitlab/gitlabvm"
)

// The platforms' credential methods under the names the neutral packages'
// tests use (a neutral package's test may not import a platform's
// package). Each is the platform's own name, not a second spelling of it.
// Product code asks how a credential travels instead
// (agentconfig.LookupMethod: a JIT configuration or a token), so that a
// new platform's method needs no case anywhere shared.
const (
	MethodJIT               = Method(hfv1.BootstrapJITConfig)
	MethodRegistrationToken = Method(hfv1.BootstrapRunnerToken)
	MethodRunnerAuthToken   = Method(gitlabvm.MethodRunnerAuthToken)
	MethodAgentToken        = Method(buildkitevm.MethodAgentToken)
	MethodJobToken          = Method(buildkitevm.MethodJobToken)
)

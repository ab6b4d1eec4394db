package workloadtest

import (
	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/pkg/workload"
	"github.com/hyperfleet/hyperfleet/pkg/workload/buildkite/buildkitevm"
	"github.com/hyperfleet/hyperfleet/pkg/workload/gitlab/gitlabvm"
)

// The platforms' credential methods under one set of names for tests,
// neutral packages' tests among them (which name no platform's package
// themselves). Each is the platform's own name, not a second spelling of
// it. Product code asks how a credential travels instead
// (agentconfig.LookupMethod: a JIT configuration or a token), so that a
// new platform's method needs no case anywhere shared; these names live
// here, in test support, so that the shared package links no platform's.
const (
	MethodJIT               = workload.Method(hfv1.BootstrapJITConfig)
	MethodRegistrationToken = workload.Method(hfv1.BootstrapRunnerToken)
	MethodRunnerAuthToken   = workload.Method(gitlabvm.MethodRunnerAuthToken)
	MethodAgentToken        = workload.Method(buildkitevm.MethodAgentToken)
	MethodJobToken          = workload.Method(buildkitevm.MethodJobToken)
)

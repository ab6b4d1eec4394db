// Package credmethods names the CI platforms' credential methods for
// tests, neutral packages' tests among them, which may import no
// platform's package themselves (.golangci.yml's depguard rules).
package credmethods

import (
	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/pkg/workload"
	"github.com/hyperfleet/hyperfleet/pkg/workload/buildkite/buildkitevm"
	"github.com/hyperfleet/hyperfleet/pkg/workload/gitlab/gitlabvm"
)

// The platforms' credential methods. Each is the platform's own name, not
// a second spelling of it. Product code asks how a credential travels
// instead (agentconfig.LookupMethod: a JIT configuration or a token), so
// that a new platform's method needs no case anywhere shared; these names
// live in the test world, so that the shared workload package links no
// platform's.
const (
	MethodJIT               = workload.Method(hfv1.BootstrapJITConfig)
	MethodRegistrationToken = workload.Method(hfv1.BootstrapRunnerToken)
	MethodRunnerAuthToken   = workload.Method(gitlabvm.MethodRunnerAuthToken)
	MethodAgentToken        = workload.Method(buildkitevm.MethodAgentToken)
	MethodJobToken          = workload.Method(buildkitevm.MethodJobToken)
)

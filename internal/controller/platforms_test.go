package controller

import (
	"github.com/hyperfleet/hyperfleet/internal/testworld/simulator/github/githubsimtest"
	"github.com/hyperfleet/hyperfleet/pkg/workload"
)

// ciPlatforms are the CI platform back-ends of the unit tests: GitHub
// Actions, registered by workload type as the operator binary registers it.
var ciPlatforms = func() *workload.Backends {
	b, err := workload.NewBackends(githubsimtest.Workloads(), workload.Dependencies{})
	if err != nil {
		panic(err)
	}
	return b
}()

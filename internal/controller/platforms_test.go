package controller

import (
	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/testworld/simulator/github/githubsimtest"
	"github.com/hyperfleet/hyperfleet/pkg/workload"
)

// ciPlatforms are the CI platform back-ends of the unit tests, registered
// by workload type as the operator binary registers them.
var ciPlatforms = func() *workload.Backends {
	b, err := workload.NewBackends(githubsimtest.Workloads(), workload.Dependencies{})
	if err != nil {
		panic(err)
	}
	return b
}()

// withoutGitLab are ciPlatforms less GitLab CI's: an operator build without
// a back-end for a type the API takes.
var withoutGitLab = func() *workload.Backends {
	ws := githubsimtest.Workloads()
	delete(ws, hfv1.WorkloadGitLabCI)
	b, err := workload.NewBackends(ws, workload.Dependencies{})
	if err != nil {
		panic(err)
	}
	return b
}()

package github

import (
	"time"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/pkg/workload/workloadmetrics"
)

// metrics records GitHub's calls in the CI platform API family
// (pkg/workload/workloadmetrics), which NewBackend registers with the
// operator's registry (workload.Dependencies.Metrics); its operations are
// the ones operationOf names (routes).
var metrics = workloadmetrics.New(hfv1.WorkloadGitHubActions, operations()...)

// observeCall records one GitHub call (Config.ObserveCall).
func observeCall(op string, code int, d time.Duration) { metrics.ObserveCall(op, code, d) }

// observeRate returns the rate-limit observer of one account
// (Config.ObserveRate): the budget left, and whether the secondary limit
// holds calls back.
func observeRate(owner string) func(RateSnapshot) {
	return func(s RateSnapshot) {
		metrics.ObserveRemaining(owner, s.Remaining)
		metrics.ObserveSecondaryLimit(owner, time.Now().Before(s.BlockedUntil))
	}
}

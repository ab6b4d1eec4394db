package metrics

import (
	"github.com/prometheus/client_golang/prometheus"
	crmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
)

var (
	// PoolDesiredReplicas is the size each RunnerPool moves to.
	PoolDesiredReplicas = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: namespace, Name: "runnerpool_desired_replicas",
		Help: "The number of runner VMs a RunnerPool moves to.",
	}, []string{"namespace", "pool"})

	// PoolEffectiveMinimum is each RunnerPool's minimum after its
	// scheduled windows (spec.scaling.schedules), by field.
	PoolEffectiveMinimum = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: namespace, Name: "runnerpool_effective_minimum",
		Help: "A RunnerPool's minimum (field=minReplicas or minIdle) after its scheduled windows raised it: spec.scaling's value or the largest open window's.",
	}, []string{"namespace", "pool", "field"})

	// PoolReplicas counts each RunnerPool's VMs by state.
	PoolReplicas = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: namespace, Name: "runnerpool_replicas",
		Help: "A RunnerPool's VMs by state: starting, idle, busy, terminating, retained (failed, kept for debugging).",
	}, []string{"namespace", "pool", "state"})

	// PoolPendingJobs is each RunnerPool's queued jobs without a runner.
	PoolPendingJobs = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: namespace, Name: "runnerpool_pending_jobs",
		Help: "Queued CI jobs routed to a RunnerPool that no runner has taken yet.",
	}, []string{"namespace", "pool"})

	// RunnerOutcomes counts how runner VMs ended.
	RunnerOutcomes = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: namespace, Name: "runner_outcomes_total",
		Help: "Runner VMs that ended, by pool and outcome: job_completed, idle_timeout, max_lifetime, job_timeout, bootstrap_timeout, drift_replaced, scaled_down, orphaned, failed, powered_off, deleted.",
	}, []string{"namespace", "pool", "outcome"})

	// PoolScalingActions counts claims created and removed by pools.
	PoolScalingActions = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: namespace, Name: "runnerpool_scaling_actions_total",
		Help: "MachineClaims created (action=create) and removed (action=remove, with the reason) by RunnerPools.",
	}, []string{"namespace", "pool", "action", "reason"})

	// PoolResyncs counts the RunnerPool resyncs against the CI platform.
	PoolResyncs = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: namespace, Name: "runnerpool_resyncs_total",
		Help: "Resyncs of runner state and queued jobs against the CI platform, by result (ok, error, rate_limited), one per credential scope.",
	}, []string{"result"})

	// ResyncRecoveredJobs counts jobs the resync learned of or advanced
	// (webhooks that were lost).
	ResyncRecoveredJobs = prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: namespace, Name: "runnerpool_resync_recovered_jobs_total",
		Help: "CI jobs the periodic resync created or moved forward because their webhooks were lost or late.",
	})
)

// ForgetPool drops a deleted pool's gauges, and its job and chargeback
// series with their label values (jobs.go).
func ForgetPool(namespace, pool string) {
	forgetPoolJobs(namespace, pool)
	PoolDesiredReplicas.DeleteLabelValues(namespace, pool)
	PoolPendingJobs.DeleteLabelValues(namespace, pool)
	PoolEffectiveMinimum.DeleteLabelValues(namespace, pool, "minReplicas")
	PoolEffectiveMinimum.DeleteLabelValues(namespace, pool, "minIdle")
	for _, s := range []string{"starting", "idle", "busy", "terminating", "retained"} {
		PoolReplicas.DeleteLabelValues(namespace, pool, s)
	}
}

func init() {
	crmetrics.Registry.MustRegister(PoolDesiredReplicas, PoolEffectiveMinimum, PoolReplicas, PoolPendingJobs, RunnerOutcomes, PoolScalingActions, PoolResyncs, ResyncRecoveredJobs)
}

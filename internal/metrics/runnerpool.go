package metrics

import "github.com/prometheus/client_golang/prometheus"

var (
	// PoolDesiredReplicas is the size each RunnerPool moves to.
	PoolDesiredReplicas = NewGaugeVec("runnerpool_desired_replicas",
		"The number of runner VMs a RunnerPool moves to.",
		"namespace", "pool")

	// PoolEffectiveMinimum is each RunnerPool's minimum after its
	// scheduled windows (spec.scaling.schedules), by field.
	PoolEffectiveMinimum = NewGaugeVec("runnerpool_effective_minimum",
		"A RunnerPool's minimum (field=minReplicas or minIdle) after its scheduled windows raised it: spec.scaling's value or the largest open window's.",
		"namespace", "pool", "field")

	// PoolReplicas counts each RunnerPool's VMs by state.
	PoolReplicas = NewGaugeVec("runnerpool_replicas",
		"A RunnerPool's VMs by state: starting, idle, busy, terminating, retained (failed, kept for debugging).",
		"namespace", "pool", "state")

	// PoolTemplateState is, for each template of a RunnerPool with
	// spec.placement, 1 for its state and 0 for the others.
	PoolTemplateState = NewGaugeVec("runnerpool_template_state",
		"For each template of a RunnerPool with spec.placement, 1 for its state (Available, Full, OverQuota, Unreachable, Invalid) and 0 for the others.",
		"namespace", "pool", "template", "state")

	// PoolTemplateMachines counts a RunnerPool's VMs by template.
	PoolTemplateMachines = NewGaugeVec("runnerpool_template_machines",
		"The VMs of a RunnerPool with spec.placement built from each of its templates and not finished.",
		"namespace", "pool", "template")

	// PoolPendingJobs is each RunnerPool's queued jobs without a runner.
	PoolPendingJobs = NewGaugeVec("runnerpool_pending_jobs",
		"Queued CI jobs routed to a RunnerPool that no runner has taken yet.",
		"namespace", "pool")

	// PoolStandby counts each RunnerPool's standby VMs by state: ready
	// (suspended, waiting), refilling (being built, booted or suspended)
	// and resuming (taken for a job, runner not online yet).
	PoolStandby = NewGaugeVec("runnerpool_standby_vms",
		"A RunnerPool's standby tier by state: ready (suspended to disk), refilling (being built, booted or suspended), resuming (taken for a job, runner not online yet).",
		"namespace", "pool", "state")

	// PoolStandbySize is each RunnerPool's standby tier size after its
	// schedules.
	PoolStandbySize = NewGaugeVec("runnerpool_standby_size",
		"The size of a RunnerPool's standby tier: spec.standby.size, or the largest open schedule window's standby.",
		"namespace", "pool")

	// StandbyRefillShort counts the pool passes that left the tier short
	// of its size, by why: max_replicas (no room under
	// spec.scaling.maxReplicas) or blocked (new VMs are paused: the
	// template, the cluster or the scope is not ready).
	StandbyRefillShort = NewCounterVec("runnerpool_standby_refill_short_total",
		"RunnerPool passes that left the standby tier below its size, by reason (max_replicas, blocked).",
		"namespace", "pool", "reason")

	// RunnerOutcomes counts how runner VMs ended.
	RunnerOutcomes = NewCounterVec("runner_outcomes_total",
		"Runner VMs that ended, by pool and outcome: job_completed, idle_timeout, max_lifetime, job_timeout, bootstrap_timeout, drift_replaced, scaled_down, orphaned, failed, powered_off, deleted.",
		"namespace", "pool", "outcome")

	// PoolScalingActions counts claims created and removed by pools.
	PoolScalingActions = NewCounterVec("runnerpool_scaling_actions_total",
		"MachineClaims created (action=create) and removed (action=remove, with the reason) by RunnerPools.",
		"namespace", "pool", "action", "reason")

	// PoolResyncs counts the RunnerPool resyncs against the CI platform.
	PoolResyncs = NewCounterVec("runnerpool_resyncs_total",
		"Resyncs of runner state and queued jobs against the CI platform, by result (ok, error, rate_limited), one per credential scope.",
		"result")

	// ResyncRecoveredJobs counts jobs the resync learned of or advanced
	// (webhooks that were lost).
	ResyncRecoveredJobs = NewCounter("runnerpool_resync_recovered_jobs_total",
		"CI jobs the periodic resync created or moved forward because their webhooks were lost or late.")
)

// ForgetPool drops a deleted pool's gauges, and its job and chargeback
// series with their label values (jobs.go).
func ForgetPool(namespace, pool string) {
	forgetPoolJobs(namespace, pool)
	PoolDesiredReplicas.DeleteLabelValues(namespace, pool)
	PoolPendingJobs.DeleteLabelValues(namespace, pool)
	PoolEffectiveMinimum.DeleteLabelValues(namespace, pool, "minReplicas")
	PoolEffectiveMinimum.DeleteLabelValues(namespace, pool, "minIdle")
	PoolStandbySize.DeleteLabelValues(namespace, pool)
	ForgetPoolTemplates(namespace, pool)
	for _, s := range []string{"ready", "refilling", "resuming"} {
		PoolStandby.DeleteLabelValues(namespace, pool, s)
	}
	for _, r := range []string{"max_replicas", "blocked"} {
		StandbyRefillShort.DeleteLabelValues(namespace, pool, r)
	}
	for _, s := range []string{"starting", "idle", "busy", "terminating", "retained"} {
		PoolReplicas.DeleteLabelValues(namespace, pool, s)
	}
}

// PoolTemplate is one entry of a pool's status.placement.
type PoolTemplate struct {
	Name, State string
	Machines    int32
}

// TemplateStates are the states PoolTemplateState reports (the API's
// TemplatePlacementState values).
var TemplateStates = []string{"Available", "Full", "OverQuota", "Unreachable", "Invalid"}

// SetPoolTemplates reports a pool's status.placement: its templates'
// states and machines. A template the pool no longer names is dropped.
func SetPoolTemplates(namespace, pool string, placement []PoolTemplate) {
	ForgetPoolTemplates(namespace, pool)
	for _, t := range placement {
		for _, s := range TemplateStates {
			v := 0.0
			if t.State == s {
				v = 1
			}
			PoolTemplateState.WithLabelValues(namespace, pool, t.Name, s).Set(v)
		}
		PoolTemplateMachines.WithLabelValues(namespace, pool, t.Name).Set(float64(t.Machines))
	}
}

// ForgetPoolTemplates drops a pool's template series.
func ForgetPoolTemplates(namespace, pool string) {
	labels := prometheus.Labels{"namespace": namespace, "pool": pool}
	PoolTemplateState.DeletePartialMatch(labels)
	PoolTemplateMachines.DeletePartialMatch(labels)
}

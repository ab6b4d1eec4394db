package controller

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	ctrl "sigs.k8s.io/controller-runtime"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/conditions"
	"github.com/hyperfleet/hyperfleet/internal/metrics"
	"github.com/hyperfleet/hyperfleet/internal/scaling"
)

// The pool's status, derived in its scope's close from what a pass that
// ran every phase found and did: the counts, Ready, Scaling (with the
// events of what changed), CapacityAvailable, and the pool's metrics.

// updateStatus derives the pool's status, events and metrics.
func (r *RunnerPoolReconciler) updateStatus(ctx context.Context, s *poolScope) {
	s.setCounts()
	r.carryScaleTime(s)
	s.readiness().setOn(&s.pool.Status.Conditions, s.pool.Generation)
	r.setScaling(ctx, s)
	r.setCapacity(s)
	r.setStandbyStatus(s)
	r.setPlacementStatus(s)
	s.recordMetrics()
}

// setCounts sets the pool's replica and job counts, the decision's
// low-demand time and the time of the last scaling action.
func (s *poolScope) setCounts() {
	pool, pc, d := s.pool, s.claims, s.decision
	st := &pool.Status
	stale := 0
	for uid := range pc.Stale {
		if !s.ended[uid] {
			stale++
		}
	}
	starting, idle, busy := s.remaining(pc.Starting)+s.created+s.activated, s.remaining(pc.Idle), s.remaining(pc.Busy)
	st.Replicas = int32(starting + idle + busy)
	st.DesiredReplicas = int32(d.Desired)
	st.MinReplicas = s.sched.MinReplicas
	st.StartingReplicas = int32(starting)
	st.IdleReplicas = int32(idle)
	st.BusyReplicas = int32(busy)
	st.ReadyReplicas = int32(idle + busy)
	st.TerminatingReplicas = int32(len(pc.Terminating) + s.removedCount() + s.released)
	st.RetainedReplicas = int32(len(pc.Retained) - s.released)
	st.StaleReplicas = int32(stale)
	st.PendingJobs = int32(s.demandPending())
	st.TemplateHash = s.hash
	st.Selector = labels.SelectorFromSet(labels.Set{hfv1.RunnerPoolLabel: pool.Name}).String()
	st.LowDemandSince = nil
	if d.LowDemandSince != nil {
		st.LowDemandSince = &metav1.Time{Time: *d.LowDemandSince}
	}
	if s.created > 0 || s.removedCount() > 0 {
		st.LastScaleTime = &metav1.Time{Time: s.now}
	}
}

// readiness is the pool's Ready: whether it can make VMs.
func (s *poolScope) readiness() *readiness {
	if ok, reason, msg := s.canBuild(); !ok {
		return notReady(hfv1.ConditionReason(reason), msg)
	}
	return isReady(fmt.Sprintf("Serving %s jobs with template %s", s.pool.Spec.Workload.Type, s.tmpl.Name))
}

// setScaling sets the Scaling condition, what the pass changed and why,
// with an event per kind of change a person acts on. Scaling up and down
// with demand is routine: a log line (and runnerpool_scaling_actions_total
// and the Scaling condition), not an event, as for a claim's routine
// steps; an event per burst was 0.4 Kubernetes writes per job
// (test/e2e's TestKubernetesRequestsPerJob).
func (r *RunnerPoolReconciler) setScaling(ctx context.Context, s *poolScope) {
	log := ctrl.LoggerFrom(ctx)
	pool, pc, d := s.pool, s.claims, s.decision
	st := &pool.Status
	gen := pool.Generation
	if n := s.removed[scaling.DriftReplaced]; n > 0 {
		r.Recorder.Eventf(pool, corev1.EventTypeNormal, string(hfv1.ReplacingStaleReason), "Replacing %d VMs built from an older template (now %s); busy ones are replaced after their job", n, shortHash(s.hash))
	}
	if n := s.removed[scaling.ScaledDown]; n > 0 {
		log.Info(fmt.Sprintf("Removing %d idle VMs: desired %d (%d pending jobs, %d busy)", n, d.Desired, s.demandPending(), len(pc.Busy)), "reason", hfv1.DemandDecreasedReason)
	}
	switch {
	case s.created > 0 || s.activated > 0:
		what := fmt.Sprintf("Creating %d VMs", s.created)
		if s.activated > 0 {
			what = fmt.Sprintf("Resuming %d standby VMs and creating %d", s.activated, s.created)
		}
		msg := fmt.Sprintf("%s: %d pending jobs, %d busy, %d idle, %d starting; desired %d (min %d, max %d, minIdle %d)",
			what, s.demandPending(), len(pc.Busy), len(pc.Idle), len(pc.Starting), d.Desired, s.sched.MinReplicas, pool.Spec.Scaling.MaxReplicas, s.sched.MinIdle)
		conditions.Set(&st.Conditions, gen, hfv1.RunnerPoolScalingCondition, metav1.ConditionTrue, hfv1.DemandIncreasedReason, msg)
		log.Info(msg, "reason", hfv1.DemandIncreasedReason)
	case s.removed[scaling.DriftReplaced] > 0:
		msg := fmt.Sprintf("Replacing %d VMs built from an older template (now %s); busy ones are replaced after their job", s.removed[scaling.DriftReplaced], shortHash(s.hash))
		conditions.Set(&st.Conditions, gen, hfv1.RunnerPoolScalingCondition, metav1.ConditionTrue, hfv1.ReplacingStaleReason, msg)
	case s.removed[scaling.ScaledDown] > 0:
		msg := fmt.Sprintf("Removing %d idle VMs: desired %d (%d pending jobs, %d busy)", s.removed[scaling.ScaledDown], d.Desired, s.demandPending(), len(pc.Busy))
		conditions.Set(&st.Conditions, gen, hfv1.RunnerPoolScalingCondition, metav1.ConditionTrue, hfv1.DemandDecreasedReason, msg)
	case int(st.Replicas) != d.Desired:
		reason, msg := hfv1.DemandIncreasedReason, fmt.Sprintf("Moving from %d to %d VMs", st.Replicas, d.Desired)
		if int(st.Replicas) > d.Desired {
			reason = hfv1.DemandDecreasedReason
			if !d.ScaleDownAt.IsZero() {
				msg += fmt.Sprintf("; idle VMs are removed at %s (spec.scaling.scaleDownDelay)", d.ScaleDownAt.UTC().Format(time.RFC3339))
			}
		}
		conditions.Set(&st.Conditions, gen, hfv1.RunnerPoolScalingCondition, metav1.ConditionTrue, reason, msg)
	default:
		conditions.Set(&st.Conditions, gen, hfv1.RunnerPoolScalingCondition, metav1.ConditionFalse, hfv1.StableReason,
			fmt.Sprintf("%d VMs for %d pending jobs and %d busy runners", st.Replicas, s.demandPending(), len(pc.Busy)))
	}
	for _, reason := range []scaling.Reason{scaling.IdleTimeout, scaling.JobTimeout, scaling.MaxLifetime} {
		if n := s.removed[reason]; n > 0 {
			r.Recorder.Eventf(pool, corev1.EventTypeNormal, string(reason.ConditionReason()), "Ending %d VMs: %s", n, reason)
		}
	}
}

// setCapacity sets CapacityAvailable: False with the first reason demand
// cannot be served.
func (r *RunnerPoolReconciler) setCapacity(s *poolScope) {
	pool, d := s.pool, s.decision
	st := &pool.Status
	gen := pool.Generation
	set := func(reason, msg string) {
		old := hfv1.FindCondition(st.Conditions, hfv1.RunnerPoolCapacityCondition)
		if old == nil || old.Status != metav1.ConditionFalse || old.Reason != reason {
			r.Recorder.Event(pool, corev1.EventTypeWarning, reason, msg)
		}
		conditions.Set(&st.Conditions, gen, hfv1.RunnerPoolCapacityCondition, metav1.ConditionFalse, hfv1.ConditionReason(reason), msg)
	}
	if s.refused != nil {
		set(string(s.refused.Reason), "No new VMs: "+s.refused.Message)
		return
	}
	if s.mismatch != "" {
		set(string(hfv1.InvalidSpecReason), "No new VMs: "+s.mismatch)
		return
	}
	if ok, msg := s.templateReady(); !ok && (s.tmpl == nil || !s.overflowAvailable()) {
		set(string(hfv1.TemplateInvalidReason), "No new VMs: "+msg)
		return
	}
	if !s.scopeVerified {
		set(string(hfv1.ScopeNotVerifiedReason), "No new VMs until the pool's scope is verified against its template's credentials; see the ScopeVerified condition")
		return
	}
	if s.feedBlocked != "" {
		set(string(s.feedBlockedReason), "No new VMs: they would be runners of a scale set nobody listens to: "+s.feedBlocked+" (see the Listening condition)")
		return
	}
	if s.backoffHeld > 0 && s.backoff.Failures < r.Backoff.Threshold {
		set(string(hfv1.ConsecutiveFailuresReason), fmt.Sprintf("%d new VMs held back: %d claims powered off before their runner was seen online and wait up to %s for a job record naming it (a job record makes them a success; without one they count as failures, %d in a row so far)",
			s.backoffHeld, len(s.undecided)-len(s.vouched), jobRecordGrace, s.backoff.Failures))
		return
	}
	if s.backoffHeld > 0 {
		next := "one at a time, each after the previous one's outcome"
		if at, waiting := s.backoff.Waiting(s.now); waiting {
			next = "the next one at " + at.UTC().Format(time.RFC3339)
		}
		set(string(hfv1.ConsecutiveFailuresReason), fmt.Sprintf("%d new VMs held back: %d claims in a row failed before their runner came online; %s (see the ReplacementBackoff condition)",
			s.backoffHeld, s.backoff.Failures, next))
		return
	}
	for _, reason := range []string{string(hfv1.ClusterUnavailableReason), string(hfv1.IPPoolExhaustedReason), string(hfv1.RateLimitedReason), string(hfv1.NamespaceNotAllowedReason),
		string(hfv1.QuotaExceededReason), string(hfv1.MaxMachinesReachedReason), string(hfv1.InsufficientCapacityReason)} {
		if n := s.blockers[reason]; n > 0 {
			set(reason, fmt.Sprintf("%d starting VMs wait: %s (see their Provisioned condition)", n, reason))
			return
		}
	}
	switch d.Limit {
	case scaling.AtMaxReplicas:
		set(string(hfv1.AtMaxReplicasReason), fmt.Sprintf("Demand needs more than spec.scaling.maxReplicas (%d) allows: %d pending jobs, %d busy, %d failed VMs retained; raise maxReplicas or wait",
			pool.Spec.Scaling.MaxReplicas, s.demandPending(), len(s.claims.Busy), len(s.claims.Retained)))
		return
	case scaling.WaitingForTermination:
		set(string(hfv1.WaitingForTerminationReason), fmt.Sprintf("%d VMs are still being destroyed and hold room under maxReplicas (%d)", len(s.claims.Terminating)+s.removedCount(), pool.Spec.Scaling.MaxReplicas))
		return
	case scaling.WaitingForStandby:
		set(string(hfv1.WaitingForStandbyReason), fmt.Sprintf("%d standby VMs being built hold room under maxReplicas (%d) that demand needs; each is taken for a job once suspended",
			len(s.tier.building), pool.Spec.Scaling.MaxReplicas))
		return
	}
	conditions.Set(&st.Conditions, gen, hfv1.RunnerPoolCapacityCondition, metav1.ConditionTrue, hfv1.ReadyReason, "The pool can serve its demand")
}

// recordMetrics sets the pool's gauges from its status.
func (s *poolScope) recordMetrics() {
	st := &s.pool.Status
	ns, name := s.pool.Namespace, s.pool.Name
	metrics.PoolDesiredReplicas.WithLabelValues(ns, name).Set(float64(s.decision.Desired))
	metrics.PoolPendingJobs.WithLabelValues(ns, name).Set(float64(s.demandPending()))
	metrics.PoolEffectiveMinimum.WithLabelValues(ns, name, "minReplicas").Set(float64(s.sched.MinReplicas))
	metrics.PoolEffectiveMinimum.WithLabelValues(ns, name, "minIdle").Set(float64(s.sched.MinIdle))
	for state, n := range map[string]int32{"starting": st.StartingReplicas, "idle": st.IdleReplicas, "busy": st.BusyReplicas,
		"terminating": st.TerminatingReplicas, "retained": st.RetainedReplicas} {
		metrics.PoolReplicas.WithLabelValues(ns, name, state).Set(float64(n))
	}
}

func ptrOr(p *int32, def int32) int32 {
	if p == nil {
		return def
	}
	return *p
}

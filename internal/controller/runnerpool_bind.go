package controller

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/poolclaims"
	"github.com/hyperfleet/hyperfleet/internal/scaling"
)

// Warm VMs bound to jobs (docs/buildkite.md, "One job per VM"). On a
// platform that binds every VM to one job (Buildkite), a warm VM (minIdle,
// minReplicas) boots with no credential and stands by (its claim
// Bootstrapped, reason WaitingForJob; the claim controller's
// jobbinding.go): it is the pool's idle capacity. When a queued job of the
// pool arrives (the CIJob's watch wakes the pool), the pool binds the
// oldest job no live claim is bound to to the oldest standing-by claim, by
// writing the claim's spec.workloadConfig.buildkite.jobID, which the API
// server takes once (CEL) and from the operator only (config/admission);
// the claim controller then issues that job's credential, as for a claim
// made for the job. The bind is in the API server before any credential
// exists, so a restart loses nothing; the pool's bind expectations keep a
// job it bound from being bound again before its cache shows the bind, and
// the credential's issuance refuses a job another live claim of the pool
// holds (internal/workloads' boundElsewhere). Jobs beyond the standing-by
// claims get new claims made for them (createClaims).

// bindStandby binds the pool's unbound queued jobs, oldest first, to the
// claims that stand by for one, oldest first: fresh (not stale) claims
// bound to no job whose Bootstrapped condition says WaitingForJob, not
// ended in this pass, and not about to reach a lifecycle limit
// (bindable). A bound claim moves from the pool's idle claims to its
// starting ones: it is about to run its job.
func (r *RunnerPoolReconciler) bindStandby(ctx context.Context, s *poolScope) error {
	jobs := r.unboundJobs(s)
	if len(jobs) == 0 || s.claims == nil {
		return nil
	}
	limits := poolclaims.Limits(s.pool)
	key := client.ObjectKeyFromObject(s.pool)
	var errs []error
	for _, c := range slices.Clone(s.claims.Idle) {
		if len(jobs) == 0 {
			break
		}
		if !standingBy(c) || s.claims.Stale[c.UID] || s.ended[c.UID] || !bindable(c, limits, s.now) {
			continue
		}
		bound, err := r.bind(ctx, c, jobs[0])
		switch {
		case err != nil:
			errs = append(errs, err)
			continue
		case !bound:
			continue
		}
		r.binds.bound(key, jobs[0], c.UID, r.Clock.Now())
		s.claims.Idle = slices.DeleteFunc(s.claims.Idle, func(x *hfv1.MachineClaim) bool { return x == c })
		s.claims.Starting = append(s.claims.Starting, c)
		jobs = jobs[1:]
	}
	if len(errs) > 0 {
		return fmt.Errorf("bind warm claims of RunnerPool %s to queued jobs: %w", s.pool.Name, errs[0])
	}
	return nil
}

// bind writes job into the claim's spec, against the claim as the pool
// saw it (an optimistic lock: a claim changed since, by its controller or
// another bind, is left alone, and the next pass looks again). It reports
// whether the claim is now bound to job, and then c is the claim as
// written. The bind is written from a copy: the pass's list of claims
// (what the bind expectations compare with) keeps showing the claim as
// the cache had it.
func (r *RunnerPoolReconciler) bind(ctx context.Context, c *hfv1.MachineClaim, job string) (bool, error) {
	updated := c.DeepCopy()
	if !bindJob(updated.Spec.WorkloadConfig, job) {
		return false, nil
	}
	err := r.Client.Patch(ctx, updated, client.MergeFromWithOptions(c, client.MergeFromWithOptimisticLock{}))
	switch {
	case err == nil:
		*c = *updated
		ctrl.LoggerFrom(ctx).Info("Bound a warm VM standing by to a queued job", "MachineClaim", klog.KObj(c), "job", job)
		r.Recorder.Eventf(c, corev1.EventTypeNormal, "BoundToJob", "Its RunnerPool bound the warm VM to queued job %s; the job's credential follows", job)
		return true, nil
	case apierrors.IsConflict(err), apierrors.IsNotFound(err), apierrors.IsInvalid(err):
		ctrl.LoggerFrom(ctx).V(1).Info("Did not bind a warm VM: the claim changed or went since the pool read it", "MachineClaim", klog.KObj(c), "job", job, "err", err.Error())
		return false, nil
	}
	return false, fmt.Errorf("bind MachineClaim %s to job %s: %w", c.Name, job, err)
}

// standingBy reports whether a claim's warm VM stands by for a job: bound
// to none, and its claim says so (Bootstrapped, reason WaitingForJob).
func standingBy(c *hfv1.MachineClaim) bool {
	if boundJobOf(c.Spec.WorkloadConfig) != "" || !c.DeletionTimestamp.IsZero() || c.EndRequested() {
		return false
	}
	cond := hfv1.FindCondition(c.Status.Conditions, hfv1.MachineClaimBootstrappedCondition)
	return cond != nil && cond.Status == metav1.ConditionTrue && cond.Reason == string(hfv1.WaitingForJobReason)
}

// bindable reports whether a standing-by claim has time left for a job:
// its idleTimeout counts from when it stood by and runs on until its job
// starts, so a claim whose next lifecycle limit is nearer than the pool's
// bootstrapTimeout (or half its idleTimeout, when that is shorter) is not
// bound; the job gets a claim of its own, and the claim's limit ends it.
func bindable(c *hfv1.MachineClaim, l scaling.Limits, now time.Time) bool {
	reached, next := scaling.Expired(poolclaims.Times(c), l, now)
	if reached.Reason != "" {
		return false
	}
	margin := l.BootstrapTimeout
	if half := l.IdleTimeout / 2; half > 0 && (margin <= 0 || half < margin) {
		margin = half
	}
	return next.At.IsZero() || next.At.Sub(now) >= margin
}

// boundIdleToStarting moves the idle claims bound to a job to the starting
// ones: a claim bound to a job is not idle capacity (no other job may
// take it) but a VM about to run the job it is bound to, until its job is
// recorded (busy). Scale-down never removes it for surplus.
func boundIdleToStarting(pc *poolclaims.Claims) {
	moved := false
	pc.Idle = slices.DeleteFunc(pc.Idle, func(c *hfv1.MachineClaim) bool {
		if boundJobOf(c.Spec.WorkloadConfig) == "" {
			return false
		}
		pc.Starting, moved = append(pc.Starting, c), true
		return true
	})
	if moved {
		slices.SortFunc(pc.Starting, func(a, b *hfv1.MachineClaim) int { return a.CreationTimestamp.Compare(b.CreationTimestamp.Time) })
	}
}

// bindExpectations remember the jobs a pool bound to existing claims
// until its cache shows the binds, as poolclaims.Expectations do for the
// claims it creates: a pass whose cache lags must not bind a job again, to
// another claim or to a new one. They live in memory: after a restart the
// cache is synced before the first pass, and the binds are in the API
// server. The zero value is ready to use.
type bindExpectations struct {
	mu sync.Mutex
	m  map[types.NamespacedName]map[string]bindExpectation // pool -> job
}

type bindExpectation struct {
	claim types.UID
	at    time.Time
}

// bound records that the pool bound job to the claim uid at now.
func (e *bindExpectations) bound(pool types.NamespacedName, job string, uid types.UID, now time.Time) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.m == nil {
		e.m = map[types.NamespacedName]map[string]bindExpectation{}
	}
	// Expectations of pools that never looked again (deleted) go with age.
	for p, jobs := range e.m {
		for j, x := range jobs {
			if now.Sub(x.at) > poolclaims.ExpectationTimeout {
				delete(jobs, j)
			}
		}
		if len(jobs) == 0 {
			delete(e.m, p)
		}
	}
	if e.m[pool] == nil {
		e.m[pool] = map[string]bindExpectation{}
	}
	e.m[pool][job] = bindExpectation{claim: uid, at: now}
}

// pending returns the jobs the pool bound that its listed claims do not
// show yet. A bind the list shows, or whose claim is gone from it, or older
// than poolclaims.ExpectationTimeout (the write probably did not happen
// after all), is dropped.
func (e *bindExpectations) pending(pool types.NamespacedName, listed []hfv1.MachineClaim, now time.Time) map[string]bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	jobs := e.m[pool]
	if len(jobs) == 0 {
		return nil
	}
	byUID := make(map[types.UID]*hfv1.MachineClaim, len(listed))
	for i := range listed {
		byUID[listed[i].UID] = &listed[i]
	}
	out := map[string]bool{}
	for job, x := range jobs {
		c, ok := byUID[x.claim]
		if !ok || boundJobOf(c.Spec.WorkloadConfig) == job || now.Sub(x.at) > poolclaims.ExpectationTimeout {
			delete(jobs, job)
			continue
		}
		out[job] = true
	}
	return out
}

package controller

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/metrics"
	"github.com/hyperfleet/hyperfleet/internal/phase"
	"github.com/hyperfleet/hyperfleet/internal/scaling"
)

// scale binds queued jobs to the warm claims standing by for one
// (runnerpool_bind.go), decides the pool's size (scaling.Plan) and applies
// the decision: drift replacement, scale-down of surplus idle claims, and
// new claims.
func (r *RunnerPoolReconciler) scale(ctx context.Context, s *poolScope) (phase.Result, error) {
	if err := r.bindStandby(ctx, s); err != nil {
		return phase.Stop(), err
	}
	staleStarting, freshStarting := byDrift(s.claims.Starting, s.claims.Stale)
	staleIdle, freshIdle := byDrift(s.claims.Idle, s.claims.Stale)
	res := s.schedWake
	s.tier = s.standbyTier()
	stranded, freshStarting := s.stranded(freshStarting)
	in := s.scalingInput(len(freshStarting), len(staleStarting), len(freshIdle), len(staleIdle))
	// A stranded claim holds its place under maxReplicas, as one being
	// removed does, but serves no demand.
	in.Terminating += len(stranded)
	d := scaling.Plan(in)
	s.decision = d
	if !d.ScaleDownAt.IsZero() {
		res = res.Sooner(d.ScaleDownAt.Sub(s.now))
	}
	if !s.tier.nextExpiry.IsZero() {
		res = res.Sooner(s.tier.nextExpiry.Sub(s.now))
	}
	for _, c := range slices.Concat(staleStarting[:d.RemoveStaleStarting], staleIdle[:d.RemoveStaleIdle]) {
		msg := fmt.Sprintf("built from template hash %s; the template is now %s", shortHash(c.Status.TemplateHash), shortHash(s.templateHash(c)))
		if err := r.endClaim(ctx, s, c, scaling.DriftReplaced, msg, false); err != nil {
			return phase.Stop(), err
		}
	}
	for _, c := range freshIdle[:d.RemoveIdle] {
		msg := fmt.Sprintf("demand stayed below the pool's size for spec.scaling.scaleDownDelay (%s)", in.ScaleDownDelay)
		if err := r.endClaim(ctx, s, c, scaling.ScaledDown, msg, false); err != nil {
			return phase.Stop(), err
		}
	}
	if err := r.applyStandby(ctx, s, s.tier, d); err != nil {
		return phase.Stop(), err
	}
	if ok, _, _ := s.canBuild(); d.Create+d.CreateStandby <= 0 || !ok || !s.scopeVerified || s.feedBlocked != "" {
		return res, nil
	}
	// The demand's claims first; the tier's refill from what the
	// replacement backoff still allows.
	n, wait := r.allowedCreations(s, d.Create+d.CreateStandby)
	runners := min(n, d.Create)
	if err := r.createClaims(ctx, s, runners, false); err != nil {
		return phase.Stop(), err
	}
	if err := r.createClaims(ctx, s, n-runners, true); err != nil {
		return phase.Stop(), err
	}
	return res.Sooner(wait), nil
}

// byDrift splits claims into those built from an older template (stale)
// and the others.
func byDrift(claims []*hfv1.MachineClaim, stale map[types.UID]bool) (old, fresh []*hfv1.MachineClaim) {
	for _, c := range claims {
		if stale[c.UID] {
			old = append(old, c)
		} else {
			fresh = append(fresh, c)
		}
	}
	return old, fresh
}

// scalingInput is what scaling.Plan decides the pool's size from, with
// the starting and idle claims counted apart by drift.
func (s *poolScope) scalingInput(starting, staleStarting, idle, staleIdle int) scaling.Input {
	pool, pc := s.pool, s.claims
	in := scaling.Input{
		MinReplicas: int(s.sched.MinReplicas), MaxReplicas: int(pool.Spec.Scaling.MaxReplicas),
		MinIdle: int(s.sched.MinIdle),
		Pending: s.demandPending(), Starting: starting, StaleStarting: staleStarting,
		Idle: idle, StaleIdle: staleIdle, Busy: len(pc.Busy),
		Terminating: len(pc.Terminating) + s.removedCount(), Retained: len(pc.Retained),
		Now: s.now, ScaleDownDelay: 5 * time.Minute,
		StandbySize: int(s.standbySize), Standby: len(s.tier.ready), StandbyBuilding: len(s.tier.building),
		StaleStandby: len(s.tier.stale), ExpiredStandby: len(s.tier.expired),
	}
	if d := pool.Spec.Scaling.ScaleDownDelay; d != nil {
		in.ScaleDownDelay = d.Duration
	}
	if t := pool.Status.LowDemandSince; t != nil {
		at := t.Time
		in.LowDemandSince = &at
	}
	return in
}

// maxParallelCreates bounds the claim creations one pass sends at once.
// One after the other, a pass that replaces several claims spends one API
// round trip on each while the pool's other decisions wait for it (the
// pool is one work item); in parallel the pass costs about one round trip.
const maxParallelCreates = 8

// createClaims creates n claims for the pool, up to maxParallelCreates at
// a time. Every creation is tried; the errors are joined.
func (r *RunnerPoolReconciler) createClaims(ctx context.Context, s *poolScope, n int, standby bool) error {
	if n <= 0 {
		return nil
	}
	claims := make([]*hfv1.MachineClaim, n)
	jobs := r.unboundJobs(s)
	if standby {
		// The tier's VMs wait for no job in particular.
		jobs = nil
	}
	on := make([]int, n)
	if s.createdOn == nil {
		s.createdOn = map[int]int{}
	}
	for i := range claims {
		var tmpl *hfv1.HypervisorMachineTemplate
		tmpl, on[i] = s.templateFor()
		claims[i] = r.newClaim(s, tmpl)
		claims[i].Spec.Standby = standby
		// A new claim for a queued job that no claim is made for yet is
		// made for it, on a platform that binds claims to jobs; the rest
		// (warm claims, minIdle) stay unbound.
		if len(jobs) > 0 && bindJob(claims[i].Spec.WorkloadConfig, jobs[0]) {
			jobs = jobs[1:]
		}
	}
	errs := make([]error, n)
	sem := make(chan struct{}, maxParallelCreates)
	var wg sync.WaitGroup
	for i, claim := range claims {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			if err := r.Client.Create(ctx, claim); err != nil {
				errs[i] = fmt.Errorf("create MachineClaim for RunnerPool %s: %w", s.pool.Name, err)
				return
			}
			r.expect.Created(client.ObjectKeyFromObject(s.pool), claim.Name, r.Clock.Now())
		}()
	}
	wg.Wait()
	action := "create"
	if standby {
		action = "create_standby"
	}
	for i, err := range errs {
		if err != nil {
			continue
		}
		s.createdOn[on[i]]++
		if standby {
			s.createdStandby++
		} else {
			s.created++
		}
		metrics.PoolScalingActions.WithLabelValues(s.pool.Namespace, s.pool.Name, action, "").Inc()
	}
	return errors.Join(errs...)
}

// demandPending is the pool's pending jobs, those no runner took, as
// scaling, status.pendingJobs, hyperfleet_runnerpool_pending_jobs and the
// scaling messages count them: the queued records less one for each busy
// claim that records no job and that no record names. The runner list can
// show a claim's runner busy before the job's in_progress event moves the
// job's record (the claim then records no job: no record names its runner
// yet), and that job counted twice, busy and pending, built a VM for no
// job (an end-to-end pool of 3 jobs built a 4th, which its scale-down
// ended). Once a record names the runner its job is no longer queued:
// subtracting it again counted one job too few until the claim recorded
// it (the pool's size dipped and came back, two status writes). The cost
// the other way, when the busy runner's job has no record at all (its
// events lost), is a queued job of the pool waiting for the resync that
// records the taken one.
func (s *poolScope) demandPending() int {
	n := len(s.pending)
	if s.claims != nil {
		for _, c := range s.claims.Busy {
			if st := c.Status.Bootstrap; st != nil && st.Job() == "" && !s.taken[st.RunnerName] {
				n--
			}
		}
	}
	return max(n, 0)
}

// unboundJobs are the ids of the pool's queued jobs that no live claim of
// the pool (starting, idle or busy) is made for or bound to, oldest first;
// a job the pool bound to a warm claim whose bind its cache does not show
// yet (bindExpectations) is bound.
func (r *RunnerPoolReconciler) unboundJobs(s *poolScope) []string {
	if len(s.pending) == 0 {
		return nil
	}
	bound := r.binds.pending(client.ObjectKeyFromObject(s.pool), s.listed, s.now)
	if bound == nil {
		bound = map[string]bool{}
	}
	var live []*hfv1.MachineClaim
	if pc := s.claims; pc != nil {
		live = slices.Concat(pc.Starting, pc.Idle, pc.Busy)
	}
	for _, c := range live {
		if id := boundJobOf(c.Spec.WorkloadConfig); id != "" {
			bound[id] = true
		}
	}
	pending := slices.Clone(s.pending)
	slices.SortStableFunc(pending, func(a, b *hfv1.CIJob) int {
		return queuedAt(a).Compare(queuedAt(b))
	})
	var out []string
	for _, j := range pending {
		if id := j.Spec.ID(); j.Spec.Platform == hfv1.WorkloadBuildkite && !bound[id] {
			out = append(out, id)
			bound[id] = true
		}
	}
	return out
}

func queuedAt(j *hfv1.CIJob) time.Time {
	if t := j.Status.QueuedAt; t != nil {
		return t.Time
	}
	return j.CreationTimestamp.Time
}

// boundJobOf is the job a claim's workload is made for; empty when none.
// Only Buildkite binds claims to jobs (spec.workloadConfig.buildkite.jobID,
// docs/buildkite.md).
func boundJobOf(wc *hfv1.WorkloadConfig) string {
	if wc != nil && wc.Type == hfv1.WorkloadBuildkite && wc.Buildkite != nil {
		return wc.Buildkite.JobID
	}
	return ""
}

// bindJob makes a new claim's workload one for job, on a platform that
// binds claims to jobs; false when its platform does not.
func bindJob(wc *hfv1.WorkloadConfig, job string) bool {
	if wc == nil || wc.Type != hfv1.WorkloadBuildkite {
		return false
	}
	if wc.Buildkite == nil {
		wc.Buildkite = &hfv1.BuildkiteAgentConfig{}
	}
	wc.Buildkite.JobID = job
	return true
}

// newClaim is a new claim for the pool, named <pool>-<suffix>, built
// from tmpl: templateRef's, or the one placement chose (templateFor). Its
// workload is the pool's, read with templateRef (an overflow template
// bootstraps as templateRef does).
func (r *RunnerPoolReconciler) newClaim(s *poolScope, tmpl *hfv1.HypervisorMachineTemplate) *hfv1.MachineClaim {
	pool := s.pool
	ref, hash := pool.Spec.TemplateRef, s.hash
	if tmpl != nil && tmpl != s.tmpl {
		ref, hash = hfv1.ObjectName{Name: tmpl.Name}, tmpl.Status.TemplateHash
	} else {
		tmpl = s.tmpl
	}
	labels, annotations := templateClaimMetadata(tmpl)
	labels[hfv1.ManagedByLabel] = hfv1.ManagedByValue
	labels[hfv1.RunnerPoolLabel] = pool.Name
	labels[hfv1.MachineTemplateLabel] = ref.Name
	if tmpl != nil {
		labels[hfv1.HypervisorClusterLabel] = tmpl.Spec.HypervisorClusterRef.Name
	}
	claim := &hfv1.MachineClaim{
		ObjectMeta: metav1.ObjectMeta{
			Namespace:    pool.Namespace,
			GenerateName: pool.Name + "-",
			Labels:       labels,
			Annotations:  annotations,
			// The claim controller's finalizer and labels in the claim's
			// creation: its first write of its own is then the status
			// that reserves the VM (machineclaim.writeReservation).
			Finalizers:      []string{hfv1.MachineClaimFinalizer},
			OwnerReferences: []metav1.OwnerReference{*metav1.NewControllerRef(pool, hfv1.GroupVersion.WithKind("RunnerPool"))},
		},
		Spec: hfv1.MachineClaimSpec{
			TemplateRef:   ref,
			RunnerPoolRef: &hfv1.ObjectName{Name: pool.Name},
		},
	}
	if hash != "" {
		claim.Labels[hfv1.TemplateHashLabel] = hash[:min(63, len(hash))]
	}
	if _, ps, ok := r.Workloads.Pool(pool, s.tmpl); ok {
		// A copy: bindJob writes into it.
		claim.Spec.WorkloadConfig = ps.Claim.DeepCopy()
	}
	return claim
}

// templateClaimMetadata returns copies of the template's spec.metadata
// labels and annotations (empty maps without a template), which a new
// claim starts from; the caller sets HyperFleet's own labels over them.
func templateClaimMetadata(tmpl *hfv1.HypervisorMachineTemplate) (labels, annotations map[string]string) {
	labels, annotations = map[string]string{}, map[string]string{}
	if tmpl == nil || tmpl.Spec.Metadata == nil {
		return labels, annotations
	}
	maps.Copy(labels, tmpl.Spec.Metadata.Labels)
	maps.Copy(annotations, tmpl.Spec.Metadata.Annotations)
	return labels, annotations
}

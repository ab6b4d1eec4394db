package controller

import (
	"context"
	"fmt"
	"slices"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/controller/fieldindex"
	"github.com/hyperfleet/hyperfleet/internal/controller/machineclaim"
	"github.com/hyperfleet/hyperfleet/internal/phase"
	"github.com/hyperfleet/hyperfleet/internal/poolclaims"
	"github.com/hyperfleet/hyperfleet/pkg/workload"
)

// load reads the pool's template, classifies its claims and reads its
// CIJobs. The pool is looked at again within poolResync whatever happens.
func (r *RunnerPoolReconciler) load(ctx context.Context, s *poolScope) (phase.Result, error) {
	pool, claims := s.pool, s.listed
	tmpl := &hfv1.HypervisorMachineTemplate{}
	switch err := r.Client.Get(ctx, client.ObjectKey{Namespace: pool.Namespace, Name: pool.Spec.TemplateRef.Name}, tmpl); {
	case err == nil:
		s.tmpl = tmpl
		s.hash = tmpl.Status.TemplateHash
		s.mismatch = platformMismatch(r.Workloads, pool, tmpl)
	case apierrors.IsNotFound(err):
	default:
		return phase.Stop(), fmt.Errorf("read HypervisorMachineTemplate %s: %w", pool.Spec.TemplateRef.Name, err)
	}
	owned := claims[:0:0]
	for i := range claims {
		if c := &claims[i]; metav1.IsControlledBy(c, pool) || len(c.OwnerReferences) == 0 {
			owned = append(owned, *c)
		}
	}
	if pool.Spec.Placement != nil {
		if err := r.loadOverflow(ctx, s); err != nil {
			return phase.Stop(), err
		}
	}
	s.claims = s.classifyClaims(owned, machineclaim.RetainsFailed(pool))
	boundIdleToStarting(s.claims)

	var jobs hfv1.CIJobList
	if err := r.Client.List(ctx, &jobs, client.InNamespace(pool.Namespace), client.MatchingFields{fieldindex.JobPool: pool.Name}); err != nil {
		return phase.Stop(), fmt.Errorf("list CIJobs of pool: %w", err)
	}
	s.jobs = make(map[string]*hfv1.CIJob, len(jobs.Items))
	for i := range jobs.Items {
		j := &jobs.Items[i]
		s.jobs[j.Spec.ID()] = j
		if j.Status.State == hfv1.CIJobQueued || j.Status.State == "" {
			s.pending = append(s.pending, j)
		}
	}
	s.taken = runnersWithJobs(s.jobs)
	takenToBusy(s.claims, s.taken)
	for _, c := range s.claims.Starting {
		if cond := hfv1.FindCondition(c.Status.Conditions, hfv1.MachineClaimProvisionedCondition); cond != nil && cond.Status == metav1.ConditionFalse {
			switch cond.Reason {
			case string(hfv1.IPPoolExhaustedReason), string(hfv1.RateLimitedReason), string(hfv1.ClusterUnavailableReason), string(hfv1.NamespaceNotAllowedReason), string(hfv1.TemplateNotReadyReason),
				string(hfv1.QuotaExceededReason), string(hfv1.MaxMachinesReachedReason), string(hfv1.InsufficientCapacityReason):
				s.blockers[cond.Reason]++
			}
		}
	}
	if pool.Spec.Placement != nil {
		if err := r.derivePlacement(ctx, s); err != nil {
			return phase.Stop(), err
		}
	}
	return phase.Recheck(poolResync), nil
}

// canBuild reports whether the pool may create claims: it sets no refused
// field and its template is ready. Otherwise it gives the reason and the
// message for the pool's Ready condition.
func (s *poolScope) canBuild() (bool, string, string) {
	if s.refused != nil {
		return false, string(s.refused.Reason), s.refused.Message
	}
	if s.mismatch != "" {
		return false, string(hfv1.InvalidSpecReason), s.mismatch
	}
	if ok, msg := s.templateReady(); !ok && (s.tmpl == nil || !s.overflowAvailable()) {
		return false, string(hfv1.TemplateNotReadyReason), msg
	}
	return true, "", ""
}

// overflowAvailable reports whether a template of spec.placement other
// than templateRef takes new VMs: the pool builds them there while
// templateRef's cluster is down (templateRef itself must exist: the
// pool's scope and credentials are its).
func (s *poolScope) overflowAvailable() bool {
	for _, t := range s.placement[min(1, len(s.placement)):] {
		if t.State == hfv1.TemplateAvailable {
			return true
		}
	}
	return false
}

// templateReady reports whether new VMs can be built from the template.
func (s *poolScope) templateReady() (bool, string) {
	if s.tmpl == nil {
		return false, fmt.Sprintf("spec.templateRef: HypervisorMachineTemplate %s/%s does not exist; create it or fix the name", s.pool.Namespace, s.pool.Spec.TemplateRef.Name)
	}
	ready := hfv1.FindCondition(s.tmpl.Status.Conditions, hfv1.ReadyCondition)
	switch {
	case !s.tmpl.DeletionTimestamp.IsZero():
		return false, fmt.Sprintf("HypervisorMachineTemplate %s is being deleted; no new VM is built from it", s.tmpl.Name)
	case ready == nil || s.tmpl.Status.ObservedGeneration != s.tmpl.Generation:
		return false, fmt.Sprintf("HypervisorMachineTemplate %s has not been validated yet", s.tmpl.Name)
	case ready.Status != metav1.ConditionTrue:
		return false, fmt.Sprintf("HypervisorMachineTemplate %s is not ready: %s: %s", s.tmpl.Name, ready.Reason, ready.Message)
	}
	return true, ""
}

// removedCount is the number of claims this pass ended.
func (s *poolScope) removedCount() int { return len(s.ended) }

// remaining counts the claims of list this pass did not end.
func (s *poolScope) remaining(list []*hfv1.MachineClaim) int {
	n := 0
	for _, c := range list {
		if !s.ended[c.UID] {
			n++
		}
	}
	return n
}

// platformMismatch says why the pool cannot use tmpl when the template has
// no section for the pool's workload type (a generic pool on a GitHub
// template, or the reverse): every claim would wait with InvalidSpec
// (machineclaim's checkPlatformSection), so the pool builds none and says
// so on its own conditions. Empty when the template has the section, or
// when no back-end serves the type (refusal.Pool reports that).
func platformMismatch(ws *workload.Backends, pool *hfv1.RunnerPool, tmpl *hfv1.HypervisorMachineTemplate) string {
	typ := pool.Spec.Workload.Type
	be, ok := ws.For(typ)
	if !ok {
		return ""
	}
	if _, reads := be.Template(tmpl); reads {
		return ""
	}
	has := "no CI platform section"
	for _, other := range ws.Types() {
		if ob, _ := ws.For(other); ob != nil {
			if tt, reads := ob.Template(tmpl); reads {
				has = tt.Field + " (workload type " + string(other) + ")"
			}
		}
	}
	return fmt.Sprintf("spec.workload.type is %s, but HypervisorMachineTemplate %s has no %s (it has %s); "+
		"point spec.templateRef at a template with %s, or set spec.workload.type to the template's platform. No VM is built until then",
		typ, tmpl.Name, be.TemplateField(), has, be.TemplateField())
}

// takenToBusy moves the starting and idle claims whose runner a job record
// names (taken: the runners of the pool's in_progress and completed
// records) to the busy ones. The record is written first (by the webhook
// receiver or the resync) and the claim records the job a moment later
// (machineclaim's observeRunner reads the same record by runner name):
// counted idle in between, the job was neither pending nor busy, and the
// pool's desired size dipped by one (Scaling DemandDecreased, a
// lowDemandSince, then Stable again when the claim caught up: two status
// writes per job for nothing), and scale-down could pick a VM whose runner
// runs a job.
func takenToBusy(pc *poolclaims.Claims, taken map[string]bool) {
	if len(taken) == 0 {
		return
	}
	moved := false
	took := func(c *hfv1.MachineClaim) bool {
		st := c.Status.Bootstrap
		if st == nil || st.RunnerName == "" || st.Job() != "" || !taken[st.RunnerName] {
			return false
		}
		pc.Busy, moved = append(pc.Busy, c), true
		return true
	}
	pc.Starting = slices.DeleteFunc(pc.Starting, took)
	pc.Idle = slices.DeleteFunc(pc.Idle, took)
	if moved {
		slices.SortFunc(pc.Busy, func(a, b *hfv1.MachineClaim) int { return a.CreationTimestamp.Compare(b.CreationTimestamp.Time) })
	}
}

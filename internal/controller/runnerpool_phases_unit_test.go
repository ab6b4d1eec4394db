package controller

import (
	"context"
	"fmt"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"
	clocktesting "k8s.io/utils/clock/testing"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/scaling"
)

// scopesVouched is a ScopeVerifier that vouches for every pool's scope.
type scopesVouched struct{}

func (scopesVouched) VerifyPoolScope(context.Context, *hfv1.RunnerPool, *hfv1.HypervisorMachineTemplate) error {
	return nil
}

// TestReconcileRunnerPool runs the RunnerPool's phase list from a
// starting state each (load, scope check, webhook secret, replacement
// backoff, lifecycle limits, scaling, pruning, CIJob collection), with
// the close that derives the status of a pass that ran every phase and
// writes it once.
func TestReconcileRunnerPool(t *testing.T) {
	const ns = "team"
	key := types.NamespacedName{Namespace: ns, Name: "runners"}
	newPool := func(mut ...func(*hfv1.RunnerPool)) *hfv1.RunnerPool {
		p := &hfv1.RunnerPool{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: key.Name, UID: "pool-uid", Generation: 2},
			Spec: hfv1.RunnerPoolSpec{
				TemplateRef: hfv1.ObjectName{Name: "debian"},
				Workload:    hfv1.Workload{Type: hfv1.WorkloadGitHubActions, GitHub: &hfv1.GitHubWorkload{Organization: "octo-org"}},
				Scaling:     hfv1.Scaling{MaxReplicas: 5},
			},
			Status: hfv1.RunnerPoolStatus{ObservedGeneration: 1},
		}
		for _, m := range mut {
			m(p)
		}
		return p
	}
	tmpl := &hfv1.HypervisorMachineTemplate{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "debian", Generation: 1},
		Spec: hfv1.HypervisorMachineTemplateSpec{Bootstrap: hfv1.Bootstrap{GitHub: &hfv1.GitHubBootstrap{Owner: "octo-org", Organization: "octo-org",
			Credentials: hfv1.GitHubCredentials{PAT: &hfv1.LocalSecretKeySelector{Name: "github", Key: "token"}}}}},
		Status: hfv1.HypervisorMachineTemplateStatus{ObservedGeneration: 1, TemplateHash: "hash-1", Conditions: []metav1.Condition{{
			Type: string(hfv1.ReadyCondition), Status: metav1.ConditionTrue, Reason: string(hfv1.ReadyReason), LastTransitionTime: metav1.Time{Time: unitEpoch}}}},
	}
	queued := func(id int64) *hfv1.CIJob {
		return &hfv1.CIJob{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: fmt.Sprintf("github-actions-%d", id), Labels: map[string]string{hfv1.RunnerPoolLabel: key.Name}},
			Spec:       hfv1.CIJobSpec{JobID: id, RunnerPoolRef: hfv1.ObjectName{Name: key.Name}},
			Status:     hfv1.CIJobStatus{State: hfv1.CIJobQueued},
		}
	}
	// starting is a claim of the pool provisioning since age before the
	// pass, whose runner has not come online.
	starting := func(name string, age time.Duration) *hfv1.MachineClaim {
		c := unitClaim(name, -age)
		c.Status.PhaseTimes = &hfv1.PhaseTimes{Provisioning: &metav1.Time{Time: unitEpoch.Add(-age)}}
		c.Namespace = ns
		c.OwnerReferences = []metav1.OwnerReference{*metav1.NewControllerRef(newPool(), hfv1.GroupVersion.WithKind("RunnerPool"))}
		c.Spec = hfv1.MachineClaimSpec{TemplateRef: hfv1.ObjectName{Name: "debian"}, RunnerPoolRef: &hfv1.ObjectName{Name: key.Name}}
		c.Status.TemplateHash = "hash-1"
		return &c
	}
	serving := wantCondition{status: metav1.ConditionTrue, reason: hfv1.ReadyReason, says: []string{"Serving github-actions jobs with template debian"}}
	for _, tc := range []struct {
		name  string
		pool  *hfv1.RunnerPool // nil: the pool is gone
		objs  []client.Object
		funcs interceptor.Funcs
		// written are claims of the pool the cache does not show yet.
		written  []string
		wantRes  ctrl.Result
		wantErr  error
		want     map[hfv1.ConditionType]wantCondition
		events   []string
		observed int64
		// claims is how many claims of the pool exist after the pass;
		// replicas and pending are its status's counts.
		claims, replicas, pending int32
		// ended is a claim the pass asked to end, with the reason.
		ended  string
		reason hfv1.EndReason
		// jobs is how many CIJobs exist after the pass.
		jobs int
	}{
		{
			name: "queued jobs create claims", pool: newPool(), objs: []client.Object{tmpl, queued(1), queued(2)},
			wantRes: ctrl.Result{RequeueAfter: poolResync},
			want: map[hfv1.ConditionType]wantCondition{
				hfv1.ReadyCondition:                        serving,
				hfv1.RunnerPoolScalingCondition:            {status: metav1.ConditionTrue, reason: hfv1.DemandIncreasedReason, says: []string{"Creating 2 VMs: 2 pending jobs"}},
				hfv1.RunnerPoolCapacityCondition:           {status: metav1.ConditionTrue, reason: hfv1.ReadyReason},
				hfv1.RunnerPoolScopeVerifiedCondition:      {status: metav1.ConditionTrue, reason: hfv1.ScopeVerifiedReason},
				hfv1.RunnerPoolReplacementBackoffCondition: {status: metav1.ConditionFalse, reason: hfv1.NoRecentFailuresReason},
			},
			// Scaling with demand is routine: a log line, no event.
			events: nil, observed: 2, claims: 2, replicas: 2, pending: 2, jobs: 2,
		},
		{
			name: "a pool whose platform differs from its template's creates nothing", pool: newPool(func(p *hfv1.RunnerPool) {
				p.Spec.Workload = hfv1.Workload{Type: hfv1.WorkloadGitLabCI, GitLab: &hfv1.GitLabWorkload{Tags: []string{"linux"}}}
			}),
			objs: []client.Object{tmpl, queued(1)}, wantRes: ctrl.Result{RequeueAfter: poolResync},
			want: map[hfv1.ConditionType]wantCondition{
				hfv1.ReadyCondition:                   {status: metav1.ConditionFalse, reason: hfv1.InvalidSpecReason, says: []string{"spec.workload.type is gitlab-ci", "has no spec.bootstrap.gitlab"}},
				hfv1.RunnerPoolCapacityCondition:      {status: metav1.ConditionFalse, reason: hfv1.InvalidSpecReason, says: []string{"No new VMs"}},
				hfv1.RunnerPoolScopeVerifiedCondition: {status: metav1.ConditionFalse, reason: hfv1.InvalidSpecReason},
			},
			// The scope check and the claims phase each say why.
			events: []string{"Warning InvalidSpec", "Warning InvalidSpec"}, observed: 2, pending: 1, jobs: 1,
		},
		{
			name: "a missing template creates nothing and says which", pool: newPool(), objs: []client.Object{queued(1)},
			wantRes: ctrl.Result{RequeueAfter: poolResync},
			want: map[hfv1.ConditionType]wantCondition{
				hfv1.ReadyCondition:                   {status: metav1.ConditionFalse, reason: hfv1.TemplateNotReadyReason, says: []string{"HypervisorMachineTemplate team/debian does not exist"}},
				hfv1.RunnerPoolScopeVerifiedCondition: {status: metav1.ConditionFalse, reason: hfv1.TemplateNotReadyReason},
				hfv1.RunnerPoolCapacityCondition:      {status: metav1.ConditionFalse, reason: hfv1.TemplateInvalidReason},
			},
			events: []string{"Warning TemplateNotReady", "Warning TemplateInvalid"}, observed: 2, pending: 1, jobs: 1,
		},
		{
			name: "a claim past its bootstrap timeout is failed and the pool wakes for the next limit", pool: newPool(),
			objs:    []client.Object{tmpl, starting("late", 11*time.Minute), starting("young", 10*time.Minute-10*time.Second)},
			wantRes: ctrl.Result{RequeueAfter: 10 * time.Second},
			want: map[hfv1.ConditionType]wantCondition{
				hfv1.ReadyCondition:             serving,
				hfv1.RunnerPoolScalingCondition: {status: metav1.ConditionTrue, reason: hfv1.DemandDecreasedReason, says: []string{"Moving from 1 to 0 VMs"}},
			},
			events: []string{"Warning BootstrapTimeout"}, observed: 2, claims: 2, replicas: 1,
			ended: "late", reason: scaling.BootstrapTimeout,
		},
		{
			name: "a failed read of the CIJobs ends the pass before observedGeneration moves", pool: newPool(), objs: []client.Object{tmpl, queued(1)},
			funcs: failLists(&hfv1.CIJobList{}), wantErr: errInjected,
			want: map[hfv1.ConditionType]wantCondition{hfv1.ReadyCondition: {}}, observed: 1, jobs: -1,
		},
		{
			name: "a cache behind the pool's own writes decides and writes nothing", pool: newPool(), objs: []client.Object{tmpl, queued(1)},
			written: []string{"runners-00001"}, wantRes: ctrl.Result{RequeueAfter: 250 * time.Millisecond},
			want: map[hfv1.ConditionType]wantCondition{hfv1.ReadyCondition: {}}, observed: 1, jobs: 1,
		},
		{
			name: "a failed status write is the pass's error", pool: newPool(), objs: []client.Object{tmpl},
			funcs: failStatusWrites(), wantErr: errInjected,
			want: map[hfv1.ConditionType]wantCondition{hfv1.ReadyCondition: {}}, observed: 1,
		},
		{
			name: "a deleted pool's demand records go with it", objs: []client.Object{tmpl, queued(1), queued(2)},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			objs := tc.objs
			if tc.pool != nil {
				objs = append(objs, tc.pool)
			}
			c := unitWorld(t, tc.funcs, objs...)
			rec := record.NewFakeRecorder(16)
			r := &RunnerPoolReconciler{Client: c, Recorder: rec, Clock: clocktesting.NewFakeClock(unitEpoch), Backoff: scaling.DefaultBackoff(),
				Scopes: scopesVouched{}, Workloads: ciPlatforms}
			for _, name := range tc.written {
				r.expect.Created(key, name, unitEpoch)
			}
			res, err := r.Reconcile(ctx, ctrl.Request{NamespacedName: key})
			var jobs hfv1.CIJobList
			if err := c.List(ctx, &jobs, client.InNamespace(ns)); err == nil && tc.jobs >= 0 && len(jobs.Items) != tc.jobs {
				t.Errorf("%d CIJobs, want %d", len(jobs.Items), tc.jobs)
			}
			var claims hfv1.MachineClaimList
			if err := c.List(ctx, &claims, client.InNamespace(ns)); err != nil || len(claims.Items) != int(tc.claims) {
				t.Errorf("%d claims (%v), want %d", len(claims.Items), err, tc.claims)
			}
			for _, claim := range claims.Items {
				e := claim.Spec.End
				switch {
				case claim.Name == tc.ended && (e == nil || e.Reason != tc.reason):
					t.Errorf("claim %s: spec.end %+v, want reason %s", claim.Name, e, tc.reason)
				case claim.Name != tc.ended && e != nil:
					t.Errorf("claim %s asked to end: %+v", claim.Name, e)
				}
			}
			got := &hfv1.RunnerPool{ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name}}
			if !checkPass(t, c, rec, got, res, err, passWant{res: tc.wantRes, err: tc.wantErr, events: tc.events, gone: tc.pool == nil,
				observed: tc.observed, conds: tc.want}) {
				return
			}
			if got.Status.Replicas != tc.replicas || got.Status.PendingJobs != tc.pending {
				t.Errorf("status: %d replicas and %d pending jobs, want %d and %d", got.Status.Replicas, got.Status.PendingJobs, tc.replicas, tc.pending)
			}
			// No row has schedules: the minimum the pool scales to (a
			// printer column) is the spec's.
			if got.Status.ObservedGeneration > 0 && got.Status.MinReplicas != got.Spec.Scaling.MinReplicas {
				t.Errorf("status.minReplicas %d, want spec.scaling.minReplicas %d", got.Status.MinReplicas, got.Spec.Scaling.MinReplicas)
			}
		})
	}
}

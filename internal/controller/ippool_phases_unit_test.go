package controller

import (
	"context"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/controller/machineclaim"
	"github.com/hyperfleet/hyperfleet/internal/ipam"
)

// TestReconcileIPPool runs the IPPool's phase lists from a starting state
// each: the normal list (parse, load the allocator, rebuild it from the
// claims, count) and the deletion list (hold while claims hold addresses,
// then forget), with the close that sets the status and writes it once.
func TestReconcileIPPool(t *testing.T) {
	const name = "lab"
	newPool := func(mut ...func(*hfv1.IPPool)) *hfv1.IPPool {
		p := &hfv1.IPPool{
			ObjectMeta: metav1.ObjectMeta{Name: name, Generation: 2, Finalizers: []string{hfv1.IPPoolFinalizer}},
			Spec:       hfv1.IPPoolSpec{Addresses: []string{"10.0.0.10-10.0.0.12"}, Prefix: 24, Gateways: []string{"10.0.0.1"}},
			Status:     hfv1.IPPoolStatus{ObservedGeneration: 1},
		}
		for _, m := range mut {
			m(p)
		}
		return p
	}
	holding := func(claim, address string) *hfv1.MachineClaim {
		c := &hfv1.MachineClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: claim, UID: types.UID("uid-" + claim)}}
		c.Status.Network = &hfv1.MachineNetworkStatus{IPAllocations: []hfv1.IPAllocation{{PoolRef: name, Address: address}}}
		return c
	}
	loaded := func(m *ipam.Manager) {
		p, err := ipam.ParsePool(machineclaim.PoolSpec(newPool()))
		if err != nil {
			panic(err)
		}
		m.SetPool(name, p)
		if _, err := m.Rebuild(name, nil); err != nil {
			panic(err)
		}
	}
	for _, tc := range []struct {
		name  string
		pool  *hfv1.IPPool
		objs  []client.Object
		funcs interceptor.Funcs
		// prep is the allocator as earlier passes left it.
		prep    func(*ipam.Manager)
		wantRes ctrl.Result
		wantErr error
		want    map[hfv1.ConditionType]wantCondition
		events  []string
		// observed is status.observedGeneration after the pass.
		observed int64
		// gone: the pass let the pool go, and the allocator forgot it.
		gone bool
		// counts are the allocator's after the pass (nil: not checked);
		// status are the counts the pool's status reports.
		counts, status *ipam.Counts
	}{
		{
			name: "a new pool gets its finalizer and nothing else", pool: newPool(func(p *hfv1.IPPool) { p.Finalizers = nil }),
			want:     map[hfv1.ConditionType]wantCondition{hfv1.ReadyCondition: {}},
			observed: 1,
		},
		{
			name: "a valid pool is counted and Ready", pool: newPool(),
			want: map[hfv1.ConditionType]wantCondition{
				hfv1.ReadyCondition:           {status: metav1.ConditionTrue, reason: hfv1.ReadyReason, says: []string{"0 of 3 addresses allocated"}},
				hfv1.IPPoolExhaustedCondition: {status: metav1.ConditionFalse, reason: hfv1.ReadyReason, says: []string{"3 of 3 addresses free"}},
			},
			observed: 2, counts: &ipam.Counts{Total: 3, Free: 3}, status: &ipam.Counts{Total: 3, Free: 3},
		},
		{
			name: "the claims' recorded addresses are rebuilt before counting", pool: newPool(),
			objs: []client.Object{holding("a", "10.0.0.10/24"), holding("b", "10.0.0.11/24"), holding("c", "10.0.0.12/24")},
			want: map[hfv1.ConditionType]wantCondition{
				hfv1.ReadyCondition:           {status: metav1.ConditionTrue, reason: hfv1.ReadyReason, says: []string{"3 of 3 addresses allocated"}},
				hfv1.IPPoolExhaustedCondition: {status: metav1.ConditionTrue, reason: hfv1.IPPoolExhaustedReason, says: []string{"spec.addresses"}},
			},
			observed: 2, counts: &ipam.Counts{Total: 3, Allocated: 3}, status: &ipam.Counts{Total: 3, Allocated: 3},
		},
		{
			name: "an invalid spec is reported and the allocator keeps the last valid one",
			pool: newPool(func(p *hfv1.IPPool) { p.Spec.Addresses = []string{"not-an-address"} }), prep: loaded,
			want: map[hfv1.ConditionType]wantCondition{
				hfv1.ReadyCondition:           {status: metav1.ConditionFalse, reason: hfv1.InvalidSpecReason, says: []string{"not-an-address"}},
				hfv1.IPPoolExhaustedCondition: {},
			},
			events:   []string{"Warning InvalidSpec"},
			observed: 2, counts: &ipam.Counts{Total: 3, Free: 3}, status: &ipam.Counts{},
		},
		{
			name: "a failed read of the claims ends the pass before observedGeneration moves", pool: newPool(),
			funcs:    failLists(&hfv1.MachineClaimList{}),
			wantErr:  errInjected,
			want:     map[hfv1.ConditionType]wantCondition{hfv1.ReadyCondition: {}},
			observed: 1, status: &ipam.Counts{},
		},
		{
			name: "a failed status write is the pass's error", pool: newPool(),
			funcs:    failStatusWrites(),
			wantErr:  errInjected,
			want:     map[hfv1.ConditionType]wantCondition{hfv1.ReadyCondition: {}},
			observed: 1, counts: &ipam.Counts{Total: 3, Free: 3},
		},
		{
			name: "a deleted pool whose addresses a claim holds is held", pool: deleting(newPool()), prep: loaded,
			objs: []client.Object{holding("keeps", "10.0.0.10/24")},
			want: map[hfv1.ConditionType]wantCondition{
				hfv1.ReadyCondition: {status: metav1.ConditionFalse, reason: hfv1.InUseReason, says: []string{"1 MachineClaims holding addresses from this pool: team/keeps"}},
			},
			events:   []string{"Warning InUse"},
			observed: 2, counts: &ipam.Counts{Total: 3, Free: 3},
		},
		{
			name: "a deleted pool no claim uses goes and the allocator forgets it", pool: deleting(newPool()), prep: loaded,
			gone: true,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			c := unitWorld(t, tc.funcs, append(tc.objs, tc.pool)...)
			rec := record.NewFakeRecorder(16)
			r := &IPPoolReconciler{Client: c, IPAM: ipam.NewManager(), Recorder: rec}
			if tc.prep != nil {
				tc.prep(r.IPAM)
			}
			res, err := r.Reconcile(ctx, ctrl.Request{NamespacedName: client.ObjectKeyFromObject(tc.pool)})
			counts, cerr := r.IPAM.Counts(name)
			switch {
			case tc.gone && cerr == nil:
				t.Errorf("the allocator still holds the pool: %+v", counts)
			case tc.counts != nil && (cerr != nil || counts != *tc.counts):
				t.Errorf("allocator counts %+v (%v), want %+v", counts, cerr, *tc.counts)
			}
			got := tc.pool.DeepCopy()
			if !checkPass(t, c, rec, got, res, err, passWant{res: tc.wantRes, err: tc.wantErr, events: tc.events, gone: tc.gone,
				finalizer: hfv1.IPPoolFinalizer, observed: tc.observed, conds: tc.want}) {
				return
			}
			if st := got.Status; tc.status != nil && (ipam.Counts{Total: st.Total, Allocated: st.Allocated, Free: st.Free}) != *tc.status {
				t.Errorf("status counts %d/%d/%d, want %+v", st.Total, st.Allocated, st.Free, *tc.status)
			}
		})
	}
}

package machineclaim

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/record"
	clocktesting "k8s.io/utils/clock/testing"
	ctrl "sigs.k8s.io/controller-runtime"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/conditions"
	"github.com/hyperfleet/hyperfleet/internal/controller/machineclaim/stuck"
)

// TestReadyAndPhase: Ready and the phase follow from the facts alone, in
// the order a claim records them.
func TestReadyAndPhase(t *testing.T) {
	set := func(c *hfv1.MachineClaim, typ hfv1.ConditionType, status metav1.ConditionStatus, reason hfv1.ConditionReason) {
		conditions.Set(&c.Status.Conditions, c.Generation, typ, status, reason, string(reason))
	}
	tests := []struct {
		name       string
		facts      func(c *hfv1.MachineClaim)
		wantPhase  hfv1.MachineClaimPhase
		wantReady  metav1.ConditionStatus
		wantReason hfv1.ConditionReason
	}{
		{"new", func(*hfv1.MachineClaim) {}, hfv1.MachineClaimPending, metav1.ConditionFalse, hfv1.ReconcilingReason},
		{"cloning", func(c *hfv1.MachineClaim) {
			c.Status.VMRef = &hfv1.VMReference{VMID: 100}
			set(c, hfv1.MachineClaimProvisionedCondition, metav1.ConditionFalse, hfv1.BuildingVMReason)
		}, hfv1.MachineClaimProvisioning, metav1.ConditionFalse, hfv1.BuildingVMReason},
		{"up, runner not yet online", func(c *hfv1.MachineClaim) {
			set(c, hfv1.MachineClaimProvisionedCondition, metav1.ConditionTrue, hfv1.ReadyReason)
		}, hfv1.MachineClaimBootstrapping, metav1.ConditionFalse, hfv1.WaitingForRunnerReason},
		{"up, not attested", func(c *hfv1.MachineClaim) {
			set(c, hfv1.MachineClaimProvisionedCondition, metav1.ConditionTrue, hfv1.ReadyReason)
			set(c, hfv1.MachineClaimAttestedCondition, metav1.ConditionFalse, hfv1.AttestationPendingReason)
		}, hfv1.MachineClaimBootstrapping, metav1.ConditionFalse, hfv1.AttestationPendingReason},
		{"runner online", func(c *hfv1.MachineClaim) {
			set(c, hfv1.MachineClaimProvisionedCondition, metav1.ConditionTrue, hfv1.ReadyReason)
			set(c, hfv1.MachineClaimBootstrappedCondition, metav1.ConditionTrue, hfv1.RunnerOnlineReason)
		}, hfv1.MachineClaimReady, metav1.ConditionTrue, hfv1.ReadyReason},
		{"draining", func(c *hfv1.MachineClaim) {
			set(c, hfv1.MachineClaimProvisionedCondition, metav1.ConditionTrue, hfv1.ReadyReason)
			set(c, hfv1.MachineClaimBootstrappedCondition, metav1.ConditionTrue, hfv1.RunnerOnlineReason)
			set(c, hfv1.MachineClaimEndingCondition, metav1.ConditionTrue, hfv1.RunnerBusyReason)
		}, hfv1.MachineClaimDraining, metav1.ConditionFalse, hfv1.RunnerBusyReason},
		{"failed", func(c *hfv1.MachineClaim) {
			c.Status.End = &hfv1.MachineClaimEnd{Reason: hfv1.EndFailed, Failed: true}
			set(c, hfv1.MachineClaimEndingCondition, metav1.ConditionTrue, hfv1.ProvisioningFailedReason)
		}, hfv1.MachineClaimFailed, metav1.ConditionFalse, hfv1.ProvisioningFailedReason},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := &hfv1.MachineClaim{}
			tc.facts(c)
			SummariseReady(c)
			ready := hfv1.FindCondition(c.Status.Conditions, hfv1.ReadyCondition)
			if got := PhaseOf(c); got != tc.wantPhase || ready == nil || ready.Status != tc.wantReady || ready.Reason != string(tc.wantReason) {
				t.Fatalf("phase %s, Ready %+v; want %s, Ready=%s %s", got, ready, tc.wantPhase, tc.wantReady, tc.wantReason)
			}
		})
	}
}

// TestDeriveStatus: the one function that sets a claim's conditions turns
// the facts a pass recorded, over the status the claim was read with,
// into its conditions, Ready, phase and Stuck: a fact replaces the stored
// condition of its type and leaves the others; a later fact about the
// same condition replaces an earlier one; a transition time moves only
// when the status does; Stuck turns True once the claim overstayed its
// phase's bound (reported once per stay) and False once it moved on.
func TestDeriveStatus(t *testing.T) {
	stored := metav1.NewTime(unitEpoch)
	cond := func(typ hfv1.ConditionType, status metav1.ConditionStatus, reason hfv1.ConditionReason) metav1.Condition {
		return metav1.Condition{Type: string(typ), Status: status, Reason: string(reason), Message: string(reason), LastTransitionTime: stored}
	}
	type fact struct {
		typ    hfv1.ConditionType
		status metav1.ConditionStatus
		reason hfv1.ConditionReason
	}
	type want struct {
		status metav1.ConditionStatus
		reason hfv1.ConditionReason
		moved  bool // the transition time is this pass's, not the stored one
	}
	const (
		provisioned  = hfv1.MachineClaimProvisionedCondition
		ending       = hfv1.MachineClaimEndingCondition
		attested     = hfv1.MachineClaimAttestedCondition
		bootstrapped = hfv1.MachineClaimBootstrappedCondition
		owned        = hfv1.MachineClaimOwnershipVerifiedCondition
		stuckCond    = hfv1.MachineClaimStuckCondition
		ready        = hfv1.ReadyCondition
		tru, fals    = metav1.ConditionTrue, metav1.ConditionFalse
	)
	// cloningSince starts a claim in Provisioning since entered, cloning
	// its VM, with the stored conditions that say so and extra ones.
	cloningSince := func(entered time.Time, extra ...metav1.Condition) func(c *hfv1.MachineClaim) {
		return func(c *hfv1.MachineClaim) {
			c.Status.VMRef = &hfv1.VMReference{VMID: 100}
			c.Status.Phase = hfv1.MachineClaimProvisioning
			c.Status.PhaseTimes = &hfv1.PhaseTimes{Provisioning: &metav1.Time{Time: entered}}
			c.Status.Conditions = append([]metav1.Condition{cond(provisioned, fals, hfv1.BuildingVMReason), cond(ready, fals, hfv1.BuildingVMReason)}, extra...)
		}
	}
	tests := []struct {
		name      string
		start     func(c *hfv1.MachineClaim)
		facts     []fact
		wantConds map[hfv1.ConditionType]want
		wantOrder []hfv1.ConditionType
		wantPhase hfv1.MachineClaimPhase
		// now is the pass's time after unitEpoch.
		now time.Duration
		// wantStuck is what the Stuck message must say when the claim
		// became stuck this pass (reported: one event), "" when it did
		// not; wantWake, when set, is when it would become stuck.
		wantStuck string
		wantWake  time.Duration
	}{
		{
			name:      "a new claim without facts waits to be provisioned",
			start:     func(*hfv1.MachineClaim) {},
			wantConds: map[hfv1.ConditionType]want{ready: {fals, hfv1.ReconcilingReason, true}},
			wantOrder: []hfv1.ConditionType{ready},
			wantPhase: hfv1.MachineClaimPending,
		},
		{
			name: "a pass without facts keeps the stored conditions and their times",
			start: func(c *hfv1.MachineClaim) {
				c.Status.Conditions = []metav1.Condition{cond(provisioned, tru, hfv1.ReadyReason), cond(bootstrapped, tru, hfv1.RunnerOnlineReason),
					cond(ready, tru, hfv1.ReadyReason)}
			},
			wantConds: map[hfv1.ConditionType]want{provisioned: {tru, hfv1.ReadyReason, false}, bootstrapped: {tru, hfv1.RunnerOnlineReason, false},
				ready: {tru, hfv1.ReadyReason, false}},
			wantPhase: hfv1.MachineClaimReady,
		},
		{
			name:      "cloning: Provisioned False, Ready repeats it",
			start:     func(c *hfv1.MachineClaim) { c.Status.VMRef = &hfv1.VMReference{VMID: 100} },
			facts:     []fact{{provisioned, fals, hfv1.BuildingVMReason}},
			wantConds: map[hfv1.ConditionType]want{provisioned: {fals, hfv1.BuildingVMReason, true}, ready: {fals, hfv1.BuildingVMReason, true}},
			wantOrder: []hfv1.ConditionType{provisioned, ready},
			wantPhase: hfv1.MachineClaimProvisioning,
		},
		{
			name: "the VM up: a fact replaces the stored condition of its type; the time moves with the status",
			start: func(c *hfv1.MachineClaim) {
				c.Status.VMRef = &hfv1.VMReference{VMID: 100}
				c.Status.Conditions = []metav1.Condition{cond(provisioned, fals, hfv1.BuildingVMReason), cond(ready, fals, hfv1.BuildingVMReason)}
			},
			facts: []fact{{provisioned, tru, hfv1.ReadyReason}, {owned, tru, hfv1.ReadyReason}},
			wantConds: map[hfv1.ConditionType]want{provisioned: {tru, hfv1.ReadyReason, true}, owned: {tru, hfv1.ReadyReason, true},
				ready: {fals, hfv1.WaitingForRunnerReason, false}},
			wantOrder: []hfv1.ConditionType{provisioned, ready, owned},
			wantPhase: hfv1.MachineClaimBootstrapping,
		},
		{
			name: "the same status again keeps the stored transition time",
			start: func(c *hfv1.MachineClaim) {
				c.Status.Conditions = []metav1.Condition{cond(provisioned, fals, hfv1.BuildingVMReason)}
			},
			facts:     []fact{{provisioned, fals, hfv1.ConditionReason("Starting")}},
			wantConds: map[hfv1.ConditionType]want{provisioned: {fals, "Starting", false}, ready: {fals, "Starting", true}},
			wantPhase: hfv1.MachineClaimPending,
		},
		{
			name: "a later fact about the same condition in the pass wins",
			start: func(c *hfv1.MachineClaim) {
				c.Status.Conditions = []metav1.Condition{cond(provisioned, tru, hfv1.ReadyReason)}
			},
			facts:     []fact{{provisioned, fals, hfv1.BuildingVMReason}, {attested, fals, hfv1.AttestationPendingReason}, {provisioned, tru, hfv1.ReadyReason}},
			wantConds: map[hfv1.ConditionType]want{provisioned: {tru, hfv1.ReadyReason, false}, attested: {fals, hfv1.AttestationPendingReason, true}, ready: {fals, hfv1.AttestationPendingReason, true}},
			wantOrder: []hfv1.ConditionType{provisioned, attested, ready},
			wantPhase: hfv1.MachineClaimBootstrapping,
		},
		{
			name: "the credential on its way: Ready repeats Bootstrapped",
			start: func(c *hfv1.MachineClaim) {
				c.Status.Conditions = []metav1.Condition{cond(provisioned, tru, hfv1.ReadyReason)}
			},
			facts:     []fact{{bootstrapped, fals, hfv1.CredentialDeliveredReason}},
			wantConds: map[hfv1.ConditionType]want{provisioned: {tru, hfv1.ReadyReason, false}, bootstrapped: {fals, hfv1.CredentialDeliveredReason, true}, ready: {fals, hfv1.CredentialDeliveredReason, true}},
			wantPhase: hfv1.MachineClaimBootstrapping,
		},
		{
			name: "the runner online",
			start: func(c *hfv1.MachineClaim) {
				c.Status.Conditions = []metav1.Condition{cond(provisioned, tru, hfv1.ReadyReason), cond(bootstrapped, fals, hfv1.CredentialDeliveredReason)}
			},
			facts: []fact{{bootstrapped, tru, hfv1.RunnerOnlineReason}},
			wantConds: map[hfv1.ConditionType]want{provisioned: {tru, hfv1.ReadyReason, false}, bootstrapped: {tru, hfv1.RunnerOnlineReason, true},
				ready: {tru, hfv1.ReadyReason, true}},
			wantPhase: hfv1.MachineClaimReady,
		},
		{
			name: "asked to end while its job runs: Ending, the others kept",
			start: func(c *hfv1.MachineClaim) {
				c.Status.Conditions = []metav1.Condition{cond(provisioned, tru, hfv1.ReadyReason), cond(bootstrapped, tru, hfv1.RunnerOnlineReason), cond(ready, tru, hfv1.ReadyReason)}
			},
			facts: []fact{{ending, tru, hfv1.RunnerBusyReason}},
			wantConds: map[hfv1.ConditionType]want{provisioned: {tru, hfv1.ReadyReason, false}, bootstrapped: {tru, hfv1.RunnerOnlineReason, false},
				ending: {tru, hfv1.RunnerBusyReason, true}, ready: {fals, hfv1.RunnerBusyReason, true}},
			wantPhase: hfv1.MachineClaimDraining,
		},
		{
			name: "an ownership mismatch fails the claim",
			start: func(c *hfv1.MachineClaim) {
				c.Status.VMRef = &hfv1.VMReference{VMID: 100}
				c.Status.End = &hfv1.MachineClaimEnd{Reason: hfv1.EndFailed, Failed: true}
			},
			facts: []fact{{owned, fals, hfv1.OwnershipMismatchReason}, {provisioned, fals, hfv1.OwnershipMismatchReason}, {ending, tru, hfv1.OwnershipMismatchReason}},
			wantConds: map[hfv1.ConditionType]want{owned: {fals, hfv1.OwnershipMismatchReason, true}, provisioned: {fals, hfv1.OwnershipMismatchReason, true},
				ending: {tru, hfv1.OwnershipMismatchReason, true}, ready: {fals, hfv1.OwnershipMismatchReason, true}},
			wantOrder: []hfv1.ConditionType{owned, provisioned, ending, ready},
			wantPhase: hfv1.MachineClaimFailed,
		},
		{
			name: "the VM destroyed on a claim that ends",
			start: func(c *hfv1.MachineClaim) {
				c.Status.End = &hfv1.MachineClaimEnd{Reason: hfv1.EndPoweredOff}
				c.Status.Conditions = []metav1.Condition{cond(provisioned, tru, hfv1.ReadyReason), cond(ending, tru, hfv1.DeletingVMReason)}
			},
			facts:     []fact{{provisioned, fals, hfv1.VMDeletedReason}, {ending, tru, hfv1.VMDeletedReason}},
			wantConds: map[hfv1.ConditionType]want{provisioned: {fals, hfv1.VMDeletedReason, true}, ending: {tru, hfv1.VMDeletedReason, false}, ready: {fals, hfv1.VMDeletedReason, true}},
			wantPhase: hfv1.MachineClaimTerminating,
		},
		{
			name:      "within the Provisioning bound: not stuck, woken when it would be",
			start:     cloningSince(unitEpoch),
			now:       9 * time.Minute,
			wantConds: map[hfv1.ConditionType]want{provisioned: {fals, hfv1.BuildingVMReason, false}, ready: {fals, hfv1.BuildingVMReason, false}},
			wantPhase: hfv1.MachineClaimProvisioning,
			wantWake:  time.Minute,
		},
		{
			name:  "past the Provisioning bound: Stuck True, naming the phase, the task and the condition it waits on",
			start: cloningSince(unitEpoch),
			now:   10 * time.Minute,
			wantConds: map[hfv1.ConditionType]want{provisioned: {fals, hfv1.BuildingVMReason, false}, ready: {fals, hfv1.BuildingVMReason, false},
				stuckCond: {tru, hfv1.NoProgressReason, true}},
			wantOrder: []hfv1.ConditionType{provisioned, ready, stuckCond},
			wantPhase: hfv1.MachineClaimProvisioning,
			wantStuck: "In phase Provisioning since 2025-01-01T12:00:00Z, longer than the manager's bound for it (10m0s); waiting on hypervisor task clone (UPID:pve1:0001:clone); Provisioned=False BuildingVM: BuildingVM",
		},
		{
			name:  "still stuck in the same stay: Stuck kept, not reported again",
			start: cloningSince(unitEpoch.Add(-time.Hour), cond(stuckCond, tru, hfv1.NoProgressReason)),
			wantConds: map[hfv1.ConditionType]want{provisioned: {fals, hfv1.BuildingVMReason, false}, ready: {fals, hfv1.BuildingVMReason, false},
				stuckCond: {tru, hfv1.NoProgressReason, false}},
			wantPhase: hfv1.MachineClaimProvisioning,
		},
		{
			name: "stuck again in a later stay: the earlier Stuck is replaced and reported anew",
			start: func(c *hfv1.MachineClaim) {
				c.Status.End = &hfv1.MachineClaimEnd{Reason: hfv1.EndPoweredOff}
				c.Status.Phase = hfv1.MachineClaimTerminating
				c.Status.PhaseTimes = &hfv1.PhaseTimes{Terminating: &metav1.Time{Time: unitEpoch.Add(time.Minute)}}
				c.Status.Conditions = []metav1.Condition{cond(ending, tru, hfv1.DeletingVMReason), cond(ready, fals, hfv1.DeletingVMReason),
					cond(stuckCond, tru, hfv1.NoProgressReason)}
			},
			now: 6 * time.Minute,
			wantConds: map[hfv1.ConditionType]want{ending: {tru, hfv1.DeletingVMReason, false}, ready: {fals, hfv1.DeletingVMReason, false},
				stuckCond: {tru, hfv1.NoProgressReason, true}},
			wantPhase: hfv1.MachineClaimTerminating,
			wantStuck: "In phase Terminating since 2025-01-01T12:01:00Z, longer than the manager's bound for it (5m0s); waiting on Ready=False DeletingVM: DeletingVM",
		},
		{
			name:  "a stuck claim that moves on: Stuck False, the new phase's time stamped",
			start: cloningSince(unitEpoch.Add(-time.Hour), cond(stuckCond, tru, hfv1.NoProgressReason)),
			facts: []fact{{provisioned, tru, hfv1.ReadyReason}},
			wantConds: map[hfv1.ConditionType]want{provisioned: {tru, hfv1.ReadyReason, true}, ready: {fals, hfv1.WaitingForRunnerReason, false},
				stuckCond: {fals, hfv1.ProgressingReason, true}},
			wantPhase: hfv1.MachineClaimBootstrapping,
		},
		{
			name: "a finished claim keeps its Stuck condition as it was",
			start: func(c *hfv1.MachineClaim) {
				c.Status.End = &hfv1.MachineClaimEnd{Reason: hfv1.EndPoweredOff, FinishedAt: &stored}
				c.Status.Phase = hfv1.MachineClaimTerminating
				c.Status.PhaseTimes = &hfv1.PhaseTimes{Terminating: &metav1.Time{Time: unitEpoch.Add(-time.Hour)}}
				c.Status.Conditions = []metav1.Condition{cond(ending, tru, hfv1.VMDeletedReason), cond(stuckCond, tru, hfv1.NoProgressReason)}
			},
			wantConds: map[hfv1.ConditionType]want{ending: {tru, hfv1.VMDeletedReason, false}, ready: {fals, hfv1.VMDeletedReason, true},
				stuckCond: {tru, hfv1.NoProgressReason, false}},
			wantPhase: hfv1.MachineClaimFinished,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := &hfv1.MachineClaim{}
			c.Generation = 3
			tc.start(c)
			var facts claimFacts
			if c.Status.VMRef != nil {
				// The task the reconciler keeps in memory (vm_progress.go).
				facts.task = "hypervisor task clone (UPID:pve1:0001:clone)"
			}
			recorded := map[hfv1.ConditionType]bool{}
			for _, f := range tc.facts {
				facts.record(f.typ, f.status, f.reason, string(f.reason))
				recorded[f.typ] = true
			}
			now := unitEpoch.Add(tc.now)
			d := deriveStatus(c, &facts, now, unitStuckBounds)
			if d.phase != tc.wantPhase || c.Status.Phase != tc.wantPhase {
				t.Errorf("phase %s (status %s), want %s", d.phase, c.Status.Phase, tc.wantPhase)
			}
			if entered := stuck.PhaseTime(c.Status.PhaseTimes, d.phase); d.changed && (entered == nil || *entered == nil || !(*entered).Time.Equal(now)) {
				t.Errorf("phase %s entered this pass, but status.phaseTimes = %+v", d.phase, c.Status.PhaseTimes)
			}
			if d.nowStuck != tc.wantStuck {
				t.Errorf("reported stuck %q, want %q", d.nowStuck, tc.wantStuck)
			}
			if tc.wantStuck != "" && hfv1.FindCondition(c.Status.Conditions, stuckCond).Message != tc.wantStuck {
				t.Errorf("Stuck message %q, want the one reported", hfv1.FindCondition(c.Status.Conditions, stuckCond).Message)
			}
			if tc.wantWake != 0 && d.stuck.Wake != tc.wantWake {
				t.Errorf("wake after %s, want %s", d.stuck.Wake, tc.wantWake)
			}
			for typ, w := range tc.wantConds {
				got := hfv1.FindCondition(c.Status.Conditions, typ)
				switch {
				case got == nil:
					t.Errorf("%s missing; conditions %+v", typ, c.Status.Conditions)
				case got.Status != w.status || got.Reason != string(w.reason):
					t.Errorf("%s = %s %s, want %s %s", typ, got.Status, got.Reason, w.status, w.reason)
				case got.LastTransitionTime.Equal(&stored) == w.moved:
					t.Errorf("%s transition time %s; moved = %v wanted", typ, got.LastTransitionTime, w.moved)
				case (typ == ready || recorded[typ]) && got.ObservedGeneration != c.Generation:
					t.Errorf("%s observedGeneration %d, want the claim's %d", typ, got.ObservedGeneration, c.Generation)
				}
			}
			if len(c.Status.Conditions) != len(tc.wantConds) {
				t.Errorf("%d conditions, want %d: %+v", len(c.Status.Conditions), len(tc.wantConds), c.Status.Conditions)
			}
			if tc.wantOrder != nil {
				var order []hfv1.ConditionType
				for _, got := range c.Status.Conditions {
					order = append(order, hfv1.ConditionType(got.Type))
				}
				if !slices.Equal(order, tc.wantOrder) {
					t.Errorf("conditions listed %v, want %v", order, tc.wantOrder)
				}
			}
		})
	}
}

// unitStuckBounds are the stuck bounds of the status tests.
var unitStuckBounds = stuck.Bounds{Pending: 15 * time.Minute, Provisioning: 10 * time.Minute, Terminating: 5 * time.Minute}

// TestStuckAcrossPasses follows one claim through passes on a fake clock
// as closeScope runs them (deriveStatus, then the stuck detector's
// Report): the claim is woken when it would become stuck; Stuck names the
// phase and what the claim waits on; its event comes once per stay; a
// claim that moves on is Stuck False, and stuck again in a later phase is
// reported anew; a finished claim is left alone.
func TestStuckAcrossPasses(t *testing.T) {
	clk := clocktesting.NewFakeClock(unitEpoch)
	events := record.NewFakeRecorder(10)
	detector := &stuck.Detector{Recorder: events, Bounds: stuck.Bounds{Provisioning: 10 * time.Minute, Terminating: 5 * time.Minute}}
	c := unitClaim("stuck-across-passes", 0)
	c.Namespace = "status-test"
	c.Status.VMRef = &hfv1.VMReference{VMID: 100}
	ctx := context.Background()
	pass := func(record func(f *claimFacts)) ctrl.Result {
		facts := claimFacts{task: "hypervisor task clone (UPID:pve1:0001:clone)"}
		if record != nil {
			record(&facts)
		}
		d := deriveStatus(&c, &facts, clk.Now(), detector.Bounds)
		return detector.Report(ctx, &c, d.phase, d.stuck, d.nowStuck, ctrl.Result{})
	}
	stuckCond := func() *metav1.Condition {
		return hfv1.FindCondition(c.Status.Conditions, hfv1.MachineClaimStuckCondition)
	}

	pass(func(f *claimFacts) {
		f.record(hfv1.MachineClaimProvisionedCondition, metav1.ConditionFalse, hfv1.BuildingVMReason, "cloning from template 9000")
	})
	clk.Step(4 * time.Minute)
	if res := pass(nil); res.RequeueAfter != 6*time.Minute || stuckCond() != nil {
		t.Fatalf("before the bound: requeue %s, Stuck %+v", res.RequeueAfter, stuckCond())
	}

	clk.Step(6 * time.Minute)
	for range 3 {
		pass(nil)
	}
	if cond := stuckCond(); cond == nil || cond.Status != metav1.ConditionTrue || cond.Reason != string(hfv1.NoProgressReason) ||
		!strings.Contains(cond.Message, "In phase Provisioning") || !strings.Contains(cond.Message, "clone (UPID:pve1:0001:clone)") ||
		!strings.Contains(cond.Message, "BuildingVM: cloning from template 9000") {
		t.Fatalf("Stuck = %+v", cond)
	}
	if got := drainEvents(events); len(got) != 1 || !strings.HasPrefix(got[0], "Warning Stuck In phase Provisioning") {
		t.Fatalf("events %q, want exactly one Stuck event", got)
	}

	// Moves on: no longer stuck.
	c.Status.End = &hfv1.MachineClaimEnd{Reason: hfv1.EndPoweredOff, StartedAt: metav1.NewTime(clk.Now())}
	pass(nil)
	if cond := stuckCond(); c.Status.Phase != hfv1.MachineClaimTerminating || cond.Status != metav1.ConditionFalse || cond.Reason != string(hfv1.ProgressingReason) {
		t.Fatalf("after progress: phase %s, Stuck = %+v", c.Status.Phase, cond)
	}

	// Stuck again in a later phase: a new event for the new stay.
	clk.Step(5 * time.Minute)
	pass(nil)
	if got := drainEvents(events); len(got) != 1 || !strings.HasPrefix(got[0], "Warning Stuck In phase Terminating") {
		t.Fatalf("events %q, want one Stuck event for the stay in Terminating", got)
	}
	// Finished: left as it was, no event.
	c.Status.End.FinishedAt = &metav1.Time{Time: clk.Now()}
	before := *stuckCond()
	if res := pass(nil); res.RequeueAfter != 0 || c.Status.Phase != hfv1.MachineClaimFinished || *stuckCond() != before || len(events.Events) != 0 {
		t.Fatalf("finished: requeue %s, phase %s, Stuck %+v (was %+v), %d events", res.RequeueAfter, c.Status.Phase, stuckCond(), before, len(events.Events))
	}
}

// TestFactsReadThrough: a step later in the pass reads a condition as the
// pass left it: the fact recorded this pass, else the stored condition.
func TestFactsReadThrough(t *testing.T) {
	c := &hfv1.MachineClaim{}
	c.Status.Conditions = []metav1.Condition{
		{Type: string(hfv1.MachineClaimProvisionedCondition), Status: metav1.ConditionFalse, Reason: string(hfv1.BuildingVMReason)},
		{Type: string(hfv1.MachineClaimOwnershipVerifiedCondition), Status: metav1.ConditionTrue, Reason: string(hfv1.ReadyReason)},
	}
	var facts claimFacts
	if facts.isTrue(c, hfv1.MachineClaimProvisionedCondition) || !facts.isFalse(c, hfv1.MachineClaimProvisionedCondition) || facts.endingReason(c) != "" {
		t.Fatal("without facts the stored conditions must be read")
	}
	facts.record(hfv1.MachineClaimProvisionedCondition, metav1.ConditionTrue, hfv1.ReadyReason, "up")
	facts.record(hfv1.MachineClaimOwnershipVerifiedCondition, metav1.ConditionFalse, hfv1.OwnershipMismatchReason, "not ours")
	facts.ending(hfv1.DeletingVMReason, "deleting")
	if !facts.isTrue(c, hfv1.MachineClaimProvisionedCondition) || !facts.isFalse(c, hfv1.MachineClaimOwnershipVerifiedCondition) ||
		facts.endingReason(c) != string(hfv1.DeletingVMReason) {
		t.Errorf("the pass's facts must be read over the stored conditions")
	}
	if got := facts.condition(c, hfv1.MachineClaimProvisionedCondition); got.Message != "up" {
		t.Errorf("Provisioned message %q, want the fact's", got.Message)
	}
	if hfv1.IsConditionTrue(c.Status.Conditions, hfv1.MachineClaimProvisionedCondition) {
		t.Error("recording a fact must not write the claim's conditions")
	}
}

// TestPendingFromCreation: a claim whose first pass already provisions it
// (its template was valid before the claim was first seen) was Pending
// from its creation, and its phase times say so; a claim seen Pending
// first keeps the time it was seen; Pending is never stamped again.
func TestPendingFromCreation(t *testing.T) {
	created := metav1.NewTime(time.Date(2026, 11, 27, 12, 0, 0, 0, time.UTC))
	now := metav1.NewTime(created.Add(3 * time.Second))
	t.Run("first pass provisions", func(t *testing.T) {
		c := &hfv1.MachineClaim{ObjectMeta: metav1.ObjectMeta{CreationTimestamp: created}}
		if left, changed := enterPhase(c, hfv1.MachineClaimProvisioning, now); left != "" || !changed {
			t.Fatalf("enterPhase = %q, %v; want \"\", true", left, changed)
		}
		pt := c.Status.PhaseTimes
		if pt.Pending == nil || !pt.Pending.Equal(&created) || pt.Provisioning == nil || !pt.Provisioning.Equal(&now) {
			t.Fatalf("phase times %+v, want pending at creation %s and provisioning at %s", pt, created, now)
		}
	})
	t.Run("first pass pending", func(t *testing.T) {
		c := &hfv1.MachineClaim{ObjectMeta: metav1.ObjectMeta{CreationTimestamp: created}}
		enterPhase(c, hfv1.MachineClaimPending, now)
		later := metav1.NewTime(now.Add(time.Second))
		enterPhase(c, hfv1.MachineClaimProvisioning, later)
		if pt := c.Status.PhaseTimes; !pt.Pending.Equal(&now) || !pt.Provisioning.Equal(&later) {
			t.Fatalf("phase times %+v, want pending at %s and provisioning at %s", pt, now, later)
		}
	})
	t.Run("no creation time", func(t *testing.T) {
		c := &hfv1.MachineClaim{}
		enterPhase(c, hfv1.MachineClaimBootstrapping, now)
		if pt := c.Status.PhaseTimes; pt.Pending == nil || !pt.Pending.Equal(&now) {
			t.Fatalf("phase times %+v, want pending at %s", pt, now)
		}
	})
}

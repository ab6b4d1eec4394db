package machineclaim

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/record"
	clocktesting "k8s.io/utils/clock/testing"
	ctrl "sigs.k8s.io/controller-runtime"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/hypervisors"
	"github.com/hyperfleet/hyperfleet/internal/phase"
	"github.com/hyperfleet/hyperfleet/internal/testworld/testobjects"
	"github.com/hyperfleet/hyperfleet/internal/vmspec"
	"github.com/hyperfleet/hyperfleet/pkg/ownership"
	"github.com/hyperfleet/hyperfleet/pkg/provider"
	fakeprovider "github.com/hyperfleet/hyperfleet/pkg/provider/fake"
	"github.com/hyperfleet/hyperfleet/pkg/workload"
)

// The table tests of the claim's services at their seam (docs/testing.md):
// each row is a starting state (a claim, the in-memory hypervisor of
// pkg/provider/fake behind the registry, a fake clock), one or more calls
// of the service, and the answer, conditions and events it must end with.

// unitCluster is the HypervisorCluster the service tests connect.
const unitCluster = "pve-a"

// serviceWorld is a reconciler whose registry has unitCluster connected
// and Ready on an in-memory hypervisor, with a fake clock and recorder.
func serviceWorld(t *testing.T) (*Reconciler, *fakeprovider.Cluster, *clocktesting.FakeClock, *record.FakeRecorder) {
	t.Helper()
	clk := clocktesting.NewFakeClock(unitEpoch)
	hv, err := fakeprovider.NewCluster(clk, fakeprovider.DefaultOptions())
	if err != nil {
		t.Fatal(err)
	}
	signer := testobjects.Signer(t)
	reg := hypervisors.NewRegistry()
	cfg := provider.ClusterConfig{Name: unitCluster, VMIDStart: 1000, VMIDEnd: 1999, Nodes: []string{"node-1"}}
	if _, err := reg.Connect(unitCluster, cfg, func() (provider.Provider, error) {
		return hv.NewProvider(cfg, provider.Deps{Signer: signer})
	}); err != nil {
		t.Fatal(err)
	}
	reg.SetHealth(unitCluster, hypervisors.Health{Ready: true}, unitEpoch)
	rec := record.NewFakeRecorder(32)
	return &Reconciler{Registry: reg, Signer: signer, Recorder: rec, Clock: clk}, hv, clk, rec
}

// ownedVM puts a stopped VM on hv whose ownership marker names claim, as
// the claim's own clone would have left it.
func ownedVM(t *testing.T, hv *fakeprovider.Cluster, signer *ownership.Signer, claim *hfv1.MachineClaim, vmid int) {
	t.Helper()
	o := vmspec.Owner(claim)
	desc := signer.ForCluster(ownership.ClusterIdentity{Name: unitCluster}).Description("", ownership.Record{
		Namespace: o.Namespace, Name: o.Name, UID: o.UID, Pool: o.Pool, VMID: vmid, CreatedAt: o.CreatedAt})
	if _, err := hv.AddForeignVM(fakeprovider.ForeignVM{VMID: vmid, Name: claim.Name, Description: desc}); err != nil {
		t.Fatal(err)
	}
}

// placedClaimOn is a claim that ended, whose status names VM vmid on
// cluster.
func placedClaimOn(cluster string, vmid int32) *hfv1.MachineClaim {
	c := unitClaim("runner-1", 0)
	c.Spec.TemplateRef.Name = "debian"
	c.Status.VMRef = hfv1.NewVMReference(cluster, string(fakeprovider.FormatID(int(vmid))), "node-1")
	c.Status.End = &hfv1.MachineClaimEnd{Reason: hfv1.EndPoweredOff, StartedAt: metav1.NewTime(unitEpoch)}
	return &c
}

// deletedClaimOn is placedClaimOn's claim ended by its deletion.
func deletedClaimOn(cluster string, vmid int32) func() *hfv1.MachineClaim {
	return func() *hfv1.MachineClaim {
		c := placedClaimOn(cluster, vmid)
		c.Status.End.Reason = hfv1.EndDeleted
		return c
	}
}

// drainEvents returns the events recorded so far.
func drainEvents(rec *record.FakeRecorder) []string {
	var out []string
	for {
		select {
		case e := <-rec.Events:
			out = append(out, e)
		default:
			return out
		}
	}
}

// hasEvent reports whether one of events starts with prefix ("Type Reason").
func hasEvent(events []string, prefix string) bool {
	for _, e := range events {
		if strings.HasPrefix(e, prefix) {
			return true
		}
	}
	return false
}

// TestDeleteVM runs the VM service's deletion (deleteVM) from each
// starting state, as many passes as the row says with the clock moved past
// the provider's operation time between them.
func TestDeleteVM(t *testing.T) {
	errStorage := errors.New("storage is locked")
	for name, tc := range map[string]struct {
		claim func() *hfv1.MachineClaim
		// setup prepares the hypervisor for the claim.
		setup  func(t *testing.T, r *Reconciler, hv *fakeprovider.Cluster, claim *hfv1.MachineClaim)
		passes int
		// want is the last pass's answer.
		wantDone    bool
		wantRequeue time.Duration
		wantEnding  hfv1.ConditionReason
		// wantOwnership is the OwnershipVerified reason, "" for none.
		wantOwnership hfv1.ConditionReason
		wantEvent     string
		wantNoEvent   bool
		// wantVM is whether the VM is still on the hypervisor after.
		wantVM bool
	}{
		"no VM": {
			claim:  func() *hfv1.MachineClaim { c := unitClaim("runner-1", 0); return &c },
			passes: 1, wantDone: true,
		},
		"cluster not connected": {
			claim:  func() *hfv1.MachineClaim { return placedClaimOn("pve-gone", 1001) },
			passes: 1, wantRequeue: 2 * time.Second, wantEnding: hfv1.ClusterUnavailableReason,
		},
		"VM already gone": {
			claim:  func() *hfv1.MachineClaim { return placedClaimOn(unitCluster, 1001) },
			passes: 1, wantDone: true, wantEnding: hfv1.VMDeletedReason,
			// A VM that powered off by itself ends routinely: logged, no
			// event (routineEnd).
			wantNoEvent: true,
		},
		"VM already gone, the claim deleted by a person: in an event": {
			claim:  deletedClaimOn(unitCluster, 1001),
			passes: 1, wantDone: true, wantEnding: hfv1.VMDeletedReason, wantEvent: "Normal VMDeleted",
		},
		"own VM: the destroy starts": {
			claim: func() *hfv1.MachineClaim { return placedClaimOn(unitCluster, 1001) },
			setup: func(t *testing.T, r *Reconciler, hv *fakeprovider.Cluster, claim *hfv1.MachineClaim) {
				ownedVM(t, hv, r.Signer, claim, 1001)
			},
			passes: 1, wantRequeue: time.Second, wantEnding: hfv1.DeletingVMReason, wantVM: true,
		},
		"own VM: destroyed in the next pass": {
			claim: deletedClaimOn(unitCluster, 1001),
			setup: func(t *testing.T, r *Reconciler, hv *fakeprovider.Cluster, claim *hfv1.MachineClaim) {
				ownedVM(t, hv, r.Signer, claim, 1001)
			},
			passes: 2, wantDone: true, wantEnding: hfv1.VMDeletedReason, wantEvent: "Normal VMDeleted",
		},
		"someone else's VM is never touched": {
			claim: func() *hfv1.MachineClaim { return placedClaimOn(unitCluster, 1001) },
			setup: func(t *testing.T, r *Reconciler, hv *fakeprovider.Cluster, claim *hfv1.MachineClaim) {
				if _, err := hv.AddForeignVM(fakeprovider.ForeignVM{VMID: 1001, Name: "admin-vm"}); err != nil {
					t.Fatal(err)
				}
			},
			passes: 1, wantRequeue: ownershipRecheck, wantEnding: hfv1.OwnershipMismatchReason,
			wantOwnership: hfv1.OwnershipMismatchReason, wantEvent: "Warning OwnershipMismatch", wantVM: true,
		},
		"a failing destroy is retried with backoff": {
			claim: func() *hfv1.MachineClaim { return placedClaimOn(unitCluster, 1001) },
			setup: func(t *testing.T, r *Reconciler, hv *fakeprovider.Cluster, claim *hfv1.MachineClaim) {
				ownedVM(t, hv, r.Signer, claim, 1001)
				t.Cleanup(hv.FailDestroys(errStorage))
			},
			passes: 1, wantRequeue: 2 * time.Second, wantEnding: hfv1.ConditionReason(provider.ReasonOf(errStorage)),
			wantEvent: "Warning FailedDelete", wantVM: true,
		},
	} {
		t.Run(name, func(t *testing.T) {
			r, hv, clk, rec := serviceWorld(t)
			claim := tc.claim()
			if tc.setup != nil {
				tc.setup(t, r, hv, claim)
			}
			vmid, err := fakeprovider.ParseID(provider.ID(claim.Status.VMRef.ID()))
			if err != nil {
				t.Fatal(err)
			}
			var done bool
			var res ctrl.Result
			for i := range tc.passes {
				if i > 0 {
					clk.Step(2 * time.Second)
				}
				inScope(r, claim, func(s *claimScope) { done, res = r.deleteVM(context.Background(), s) })
			}
			if done != tc.wantDone || res.RequeueAfter != tc.wantRequeue {
				t.Errorf("deleteVM = %v, %s; want %v, %s", done, res.RequeueAfter, tc.wantDone, tc.wantRequeue)
			}
			if tc.wantDone != (claim.Status.VMRef == nil) {
				t.Errorf("status.vmRef = %+v after done = %v", claim.Status.VMRef, done)
			}
			ending := hfv1.FindCondition(claim.Status.Conditions, hfv1.MachineClaimEndingCondition)
			switch {
			case tc.wantEnding == "" && ending != nil:
				t.Errorf("Ending = %+v, want none", ending)
			case tc.wantEnding != "" && (ending == nil || ending.Reason != string(tc.wantEnding)):
				t.Errorf("Ending = %+v, want reason %s", ending, tc.wantEnding)
			}
			owned := hfv1.FindCondition(claim.Status.Conditions, hfv1.MachineClaimOwnershipVerifiedCondition)
			switch {
			case tc.wantOwnership == "" && owned != nil:
				t.Errorf("OwnershipVerified = %+v, want none", owned)
			case tc.wantOwnership != "" && (owned == nil || owned.Status != metav1.ConditionFalse || owned.Reason != string(tc.wantOwnership)):
				t.Errorf("OwnershipVerified = %+v, want False %s", owned, tc.wantOwnership)
			}
			events := drainEvents(rec)
			if tc.wantEvent != "" && !hasEvent(events, tc.wantEvent) {
				t.Errorf("events %q, want one %q", events, tc.wantEvent)
			}
			if tc.wantNoEvent && len(events) > 0 {
				t.Errorf("events %q, want none", events)
			}
			if _, on := hv.VM(vmid); vmid != 0 && on != tc.wantVM {
				t.Errorf("VM %d on the hypervisor: %v, want %v", vmid, on, tc.wantVM)
			}
		})
	}
}

// TestProvisionError: each class of a provisioning failure (and a render
// failure, the CI platform's rate limit) ends the pass as docs/architecture.md
// "Classified errors" says: a VM that is not ours and a permanent error fail
// the claim; configuration and resource errors wait (5 minutes, 30
// seconds) with the Provisioned condition saying why; a transient error
// backs off 2s, 4s ...; the rate limit waits until its retry time without
// counting a failure. A warning event marks each change of reason.
func TestProvisionError(t *testing.T) {
	type pass struct {
		requeue time.Duration
		// event is whether this pass records a FailedProvision event.
		event bool
	}
	for name, tc := range map[string]struct {
		err           error
		passes        []pass
		wantReason    hfv1.ConditionReason
		wantFailed    bool
		wantOwnership bool
	}{
		"not our VM": {
			err:    fmt.Errorf("clone into VM 1001: %w", provider.ErrNotOwned),
			passes: []pass{{}}, wantReason: hfv1.OwnershipMismatchReason, wantFailed: true, wantOwnership: true,
		},
		"permanent": {
			err:    provider.Errorf(provider.ClassPermanent, "TemplateMissing", "template 9000 is gone"),
			passes: []pass{{}}, wantReason: hfv1.ProvisioningFailedReason, wantFailed: true,
		},
		"configuration": {
			err:    provider.Errorf(provider.ClassConfiguration, "InvalidBridge", "bridge vmbr9 does not exist"),
			passes: []pass{{5 * time.Minute, true}, {5 * time.Minute, false}}, wantReason: "InvalidBridge",
		},
		"render": {
			err:    fmt.Errorf("%w of HypervisorMachineTemplate debian: bad template", vmspec.ErrRender),
			passes: []pass{{5 * time.Minute, true}}, wantReason: "InvalidCloudInit",
		},
		"resource": {
			err:    provider.Errorf(provider.ClassResource, "NoCapacity", "no node has 64 GiB free"),
			passes: []pass{{30 * time.Second, true}, {30 * time.Second, false}}, wantReason: "NoCapacity",
		},
		"transient": {
			err:    provider.Errorf(provider.ClassTransient, "Unreachable", "connection refused"),
			passes: []pass{{2 * time.Second, true}, {4 * time.Second, false}, {8 * time.Second, false}}, wantReason: "Unreachable",
		},
		"rate limited": {
			err:    fmt.Errorf("issue the runner: %w", &workload.RateLimitError{RetryAt: unitEpoch.Add(90 * time.Second)}),
			passes: []pass{{90 * time.Second, false}, {90 * time.Second, false}}, wantReason: hfv1.RateLimitedReason,
		},
	} {
		t.Run(name, func(t *testing.T) {
			r, _, _, rec := serviceWorld(t)
			c := unitClaim("runner-1", 0)
			for i, p := range tc.passes {
				var res phase.Result
				var err error
				inScope(r, &c, func(s *claimScope) { res, err = r.provisionError(context.Background(), s, tc.err) })
				if err != nil {
					t.Fatalf("pass %d: %v", i, err)
				}
				if !res.Stopped() || res.After() != p.requeue {
					t.Errorf("pass %d: %+v, want the pass stopped, requeued after %s", i, res, p.requeue)
				}
				if got := hasEvent(drainEvents(rec), "Warning FailedProvision"); got != p.event {
					t.Errorf("pass %d: FailedProvision event %v, want %v", i, got, p.event)
				}
			}
			cond := hfv1.FindCondition(c.Status.Conditions, hfv1.MachineClaimProvisionedCondition)
			if cond == nil || cond.Status != metav1.ConditionFalse || cond.Reason != string(tc.wantReason) {
				t.Errorf("Provisioned = %+v, want False %s", cond, tc.wantReason)
			}
			if c.HasFailed() != tc.wantFailed {
				t.Errorf("failed = %v, want %v (status.end %+v)", c.HasFailed(), tc.wantFailed, c.Status.End)
			}
			if owned := hfv1.FindCondition(c.Status.Conditions, hfv1.MachineClaimOwnershipVerifiedCondition); (owned != nil && owned.Status == metav1.ConditionFalse) != tc.wantOwnership {
				t.Errorf("OwnershipVerified = %+v, want False: %v", owned, tc.wantOwnership)
			}
		})
	}
}

// TestConfigurationErrorHoldsTheClaim: after a step failed for a reason
// only its user can fix, the claim calls the hypervisor again only once
// its spec, its template's or its cluster's changes, or after the hold;
// a transient error holds nothing of the kind (its backoff paces it).
func TestConfigurationErrorHoldsTheClaim(t *testing.T) {
	r, _, clk, _ := serviceWorld(t)
	c := unitClaim("runner-1", 0)
	tmpl := &hfv1.HypervisorMachineTemplate{ObjectMeta: metav1.ObjectMeta{Name: "debian", Generation: 3}}
	cluster := &hfv1.HypervisorCluster{ObjectMeta: metav1.ObjectMeta{Name: unitCluster, Generation: 7}}
	fail := func(err error) {
		t.Helper()
		s := &claimScope{claim: &c, tmpl: tmpl, cluster: cluster, claimEnv: r.env()}
		if _, perr := r.provisionError(context.Background(), s, err); perr != nil {
			t.Fatal(perr)
		}
	}
	fail(provider.Errorf(provider.ClassConfiguration, "InvalidParameter", "parameter verification failed"))
	if wait, held := r.memory.heldForUser(&c, tmpl, cluster, clk.Now()); !held || wait != configurationHold {
		t.Fatalf("right after the failure: held %v for %s, want %s", held, wait, configurationHold)
	}
	clk.Step(time.Minute)
	if wait, held := r.memory.heldForUser(&c, tmpl, cluster, clk.Now()); !held || wait != configurationHold-time.Minute {
		t.Errorf("a minute later, nothing changed: held %v for %s", held, wait)
	}
	for name, change := range map[string]func(){
		"the claim's spec":    func() { c.Generation++ },
		"the template's spec": func() { tmpl.Generation++ },
		"the cluster's spec":  func() { cluster.Generation++ },
		"the hold's end":      func() { clk.Step(configurationHold) },
	} {
		fail(provider.Errorf(provider.ClassConfiguration, "InvalidParameter", "parameter verification failed"))
		change()
		if _, held := r.memory.heldForUser(&c, tmpl, cluster, clk.Now()); held {
			t.Errorf("after a change of %s: still held", name)
		}
	}
	fail(provider.Errorf(provider.ClassTransient, "Unreachable", "connection refused"))
	if _, held := r.memory.heldForUser(&c, tmpl, cluster, clk.Now()); held {
		t.Error("a transient error holds the claim for its user")
	}
}

// TestProgressSaysTheBuildIsTheClaims: the persisted progress says the VM
// id holds the claim's own build (provider.Progress.Building) exactly when
// the Provisioned condition recorded the build under way or the VM up, so
// that after a restart the provider takes a clone in progress at the id
// for the claim's own instead of waiting at Queued to read whose it is.
func TestProgressSaysTheBuildIsTheClaims(t *testing.T) {
	for _, tc := range []struct {
		name   string
		ref    bool
		status metav1.ConditionStatus
		reason hfv1.ConditionReason
		want   bool
	}{
		{"no VM reserved", false, metav1.ConditionFalse, hfv1.BuildingVMReason, false},
		{"no condition yet", true, "", "", false},
		{"waiting for a clone slot", true, metav1.ConditionFalse, hfv1.QueuedReason, false},
		{"building", true, metav1.ConditionFalse, hfv1.BuildingVMReason, true},
		{"up", true, metav1.ConditionTrue, hfv1.ReadyReason, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			claim := &hfv1.MachineClaim{}
			if tc.ref {
				claim.Status.VMRef = hfv1.NewVMReference(unitCluster, "fake://1000", "node-1")
			}
			if tc.status != "" {
				claim.Status.Conditions = []metav1.Condition{{Type: string(hfv1.MachineClaimProvisionedCondition), Status: tc.status, Reason: string(tc.reason)}}
			}
			if got := Progress(claim).Building; got != tc.want {
				t.Errorf("Progress(claim).Building = %v, want %v", got, tc.want)
			}
		})
	}
}

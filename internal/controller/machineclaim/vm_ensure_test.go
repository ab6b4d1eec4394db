package machineclaim

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/phase"
	"github.com/hyperfleet/hyperfleet/internal/testworld/testobjects"
	"github.com/hyperfleet/hyperfleet/internal/vmspec"
	"github.com/hyperfleet/hyperfleet/pkg/ownership"
	"github.com/hyperfleet/hyperfleet/pkg/provider"
)

// The two steps of ensureVM (vm.go), each reached directly: vmCallFor
// builds the provider call's inputs, settleVM records the provider's
// answer.

// callTemplate is a template of 2 cores and 4 GiB on bridge vmbr1, in the
// DNS domain now.example.
func callTemplate() *hfv1.HypervisorMachineTemplate {
	return testobjects.GitHubTemplate(func(t *hfv1.HypervisorMachineTemplate) {
		t.Spec.Resources.CPU = 2
		t.Spec.Resources.Memory = resource.MustParse("4Gi")
		t.Spec.Network.Bridge = "vmbr1"
		t.Spec.Network.DNS = &hfv1.DNSSettings{Domain: "now.example"}
	})
}

// TestVMCallFor: the provider call is built from the template while the
// claim is not placed, from its placement record once it is (whatever the
// template says now, its DNS domain included), and goes on from the
// progress it is given.
func TestVMCallFor(t *testing.T) {
	kept := provider.Progress{ID: "fake://1001", Node: "node-1", Task: &provider.Task{ID: "UPID:1", Operation: "clone"}}
	for name, tc := range map[string]struct {
		mutate     func(*hfv1.HypervisorMachineTemplate)
		placed     *ownership.Placement
		prev       provider.Progress
		wantCores  int
		wantMemory int64
		wantBridge string
		wantDomain string
	}{
		"not placed: the template": {
			wantCores: 2, wantMemory: 4 << 30, wantBridge: "vmbr1", wantDomain: "now.example",
		},
		"not placed, no bridge: the cluster's default": {
			mutate:    func(t *hfv1.HypervisorMachineTemplate) { t.Spec.Network.Bridge = "" },
			wantCores: 2, wantMemory: 4 << 30, wantBridge: "vmbr0", wantDomain: "now.example",
		},
		"placed: the placement record, not the template's edits": {
			placed:    &ownership.Placement{CPUCores: 8, MemoryBytes: 16 << 30, Bridge: "vmbr7", DNSDomain: "placed.example"},
			prev:      kept,
			wantCores: 8, wantMemory: 16 << 30, wantBridge: "vmbr7", wantDomain: "placed.example",
		},
	} {
		t.Run(name, func(t *testing.T) {
			claim := unitClaim("runner-1", 0)
			tmpl := callTemplate()
			if tc.mutate != nil {
				tc.mutate(tmpl)
			}
			cluster := &hfv1.HypervisorCluster{ObjectMeta: metav1.ObjectMeta{Name: unitCluster}}
			cluster.Spec.DefaultBridge = "vmbr0"
			ci := &claimCloudInit{claim: &claim}
			call, err := vmCallFor(&claim, tmpl, cluster, tc.placed, nil, ciPlatforms, ci, nil, tc.prev)
			if err != nil {
				t.Fatal(err)
			}
			spec := call.spec
			if spec.CPUCores != tc.wantCores || spec.MemoryBytes != tc.wantMemory || spec.MemoryHint != tc.wantMemory || spec.Network.Bridge != tc.wantBridge {
				t.Errorf("spec: %d cores, %d bytes (hint %d), bridge %q; want %d, %d, %q",
					spec.CPUCores, spec.MemoryBytes, spec.MemoryHint, spec.Network.Bridge, tc.wantCores, tc.wantMemory, tc.wantBridge)
			}
			if got := vmspec.DNS(call.cluster, call.tmpl).Domain; got != tc.wantDomain {
				t.Errorf("the call's DNS domain is %q, want %q", got, tc.wantDomain)
			}
			if ci.tmpl != call.tmpl || ci.cluster != call.cluster || spec.CloudInit != ci {
				t.Error("the cloud-init is not rendered from the call's template and cluster")
			}
			if tmpl.Spec.Network.DNS.Domain != "now.example" {
				t.Errorf("the scope's template was changed: domain %q", tmpl.Spec.Network.DNS.Domain)
			}
			if call.prev != tc.prev || spec.Owner != vmspec.Owner(&claim) {
				t.Errorf("the call goes on from %+v for %+v, want %+v for the claim", call.prev, spec.Owner, tc.prev)
			}
		})
	}
}

// TestSettleVM records each answer of the provider (each phase, a
// retry-after, a wait for a clone slot, the errors of each class) from a
// claim building its VM, and checks the pass's answer, the claim's
// conditions and end, and what is remembered (the backoff, the progress
// with its task, which the status does not persist).
func TestSettleVM(t *testing.T) {
	vm := provider.Progress{ID: "fake://1001", Node: "node-1"}
	task := provider.Progress{ID: vm.ID, Node: vm.Node, Task: &provider.Task{ID: "UPID:clone", Operation: "clone"}}
	building := buildingMessage(unitCluster, vm)
	queued := queuedBuildMessage(unitCluster, vm, "no clone slot free on node-1")
	for name, tc := range map[string]struct {
		res *provider.EnsureResult
		err error
		// cond is the Provisioned condition the claim starts with.
		cond *metav1.Condition
		// failedBefore: the claim's last step failed transiently.
		failedBefore bool

		wantRequeue   time.Duration // 0: the pass stops without a requeue
		wantRunning   bool          // requeued for the running resync
		wantStatus    metav1.ConditionStatus
		wantReason    hfv1.ConditionReason
		wantMessage   string // the message starts with it
		wantOwnership metav1.ConditionStatus
		wantEnd       hfv1.EndReason
		wantFailed    bool
		wantPaused    bool // the next pass waits before calling the provider
		wantVM        provider.ID
		wantTask      string // the task kept in memory
	}{
		"cloning, call again now": {
			res:         &provider.EnsureResult{Phase: provider.PhaseCloning, Progress: task},
			wantRequeue: CallAgainNow, wantStatus: metav1.ConditionFalse, wantReason: hfv1.BuildingVMReason, wantMessage: building,
			wantVM: vm.ID, wantTask: "UPID:clone",
		},
		"configuring, retry after": {
			res:         &provider.EnsureResult{Phase: provider.PhaseConfiguring, Progress: task, RetryAfter: 3 * time.Second},
			wantRequeue: 3 * time.Second, wantStatus: metav1.ConditionFalse, wantReason: hfv1.BuildingVMReason, wantMessage: building,
			wantVM: vm.ID, wantTask: "UPID:clone",
		},
		"starting": {
			res:         &provider.EnsureResult{Phase: provider.PhaseStarting, Progress: vm},
			wantRequeue: CallAgainNow, wantStatus: metav1.ConditionFalse, wantReason: hfv1.BuildingVMReason, wantMessage: building, wantVM: vm.ID,
		},
		"booting, no task, waits on a lock: the message says why": {
			res:         &provider.EnsureResult{Phase: provider.PhaseBooting, Progress: vm, RetryAfter: 5 * time.Second, Message: "the VM's config is locked"},
			wantRequeue: 5 * time.Second, wantStatus: metav1.ConditionFalse, wantReason: hfv1.BuildingVMReason,
			wantMessage: building + "; the VM's config is locked", wantVM: vm.ID,
		},
		"building after a wait for a clone slot: the queued message stays": {
			res:         &provider.EnsureResult{Phase: provider.PhaseCloning, Progress: task},
			cond:        &metav1.Condition{Type: string(hfv1.MachineClaimProvisionedCondition), Status: metav1.ConditionFalse, Reason: string(hfv1.BuildingVMReason), Message: queued},
			wantRequeue: CallAgainNow, wantStatus: metav1.ConditionFalse, wantReason: hfv1.BuildingVMReason, wantMessage: queued,
			wantVM: vm.ID, wantTask: "UPID:clone",
		},
		"placed, waits for a clone slot": {
			res:         &provider.EnsureResult{Phase: provider.PhasePlaced, Progress: vm, Waits: "no clone slot free on node-1", RetryAfter: 10 * time.Second},
			wantRequeue: 10 * time.Second, wantStatus: metav1.ConditionFalse, wantReason: hfv1.BuildingVMReason, wantMessage: queued, wantVM: vm.ID,
		},
		"queued without a VM": {
			res:         &provider.EnsureResult{Phase: provider.PhaseQueued, RetryAfter: 20 * time.Second, Message: "the cluster has no free VM id"},
			wantRequeue: 20 * time.Second, wantStatus: metav1.ConditionFalse, wantReason: hfv1.QueuedReason, wantMessage: "the cluster has no free VM id",
		},
		"queued, no message": {
			res:         &provider.EnsureResult{Phase: provider.PhaseQueued},
			wantRequeue: CallAgainNow, wantStatus: metav1.ConditionFalse, wantReason: hfv1.QueuedReason, wantMessage: "Waiting for a clone slot",
		},
		"running": {
			res:         &provider.EnsureResult{Phase: provider.PhaseRunning, Progress: vm, Addresses: []string{"192.0.2.10"}, MACAddress: "bc:24:11:00:00:01"},
			wantRunning: true, wantStatus: metav1.ConditionTrue, wantReason: hfv1.ReadyReason,
			wantMessage: fmt.Sprintf("VM %s runs on %s/node-1 with addresses 192.0.2.10", vm.ID, unitCluster), wantOwnership: metav1.ConditionTrue, wantVM: vm.ID,
		},
		"stopped before it was ready: the claim ends": {
			res:    &provider.EnsureResult{Phase: provider.PhaseStopped, Progress: vm},
			wantVM: vm.ID, wantEnd: hfv1.EndPoweredOff,
		},
		"success after transient failures: the backoff ends": {
			res:          &provider.EnsureResult{Phase: provider.PhaseStarting, Progress: vm},
			failedBefore: true,
			wantRequeue:  CallAgainNow, wantStatus: metav1.ConditionFalse, wantReason: hfv1.BuildingVMReason, wantMessage: building, wantVM: vm.ID,
		},
		"transient error: backs off, and the next pass waits it out": {
			err:         provider.Errorf(provider.ClassTransient, "Unreachable", "connection refused"),
			wantRequeue: 2 * time.Second, wantStatus: metav1.ConditionFalse, wantReason: "Unreachable", wantMessage: "Transient error", wantPaused: true,
		},
		"permanent error: the claim fails": {
			err:        provider.Errorf(provider.ClassPermanent, "TemplateMissing", "template 9000 is gone"),
			wantStatus: metav1.ConditionFalse, wantReason: hfv1.ProvisioningFailedReason, wantEnd: hfv1.EndFailed, wantFailed: true,
		},
		"not owned: the claim fails, its VM untouched": {
			err:        fmt.Errorf("clone into VM 1001: %w", provider.ErrNotOwned),
			wantStatus: metav1.ConditionFalse, wantReason: hfv1.OwnershipMismatchReason, wantOwnership: metav1.ConditionFalse,
			wantEnd: hfv1.EndFailed, wantFailed: true,
		},
	} {
		t.Run(name, func(t *testing.T) {
			r, _, clk, _ := serviceWorld(t)
			claim := unitClaim("runner-1", 0)
			if tc.cond != nil {
				claim.Status.Conditions = []metav1.Condition{*tc.cond}
			}
			if tc.failedBefore {
				r.memory.failed(claim.UID)
				r.memory.setRetryAt(claim.UID, clk.Now().Add(-time.Second))
			}
			tmpl := callTemplate()
			cluster := &hfv1.HypervisorCluster{ObjectMeta: metav1.ObjectMeta{Name: unitCluster}}
			call := &vmCall{spec: &provider.VMSpec{}, tmpl: tmpl, cluster: cluster}
			var res phase.Result
			var err error
			inScope(r, &claim, func(s *claimScope) {
				s.tmpl, s.cluster = tmpl, cluster
				res, err = r.settleVM(context.Background(), s, call, tc.res, tc.err)
			})
			if err != nil {
				t.Fatal(err)
			}
			switch {
			case !res.Stopped():
				t.Errorf("the pass goes on (%+v); every answer stops it", res)
			case tc.wantRunning && (res.After() < runningResync || res.After() >= runningResync*3/2):
				t.Errorf("requeued after %s, want the running resync (%s to %s)", res.After(), runningResync, runningResync*3/2)
			case !tc.wantRunning && res.After() != tc.wantRequeue:
				t.Errorf("requeued after %s, want %s", res.After(), tc.wantRequeue)
			}
			cond := hfv1.FindCondition(claim.Status.Conditions, hfv1.MachineClaimProvisionedCondition)
			switch {
			case tc.wantStatus == "":
			case cond == nil:
				t.Errorf("no Provisioned condition, want %s %s", tc.wantStatus, tc.wantReason)
			case cond.Status != tc.wantStatus || cond.Reason != string(tc.wantReason) || !strings.HasPrefix(cond.Message, tc.wantMessage):
				t.Errorf("Provisioned = %s %s %q, want %s %s %q...", cond.Status, cond.Reason, cond.Message, tc.wantStatus, tc.wantReason, tc.wantMessage)
			}
			owned := hfv1.FindCondition(claim.Status.Conditions, hfv1.MachineClaimOwnershipVerifiedCondition)
			if got := metav1.ConditionStatus(""); owned != nil {
				got = owned.Status
				if got != tc.wantOwnership {
					t.Errorf("OwnershipVerified = %s, want %q", got, tc.wantOwnership)
				}
			} else if tc.wantOwnership != "" {
				t.Errorf("no OwnershipVerified condition, want %s", tc.wantOwnership)
			}
			var end hfv1.EndReason
			if e := claim.Status.End; e != nil {
				end = e.Reason
			}
			if end != tc.wantEnd || claim.HasFailed() != tc.wantFailed {
				t.Errorf("end %q (failed %v), want %q (failed %v)", end, claim.HasFailed(), tc.wantEnd, tc.wantFailed)
			}
			if _, paused := r.memory.provisionPaused(&claim, tmpl, cluster, clk.Now()); paused != tc.wantPaused {
				t.Errorf("the next pass waits before calling the provider: %v, want %v", paused, tc.wantPaused)
			}
			if tc.err == nil && r.memory.failed(claim.UID) != 0 {
				t.Error("a step that succeeded left the claim's backoff running")
			}
			// The VM is persisted in the status; its task only in memory.
			if got := Progress(&claim); got.ID != tc.wantVM || got.Task != nil {
				t.Errorf("persisted progress %+v, want VM %q and no task", got, tc.wantVM)
			}
			kept := r.memory.progressOf(&claim)
			if got := ""; kept.Task != nil {
				got = kept.Task.ID
				if got != tc.wantTask {
					t.Errorf("task kept %q, want %q", got, tc.wantTask)
				}
			} else if tc.wantTask != "" {
				t.Errorf("no task kept, want %q", tc.wantTask)
			}
		})
	}
}

package machineclaim

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clocktesting "k8s.io/utils/clock/testing"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/hypervisors"
	"github.com/hyperfleet/hyperfleet/internal/phase"
	"github.com/hyperfleet/hyperfleet/internal/poweroff"
	"github.com/hyperfleet/hyperfleet/internal/testworld/testobjects"
	"github.com/hyperfleet/hyperfleet/internal/vmspec"
	"github.com/hyperfleet/hyperfleet/pkg/provider"
	fakeprovider "github.com/hyperfleet/hyperfleet/pkg/provider/fake"
)

// TestStandbySuspendWaitsForTheAgent: a standby claim's VM, up and
// running, is suspended once its agent's ready hint says it waits for its
// credential (so a resume finds it waiting), at once when the operator
// gives VMs no ready URL (no hint can come), and after standbyHintWait
// without a hint (one sent while the operator restarted is lost). Until
// then it is left running, the claim saying why.
func TestStandbySuspendWaitsForTheAgent(t *testing.T) {
	const vmid = 1042
	cases := []struct {
		name string
		// hints: the operator gives VMs a ready URL and keeps hints.
		hints bool
		// heard: the claim's agent sent its hint; after: how long after
		// the VM came up the claim looks.
		heard   bool
		after   time.Duration
		suspend bool
	}{
		{name: "no hint yet", hints: true, after: 10 * time.Second},
		{name: "hint heard", hints: true, heard: true, after: 10 * time.Second, suspend: true},
		{name: "no hint within the wait", hints: true, after: standbyHintWait, suspend: true},
		{name: "no ready URL given", after: time.Second, suspend: true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r, hv, clk, _ := serviceWorld(t)
			claim := standbyClaim(t, r, hv, clk, vmid)
			n := &poweroff.Notices{Signer: testobjects.Signer(t), Clock: clk, ReadyHints: poweroff.NewReadyHints()}
			if c.hints {
				n.URL, n.ReadyURL = "https://operator.example/poweroff", "https://operator.example/ready"
			}
			r.PowerOff.Notices = n
			clk.Step(c.after)
			if c.heard {
				n.ReadyHints.Add(claim.UID, clk.Now())
			}
			var res phase.Result
			var err error
			inScope(r, claim, func(s *claimScope) {
				res, err = r.holdStandby(context.Background(), s)
			})
			if err != nil {
				t.Fatal(err)
			}
			clk.Step(time.Minute) // the hypervisor writes the memory out
			vm, ok := hv.VM(vmid)
			if !ok {
				t.Fatalf("VM %d is gone", vmid)
			}
			if suspended := vm.Power == provider.PowerSuspended; suspended != c.suspend {
				t.Fatalf("VM power %s after the pass; want it suspended: %v", vm.Power, c.suspend)
			}
			cond := hfv1.FindCondition(claim.Status.Conditions, hfv1.MachineClaimBootstrappedCondition)
			if cond == nil || cond.Reason != string(hfv1.SuspendingReason) {
				t.Fatalf("Bootstrapped %+v, want reason %s", cond, hfv1.SuspendingReason)
			}
			if !c.suspend {
				if !strings.Contains(cond.Message, "once its agent says it waits") {
					t.Errorf("Bootstrapped says %q; want it to say the VM waits for its agent", cond.Message)
				}
				if want := standbyHintWait - c.after; !res.Stopped() || res.After() != want {
					t.Errorf("requeue after %s, want %s (the end of the wait; the hint wakes the claim sooner)", res.After(), want)
				}
			}
		})
	}
}

// standbyClaim is a provisioned standby claim whose VM vmid runs on hv,
// up since the clock's now.
func standbyClaim(t *testing.T, r *Reconciler, hv *fakeprovider.Cluster, clk *clocktesting.FakeClock, vmid int) *hfv1.MachineClaim {
	t.Helper()
	c := unitClaim("standby-1", 0)
	claim := &c
	claim.Spec.Standby = true
	claim.Spec.RunnerPoolRef = &hfv1.ObjectName{Name: "runners"}
	claim.Status.VMRef = hfv1.NewVMReference(unitCluster, string(fakeprovider.FormatID(vmid)), "node-1")
	ownedVM(t, hv, r.Signer, claim, vmid)
	p, _, _ := r.Registry.Provider(unitCluster)
	if _, err := p.SetPower(context.Background(), vmspec.Owner(claim), vmRefOf(claim.Status.VMRef), provider.PowerOn); err != nil {
		t.Fatal(err)
	}
	for range 100 {
		if vm, ok := hv.VM(vmid); ok && vm.Power == provider.PowerRunning {
			break
		}
		clk.Step(time.Second)
	}
	if vm, _ := hv.VM(vmid); vm.Power != provider.PowerRunning {
		t.Fatalf("VM %d does not run: %s", vmid, vm.Power)
	}
	claim.Status.Conditions = []metav1.Condition{{Type: string(hfv1.MachineClaimProvisionedCondition), Status: metav1.ConditionTrue,
		Reason: "Running", LastTransitionTime: metav1.NewTime(clk.Now())}}
	return claim
}

// refusingPower is a hypervisor that refuses one power action for good,
// as Proxmox VE refuses to suspend a VM with a passed-through PCI device.
type refusingPower struct {
	provider.Provider
	action provider.PowerAction
}

func (p refusingPower) SetPower(ctx context.Context, o provider.Owner, ref provider.VMRef, action provider.PowerAction) (*provider.Task, error) {
	if action == p.action {
		return nil, provider.Errorf(provider.ClassPermanent, "SuspendUnsupported", "VM %s has a passed-through PCI device and cannot be suspended", ref.ID)
	}
	return p.Provider.SetPower(ctx, o, ref, action)
}

// TestStandbyVMThatCannotBeSuspendedFails: a standby claim whose VM the
// hypervisor refuses to suspend for good does not ask again and again: the
// claim fails with StandbyFailed, naming the VM and the hypervisor's
// reason, its VM is left running for the end to destroy, and its pool
// replaces it. A transient refusal is asked again soon, the claim going on.
func TestStandbyVMThatCannotBeSuspendedFails(t *testing.T) {
	for _, permanent := range []bool{true, false} {
		t.Run(fmt.Sprintf("permanent %v", permanent), func(t *testing.T) {
			r, hv, clk, _ := serviceWorld(t)
			claim := standbyClaim(t, r, hv, clk, 1043)
			p, _, _ := r.Registry.Provider(unitCluster)
			var wrapped provider.Provider = refusingPower{Provider: p, action: provider.PowerSuspend}
			if !permanent {
				wrapped = transientPower{Provider: p}
			}
			cfg := provider.ClusterConfig{Name: unitCluster, VMIDStart: 1000, VMIDEnd: 1999, Nodes: []string{"node-1"}}
			r.Registry.Remove(unitCluster)
			if _, err := r.Registry.Connect(unitCluster, cfg, func() (provider.Provider, error) { return wrapped, nil }); err != nil {
				t.Fatal(err)
			}
			r.Registry.SetHealth(unitCluster, hypervisors.Health{Ready: true}, clk.Now())
			var res phase.Result
			var err error
			inScope(r, claim, func(s *claimScope) { res, err = r.holdStandby(context.Background(), s) })
			if err != nil {
				t.Fatal(err)
			}
			cond := hfv1.FindCondition(claim.Status.Conditions, hfv1.MachineClaimProvisionedCondition)
			if !permanent {
				if claim.Status.End != nil || !res.Stopped() || res.After() != standbyPoll {
					t.Fatalf("a transient refusal: end %+v, result %+v; want the suspend asked again after %s", claim.Status.End, res, standbyPoll)
				}
				return
			}
			if claim.Status.End == nil || claim.Status.End.Reason != hfv1.EndFailed {
				t.Fatalf("claim end %+v, want %s", claim.Status.End, hfv1.EndFailed)
			}
			if cond == nil || cond.Reason != string(hfv1.StandbyFailedReason) ||
				!strings.Contains(cond.Message, "could not be suspended to disk (SuspendUnsupported)") || !strings.Contains(cond.Message, "PCI") {
				t.Fatalf("Provisioned %+v, want reason %s naming the hypervisor's reason", cond, hfv1.StandbyFailedReason)
			}
			if vm, _ := hv.VM(1043); vm.Power != provider.PowerRunning {
				t.Errorf("VM power %s, want it left running for the claim's end", vm.Power)
			}
		})
	}
}

// transientPower refuses every power action for now.
type transientPower struct{ provider.Provider }

func (transientPower) SetPower(_ context.Context, _ provider.Owner, ref provider.VMRef, _ provider.PowerAction) (*provider.Task, error) {
	return nil, provider.Errorf(provider.ClassTransient, "Locked", "VM %s is locked by another task", ref.ID)
}

package controller_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	proxmoxsim "github.com/hyperfleet/hyperfleet/internal/testworld/simulator/proxmox"
)

// waitInUse waits until obj is Terminating with Ready False, reason InUse,
// naming every claim of names, and has an InUse warning event.
func waitInUse(t *testing.T, obj client.Object, conds func() []metav1.Condition, names ...string) {
	t.Helper()
	eventually(t, 60*time.Second, obj.GetName()+" Terminating and InUse", func() error {
		if err := env.Client.Get(context.Background(), client.ObjectKeyFromObject(obj), obj); err != nil {
			return err
		}
		if obj.GetDeletionTimestamp().IsZero() {
			return fmt.Errorf("not being deleted")
		}
		ready := hfv1.FindCondition(conds(), hfv1.ReadyCondition)
		if !hfv1.HasReason(ready, hfv1.InUseReason) || ready.Status != metav1.ConditionFalse {
			return fmt.Errorf("Ready = %+v", ready)
		}
		for _, n := range names {
			if !strings.Contains(ready.Message, n) {
				return fmt.Errorf("Ready message %q does not name %s", ready.Message, n)
			}
		}
		return inUseEvent(obj)
	})
}

// inUseEvent finds obj's InUse warning event.
func inUseEvent(obj client.Object) error {
	var events corev1.EventList
	if err := env.Client.List(context.Background(), &events); err != nil {
		return err
	}
	for _, e := range events.Items {
		if e.InvolvedObject.UID == obj.GetUID() && e.Reason == string(hfv1.InUseReason) && e.Type == corev1.EventTypeWarning {
			return nil
		}
	}
	return fmt.Errorf("no InUse event for %s", obj.GetName())
}

// deleteHeld waits until the operator put finalizer on obj, then deletes it.
func deleteHeld(t *testing.T, obj client.Object, finalizer string) {
	t.Helper()
	eventually(t, 30*time.Second, obj.GetName()+"'s finalizer", func() error {
		if err := env.Client.Get(context.Background(), client.ObjectKeyFromObject(obj), obj); err != nil {
			return err
		}
		if !slices.Contains(obj.GetFinalizers(), finalizer) {
			return fmt.Errorf("finalizers %v", obj.GetFinalizers())
		}
		return nil
	})
	if err := env.Client.Delete(context.Background(), obj); err != nil {
		t.Fatal(err)
	}
}

// waitGone waits until obj no longer exists.
func waitGone(t *testing.T, obj client.Object, timeout time.Duration) {
	t.Helper()
	eventually(t, timeout, obj.GetName()+" gone", func() error {
		err := env.Client.Get(context.Background(), client.ObjectKeyFromObject(obj), obj)
		switch {
		case apierrors.IsNotFound(err):
			return nil
		case err != nil:
			return err
		}
		return fmt.Errorf("still there (finalizers %v)", obj.GetFinalizers())
	})
}

// powerOff powers the claim's VM off from inside, as its agent does after
// the job, and waits until the claim and its VM are gone.
func powerOff(t *testing.T, sim *simulator, claim *hfv1.MachineClaim) {
	t.Helper()
	got, err := getClaim(t, claim)
	if err != nil || got.Status.VMRef == nil {
		t.Fatalf("claim %s has no VM: %v", claim.Name, err)
	}
	vmid := int(got.Status.VMRef.VMID)
	if err := sim.GuestPowerOff(vmid); err != nil {
		t.Fatal(err)
	}
	waitGone(t, claim, 60*time.Second)
	for _, vm := range sim.VMs() {
		if vm.VMID == vmid {
			t.Fatalf("VM %d of claim %s still exists after its claim went: %+v", vmid, claim.Name, vm)
		}
	}
}

// forceDelete deletes obj and removes every finalizer, as an admin who
// bypasses the operator does (or as a template made before templates had
// a finalizer is simply deleted).
func forceDelete(t *testing.T, obj client.Object) {
	t.Helper()
	ctx := context.Background()
	if err := env.Client.Delete(ctx, obj); err != nil {
		t.Fatal(err)
	}
	err := retry.RetryOnConflict(conflictRetry, func() error {
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(obj), obj); err != nil {
			return client.IgnoreNotFound(err)
		}
		obj.SetFinalizers(nil)
		return client.IgnoreNotFound(env.Client.Update(ctx, obj))
	})
	if err != nil {
		t.Fatal(err)
	}
	waitGone(t, obj, 10*time.Second)
}

// TestDeletingAnInUseTemplateWaitsForItsClaims: a template deleted while a
// claim runs a VM built from it stays, Terminating, with Ready False,
// reason InUse, naming the claim (and an InUse event); no new VM is built
// from it meanwhile; once the claim's VM powers off and the claim is gone,
// the template goes.
func TestDeletingAnInUseTemplateWaitsForItsClaims(t *testing.T) {
	sim := startSim(t, nil)
	startOperator(t, operatorOptions{})
	f := newFixture(t, sim, nil)
	running := waitPhase(t, f.newClaim("running"), hfv1.MachineClaimBootstrapping, 60*time.Second)
	tmpl := f.template.DeepCopy()
	deleteHeld(t, tmpl, hfv1.HypervisorMachineTemplateFinalizer)
	waitInUse(t, tmpl, func() []metav1.Condition { return tmpl.Status.Conditions }, f.namespace+"/"+running.Name)

	// A new claim gets no VM from a template being deleted, and does not
	// hold it.
	late := f.newClaim("late")
	eventually(t, 30*time.Second, "the late claim waits", func() error {
		got, err := getClaim(t, late)
		if err != nil {
			return err
		}
		c := hfv1.FindCondition(got.Status.Conditions, hfv1.MachineClaimProvisionedCondition)
		if c == nil || c.Status != metav1.ConditionFalse || (c.Reason != string(hfv1.TemplateNotReadyReason) && c.Reason != string(hfv1.TemplateNotFoundReason)) {
			return fmt.Errorf("Provisioned = %+v", c)
		}
		return nil
	})
	if err := env.Client.Get(context.Background(), client.ObjectKeyFromObject(tmpl), tmpl); err != nil {
		t.Fatalf("the template went while a claim's VM built from it runs: %v", err)
	}

	powerOff(t, sim, running)
	waitGone(t, tmpl, 60*time.Second)
	if vms := operatorVMs(sim); len(vms) != 0 {
		t.Fatalf("VMs left: %+v", vms)
	}
	got, err := getClaim(t, late)
	if err != nil || got.Status.VMRef != nil {
		t.Fatalf("the late claim: vmRef %+v (%v), want none", got.Status.VMRef, err)
	}
}

// TestDeletingAnInUseIPPoolWaitsForItsClaims: an IPPool deleted while a
// claim's VM runs with one of its addresses stays, Terminating, InUse,
// naming the claim; a new claim gets no address from it; once the VM is
// gone and the address released, the pool goes. A pool deleted anyway and
// created again never hands out an address a running VM still has.
func TestDeletingAnInUseIPPoolWaitsForItsClaims(t *testing.T) {
	sim := startSim(t, nil)
	startOperator(t, operatorOptions{})
	f := newFixture(t, sim, nil)
	newPool := func() *hfv1.IPPool {
		p := &hfv1.IPPool{
			ObjectMeta: metav1.ObjectMeta{Name: "pool-" + f.namespace},
			Spec:       hfv1.IPPoolSpec{Addresses: []string{"10.30.0.10-10.30.0.12"}, Prefix: 24, Gateways: []string{"10.30.0.1"}},
		}
		f.create(p)
		return p
	}
	pool := newPool()
	static := f.staticTemplate(t, pool)
	newClaim := func(name string) *hfv1.MachineClaim {
		c := &hfv1.MachineClaim{ObjectMeta: metav1.ObjectMeta{Namespace: f.namespace, Name: name}, Spec: hfv1.MachineClaimSpec{TemplateRef: hfv1.ObjectName{Name: static.Name}}}
		f.create(c)
		return c
	}
	addressOf := func(c *hfv1.MachineClaim) string {
		t.Helper()
		got := waitPhase(t, c, hfv1.MachineClaimBootstrapping, 60*time.Second)
		if got.Status.Network == nil || len(got.Status.Network.IPAllocations) != 1 {
			t.Fatalf("claim %s allocations: %+v", c.Name, got.Status.Network)
		}
		return got.Status.Network.IPAllocations[0].Address
	}

	first := newClaim("first")
	addressOf(first)
	deleteHeld(t, pool, hfv1.IPPoolFinalizer)
	waitInUse(t, pool, func() []metav1.Condition { return pool.Status.Conditions }, f.namespace+"/"+first.Name)
	late := newClaim("late")
	eventually(t, 30*time.Second, "the late claim gets no address", func() error {
		got, err := getClaim(t, late)
		if err != nil {
			return err
		}
		c := hfv1.FindCondition(got.Status.Conditions, hfv1.MachineClaimProvisionedCondition)
		if c == nil || !strings.Contains(c.Message, "is being deleted") || got.Status.Network != nil && len(got.Status.Network.IPAllocations) > 0 {
			return fmt.Errorf("Provisioned = %+v, network %+v", c, got.Status.Network)
		}
		return nil
	})
	if err := env.Client.Delete(context.Background(), late); err != nil {
		t.Fatal(err)
	}
	powerOff(t, sim, first)
	waitGone(t, pool, 60*time.Second)

	// Deleted anyway while a VM has one of its addresses, then created
	// again: the address stays the running VM's.
	pool = newPool()
	holder := newClaim("holder")
	held := addressOf(holder)
	forceDelete(t, pool)
	pool = newPool()
	for i := range 2 {
		c := newClaim(fmt.Sprintf("after-%d", i))
		if got := addressOf(c); got == held {
			t.Fatalf("claim %s got %s, the address VM of claim %s still has", c.Name, got, holder.Name)
		}
	}
}

// TestClaimOfADeletedTemplateStillEnds: a template deleted anyway (its
// finalizer removed by hand, or deleted before templates had one) does not
// strand its claims. A running claim still sees its VM power off, ends,
// and its VM is destroyed; a claim whose VM was still being built fails
// and its VM is destroyed; neither waits for the template.
func TestClaimOfADeletedTemplateStillEnds(t *testing.T) {
	sim := startSim(t, func(c *proxmoxsim.Config) { c.Latency.CloneBase = proxmoxsim.Duration(3 * time.Second) })
	startOperator(t, operatorOptions{})
	f := newFixture(t, sim, nil)
	running := waitPhase(t, f.newClaim("running"), hfv1.MachineClaimBootstrapping, 60*time.Second)
	building := waitPlaced(t, f.newClaim("building"))
	forceDelete(t, f.template.DeepCopy())

	powerOff(t, sim, running)
	eventually(t, 60*time.Second, "the claim being built failed and its VM is gone", func() error {
		got, err := getClaim(t, building)
		if err != nil {
			return err
		}
		if !got.HasFailed() || !strings.HasPrefix(got.Status.TerminationReason, string(hfv1.TemplateNotFoundReason)+": ") {
			return fmt.Errorf("failed %v, terminationReason %q", got.HasFailed(), got.Status.TerminationReason)
		}
		if vms := operatorVMs(sim); len(vms) != 0 || got.Status.VMRef != nil {
			return fmt.Errorf("VMs %+v, vmRef %+v", vms, got.Status.VMRef)
		}
		return nil
	})
}

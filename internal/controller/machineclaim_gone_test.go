package controller_test

import (
	"context"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/ipam"
)

// TestOwnershipMismatchAtDeleteKeepsClaim: a claim whose VM's ownership
// marker no longer verifies when the claim is deleted keeps its finalizer,
// its VM reference and its address (in status and in the allocator) and
// says what an admin must do; the VM is left running. Once the admin
// deletes the VM by hand, the claim finishes on its own and its address
// returns to the pool.
func TestOwnershipMismatchAtDeleteKeepsClaim(t *testing.T) {
	sim := startSim(t, nil)
	op := startOperator(t, operatorOptions{})
	f := newFixture(t, sim, nil)
	pool := &hfv1.IPPool{
		ObjectMeta: metav1.ObjectMeta{Name: "pool-" + f.namespace},
		Spec:       hfv1.IPPoolSpec{Addresses: []string{"10.30.0.0/29"}, Prefix: 29, Gateways: []string{"10.30.0.1"}},
	}
	f.create(pool)
	t.Cleanup(func() { _ = env.Client.Delete(context.Background(), pool) })
	static := f.template.DeepCopy()
	static.ObjectMeta = metav1.ObjectMeta{Namespace: f.namespace, Name: "static"}
	static.Status = hfv1.HypervisorMachineTemplateStatus{}
	static.Spec.Network = hfv1.MachineNetwork{Mode: hfv1.NetworkModeStatic, IPPoolRef: &hfv1.ObjectName{Name: pool.Name}}
	f.create(static)
	waitTemplate(t, static, metav1.ConditionTrue, "")
	claim := &hfv1.MachineClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: f.namespace, Name: "tampered"},
		Spec:       hfv1.MachineClaimSpec{TemplateRef: hfv1.ObjectName{Name: static.Name}},
	}
	f.create(claim)
	running := waitPhase(t, claim, hfv1.MachineClaimBootstrapping, 60*time.Second)
	ref := running.Status.VMRef
	if ref == nil || running.Status.Network == nil || len(running.Status.Network.IPAllocations) != 1 {
		t.Fatalf("claim status: vmRef %+v, network %+v", ref, running.Status.Network)
	}
	addr, err := ipam.ParseAllocatedAddress(running.Status.Network.IPAllocations[0].Address)
	if err != nil {
		t.Fatal(err)
	}
	vmPath := fmt.Sprintf("/nodes/%s/qemu/%d", ref.Node, ref.VMID)

	// Someone edits the VM's description: its marker no longer verifies.
	simCall(t, sim, "PUT", vmPath+"/config", url.Values{"description": {"edited by hand"}})
	if err := env.Client.Delete(context.Background(), claim); err != nil {
		t.Fatal(err)
	}
	eventually(t, 60*time.Second, "claim held for an admin", func() error {
		got, err := getClaim(t, claim)
		if err != nil {
			return err
		}
		c := hfv1.FindCondition(got.Status.Conditions, hfv1.ReadyCondition)
		if c == nil || c.Reason != string(hfv1.OwnershipMismatchReason) {
			return fmt.Errorf("Ready = %+v", c)
		}
		if !strings.Contains(c.Message, hfv1.MachineClaimFinalizer) || !strings.Contains(c.Message, fmt.Sprint(ref.VMID)) {
			t.Errorf("the Ready message names neither the finalizer nor the VM: %s", c.Message)
		}
		return nil
	})
	// Several more reconciles (a power-state poll every second) must not
	// change the verdict.
	time.Sleep(3 * time.Second)
	got, err := getClaim(t, claim)
	if err != nil {
		t.Fatalf("the claim went away while its VM may exist: %v", err)
	}
	if !slices.Contains(got.Finalizers, hfv1.MachineClaimFinalizer) {
		t.Errorf("finalizers %v lack %s", got.Finalizers, hfv1.MachineClaimFinalizer)
	}
	if got.Status.VMRef == nil || got.Status.VMRef.VMID != ref.VMID {
		t.Errorf("vmRef %+v, want VM %d kept", got.Status.VMRef, ref.VMID)
	}
	if got.Status.Network == nil || len(got.Status.Network.IPAllocations) != 1 {
		t.Errorf("status no longer records the address: %+v", got.Status.Network)
	}
	if owner, held := op.components.IPAM.Owner(pool.Name, addr); !held || owner != string(claim.UID) {
		t.Errorf("address %s: held %v by %q, want kept for the claim", addr, held, owner)
	}
	if vm := findVM(t, sim, int(ref.VMID)); vm.Status != "running" || vm.Description != "edited by hand" {
		t.Errorf("the VM was touched: %s, description %q", vm.Status, vm.Description)
	}
	wantEvents(t, claim, string(hfv1.OwnershipMismatchReason))

	// The admin checks the VM and deletes it by hand.
	simCall(t, sim, "POST", vmPath+"/status/stop", nil)
	eventually(t, 30*time.Second, "VM stopped by hand", func() error {
		if vm := findVM(t, sim, int(ref.VMID)); vm.Status != "stopped" || vm.Lock != "" {
			return fmt.Errorf("VM %s, lock %q", vm.Status, vm.Lock)
		}
		return nil
	})
	simCall(t, sim, "DELETE", vmPath+"?purge=1", nil)
	eventually(t, 60*time.Second, "claim finished after the VM was deleted by hand", func() error {
		if _, err := getClaim(t, claim); !apierrors.IsNotFound(err) {
			return fmt.Errorf("claim still there (%w)", err)
		}
		return nil
	})
	if owner, held := op.components.IPAM.Owner(pool.Name, addr); held {
		t.Errorf("address %s still held by %q after the claim finished", addr, owner)
	}
}

// TestClaimsDeletedAsCreatedLeaveNoVM: claims deleted within milliseconds
// of their creation leave no VM, whichever way each goes: deleted before
// the operator's first write, deleted after it through the deletion pass,
// or removed by the API server although the finalizer's write had
// succeeded (kubernetes/kubernetes#77988; under load 52 of 300 such claims
// were, and before the claim controller handed their VMs to the orphan
// sweeper a few of those left a clone on the cluster).
func TestClaimsDeletedAsCreatedLeaveNoVM(t *testing.T) {
	longScenario(t)
	w := newPropertyWorld(t)
	const n = 150
	var claims []*hfv1.MachineClaim
	for i := range n {
		c := w.f.newClaim(fmt.Sprintf("quick-%d", i))
		time.Sleep(time.Duration(i%4) * time.Millisecond)
		if err := env.Client.Delete(context.Background(), c); err != nil && !apierrors.IsNotFound(err) {
			t.Fatal(err)
		}
		claims = append(claims, c)
		time.Sleep(10 * time.Millisecond)
	}
	eventually(t, 2*time.Minute, "every claim gone and no VM left", func() error {
		for _, c := range claims {
			if _, err := getClaim(t, c); !apierrors.IsNotFound(err) {
				return fmt.Errorf("claim %s still there (%w)", c.Name, err)
			}
		}
		if vms := w.strayVMs(); len(vms) > 0 {
			return fmt.Errorf("VMs %v are on the cluster", vms)
		}
		return nil
	})
	t.Logf("claims the API server removed while they carried the finalizer: %d of %d",
		strings.Count(w.op.logs.String(), "Claim removed by the API server while it still carried its finalizer"), n)
}

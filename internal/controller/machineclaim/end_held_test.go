package machineclaim

import (
	"context"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/controller/machineclaim/stuck"
	proxmoxsim "github.com/hyperfleet/hyperfleet/internal/testworld/simulator/proxmox"
)

// requestEnd asks the claim to end as its pool would (spec.end), for a
// hard limit: no runner is drained first.
func (w *simWorld) requestEnd(c *hfv1.MachineClaim) {
	w.t.Helper()
	cur := w.claim(c)
	cur.Spec.End = &hfv1.MachineClaimEndRequest{Reason: hfv1.EndMaxLifetime, Message: "maxLifetime reached", RequestedAt: metav1.NewTime(unitEpoch)}
	if err := w.kube.Update(context.Background(), cur); err != nil {
		w.t.Fatal(err)
	}
}

// runUntilGone reconciles the claim pass by pass, as runUntil does, until
// it is deleted; each sees the stored claim after every pass.
func (w *simWorld) runUntilGone(c *hfv1.MachineClaim, each func(pass int, stored *hfv1.MachineClaim)) {
	w.t.Helper()
	for pass := range maxPasses {
		res, err := w.r.Reconcile(context.Background(), ctrl.Request{NamespacedName: client.ObjectKeyFromObject(c)})
		if err != nil {
			w.t.Logf("pass: %v", err)
		}
		stored := &hfv1.MachineClaim{}
		if err := w.kube.Get(context.Background(), client.ObjectKeyFromObject(c), stored); apierrors.IsNotFound(err) {
			return
		} else if err != nil {
			w.t.Fatal(err)
		}
		each(pass, stored)
		step := res.RequeueAfter
		if step <= 0 || step > time.Minute {
			step = time.Second
		}
		w.advance(step)
	}
	w.t.Fatalf("claim %s was not deleted in %d passes", c.Name, maxPasses)
}

// restart replaces the world's reconciler with one that remembers nothing,
// as an operator restarted (the provider's registry stays).
func (w *simWorld) restart() {
	old := w.r
	w.r = &Reconciler{Client: old.Client, Registry: old.Registry, Signer: old.Signer, Recorder: old.Recorder, Clock: old.Clock, CI: old.CI}
}

// vmExists reports whether the simulator still holds the VM.
func (w *simWorld) vmExists(vmid int32) bool {
	for _, vm := range w.sim.VMs() {
		if vm.VMID == int(vmid) {
			return true
		}
	}
	return false
}

// TestRoutineEndIsNotWritten: a claim whose pool asks it to end loses its
// VM and goes with no status write of its end (end_held.go): at no pass
// does the stored claim show status.end, and once it is deleted its VM is
// gone. An operator restarted in the middle of the teardown finds the end
// again from the stored spec.end and finishes it.
//
// Mutation: writing the routine end (holdsEnd always false) fails the
// first subtest: the stored claim shows status.end, phase Terminating.
func TestRoutineEndIsNotWritten(t *testing.T) {
	for _, restart := range []bool{false, true} {
		name := "one operator"
		if restart {
			name = "restarted mid-teardown"
		}
		t.Run(name, func(t *testing.T) {
			w := newSimWorld(t, simOptions{sim: func(c *proxmoxsim.Config) {
				// A destroy that takes a few passes.
				c.Latency.Destroy = proxmoxsim.Duration(5 * time.Second)
			}})
			c := w.newClaim("runner-1")
			running := w.runUntil(c, "a running VM", provisioned)
			vmid := running.Status.VMRef.VMID
			w.requestEnd(c)
			w.runUntilGone(c, func(pass int, stored *hfv1.MachineClaim) {
				if stored.Status.End != nil || stored.Status.Phase == hfv1.MachineClaimTerminating {
					t.Fatalf("pass %d wrote the routine end: phase %s, end %+v", pass, stored.Status.Phase, stored.Status.End)
				}
				if restart && pass == 0 {
					w.restart()
				}
			})
			if w.vmExists(vmid) {
				t.Errorf("the claim is gone but VM %d is not", vmid)
			}
		})
	}
}

// TestStuckEndIsWritten: a routine end whose teardown overstays the
// Terminating bound is written, with the Stuck condition, so that a
// person sees what the claim waits on.
//
// Mutation: holding a stuck end (no d.stuck.Stuck in holdsEnd) fails it.
func TestStuckEndIsWritten(t *testing.T) {
	w := newSimWorld(t, simOptions{sim: func(c *proxmoxsim.Config) {
		c.Latency.Destroy = proxmoxsim.Duration(30 * time.Minute)
	}})
	// What SetupWithManager sets.
	w.r.Stuck.Bounds, w.r.Stuck.Recorder = stuck.Bounds{Terminating: 2 * time.Minute}, w.r.Recorder
	c := w.newClaim("runner-1")
	w.runUntil(c, "a running VM", provisioned)
	w.requestEnd(c)
	got := w.runUntil(c, "its stuck end written", func(stored *hfv1.MachineClaim) bool {
		return stored.Status.End != nil
	})
	if !hfv1.IsConditionTrue(got.Status.Conditions, hfv1.MachineClaimStuckCondition) || got.Status.Phase != hfv1.MachineClaimTerminating {
		t.Errorf("end written without the claim stuck in Terminating: phase %s, conditions %+v", got.Status.Phase, got.Status.Conditions)
	}
}

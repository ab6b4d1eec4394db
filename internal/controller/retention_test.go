package controller_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/agentconfig"
)

// TestRetainedFailedVMKeepsNoCredential: a failed VM kept for debugging
// keeps neither its cloud-init ISO nor its runner registration, nor the
// runner credential placed in it. The VM's runner never comes online
// (nothing runs in the guest), so the claim fails after its JIT runner
// was registered and its credential placed in the running VM.
func TestRetainedFailedVMKeepsNoCredential(t *testing.T) {
	w := startPoolWorld(t, poolWorldOptions{noGuest: true})
	pool := w.newPool("keep", func(p *hfv1.RunnerPool) {
		p.Spec.Scaling.MinReplicas, p.Spec.Scaling.MaxReplicas = 1, 1
		p.Spec.Lifecycle = hfv1.Lifecycle{FailedRetention: &hfv1.FailedRetention{MaxRetained: 1, TTL: &metav1.Duration{Duration: time.Hour}}}
	})

	var booting hfv1.MachineClaim
	eventually(t, 2*time.Minute, "a claim waits for its runner with its credential placed", func() error {
		for _, c := range w.claims(pool) {
			cond := hfv1.FindCondition(c.Status.Conditions, hfv1.MachineClaimBootstrappedCondition)
			if c.Status.VMRef != nil && c.Status.Bootstrap != nil && c.Status.Bootstrap.RunnerName != "" && cond != nil && cond.Reason == string(hfv1.CredentialDeliveredReason) {
				booting = c
				return nil
			}
		}
		return fmt.Errorf("claims: %s", w.claimSummary())
	})
	vmid, runner := int(booting.Status.VMRef.VMID), booting.Status.Bootstrap.RunnerName
	iso := fmt.Sprintf("-%d-", vmid)
	if _, _, err := w.sim.GuestFile(context.Background(), vmid, agentconfig.SecretsFile); err != nil || !runnerRegistered(w, runner) {
		t.Fatalf("before the failure: the credential in VM %d (%v), runner %s registered %v; the test needs both", vmid, err, runner, runnerRegistered(w, runner))
	}

	patch := client.MergeFrom(booting.DeepCopy())
	booting.Spec.End = &hfv1.MachineClaimEndRequest{Reason: hfv1.EndBootstrapTimeout, Message: "the test fails it", Fail: true, RequestedAt: metav1.Now()}
	if err := env.Client.Patch(context.Background(), &booting, patch); err != nil {
		t.Fatal(err)
	}

	eventually(t, 2*time.Minute, "the failed VM retained", func() error {
		var c hfv1.MachineClaim
		if err := env.Client.Get(context.Background(), client.ObjectKeyFromObject(&booting), &c); err != nil {
			return err
		}
		if cond := hfv1.FindCondition(c.Status.Conditions, hfv1.ReadyCondition); cond == nil || cond.Reason != string(hfv1.RetainedReason) {
			return fmt.Errorf("claim %s: phase %s, Ready %+v", c.Name, c.Status.Phase, cond)
		}
		if vm := findVM(t, w.sim, vmid); vm.Status != "stopped" {
			return fmt.Errorf("retained VM %d is %s", vmid, vm.Status)
		}
		return nil
	})
	vm := findVM(t, w.sim, vmid)
	for k, v := range vm.Config {
		if strings.Contains(v, ".iso") {
			t.Errorf("retained VM %d still has a cloud-init ISO in %s: %s", vmid, k, v)
		}
	}
	if hasISO(w.sim, iso) {
		t.Errorf("the cloud-init ISO of retained VM %d is still on storage: %v", vmid, isoVolumes(w.sim))
	}
	if runnerRegistered(w, runner) {
		t.Errorf("runner %s of retained VM %d is still registered", runner, vmid)
	}
	if _, _, err := w.sim.GuestFile(context.Background(), vmid, agentconfig.SecretsFile); err == nil {
		t.Errorf("the credential placed in retained VM %d is still in it", vmid)
	}
	assertNoCanaries(t, canaryWorld{sim: w.sim, gs: w.gs, op: w.op})
}

// hasISO reports whether an ISO volume whose name contains part is stored.
func hasISO(sim *simulator, part string) bool {
	for _, v := range isoVolumes(sim) {
		if strings.Contains(v, part) {
			return true
		}
	}
	return false
}

// runnerRegistered reports whether GitHub lists a runner of that name.
func runnerRegistered(w *poolWorld, name string) bool {
	for _, r := range w.gs.Sim.Runners() {
		if r.Name == name {
			return true
		}
	}
	return false
}

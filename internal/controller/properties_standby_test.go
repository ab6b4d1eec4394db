package controller_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"pgregory.net/rapid"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/agentconfig"
	"github.com/hyperfleet/hyperfleet/internal/controller/machineclaim"
	"github.com/hyperfleet/hyperfleet/internal/testworld/proptest"
	"github.com/hyperfleet/hyperfleet/pkg/provider"
)

// Feature: hyperfleet-operator, Property 28: Standby VMs Serve One Job
//
// TestStandbyVMServesOneJobProperty: a claim of a pool's standby tier
// (spec.standby) gets its VM built, booted and suspended to disk, and
// until its pool takes it for a job (clearing spec.standby) no credential
// is issued for it and nothing secret is placed in its VM: no runner
// credential, no join token, whatever happens meanwhile (an operator
// restart, its template edited, hours standing by). Once taken, the same
// VM is resumed and receives exactly one credential, placed after the
// resume with the operator's time and fresh entropy for the guest; a
// restart after that issues none again. The draws: how many claims, when
// the operator restarts, transient hypervisor failures, the template's
// edit, how long the VMs stand by and which of them are taken.
//
// Mutation: holdStandby letting a standing claim's pass go on to
// ensureSecrets (return phase.Next() for a suspended standby claim) fails
// this test (a credential is issued for a VM standing by); so does
// resumeStandby not resuming (the claim never comes back from Resuming).
func TestStandbyVMServesOneJobProperty(t *testing.T) {
	proptest.Check(t, proptest.Minimum, func(rt *rapid.T) {
		n := rapid.IntRange(1, 3).Draw(rt, "standby claims")
		restartStanding := rapid.Bool().Draw(rt, "operator restarts while they stand by")
		restartResumed := rapid.Bool().Draw(rt, "operator restarts after the resume")
		editTemplate := rapid.Bool().Draw(rt, "template edited while they stand by")
		standFor := time.Duration(rapid.IntRange(0, 6*60).Draw(rt, "minutes standing by")) * time.Minute
		// The cluster's poll every 10 minutes: standing by is hours of the
		// operator's time, and a 5 s poll made each case thousands of
		// reconciles of the cluster alone.
		w := newLifeWorld(t, rt, lifeOptions{pollInterval: 10 * time.Minute})
		tmpl := w.template("debian")
		w.createTemplate(tmpl)
		if rapid.Bool().Draw(rt, "the hypervisor fails power changes and reads at times") {
			// Transient failures of the suspend, the resume and the
			// reads: asked again, never a second credential.
			w.setFaults(map[string]float64{"power": 0.3, "status": 0.2}, rapid.Uint64().Draw(rt, "fault seed"))
		}
		var claims []*hfv1.MachineClaim
		for i := range n {
			c := w.newClaim(fmt.Sprintf("standby-%d", i), tmpl.Name)
			c.Spec.RunnerPoolRef, c.Spec.Standby = &hfv1.ObjectName{Name: "runners"}, true
			if err := w.kube.Update(w.ctx, c); err != nil {
				rt.Fatal(err)
			}
			claims = append(claims, c)
		}
		// The invariant, after every reconcile: a claim in the tier has
		// nothing secret, issued or placed.
		w.afterStep = func(lifeItem) {
			for _, c := range claims {
				got := w.get(c)
				if got == nil || !got.Spec.Standby {
					continue
				}
				if k := w.ci.issuedFor(got.UID); k != 0 {
					rt.Fatalf("claim %s stands by, and %d runner credentials were issued for it", got.Name, k)
				}
				if got.Status.VMRef == nil {
					continue
				}
				if doc, ok := guestSecretsIn(w, w.vmidOf(got)); ok {
					rt.Fatalf("claim %s stands by, and its VM holds secrets: join token %v, runner credential %v", got.Name, doc.JoinToken != "", doc.JITConfig != "")
				}
			}
		}
		vmids := map[string]int{}
		for _, c := range claims {
			w.runUntil("claim "+c.Name+" suspended in the standby tier", func() error {
				got := w.get(c)
				if got == nil || got.Status.Phase != hfv1.MachineClaimStandby || !got.Suspended() {
					return w.pending("", got)
				}
				if vm, ok := w.hv.VM(w.vmidOf(got)); !ok || vm.Power != provider.PowerSuspended {
					return w.pending(fmt.Sprintf("its VM is not suspended (%+v)", vm), got)
				}
				return nil
			})
			vmids[c.Name] = w.vmidOf(w.get(c))
		}
		if editTemplate {
			cur := &hfv1.HypervisorMachineTemplate{}
			if err := w.kube.Get(w.ctx, client.ObjectKeyFromObject(tmpl), cur); err != nil {
				rt.Fatal(err)
			}
			cur.Spec.Resources.CPU++
			if err := w.kube.Update(w.ctx, cur); err != nil {
				rt.Fatal(err)
			}
		}
		if restartStanding {
			restartClaimController(w)
		}
		runLong(w, standFor)

		taken := rapid.SliceOfNDistinct(rapid.SampledFrom(claims), 1, n, func(c *hfv1.MachineClaim) string { return c.Name }).Draw(rt, "taken for jobs")
		for _, c := range taken {
			got := w.get(c)
			got.Spec.Standby = false
			if err := w.kube.Update(w.ctx, got); err != nil {
				rt.Fatal(err)
			}
		}
		for _, c := range taken {
			w.runUntil("claim "+c.Name+" resumed with its credential", func() error {
				got := w.get(c)
				if got == nil || got.Status.Phase != hfv1.MachineClaimBootstrapping {
					return w.pending("", got)
				}
				if b := got.Status.Bootstrap; b == nil || b.CredentialDeliveredAt == nil {
					return w.pending("credential not delivered", got)
				}
				if _, ok := guestSecretsIn(w, w.vmidOf(got)); !ok {
					return w.pending("no secrets in the VM", got)
				}
				return nil
			})
		}
		if restartResumed {
			restartClaimController(w)
		}
		w.runFor(time.Minute)
		for _, c := range claims {
			got := w.get(c)
			if got == nil {
				rt.Fatalf("claim %s is gone", c.Name)
			}
			if vmid := w.vmidOf(got); vmid != vmids[c.Name] {
				rt.Fatalf("claim %s's VM is %d, not the standby VM %d it was given", c.Name, vmid, vmids[c.Name])
			}
			if !slices.Contains(taken, c) {
				if !got.Suspended() || got.Status.Phase != hfv1.MachineClaimStandby {
					rt.Fatalf("claim %s was not taken and is no longer standing by: %s", c.Name, w.describe(got))
				}
				continue
			}
			st := got.Status.Standby
			if st == nil || st.SuspendedAt == nil || st.ResumedAt == nil || st.ResumedAt.Before(st.SuspendedAt) {
				rt.Fatalf("claim %s: status.standby %+v, want suspendedAt, then resumedAt", c.Name, st)
			}
			if vm, _ := w.hv.VM(w.vmidOf(got)); vm.Power != provider.PowerRunning {
				rt.Fatalf("claim %s's VM is %s after its resume", c.Name, vm.Power)
			}
			doc, _ := guestSecretsIn(w, w.vmidOf(got))
			if k := w.ci.issuedFor(got.UID); k != 1 {
				rt.Fatalf("claim %s: %d runner credentials issued, want exactly 1", c.Name, k)
			}
			if doc.JITConfig == "" {
				rt.Fatalf("claim %s's VM holds no runner credential after its resume", c.Name)
			}
			if f := doc.Fresh; f == nil || len(f.Entropy) != agentconfig.FreshEntropyBytes || f.Time.Before(st.ResumedAt.Time) {
				rt.Fatalf("claim %s: the secrets placed after the resume carry fresh %+v, want the operator's time (not before the resume at %s) and %d bytes of entropy",
					c.Name, f, st.ResumedAt.Time, agentconfig.FreshEntropyBytes)
			}
		}
	})
}

// runLong runs the world for d an hour at a time: the cluster's poll alone
// is hundreds of reconciles an hour, and one runFor bounds its reconciles
// as a hot loop would.
func runLong(w *lifeWorld, d time.Duration) {
	for ; d > time.Hour; d -= time.Hour {
		w.runFor(time.Hour)
	}
	w.runFor(d)
}

// restartClaimController replaces the world's claim controller with a new
// one, as an operator restart does: what the old one kept in memory is
// lost.
func restartClaimController(w *lifeWorld) {
	old := w.claims
	w.claims = &machineclaim.Reconciler{Client: old.Client, Registry: old.Registry, Recorder: old.Recorder, Clock: old.Clock,
		Signer: old.Signer, CI: old.CI, Identity: old.Identity}
	// Everything is looked at again after a restart.
	var list hfv1.MachineClaimList
	if err := w.kube.List(w.ctx, &list); err != nil {
		w.t.Fatal(err)
	}
	for i := range list.Items {
		w.enqueue(lifeItem{"claim", client.ObjectKeyFromObject(&list.Items[i])}, 0)
	}
}

// TestStandbyClaimLifecycle walks one standby claim through its states in
// the cheap world, the phases and conditions a person reads on the way.
func TestStandbyClaimLifecycle(t *testing.T) {
	w := newLifeWorld(t, t, lifeOptions{})
	w.createTemplate(w.template("debian"))
	c := w.newClaim("standby", "debian")
	c.Spec.RunnerPoolRef, c.Spec.Standby = &hfv1.ObjectName{Name: "runners"}, true
	if err := w.kube.Update(w.ctx, c); err != nil {
		t.Fatal(err)
	}
	w.runUntil("suspended", func() error {
		got := w.get(c)
		if got == nil || !got.Suspended() {
			return w.pending("", got)
		}
		return nil
	})
	got := w.get(c)
	if cond := hfv1.FindCondition(got.Status.Conditions, hfv1.MachineClaimBootstrappedCondition); cond == nil || cond.Reason != string(hfv1.StandingByReason) {
		t.Errorf("Bootstrapped of a suspended standby claim: %+v, want reason %s", cond, hfv1.StandingByReason)
	}
	if got.Status.Phase != hfv1.MachineClaimStandby || got.Status.PhaseTimes == nil || got.Status.PhaseTimes.Standby == nil {
		t.Errorf("phase %s, phase times %+v; want %s with its time", got.Status.Phase, got.Status.PhaseTimes, hfv1.MachineClaimStandby)
	}
	passes := 0
	w.afterStep = func(it lifeItem) {
		if it.kind == "claim" {
			passes++
		}
	}
	runLong(w, 6*time.Hour)
	// One pass: the one its own status write (suspendedAt) queued.
	if passes > 1 {
		t.Errorf("%d passes of a claim standing by for 6h, want at most the one its last write queued (nothing to do until its pool takes it)", passes)
	}
	w.afterStep = nil
	got = w.get(c)
	got.Spec.Standby = false
	if err := w.kube.Update(w.ctx, got); err != nil {
		t.Fatal(err)
	}
	w.runUntil("resumed and its credential delivered", func() error {
		got := w.get(c)
		if got == nil || got.Status.Bootstrap == nil || got.Status.Bootstrap.CredentialDeliveredAt == nil {
			return w.pending("", got)
		}
		return nil
	})

	// The guest renews its DHCP lease before it uses its credential, and
	// the server gives it another address: once its runner registered,
	// the claim reads the addresses again and reports the new one.
	got = w.get(c)
	renewed := "192.0.2.77"
	if err := w.hv.SetGuestAddress(w.vmidOf(got), renewed); err != nil {
		t.Fatal(err)
	}
	if slices.Contains(got.Status.Network.Addresses, renewed) {
		t.Fatalf("the claim reports %v before the renewal", got.Status.Network.Addresses)
	}
	now := metav1.NewTime(w.clk.Now())
	got.Status.Bootstrap.RegisteredAt = &now
	if err := w.kube.Status().Update(w.ctx, got); err != nil {
		t.Fatal(err)
	}
	w.runUntil("the renewed address reported", func() error {
		got := w.get(c)
		if got == nil || got.Status.Network == nil || !slices.Equal(got.Status.Network.Addresses, []string{renewed}) {
			return w.pending("addresses", got)
		}
		return nil
	})
	if cond := hfv1.FindCondition(w.get(c).Status.Conditions, hfv1.MachineClaimProvisionedCondition); cond == nil || !strings.Contains(cond.Message, renewed) {
		t.Errorf("Provisioned %+v, want it to name the renewed address %s", cond, renewed)
	}

	events := w.rec.of(c.Name)
	for _, want := range []string{string(hfv1.StandingByReason), string(hfv1.ResumingReason), "AddressesChanged"} {
		if !slices.ContainsFunc(events, func(e string) bool { return strings.Contains(e, want) }) {
			t.Errorf("events %v: none %s", events, want)
		}
	}
}

// TestStandbyRefusedForAttestingTemplates: a standby claim of a template
// whose VMs attest with SPIRE fails, reason StandbyUnsupported, before its
// VM is suspended and before anything secret reaches it: its join token,
// issued with the build, would expire while it stood by.
func TestStandbyRefusedForAttestingTemplates(t *testing.T) {
	w := newLifeWorld(t, t, lifeOptions{spire: true})
	tmpl := w.template("debian")
	tmpl.Spec.Attestation.Method = hfv1.AttestationJoinToken
	w.createTemplate(tmpl)
	c := w.newClaim("standby", tmpl.Name)
	c.Spec.RunnerPoolRef, c.Spec.Standby = &hfv1.ObjectName{Name: "runners"}, true
	if err := w.kube.Update(w.ctx, c); err != nil {
		t.Fatal(err)
	}
	w.runUntil("failed", func() error {
		got := w.get(c)
		if got == nil || !got.HasFailed() {
			return w.pending("", got)
		}
		return nil
	})
	got := w.get(c)
	if cond := hfv1.FindCondition(got.Status.Conditions, hfv1.MachineClaimProvisionedCondition); cond == nil || cond.Reason != string(hfv1.StandbyUnsupportedReason) {
		t.Errorf("Provisioned %+v, want reason %s", cond, hfv1.StandbyUnsupportedReason)
	}
	if got.Status.VMRef != nil {
		if doc, ok := guestSecretsIn(w, w.vmidOf(got)); ok {
			t.Errorf("the VM of a refused standby claim received secrets (join token %v)", doc.JoinToken != "")
		}
	}
}

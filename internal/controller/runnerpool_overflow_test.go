package controller

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/record"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/metrics"
)

// Overflow across clusters in the pool world: a pool whose templateRef
// (debian, on HypervisorCluster alpha) and whose placement template
// (debian-beta, on beta) take its VMs in turn. The test plays the claim
// controller and the clusters' state: alpha at maxMachines spills the
// pool's new VMs to beta; beta partitioned while alpha has room again
// brings them back to alpha.

// overflowCluster is a connected HypervisorCluster (or not).
func overflowCluster(name string, connected bool) *hfv1.HypervisorCluster {
	st, reason, msg := metav1.ConditionTrue, "Connected", "connected"
	if !connected {
		st, reason, msg = metav1.ConditionFalse, string(hfv1.ClusterUnavailableReason), "dial tcp 10.0.0.2:8006: i/o timeout"
	}
	return &hfv1.HypervisorCluster{ObjectMeta: metav1.ObjectMeta{Name: name},
		Status: hfv1.HypervisorClusterStatus{Conditions: []metav1.Condition{{Type: string(hfv1.HypervisorClusterConnectedCondition), Status: st,
			Reason: reason, Message: msg, LastTransitionTime: metav1.Time{Time: unitEpoch}}}}}
}

// overflowTemplates are the pool world's template on alpha and a copy of
// it on beta with its own hash.
func overflowTemplates() (*hfv1.HypervisorMachineTemplate, *hfv1.HypervisorMachineTemplate) {
	alpha := poolWorldTemplate()
	alpha.Spec.HypervisorClusterRef.Name = "alpha"
	beta := poolWorldTemplate()
	beta.Name = "debian-beta"
	beta.Spec.HypervisorClusterRef.Name = "beta"
	beta.Status.TemplateHash = "hash-beta"
	return alpha, beta
}

// newOverflowWorld is the pool world with two templates on two connected
// clusters; its recorder keeps the events.
func newOverflowWorld(t *testing.T, strategy hfv1.PlacementStrategy) (*poolWorld, *record.FakeRecorder) {
	pool := poolWorldPool(2, 4)
	pool.Spec.Placement = &hfv1.PoolPlacement{Strategy: strategy, Templates: []hfv1.ObjectName{{Name: "debian-beta"}}}
	_, beta := overflowTemplates()
	w := newPoolWorld(t, unitEpoch, pool, beta, overflowCluster("alpha", true), overflowCluster("beta", true))
	// newPoolWorld wrote its own debian: put it on alpha.
	tmpl := &hfv1.HypervisorMachineTemplate{}
	if err := w.c.Get(context.Background(), client.ObjectKey{Namespace: poolWorldNamespace, Name: "debian"}, tmpl); err != nil {
		t.Fatal(err)
	}
	tmpl.Spec.HypervisorClusterRef.Name = "alpha"
	if err := w.c.Update(context.Background(), tmpl); err != nil {
		t.Fatal(err)
	}
	rec := record.NewFakeRecorder(100)
	w.r.Recorder = rec
	return w, rec
}

// waitWith plays the claim controller on a claim that cannot be placed.
func (w *poolWorld) waitWith(c *hfv1.MachineClaim, reason hfv1.ConditionReason) {
	w.t.Helper()
	c.Status.Conditions = append(c.Status.Conditions, metav1.Condition{Type: string(hfv1.MachineClaimProvisionedCondition), Status: metav1.ConditionFalse,
		Reason: string(reason), Message: "waits", LastTransitionTime: metav1.Time{Time: w.clk.Now()}})
	w.updateClaimStatus(c)
}

// place plays the claim controller placing a claim's VM on its template's
// cluster.
func (w *poolWorld) place(c *hfv1.MachineClaim, cluster, hash string) {
	w.t.Helper()
	c.Status.VMRef = hfv1.NewVMReference(cluster, c.Name, "node1")
	c.Status.TemplateHash = hash
	w.updateClaimStatus(c)
}

// collectDeleted plays the claim controller releasing the claims the pool
// deleted (nothing was placed for them), and names them.
func (w *poolWorld) collectDeleted() []string {
	w.t.Helper()
	var gone []string
	for name, c := range w.claims() {
		if !c.DeletionTimestamp.IsZero() {
			gone = append(gone, name)
			// Its finalizer goes; the API server then removes it.
			c.Finalizers = nil
			if err := w.c.Update(context.Background(), c); err != nil {
				w.t.Fatalf("release deleted claim %s: %v", name, err)
			}
		}
	}
	return gone
}

// spillPass runs a pass, plays the claim controller on the claims it
// deleted, fails unless those are want, and returns the live claims by
// template.
func (w *poolWorld) spillPass(t *testing.T, want ...string) map[string][]*hfv1.MachineClaim {
	t.Helper()
	w.pass()
	gone := w.collectDeleted()
	slices.Sort(gone)
	if !slices.Equal(gone, want) && len(gone)+len(want) > 0 {
		t.Fatalf("the pass deleted %v, want %v", gone, want)
	}
	return w.onTemplate()
}

// onTemplate names the pool's live claims by template.
func (w *poolWorld) onTemplate() map[string][]*hfv1.MachineClaim {
	out := map[string][]*hfv1.MachineClaim{}
	for _, c := range w.sortedClaims() {
		if c.DeletionTimestamp.IsZero() {
			out[c.Spec.TemplateRef.Name] = append(out[c.Spec.TemplateRef.Name], c)
		}
	}
	return out
}

func placementOf(t *testing.T, p *hfv1.RunnerPool, name string) hfv1.TemplatePlacement {
	t.Helper()
	for _, tp := range p.Status.Placement {
		if tp.Name == name {
			return tp
		}
	}
	t.Fatalf("status.placement has no %s: %+v", name, p.Status.Placement)
	return hfv1.TemplatePlacement{}
}

func drainEvents(rec *record.FakeRecorder) (out []string) {
	for len(rec.Events) > 0 {
		out = append(out, <-rec.Events)
	}
	return out
}

func TestOverflowSpillsToTheNextClusterAndReturns(t *testing.T) {
	w, rec := newOverflowWorld(t, hfv1.PlacementPack)
	w.pass()
	on := w.onTemplate()
	if len(on["debian"]) != 2 || len(on["debian-beta"]) != 0 {
		t.Fatalf("pack with both clusters Available: claims by template %v, want both on debian", claimNamesByTemplate(on))
	}
	for _, c := range on["debian"] {
		if c.Labels[hfv1.HypervisorClusterLabel] != "alpha" || c.Labels[hfv1.TemplateHashLabel] != "hash-1" {
			t.Errorf("claim %s on debian has labels %v", c.Name, c.Labels)
		}
	}
	p := w.pool()
	if a := placementOf(t, p, "debian"); a.State != hfv1.TemplateAvailable || a.Machines != 2 || a.HypervisorCluster != "alpha" {
		t.Errorf("debian: %+v", a)
	}

	// Alpha reaches maxMachines: the first claim got its VM, the second
	// waits. It is spilled, and its replacement goes to beta in the same
	// pass.
	placed, waiting := on["debian"][0], on["debian"][1]
	w.place(placed, "alpha", "hash-1")
	w.comeOnline(placed)
	w.waitWith(waiting, hfv1.MaxMachinesReachedReason)
	on = w.spillPass(t, waiting.Name)
	if len(on["debian"]) != 1 || len(on["debian-beta"]) != 1 {
		t.Fatalf("after alpha filled: claims by template %v, want one on each", claimNamesByTemplate(on))
	}
	spilled := on["debian-beta"][0]
	if spilled.Labels[hfv1.HypervisorClusterLabel] != "beta" || spilled.Labels[hfv1.TemplateHashLabel] != "hash-beta" ||
		spilled.Labels[hfv1.MachineTemplateLabel] != "debian-beta" || spilled.Spec.WorkloadConfig == nil {
		t.Errorf("spilled claim %s: labels %v, workload %+v", spilled.Name, spilled.Labels, spilled.Spec.WorkloadConfig)
	}
	p = w.pool()
	a, b := placementOf(t, p, "debian"), placementOf(t, p, "debian-beta")
	if a.State != hfv1.TemplateFull || !strings.Contains(a.Message, string(hfv1.MaxMachinesReachedReason)) || a.Machines != 1 {
		t.Errorf("debian after alpha filled: %+v, want Full naming MaxMachinesReached with 1 machine", a)
	}
	if b.State != hfv1.TemplateAvailable || b.Machines != 1 || b.HypervisorCluster != "beta" {
		t.Errorf("debian-beta after alpha filled: %+v", b)
	}
	events := drainEvents(rec)
	if !slices.ContainsFunc(events, func(e string) bool {
		return strings.Contains(e, "Spilled") && strings.Contains(e, "debian-beta") && strings.Contains(e, "Full")
	}) {
		t.Errorf("no Spilled event naming both templates and the reason: %v", events)
	}

	// The overflow VM is judged against its own template's hash: not
	// stale, and not replaced.
	w.place(spilled, "beta", "hash-beta")
	w.pass()
	if p = w.pool(); p.Status.StaleReplicas != 0 {
		t.Errorf("staleReplicas %d with every VM built from its own template's current hash", p.Status.StaleReplicas)
	}
	if gone := w.collectDeleted(); len(gone) != 0 || len(w.endClaims()) != 0 {
		t.Errorf("the pool ended claims %v of a steady pool", gone)
	}
	// Alpha stays Full though no claim waits there any more (it was
	// spilled): nothing observed since can have made room.
	if a := placementOf(t, p, "debian"); a.State != hfv1.TemplateFull || a.Since == nil {
		t.Errorf("debian a pass after the spill: %+v, want still Full, with its since", a)
	}
	// Alpha's status is polled again after that: the next VM may try it.
	polled := overflowCluster("alpha", true)
	polled.Status.LastPollTime = &metav1.Time{Time: w.clk.Now().Add(time.Second)}
	setCluster(t, w, polled)
	w.pass()
	if a := placementOf(t, w.pool(), "debian"); a.State != hfv1.TemplateAvailable {
		t.Errorf("debian after alpha's status was polled again: %+v, want Available", a)
	}

	// Beta is partitioned and alpha has room again (its VM's job is done
	// and the VM gone). The pool needs VMs: they go back to alpha, both of
	// its minimum, since the claim on beta (its VM not up) is stranded
	// there until beta is back.
	setCluster(t, w, overflowCluster("beta", false))
	w.destroy(placed)
	w.pass()
	on = w.onTemplate()
	if len(on["debian"]) != 2 || len(on["debian-beta"]) != 1 {
		t.Fatalf("after beta partitioned: claims by template %v, want two new ones on debian", claimNamesByTemplate(on))
	}
	p = w.pool()
	a, b = placementOf(t, p, "debian"), placementOf(t, p, "debian-beta")
	if a.State != hfv1.TemplateAvailable || a.Machines != 2 {
		t.Errorf("debian after alpha had room: %+v", a)
	}
	if b.State != hfv1.TemplateUnreachable || !strings.Contains(b.Message, "beta is not connected") {
		t.Errorf("debian-beta after the partition: %+v, want Unreachable naming the cluster", b)
	}
	// The VM already on beta stays: VMs are single-use and end with their
	// job, never moved.
	if on["debian-beta"][0].Name != spilled.Name {
		t.Errorf("the VM on beta was replaced: %v", claimNamesByTemplate(on))
	}
}

// TestOverflowSpillsUnplacedClaimsOfAnUnreachableCluster: a claim that
// waits for its template's cluster, with nothing placed, is replaced on a
// template that takes VMs; a claim with a VM on it is not.
func TestOverflowSpillsUnplacedClaimsOfAnUnreachableCluster(t *testing.T) {
	w, _ := newOverflowWorld(t, hfv1.PlacementSpread)
	w.pass()
	on := w.onTemplate()
	if len(on["debian"]) != 1 || len(on["debian-beta"]) != 1 {
		t.Fatalf("spread over two Available templates: %v, want one on each", claimNamesByTemplate(on))
	}
	setCluster(t, w, overflowCluster("alpha", false))
	building := on["debian"][0]
	w.place(building, "alpha", "hash-1")
	// A claim with a VM on the partitioned cluster is not spilled.
	w.spillPass(t)
	if a := placementOf(t, w.pool(), "debian"); a.State != hfv1.TemplateUnreachable {
		t.Errorf("debian with alpha partitioned: %+v", a)
	}
	// A new claim (the pool grows) goes to beta; one waiting on alpha with
	// nothing placed moves there.
	fresh := poolWorldClaim(w.pool(), "runners-waiting", w.clk.Now())
	fresh.Finalizers = []string{hfv1.MachineClaimFinalizer}
	if err := w.c.Create(context.Background(), fresh); err != nil {
		t.Fatal(err)
	}
	w.waitWith(fresh, hfv1.ClusterUnavailableReason)
	w.editPool(func(p *hfv1.RunnerPool) { p.Spec.Scaling.MinReplicas = 3 })
	// The waiting claim, nothing placed, is spilled.
	on = w.spillPass(t, fresh.Name)
	// The claim with a VM on alpha is stranded there: it holds its place
	// under maxReplicas but serves no demand, so the pool's three go to
	// beta.
	if len(on["debian"]) != 1 || len(on["debian-beta"]) != 3 || on["debian"][0].Name != building.Name {
		t.Errorf("after the spill: %v, want the VM on alpha kept and three on beta", claimNamesByTemplate(on))
	}
}

// TestOverflowTemplateMustBootstrapAsTemplateRef: an overflow template
// whose bootstrap differs is Invalid and takes no VMs, and the message
// names it.
func TestOverflowTemplateMustBootstrapAsTemplateRef(t *testing.T) {
	w, _ := newOverflowWorld(t, hfv1.PlacementSpread)
	beta := &hfv1.HypervisorMachineTemplate{}
	if err := w.c.Get(context.Background(), client.ObjectKey{Namespace: poolWorldNamespace, Name: "debian-beta"}, beta); err != nil {
		t.Fatal(err)
	}
	beta.Spec.Bootstrap.GitHub.Organization = "other-org"
	if err := w.c.Update(context.Background(), beta); err != nil {
		t.Fatal(err)
	}
	w.editPool(func(p *hfv1.RunnerPool) {
		p.Spec.Placement.Templates = append(p.Spec.Placement.Templates, hfv1.ObjectName{Name: "missing"})
	})
	w.pass()
	on := w.onTemplate()
	if len(on["debian"]) != 2 || len(on["debian-beta"]) != 0 {
		t.Errorf("claims by template %v, want none on the Invalid template", claimNamesByTemplate(on))
	}
	p := w.pool()
	if b := placementOf(t, p, "debian-beta"); b.State != hfv1.TemplateInvalid || !strings.Contains(b.Message, "debian-beta") || !strings.Contains(b.Message, "spec.bootstrap") {
		t.Errorf("debian-beta with another bootstrap: %+v", b)
	}
	if m := placementOf(t, p, "missing"); m.State != hfv1.TemplateInvalid || !strings.Contains(m.Message, "does not exist") {
		t.Errorf("a missing template: %+v", m)
	}
}

// TestTemplateStateMetricStatesAreTheAPIs: the metric reports every state
// the API has, and only those.
func TestTemplateStateMetricStatesAreTheAPIs(t *testing.T) {
	api := []string{string(hfv1.TemplateAvailable), string(hfv1.TemplateFull), string(hfv1.TemplateOverQuota), string(hfv1.TemplateUnreachable), string(hfv1.TemplateInvalid)}
	if !slices.Equal(metrics.TemplateStates, api) {
		t.Errorf("metrics.TemplateStates %v, API %v", metrics.TemplateStates, api)
	}
}

func setCluster(t *testing.T, w *poolWorld, c *hfv1.HypervisorCluster) {
	t.Helper()
	cur := &hfv1.HypervisorCluster{}
	if err := w.c.Get(context.Background(), client.ObjectKey{Name: c.Name}, cur); err != nil {
		t.Fatal(err)
	}
	cur.Spec, cur.Status = c.Spec, c.Status
	if err := w.c.Update(context.Background(), cur); err != nil {
		t.Fatal(err)
	}
}

func claimNamesByTemplate(on map[string][]*hfv1.MachineClaim) map[string][]string {
	out := map[string][]string{}
	for k, cs := range on {
		for _, c := range cs {
			out[k] = append(out[k], c.Name)
		}
	}
	return out
}

// TestPlacementMachinesWaitWithTheCounts: status.placement's machines
// are counts (held with the others, runnerpool_statusbatch.go); a
// template's state is not.
func TestPlacementMachinesWaitWithTheCounts(t *testing.T) {
	before := poolWorldPool(1, 4)
	before.Status.Placement = []hfv1.TemplatePlacement{{Name: "debian", State: hfv1.TemplateAvailable, Machines: 1}, {Name: "b", State: hfv1.TemplateAvailable}}
	after := before.DeepCopy()
	after.Status.Placement[0].Machines = 2
	if !countsOnly(before, after) {
		t.Error("a change of a template's machines alone is written at once")
	}
	after.Status.Placement[1].State = hfv1.TemplateFull
	if countsOnly(before, after) {
		t.Error("a change of a template's state waits with the counts")
	}
}

// TestOverflowFullAtMaxMachines: a cluster holding its
// spec.limits.maxMachines of the install's claims' VMs is Full before any
// claim of the pool waits there (another pool's VMs count too), so the
// pool's first claims go to the next template; raising the cap makes it
// Available again.
func TestOverflowFullAtMaxMachines(t *testing.T) {
	w, _ := newOverflowWorld(t, hfv1.PlacementPack)
	capped := overflowCluster("alpha", true)
	capped.Spec.Limits = &hfv1.HypervisorLimits{MaxMachines: ptr.To[int32](1)}
	setCluster(t, w, capped)
	other := &hfv1.MachineClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "other", Name: "elsewhere"},
		Spec: hfv1.MachineClaimSpec{TemplateRef: hfv1.ObjectName{Name: "x"}}}
	if err := w.c.Create(context.Background(), other); err != nil {
		t.Fatal(err)
	}
	other.Status.VMRef = hfv1.NewVMReference("alpha", "proxmox://4000", "pve1")
	if err := w.c.Status().Update(context.Background(), other); err != nil {
		t.Fatal(err)
	}
	w.pass()
	on := w.onTemplate()
	if len(on["debian"]) != 0 || len(on["debian-beta"]) != 2 {
		t.Fatalf("alpha at maxMachines: claims by template %v, want both on debian-beta", claimNamesByTemplate(on))
	}
	if a := placementOf(t, w.pool(), "debian"); a.State != hfv1.TemplateFull || !strings.Contains(a.Message, "at its spec.limits.maxMachines (1)") {
		t.Errorf("debian with alpha at maxMachines: %+v, want Full naming the cap", a)
	}
	capped.Spec.Limits.MaxMachines = ptr.To[int32](4)
	setCluster(t, w, capped)
	w.pass()
	if a := placementOf(t, w.pool(), "debian"); a.State != hfv1.TemplateAvailable {
		t.Errorf("debian with alpha's cap raised: %+v, want Available", a)
	}
}

package controller_test

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/ipam"
	"github.com/hyperfleet/hyperfleet/internal/manager"
	"github.com/hyperfleet/hyperfleet/internal/metrics"
	"github.com/hyperfleet/hyperfleet/internal/testworld/identitytest"
	"github.com/hyperfleet/hyperfleet/internal/testworld/simulator/github/githubsimtest"
	proxmoxsim "github.com/hyperfleet/hyperfleet/internal/testworld/simulator/proxmox"
)

// adminWorld is an operator whose claims hold everything a force-delete or
// a disownment releases: runners registered on the GitHub simulator, SPIFFE
// identities on an in-memory SPIRE server (the cluster's spec.spire; the
// agent server carries the broker such templates need) and static
// addresses of an IPPool; and a fast orphan sweep.
type adminWorld struct {
	f     *fixture
	sim   *simulator
	gs    *githubsimtest.Server
	spire *identitytest.Server
	op    *operator
	pool  *hfv1.IPPool
}

func startAdminWorld(t *testing.T) *adminWorld {
	t.Helper()
	sim := startSimCapturingSeeds(t, t.TempDir())
	gs := startGitHub(t)
	spire := identitytest.NewServer(t, "example.org")
	certFile, keyFile, _ := webhookCertificate(t)
	agents := t.TempDir()
	if err := os.WriteFile(filepath.Join(agents, "hyperfleet-agent-linux-amd64"), []byte("\x7fELF stand-in for the agent"), 0o755); err != nil {
		t.Fatal(err)
	}
	op := startOperator(t, operatorOptions{
		github: gs.Transport, spireDial: identitytest.Dialer(spire), maxRetryDelay: 2 * time.Second,
		sweepInterval: 300 * time.Millisecond, orphanGrace: time.Second,
		agentServer: &manager.AgentServerOptions{Addr: "127.0.0.1:0", CertFile: certFile, KeyFile: keyFile, Dir: agents, URL: "https://hyperfleet-agent.test:9443"},
	})
	f := newFixture(t, sim, func(c *hfv1.HypervisorCluster) {
		c.Spec.SPIRE = &hfv1.SPIREConfig{
			TrustDomain: "example.org", ServerAddress: "spire.example.org:8081",
			ServerAPI:           hfv1.SPIREServerAPI{AdminSocket: "/run/spire/server/api.sock"},
			AttestationDeadline: &metav1.Duration{Duration: 10 * time.Minute},
		}
	})
	f.useGitHub(gs, nil)
	pool := &hfv1.IPPool{
		ObjectMeta: metav1.ObjectMeta{Name: "pool-" + f.namespace},
		// .0 is the network, .7 the broadcast, .1 the gateway.
		Spec: hfv1.IPPoolSpec{Addresses: []string{"10.30.0.0/29"}, Prefix: 29, Gateways: []string{"10.30.0.1"}},
	}
	f.create(pool)
	t.Cleanup(func() { _ = env.Client.Delete(context.Background(), pool) })
	return &adminWorld{f: f, sim: sim, gs: gs, spire: spire, op: op, pool: pool}
}

// annotateClaim sets annotation key of the claim, as a platform admin's
// kubectl annotate does.
func annotateClaim(t *testing.T, c *hfv1.MachineClaim, key, value string) {
	t.Helper()
	err := retry.RetryOnConflict(conflictRetry, func() error {
		cur := &hfv1.MachineClaim{}
		if err := env.Client.Get(context.Background(), client.ObjectKeyFromObject(c), cur); err != nil {
			return err
		}
		before := cur.DeepCopy()
		if cur.Annotations == nil {
			cur.Annotations = map[string]string{}
		}
		cur.Annotations[key] = value
		return env.Client.Patch(context.Background(), cur, client.MergeFrom(before))
	})
	if err != nil {
		t.Fatal(err)
	}
}

// addressOf is the address a claim's status records, without its prefix.
func addressOf(t *testing.T, c *hfv1.MachineClaim) netip.Addr {
	t.Helper()
	if c.Status.Network == nil || len(c.Status.Network.IPAllocations) != 1 {
		t.Fatalf("claim %s records addresses %+v, want one", c.Name, c.Status.Network)
	}
	a, err := ipam.ParseAllocatedAddress(c.Status.Network.IPAllocations[0].Address)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// TestForceDeleteClaimsOfAnUnreachableCluster: the deletion of two claims
// waits while their cluster cannot be reached; a platform admin's
// hyperfleet.io/force-delete lets both go without the hypervisor, the one
// with its runner removed from GitHub, the other with its SPIFFE entries
// deleted from the SPIRE server and its static address back in the pool,
// each with a ForceDeleted event and a count in
// hyperfleet_claims_force_deleted_total. When the cluster is back, the
// orphan sweeper destroys both abandoned VMs: their markers still verify
// for claims that no longer exist.
func TestForceDeleteClaimsOfAnUnreachableCluster(t *testing.T) {
	w := startAdminWorld(t)
	f := w.f
	attested := f.template.DeepCopy()
	attested.ObjectMeta = metav1.ObjectMeta{Namespace: f.namespace, Name: "attested"}
	attested.Status = hfv1.HypervisorMachineTemplateStatus{}
	attested.Spec.Attestation = hfv1.Attestation{Method: hfv1.AttestationJoinToken, JoinToken: &hfv1.JoinTokenAttestation{TTL: &metav1.Duration{Duration: 10 * time.Minute}}}
	attested.Spec.Network = hfv1.MachineNetwork{Mode: hfv1.NetworkModeStatic, IPPoolRef: &hfv1.ObjectName{Name: w.pool.Name}}
	f.create(attested)
	waitTemplate(t, attested, metav1.ConditionTrue, "")

	start := time.Now()
	step := func(what string) { t.Logf("%6.1fs %s", time.Since(start).Seconds(), what) }
	runner := waitDelivered(t, f.newClaim("runner"), 90*time.Second)
	step("runner delivered")
	runnerName := runner.Status.Bootstrap.RunnerName
	if len(runnerIDs(w.gs, runnerName)) != 1 {
		t.Fatalf("runner %s is not registered on GitHub (runners %+v)", runnerName, w.gs.Sim.Runners())
	}
	identity := &hfv1.MachineClaim{ObjectMeta: metav1.ObjectMeta{Namespace: f.namespace, Name: "identity"},
		Spec: hfv1.MachineClaimSpec{TemplateRef: hfv1.ObjectName{Name: attested.Name}}}
	f.create(identity)
	waitClaimProvisioned(t, identity, metav1.ConditionTrue, string(hfv1.ReadyReason))
	identity, err := getClaim(t, identity)
	if err != nil {
		t.Fatal(err)
	}
	addr := addressOf(t, identity)
	if st := w.spire.State(); len(st.Entries) != 1 {
		t.Fatalf("the SPIRE server holds entries %v, want the claim's", st.Entries)
	}
	vms := []int{int(runner.Status.VMRef.VMID), int(identity.Status.VMRef.VMID)}
	step("identity provisioned")

	// The cluster goes away: deleting the claims waits for it.
	if err := w.sim.SetFaults(proxmoxsim.Faults{Classes: map[string]proxmoxsim.FaultSpec{"*": {DropRate: 1}}}); err != nil {
		t.Fatal(err)
	}
	waitClusterReady(t, f.cluster, metav1.ConditionFalse)
	step("cluster down")
	for _, c := range []*hfv1.MachineClaim{runner, identity} {
		if err := env.Client.Delete(context.Background(), c); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, 30*time.Second, "the deletions wait for the cluster", func() error {
		for _, c := range []*hfv1.MachineClaim{runner, identity} {
			got, err := getClaim(t, c)
			if err != nil {
				return fmt.Errorf("claim %s: %w", c.Name, err)
			}
			e := hfv1.FindCondition(got.Status.Conditions, hfv1.MachineClaimEndingCondition)
			if e == nil || e.Reason != string(hfv1.ClusterUnavailableReason) && e.Reason != string(hfv1.UnreachableReason) || got.Status.VMRef == nil {
				return fmt.Errorf("claim %s: Ending %+v, vmRef %+v", c.Name, e, got.Status.VMRef)
			}
		}
		return nil
	})

	step("deletions wait")
	for _, c := range []*hfv1.MachineClaim{runner, identity} {
		annotateClaim(t, c, hfv1.ForceDeleteAnnotation, "pve is gone for good (test)")
	}
	for _, c := range []*hfv1.MachineClaim{runner, identity} {
		waitGone(t, c, 30*time.Second)
		wantEvents(t, c, string(hfv1.ForceDeletedReason))
	}
	if ids := runnerIDs(w.gs, runnerName); len(ids) != 0 {
		t.Errorf("runner %s is still registered on GitHub: %v", runnerName, ids)
	}
	if st := w.spire.State(); len(st.Entries) != 0 || len(st.Aliases) != 0 {
		t.Errorf("the SPIRE server still holds entries %v and agent aliases %v", st.Entries, st.Aliases)
	}
	if owner, held := w.op.components.IPAM.Owner(w.pool.Name, addr); held {
		t.Errorf("address %s is still held by %s", addr, owner)
	}
	if got := testutil.ToFloat64(metrics.ClaimsForceDeleted.WithLabelValues(f.cluster.Name)); got != 2 {
		t.Errorf("hyperfleet_claims_force_deleted_total{cluster=%q} = %v, want 2", f.cluster.Name, got)
	}
	for _, vmid := range vms {
		findVM(t, w.sim, vmid)
	}

	step("claims force-deleted")
	// The cluster is back: its sweep finds both VMs orphaned.
	if err := w.sim.SetFaults(proxmoxsim.Faults{}); err != nil {
		t.Fatal(err)
	}
	// Any edit of the cluster makes it probe at once instead of at the
	// end of its backoff after this test's failures (tens of seconds).
	c := &hfv1.HypervisorCluster{}
	if err := env.Client.Get(context.Background(), client.ObjectKeyFromObject(f.cluster), c); err != nil {
		t.Fatal(err)
	}
	patched := c.DeepCopy()
	patched.Annotations = map[string]string{"example.com/back": "yes"}
	if err := env.Client.Patch(context.Background(), patched, client.MergeFrom(c)); err != nil {
		t.Fatal(err)
	}
	eventually(t, 90*time.Second, "the abandoned VMs destroyed by the orphan sweeper", func() error {
		for _, vm := range w.sim.VMs() {
			for _, vmid := range vms {
				if vm.VMID == vmid {
					return fmt.Errorf("VM %d still exists (%s)", vmid, vm.Status)
				}
			}
		}
		return nil
	})
	step("orphans destroyed")
	wantEvents(t, f.cluster, "OrphanFound", "OrphanRemoved")
}

// TestDisownAClaimOfARunnerPool: a platform admin's hyperfleet.io/disown on
// a running claim of a pool releases its VM from management: the VM stays
// on the hypervisor, running, without HyperFleet's tags or ownership block
// (a note says whose it was), its idle runner is removed from GitHub, the
// claim is Finalized (Disowned) and no longer counted by its pool, which
// replaces it with a claim of another address. The claim holds its static
// address, saying which pool must exclude it, and goes once it is
// excluded; the orphan sweeper never touches the VM.
func TestDisownAClaimOfARunnerPool(t *testing.T) {
	w := startAdminWorld(t)
	f := w.f
	static := f.staticTemplate(t, w.pool)
	pool := &hfv1.RunnerPool{
		ObjectMeta: metav1.ObjectMeta{Namespace: f.namespace, Name: "linux"},
		Spec: hfv1.RunnerPoolSpec{
			TemplateRef: hfv1.ObjectName{Name: static.Name},
			Workload:    hfv1.Workload{Type: hfv1.WorkloadGitHubActions, GitHub: &hfv1.GitHubWorkload{Labels: []string{"linux"}}},
			// One at most: a pool still counting the disowned claim (as
			// terminating) would have no room for its replacement.
			Scaling: hfv1.Scaling{MinReplicas: 1, MaxReplicas: 1, ScaleDownDelay: &metav1.Duration{}},
		},
	}
	f.create(pool)
	poolClaims := func() []hfv1.MachineClaim {
		var list hfv1.MachineClaimList
		if err := env.Client.List(context.Background(), &list, client.InNamespace(f.namespace), client.MatchingLabels{hfv1.RunnerPoolLabel: pool.Name}); err != nil {
			t.Fatal(err)
		}
		return list.Items
	}
	var first *hfv1.MachineClaim
	eventually(t, 60*time.Second, "the pool's claim", func() error {
		if items := poolClaims(); len(items) == 1 {
			first = &items[0]
			return nil
		}
		return fmt.Errorf("%d claims", len(poolClaims()))
	})
	start := time.Now()
	step := func(what string) { t.Logf("%6.1fs %s", time.Since(start).Seconds(), what) }
	first = waitDelivered(t, first, 90*time.Second)
	step("first claim delivered")
	runnerName, vmid, addr := first.Status.Bootstrap.RunnerName, int(first.Status.VMRef.VMID), addressOf(t, first)
	if len(runnerIDs(w.gs, runnerName)) != 1 {
		t.Fatalf("runner %s is not registered on GitHub", runnerName)
	}

	annotateClaim(t, first, hfv1.DisownAnnotation, "keep it to debug the network (test)")
	var held *hfv1.MachineClaim
	eventually(t, 30*time.Second, "the VM disowned and the claim holding its address", func() error {
		var err error
		if held, err = getClaim(t, first); err != nil {
			return err
		}
		fin := hfv1.FindCondition(held.Status.Conditions, hfv1.MachineClaimFinalizedCondition)
		ending := hfv1.FindCondition(held.Status.Conditions, hfv1.MachineClaimEndingCondition)
		if fin == nil || fin.Status != metav1.ConditionTrue || fin.Reason != string(hfv1.DisownedReason) || !hfv1.HasReason(ending, hfv1.AddressNotExcludedReason) {
			return fmt.Errorf("Finalized %+v, Ending %+v", fin, ending)
		}
		return nil
	})
	step("disowned")
	fin := hfv1.FindCondition(held.Status.Conditions, hfv1.MachineClaimFinalizedCondition)
	for _, want := range []string{fmt.Sprintf("VM proxmox://%d", vmid), f.cluster.Name, "tags hyperfleet, hf-test", "the ownership block"} {
		if !strings.Contains(fin.Message, want) {
			t.Errorf("Finalized message %q does not say %q", fin.Message, want)
		}
	}
	ending := hfv1.FindCondition(held.Status.Conditions, hfv1.MachineClaimEndingCondition)
	exclusion := addr.String() + "/32"
	for _, want := range []string{exclusion, "spec.excludedAddresses of IPPool " + w.pool.Name, "kubectl patch ippool " + w.pool.Name} {
		if !strings.Contains(ending.Message, want) {
			t.Errorf("Ending message %q does not say %q", ending.Message, want)
		}
	}
	wantEvents(t, first, string(hfv1.DisownedReason), string(hfv1.AddressNotExcludedReason), string(hfv1.RunnerRemovedReason))
	if ids := runnerIDs(w.gs, runnerName); len(ids) != 0 {
		t.Errorf("the idle runner %s of the disowned VM is still registered: %v", runnerName, ids)
	}
	vm := findVM(t, w.sim, vmid)
	if vm.Status != "running" || strings.Contains(vm.Tags, "hyperfleet") || strings.Contains(vm.Tags, testSigner.OperatorTag()) ||
		strings.Contains(vm.Description, "BEGIN HYPERFLEET OWNERSHIP") || !strings.Contains(vm.Description, "Released from HyperFleet management") {
		t.Errorf("the disowned VM: status %s, tags %q, description %q; want it running without HyperFleet's tags and block, with the note", vm.Status, vm.Tags, vm.Description)
	}
	if got := testutil.ToFloat64(metrics.ClaimsDisowned.WithLabelValues(f.cluster.Name)); got != 1 {
		t.Errorf("hyperfleet_claims_disowned_total{cluster=%q} = %v, want 1", f.cluster.Name, got)
	}

	// The pool no longer counts it: a replacement with another address.
	eventually(t, 90*time.Second, "the pool's replacement running", func() error {
		for _, c := range poolClaims() {
			if c.UID == first.UID {
				continue
			}
			if c.Status.Phase != hfv1.MachineClaimBootstrapping && c.Status.Phase != hfv1.MachineClaimReady {
				return fmt.Errorf("replacement %s in phase %s", c.Name, c.Status.Phase)
			}
			if got := addressOf(t, &c); got == addr {
				t.Fatalf("the replacement %s got the disowned VM's address %s", c.Name, addr)
			}
			return nil
		}
		return fmt.Errorf("no replacement yet")
	})

	step("replaced")
	// Excluded: the claim goes, and nobody gets the address.
	err := retry.RetryOnConflict(conflictRetry, func() error {
		p := &hfv1.IPPool{}
		if err := env.Client.Get(context.Background(), client.ObjectKeyFromObject(w.pool), p); err != nil {
			return err
		}
		p.Spec.ExcludedAddresses = append(p.Spec.ExcludedAddresses, exclusion)
		return env.Client.Update(context.Background(), p)
	})
	if err != nil {
		t.Fatal(err)
	}
	waitGone(t, first, 60*time.Second)
	step("gone")
	if owner, held := w.op.components.IPAM.Owner(w.pool.Name, addr); held {
		t.Errorf("the excluded address %s is held by %s", addr, owner)
	}
	// Several sweeps (every 300 ms, grace 1 s) later the VM is still there.
	time.Sleep(3 * time.Second)
	if vm := findVM(t, w.sim, vmid); vm.Status != "running" {
		t.Errorf("the disowned VM is %s, want still running", vm.Status)
	}
	if orphans := w.op.components.Sweeper.Orphans(); len(orphans) != 0 {
		t.Errorf("the sweeper holds orphans %v", orphans)
	}
}

package controller_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	crmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/agentconfig"
	proxmoxsim "github.com/hyperfleet/hyperfleet/internal/testworld/simulator/proxmox"
)

// TestClaimLifecycle: a claim becomes an owned, configured VM; deleting the
// claim destroys the VM and its ISO.
func TestClaimLifecycle(t *testing.T) {
	sim := startSim(t, nil)
	op := startOperator(t, operatorOptions{})
	f := newFixture(t, sim, nil)
	claim := f.newClaim("runner-1")

	got := waitDelivered(t, claim, 60*time.Second)
	st := got.Status
	if st.VMRef == nil || st.VMRef.HypervisorCluster != f.cluster.Name || st.VMRef.VMID < 1000 || st.VMRef.VMID > 1999 || st.VMRef.Node != "pve1" {
		t.Fatalf("vmRef = %+v", st.VMRef)
	}
	if st.Task != nil {
		t.Errorf("task left in status of a running VM: %+v", st.Task)
	}
	if st.Network == nil || len(st.Network.Addresses) == 0 || st.Network.Hostname != "runner-1" || st.Network.MACAddress == "" {
		t.Errorf("network status = %+v", st.Network)
	}
	if st.TemplateHash == "" {
		t.Error("templateHash not recorded")
	}
	if pt := st.PhaseTimes; pt == nil || pt.Pending == nil || pt.Provisioning == nil || pt.Bootstrapping == nil {
		t.Errorf("phase times = %+v", pt)
	}
	for _, typ := range []string{string(hfv1.MachineClaimProvisionedCondition), string(hfv1.MachineClaimOwnershipVerifiedCondition)} {
		if !meta.IsStatusConditionTrue(st.Conditions, typ) {
			t.Errorf("condition %s not True: %+v", typ, st.Conditions)
		}
	}
	if c := hfv1.FindCondition(st.Conditions, hfv1.ReadyCondition); c == nil || c.Reason != string(hfv1.CredentialDeliveredReason) {
		t.Errorf("Ready condition = %+v, want False/CredentialDelivered", c)
	}
	if b := st.Bootstrap; b == nil || b.CredentialRequestedAt == nil || b.CredentialDeliveredAt == nil || b.CredentialDeliveredAt.Before(b.CredentialRequestedAt) || b.RunnerName == "" {
		t.Errorf("status.bootstrap = %+v, want the credential requested, then delivered", b)
	}
	for k, v := range map[string]string{
		hfv1.ManagedByLabel: hfv1.ManagedByValue, hfv1.MachineTemplateLabel: "debian", hfv1.HypervisorClusterLabel: f.cluster.Name,
	} {
		if got.Labels[k] != v {
			t.Errorf("label %s = %q, want %q", k, got.Labels[k], v)
		}
	}

	// The VM on the hypervisor: owned, configured, ISO gone after boot.
	vmid := int(st.VMRef.VMID)
	vm := findVM(t, sim, vmid)
	if vm.Status != "running" || vm.Config["cores"] != "2" || vm.Config["memory"] != "2048" {
		t.Errorf("VM config: status %s cores %s memory %s", vm.Status, vm.Config["cores"], vm.Config["memory"])
	}
	if rec, err := f.signer().Verify(vm.Description, vmid); err != nil || rec.UID != string(got.UID) {
		t.Errorf("ownership marker: %+v, %v", rec, err)
	}
	if !strings.Contains(vm.Config["net0"], strings.ToUpper(st.Network.MACAddress)) && !strings.Contains(strings.ToLower(vm.Config["net0"]), st.Network.MACAddress) {
		t.Errorf("net0 %q does not carry the claim's MAC %s", vm.Config["net0"], st.Network.MACAddress)
	}
	if isos := isoVolumes(sim); len(isos) != 0 {
		t.Errorf("cloud-init ISO not removed after boot: %v", isos)
	}
	// The routine steps (Provisioning, Provisioned, Bootstrapping) and
	// the credential's delivery are the claim's status and log lines, not
	// events (machineclaim/events.go).
	// The workload credential reached the running VM through its guest
	// agent, and nothing else on the hypervisor holds it.
	placed, _, err := sim.GuestFile(context.Background(), vmid, agentconfig.SecretsFile)
	if err != nil {
		t.Fatalf("the VM's secrets file: %v", err)
	}
	if doc, err := agentconfig.ParseGuestSecrets(placed); err != nil || doc.JITConfig != jitSecretOf(string(got.UID)) {
		t.Errorf("the VM received %+v, %v; want its JIT configuration", doc, err)
	}
	assertNoSecrets(t, sim, op, jitSecretOf(string(got.UID)))

	// Deleting the claim destroys the VM.
	if err := env.Client.Delete(context.Background(), got); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "claim gone", func() error {
		if _, err := getClaim(t, claim); !apierrors.IsNotFound(err) {
			return fmt.Errorf("claim still there: %w", err)
		}
		return nil
	})
	if vms := operatorVMs(sim); len(vms) != 0 {
		t.Fatalf("VMs left after delete: %+v", vms)
	}
	if isos := isoVolumes(sim); len(isos) != 0 {
		t.Errorf("ISOs left after delete: %v", isos)
	}
	assertNoSecrets(t, sim, op, jitSecretOf(string(got.UID)))
}

// TestClaimPowerOffDestroysVM: a VM whose guest powers off is destroyed and
// its claim deleted (shutdown detection).
func TestClaimPowerOffDestroysVM(t *testing.T) {
	sim := startSim(t, nil)
	startOperator(t, operatorOptions{})
	f := newFixture(t, sim, nil)
	claim := f.newClaim("runner-off")
	got := waitPhase(t, claim, hfv1.MachineClaimBootstrapping, 60*time.Second)
	vmid := int(got.Status.VMRef.VMID)
	if err := sim.GuestPowerOff(vmid); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "claim deleted after power-off", func() error {
		if _, err := getClaim(t, claim); !apierrors.IsNotFound(err) {
			return fmt.Errorf("claim still there: %w", err)
		}
		return nil
	})
	for _, vm := range sim.VMs() {
		if vm.VMID == vmid {
			t.Fatalf("VM %d still exists after power-off: %+v", vmid, vm)
		}
	}
}

// TestOperatorRestartMidCloneCreatesNoSecondVM stops the operator while a
// slow clone runs and starts a new one: it must continue with the same VM.
func TestOperatorRestartMidCloneCreatesNoSecondVM(t *testing.T) {
	sim := startSim(t, func(c *proxmoxsim.Config) { c.Latency.CloneBase = proxmoxsim.Duration(3 * time.Second) })
	first := startOperator(t, operatorOptions{})
	f := newFixture(t, sim, nil)
	claim := f.newClaim("runner-restart")
	eventually(t, 30*time.Second, "clone running", func() error {
		for _, vm := range sim.VMs() {
			if vm.Lock == "clone" {
				return nil
			}
		}
		return fmt.Errorf("no clone in progress")
	})
	first.restart(t, operatorOptions{})
	got := waitPhase(t, claim, hfv1.MachineClaimBootstrapping, 60*time.Second)
	expectOneVMOneClone(t, sim, got)
}

// expectOneVMOneClone checks that the simulator holds exactly the claim's
// VM, made by one clone task.
func expectOneVMOneClone(t *testing.T, sim *simulator, claim *hfv1.MachineClaim) {
	t.Helper()
	vms := operatorVMs(sim)
	if len(vms) != 1 || vms[0].VMID != int(claim.Status.VMRef.VMID) {
		t.Fatalf("want exactly the claim's VM %d, got %+v", claim.Status.VMRef.VMID, vms)
	}
	if n := cloneTasks(sim); n != 1 {
		t.Fatalf("%d clone tasks, want 1", n)
	}
}

func cloneTasks(sim *simulator) int {
	n := 0
	for _, task := range sim.State().Tasks {
		if task.Type == "qmclone" {
			n++
		}
	}
	return n
}

// TestOperatorStoppedAfterCloneRequestCreatesNoSecondVM stops the operator
// while its clone request is in flight, before it could record anything
// after it: the claim's only write before the clone (finalizer and VM
// reservation) must be enough for the next operator to continue that clone.
func TestOperatorStoppedAfterCloneRequestCreatesNoSecondVM(t *testing.T) {
	sim := startSim(t, func(c *proxmoxsim.Config) { c.Latency.CloneBase = proxmoxsim.Duration(2 * time.Second) })
	cloneSent, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	hook := func(r *http.Request) {
		if r.Method != http.MethodPost || !strings.HasSuffix(r.URL.Path, "/clone") {
			return
		}
		once.Do(func() {
			close(cloneSent)
			// Hold the response: the operator stops before it can
			// read it and write the clone task into the claim.
			<-release
		})
	}
	sim.onRequest.Store(&hook)
	first := startOperator(t, operatorOptions{})
	f := newFixture(t, sim, nil)
	claim := f.newClaim("runner-stopped")
	select {
	case <-cloneSent:
	case <-time.After(time.Minute):
		t.Fatal("no clone request within a minute")
	}
	first.stop(t)
	close(release)
	sim.onRequest.Store(nil)
	eventually(t, 30*time.Second, "the held clone running", func() error {
		if cloneTasks(sim) == 0 {
			return fmt.Errorf("no clone task")
		}
		return nil
	})
	stored, err := getClaim(t, claim)
	if err != nil {
		t.Fatal(err)
	}
	// The finalizer, then the VM with its signed placement record in one
	// status write, all before the clone request.
	reserved := stored.Status.VMRef
	if reserved == nil || reserved.ProviderID == "" || stored.Status.PlacementRecord == "" || !slices.Contains(stored.Finalizers, hfv1.MachineClaimFinalizer) {
		t.Fatalf("want the finalizer, the VM and its placement record stored before the restart, got finalizers %v, vmRef %+v, placement record %q",
			stored.Finalizers, reserved, stored.Status.PlacementRecord)
	}

	first.restart(t, operatorOptions{})
	got := waitPhase(t, claim, hfv1.MachineClaimBootstrapping, 60*time.Second)
	ref := got.Status.VMRef
	if ref.HypervisorCluster != reserved.HypervisorCluster || ref.ProviderID != reserved.ProviderID {
		t.Fatalf("claim runs VM %+v, reserved %+v", ref, reserved)
	}
	expectOneVMOneClone(t, sim, got)
}

// TestClaimsConvergeUnderFaults injects 500s, lock timeouts and latency
// spikes on every endpoint class and expects every claim to come up and go
// away without leaks or duplicates.
func TestClaimsConvergeUnderFaults(t *testing.T) {
	longScenario(t)
	sim := startSim(t, nil)
	// Every VM operation fails now and then with the errors real clusters
	// give under load (lock timeouts, "VM is locked"), every request may be
	// slow; the cluster-wide reads fail less often, as on a real cluster
	// where pveproxy itself is rarely down.
	vmOps := proxmoxsim.FaultSpec{ErrorRate: 0.25, SpikeRate: 0.1, SpikeLatency: proxmoxsim.Duration(300 * time.Millisecond)}
	if err := sim.SetFaults(proxmoxsim.Faults{Classes: map[string]proxmoxsim.FaultSpec{
		"clone": vmOps, "config": vmOps, "power": vmOps, "destroy": vmOps, "status": vmOps, "agent": vmOps, "upload": vmOps, "storage": vmOps,
		"resources": {ErrorRate: 0.05}, "other": {ErrorRate: 0.05, SpikeRate: 0.1, SpikeLatency: proxmoxsim.Duration(300 * time.Millisecond)},
	}}); err != nil {
		t.Fatal(err)
	}
	startOperator(t, operatorOptions{maxRetryDelay: 10 * time.Second})
	f := newFixture(t, sim, nil)
	var claims []*hfv1.MachineClaim
	for i := range 4 {
		claims = append(claims, f.newClaim(fmt.Sprintf("faulty-%d", i)))
	}
	for _, c := range claims {
		waitPhase(t, c, hfv1.MachineClaimBootstrapping, 120*time.Second)
	}
	if vms := operatorVMs(sim); len(vms) != len(claims) {
		t.Fatalf("%d VMs for %d claims: %+v", len(vms), len(claims), vms)
	}
	for _, c := range claims {
		if err := env.Client.Delete(context.Background(), c); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, 120*time.Second, "all VMs gone", func() error {
		if vms := operatorVMs(sim); len(vms) != 0 {
			return fmt.Errorf("%d VMs left", len(vms))
		}
		if isos := isoVolumes(sim); len(isos) != 0 {
			return fmt.Errorf("ISOs left: %v", isos)
		}
		return nil
	})
}

// TestClusterOfflineAndBack: claims wait (and say why) while the cluster's
// API is unreachable, and proceed when it comes back.
func TestClusterOfflineAndBack(t *testing.T) {
	sim := startSim(t, nil)
	op := startOperator(t, operatorOptions{maxRetryDelay: 10 * time.Second})
	f := newFixture(t, sim, nil)
	waitClusterReady(t, f.cluster, metav1.ConditionTrue)
	if err := sim.SetFaults(proxmoxsim.Faults{Classes: map[string]proxmoxsim.FaultSpec{"*": {DropRate: 1}}}); err != nil {
		t.Fatal(err)
	}
	c := waitClusterReady(t, f.cluster, metav1.ConditionFalse)
	if cond := hfv1.FindCondition(c.Status.Conditions, hfv1.ReadyCondition); cond.Reason != string(hfv1.UnreachableReason) {
		t.Errorf("Ready reason %s, want %s", cond.Reason, hfv1.UnreachableReason)
	}
	// Marked down at the third failure in a row, the cluster is probed
	// again 5 s, 10 s, 20 s ... later (docs/operations.md): the two
	// failures it absorbed while Ready do not start its backoff further
	// on (they once made it 40 s, then 80 s, pausing new VMs that long).
	eventually(t, 30*time.Second, "the down cluster's first two retries", func() error {
		var got []float64
		for _, l := range strings.Split(op.logs.String(), "\n") {
			var e struct {
				Msg        string  `json:"msg"`
				Cluster    string  `json:"name"`
				RetryAfter float64 `json:"retryAfter"`
			}
			if json.Unmarshal([]byte(l), &e) == nil && e.Msg == "HypervisorCluster unreachable, retrying" && e.Cluster == f.cluster.Name {
				got = append(got, e.RetryAfter)
			}
		}
		if len(got) < 2 {
			return fmt.Errorf("retries so far after %v s", got)
		}
		if got[0] != 5 || got[1] != 10 {
			t.Fatalf("a cluster marked down is retried after %v s, want 5 then 10", got)
		}
		return nil
	})
	claim := f.newClaim("waits")
	eventually(t, 30*time.Second, "claim explains the wait", func() error {
		got, err := getClaim(t, claim)
		if err != nil {
			return err
		}
		cond := hfv1.FindCondition(got.Status.Conditions, hfv1.MachineClaimProvisionedCondition)
		if cond == nil || (cond.Reason != string(hfv1.ClusterUnavailableReason) && cond.Reason != "TemplateNotReady") {
			return fmt.Errorf("Provisioned = %+v", cond)
		}
		if got.Status.VMRef != nil {
			return fmt.Errorf("VM created on an unreachable cluster: %+v", got.Status.VMRef)
		}
		return nil
	})
	if err := sim.SetFaults(proxmoxsim.Faults{}); err != nil {
		t.Fatal(err)
	}
	// Backoff after a few failures can reach tens of seconds.
	waitPhase(t, claim, hfv1.MachineClaimBootstrapping, 90*time.Second)
}

func waitClusterReady(t *testing.T, cluster *hfv1.HypervisorCluster, want metav1.ConditionStatus) *hfv1.HypervisorCluster {
	t.Helper()
	got := &hfv1.HypervisorCluster{}
	eventually(t, 60*time.Second, fmt.Sprintf("cluster Ready=%s", want), func() error {
		if err := env.Client.Get(context.Background(), client.ObjectKeyFromObject(cluster), got); err != nil {
			return err
		}
		c := hfv1.FindCondition(got.Status.Conditions, hfv1.ReadyCondition)
		if c == nil || c.Status != want {
			return fmt.Errorf("Ready = %+v", c)
		}
		return nil
	})
	return got
}

func findVM(t *testing.T, sim *simulator, vmid int) proxmoxsim.VMState {
	t.Helper()
	for _, vm := range sim.VMs() {
		if vm.VMID == vmid {
			return vm
		}
	}
	t.Fatalf("VM %d not found in the simulator", vmid)
	return proxmoxsim.VMState{}
}

// isoVolumes lists uploaded ISO volumes.
func isoVolumes(sim *simulator) []string {
	return sim.VolumeIDs("iso")
}

// wantEvents checks that the claim has events with these reasons.
func wantEvents(t *testing.T, obj client.Object, reasons ...string) {
	t.Helper()
	eventually(t, 10*time.Second, "events recorded", func() error {
		var list corev1.EventList
		if err := env.Client.List(context.Background(), &list, client.InNamespace(obj.GetNamespace())); err != nil {
			return err
		}
		have := map[string]bool{}
		for _, e := range list.Items {
			if e.InvolvedObject.UID == obj.GetUID() {
				have[e.Reason] = true
			}
		}
		for _, r := range reasons {
			if !have[r] {
				return fmt.Errorf("no %q event (have %v)", r, have)
			}
		}
		return nil
	})
}

// assertNoSecrets scans the simulator's whole stored state, the operator's
// log and every event for the Proxmox token secret and the GitHub PAT.
func assertNoSecrets(t *testing.T, sim *simulator, op *operator, workloadSecrets ...string) {
	t.Helper()
	secrets := append([]string{simTokenSecret, "ghp_longLivedPATthatMustNeverLeaveTheOperator"}, workloadSecrets...)
	state := fmt.Sprintf("%+v", sim.State())
	var events corev1.EventList
	if err := env.Client.List(context.Background(), &events); err != nil {
		t.Fatal(err)
	}
	places := map[string]string{"simulator state": state, "operator log": op.logs.String(), "events": fmt.Sprintf("%+v", events.Items)}
	for where, text := range places {
		for _, s := range secrets {
			if strings.Contains(text, s) {
				t.Errorf("secret %q…found in %s", s[:6], where)
			}
		}
	}
}

// TestTamperedVMIsNeverDestroyed: when the VM's ownership block is edited
// behind the operator's back, deleting the claim leaves the VM alone and
// says so; the claim stays (finalizer kept: its VM may exist) until an
// admin who decided the VM is someone else's removes the finalizer.
func TestTamperedVMIsNeverDestroyed(t *testing.T) {
	sim := startSim(t, nil)
	startOperator(t, operatorOptions{})
	f := newFixture(t, sim, nil)
	claim := f.newClaim("tampered")
	got := waitPhase(t, claim, hfv1.MachineClaimBootstrapping, 60*time.Second)
	vmid := int(got.Status.VMRef.VMID)
	desc := strings.Replace(findVM(t, sim, vmid).Description, "name: tampered", "name: someone-else", 1)
	simCall(t, sim, "PUT", fmt.Sprintf("/nodes/pve1/qemu/%d/config", vmid), url.Values{"description": {desc}})
	if err := env.Client.Delete(context.Background(), got); err != nil {
		t.Fatal(err)
	}
	wantEvents(t, got, string(hfv1.OwnershipMismatchReason))
	eventually(t, 30*time.Second, "claim held with its finalizer", func() error {
		held, err := getClaim(t, claim)
		if err != nil {
			return err
		}
		if c := hfv1.FindCondition(held.Status.Conditions, hfv1.ReadyCondition); c == nil || c.Reason != string(hfv1.OwnershipMismatchReason) {
			return fmt.Errorf("Ready = %+v", c)
		}
		if !controllerutil.ContainsFinalizer(held, hfv1.MachineClaimFinalizer) {
			t.Fatalf("the claim lost its finalizer while its VM may exist: %v", held.Finalizers)
		}
		// The admin's decision (docs/operations.md).
		patch := client.MergeFromWithOptions(held.DeepCopy(), client.MergeFromWithOptimisticLock{})
		controllerutil.RemoveFinalizer(held, hfv1.MachineClaimFinalizer)
		return env.Client.Patch(context.Background(), held, patch)
	})
	eventually(t, 30*time.Second, "claim released", func() error {
		if _, err := getClaim(t, claim); !apierrors.IsNotFound(err) {
			return fmt.Errorf("claim still there: %w", err)
		}
		return nil
	})
	if vm := findVM(t, sim, vmid); vm.Status != "running" {
		t.Fatalf("tampered VM was touched: %+v", vm)
	}
}

// TestMetricsExposed: the operator's metrics are registered and move.
func TestMetricsExposed(t *testing.T) {
	sim := startSim(t, nil)
	startOperator(t, operatorOptions{})
	f := newFixture(t, sim, nil)
	waitPhase(t, f.newClaim("measured"), hfv1.MachineClaimBootstrapping, 60*time.Second)
	eventually(t, 10*time.Second, "metrics", func() error {
		families, err := crmetrics.Registry.Gather()
		if err != nil {
			return err
		}
		want := map[string]bool{
			"hyperfleet_machineclaims": false, "hyperfleet_hypervisor_api_calls_total": false,
			"hyperfleet_machineclaim_created_to_clone_seconds": false, "hyperfleet_machineclaim_phase_duration_seconds": false,
			"hyperfleet_hypervisor_cluster_connected": false,
		}
		for _, fam := range families {
			if _, ok := want[fam.GetName()]; !ok {
				continue
			}
			for _, m := range fam.GetMetric() {
				v := m.GetGauge().GetValue() + m.GetCounter().GetValue() + float64(m.GetHistogram().GetSampleCount())
				if v > 0 {
					want[fam.GetName()] = true
				}
				for _, l := range m.GetLabel() {
					if l.GetName() == "endpoint" && strings.ContainsAny(l.GetValue(), "0123456789") {
						return fmt.Errorf("endpoint label %q carries an id", l.GetValue())
					}
				}
			}
		}
		for name, seen := range want {
			if !seen {
				return fmt.Errorf("%s missing or zero", name)
			}
		}
		return nil
	})
}

// TestClaimWrittenBeforeProviderIDs: a running claim whose status an
// earlier version wrote (status.vmRef with vmId and node, no providerID;
// the bootstrap's runnerId: the ...Id spelling of that version) keeps its
// VM and runner across the upgrade: the new operator records the VM's
// providerID (proxmox://<vmID>) at its next reconcile, in the same write
// moves the ...Id keys to ...ID (api/v1alpha1/spelling.go), creates no
// second VM, and deleting the claim destroys exactly that VM.
func TestClaimWrittenBeforeProviderIDs(t *testing.T) {
	sim := startSim(t, nil)
	first := startOperator(t, operatorOptions{})
	f := newFixture(t, sim, nil)
	claim := f.newClaim("runner-legacy")
	got := waitDelivered(t, claim, 60*time.Second)
	ref := *got.Status.VMRef
	if ref.ProviderID != fmt.Sprintf("proxmox://%d", ref.VMID) || ref.VMID == 0 {
		t.Fatalf("vmRef = %+v, want providerID proxmox://<vmID> and vmID mirrored", ref)
	}
	runnerID := got.Status.Bootstrap.RunnerID
	first.stop(t)

	// What an earlier version stored.
	raw := &unstructured.Unstructured{}
	raw.SetGroupVersionKind(hfv1.GroupVersion.WithKind("MachineClaim"))
	if err := env.Client.Get(context.Background(), client.ObjectKeyFromObject(got), raw); err != nil {
		t.Fatal(err)
	}
	raw.Object["status"].(map[string]any)["vmRef"] = map[string]any{"hypervisorCluster": ref.HypervisorCluster, "vmId": int64(ref.VMID), "node": ref.Node}
	bootstrap := raw.Object["status"].(map[string]any)["bootstrap"].(map[string]any)
	if id, ok := bootstrap["runnerID"]; ok {
		delete(bootstrap, "runnerID")
		bootstrap["runnerId"] = id
	}
	if err := env.Client.Status().Update(context.Background(), raw); err != nil {
		t.Fatalf("write the legacy vmRef: %v", err)
	}
	if stored, err := getClaim(t, claim); err != nil || stored.Status.VMRef.ProviderID != "" || stored.Status.Bootstrap.RunnerID != runnerID {
		t.Fatalf("the legacy status was not stored as written: %+v, %+v, %v", stored.Status.VMRef, stored.Status.Bootstrap, err)
	}

	first.restart(t, operatorOptions{})
	eventually(t, 30*time.Second, "providerID recorded", func() error {
		stored, err := getClaim(t, claim)
		if err != nil {
			return err
		}
		if r := stored.Status.VMRef; r == nil || *r != ref {
			return fmt.Errorf("vmRef %+v, want %+v", r, ref)
		}
		return nil
	})
	if vms := operatorVMs(sim); len(vms) != 1 || vms[0].VMID != int(ref.VMID) {
		t.Fatalf("operator VMs %+v, want only VM %d", vms, ref.VMID)
	}
	if err := env.Client.Get(context.Background(), client.ObjectKeyFromObject(got), raw); err != nil {
		t.Fatal(err)
	}
	status := raw.Object["status"].(map[string]any)
	vmRef, bootstrap := status["vmRef"].(map[string]any), status["bootstrap"].(map[string]any)
	if _, old := vmRef["vmId"]; old || vmRef["vmID"] != int64(ref.VMID) {
		t.Errorf("status.vmRef stored as %v, want vmID %d and no vmId", vmRef, ref.VMID)
	}
	if _, old := bootstrap["runnerId"]; old || (runnerID != 0 && bootstrap["runnerID"] != runnerID) {
		t.Errorf("status.bootstrap stored as %v, want runnerID %d and no runnerId", bootstrap, runnerID)
	}
	if err := env.Client.Delete(context.Background(), got); err != nil {
		t.Fatal(err)
	}
	waitGone(t, got, 30*time.Second)
	if vms := operatorVMs(sim); len(vms) != 0 {
		t.Fatalf("VMs left after delete: %+v", vms)
	}
}

package controller_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	proxmoxsim "github.com/hyperfleet/hyperfleet/internal/testworld/simulator/proxmox"
)

// placementWorld is a cluster whose tenancy gives the fixture's namespace
// template 9000, bridge vmbr0 and VLANs 100-199 only, on a simulator that
// also holds template 9001 (which the cluster does not allow) and whose
// clones are slow enough for a tenant to edit the template while one runs.
// It records every template the operator clones from and every net0 it
// writes, so that a value that reached the hypervisor even for a moment
// is seen.
type placementWorld struct {
	t   *testing.T
	sim *simulator
	f   *fixture
	op  *operator
	// also, when set, sees every request after the recording.
	also func(*http.Request)

	mu      sync.Mutex
	sources []string
	nets    []string
}

// The values a tenant is refused (and writes into its template once its
// claim is placed), and the ones the cluster allows.
const (
	refusedBridge = "vmbr9"
	refusedVLAN   = 4000
	allowedVLAN   = 100
)

func newPlacementWorld(t *testing.T, cloneTime time.Duration, also func(*http.Request)) *placementWorld {
	t.Helper()
	w := &placementWorld{t: t, also: also}
	w.sim = startSim(t, func(c *proxmoxsim.Config) {
		c.Latency.CloneBase = proxmoxsim.Duration(cloneTime)
		c.Templates = append(c.Templates, proxmoxsim.TemplateConfig{
			VMID: 9001, Node: "pve1", Name: "admin-only", Storage: "local-lvm", DiskSize: 32 << 30,
			Cores: 2, MemoryMiB: 2048, Agent: true, Tags: "template",
		})
	})
	hook := w.record
	w.sim.onRequest.Store(&hook)
	w.op = startOperator(t, operatorOptions{})
	w.f = newFixture(t, w.sim, func(c *hfv1.HypervisorCluster) {
		c.Spec.AllowedNamespaces = tenantSelector.DeepCopy()
		c.Spec.Tenancy = []hfv1.TenancyRule{{
			NamespaceSelector: *tenantSelector.DeepCopy(),
			Templates:         []hfv1.AllowedTemplate{{ID: ptr.To[int32](9000)}},
			Bridges:           []string{"vmbr0"},
			VLANs:             []hfv1.VLANRange{{Start: 100, End: 199}},
		}}
	})
	w.updateTemplate(func(tm *hfv1.HypervisorMachineTemplate) {
		tm.Spec.Network.Bridge, tm.Spec.Network.VLAN = "vmbr0", ptr.To[int32](allowedVLAN)
	})
	waitTemplate(t, w.f.template, metav1.ConditionTrue, "")
	return w
}

var clonePath = regexp.MustCompile(`/nodes/[^/]+/qemu/(\d+)/clone$`)
var configPath = regexp.MustCompile(`/nodes/[^/]+/qemu/\d+/config$`)

// record notes the template of every clone request and the net0 of every
// config update, then passes the request on.
func (w *placementWorld) record(r *http.Request) {
	if m := clonePath.FindStringSubmatch(r.URL.Path); m != nil && r.Method == http.MethodPost {
		w.mu.Lock()
		w.sources = append(w.sources, m[1])
		w.mu.Unlock()
	}
	if configPath.MatchString(r.URL.Path) && (r.Method == http.MethodPut || r.Method == http.MethodPost) {
		raw, _ := io.ReadAll(r.Body)
		r.Body = io.NopCloser(bytes.NewReader(raw))
		var body map[string]any
		if json.Unmarshal(raw, &body) == nil {
			if net, ok := body["net0"].(string); ok {
				w.mu.Lock()
				w.nets = append(w.nets, net)
				w.mu.Unlock()
			}
		}
	}
	if w.also != nil {
		w.also(r)
	}
}

func (w *placementWorld) updateTemplate(mutate func(*hfv1.HypervisorMachineTemplate)) {
	w.t.Helper()
	err := retry.RetryOnConflict(conflictRetry, func() error {
		tmpl := &hfv1.HypervisorMachineTemplate{}
		if err := env.Client.Get(context.Background(), client.ObjectKeyFromObject(w.f.template), tmpl); err != nil {
			return err
		}
		mutate(tmpl)
		return env.Client.Update(context.Background(), tmpl)
	})
	if err != nil {
		w.t.Fatal(err)
	}
}

// escape is the tenant's edit: the refused bridge and VLAN, the refused
// template, and more resources.
func (w *placementWorld) escape() {
	w.t.Helper()
	w.updateTemplate(func(tm *hfv1.HypervisorMachineTemplate) {
		tm.Spec.Network.Bridge, tm.Spec.Network.VLAN = refusedBridge, ptr.To[int32](refusedVLAN)
		tm.Spec.Source.Proxmox.TemplateID = ptr.To[int32](9001)
		tm.Spec.Resources.CPU, tm.Spec.Resources.Memory = 8, resource.MustParse("4Gi")
	})
}

// waitPlaced waits until the claim records its VM and returns it.
func waitPlaced(t *testing.T, claim *hfv1.MachineClaim) *hfv1.MachineClaim {
	t.Helper()
	var got *hfv1.MachineClaim
	eventually(t, 60*time.Second, "claim "+claim.Name+" placed", func() error {
		var err error
		if got, err = getClaim(t, claim); err != nil {
			return err
		}
		if got.Status.VMRef == nil {
			return fmt.Errorf("no vmRef yet")
		}
		return nil
	})
	return got
}

// stillCloning fails the test when the claim's VM was configured before
// the tenant's edit: the attack would not have been tried.
func (w *placementWorld) stillCloning(vmid int32) {
	w.t.Helper()
	for _, vm := range w.sim.VMs() {
		if vm.VMID == int(vmid) && vm.Lock != "clone" {
			w.t.Fatalf("VM %d is past its clone (lock %q) when the template was edited; slow the clone", vmid, vm.Lock)
		}
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.nets) > 0 {
		w.t.Fatalf("net0 was written (%v) before the template was edited; slow the clone", w.nets)
	}
}

// expectAuthorizedVM waits until the claim's VM is up and checks that the
// hypervisor never saw the refused template, bridge or VLAN, and that the
// VM has what was authorized.
func (w *placementWorld) expectAuthorizedVM(claim *hfv1.MachineClaim) {
	w.t.Helper()
	got := waitPhase(w.t, claim, hfv1.MachineClaimBootstrapping, 90*time.Second)
	w.mu.Lock()
	sources, nets := append([]string(nil), w.sources...), append([]string(nil), w.nets...)
	w.mu.Unlock()
	for _, src := range sources {
		if src != "9000" {
			w.t.Errorf("cloned from template %s; only 9000 was authorized (clones: %v)", src, sources)
		}
	}
	if len(nets) == 0 {
		w.t.Fatal("no net0 was ever written: the VM was not configured")
	}
	for _, net := range nets {
		if strings.Contains(net, "bridge="+refusedBridge) || strings.Contains(net, fmt.Sprintf("tag=%d", refusedVLAN)) {
			w.t.Errorf("the operator wrote net0 %q: the refused bridge or VLAN reached the VM", net)
		}
	}
	var vm *proxmoxsim.VMState
	for _, v := range w.sim.VMs() {
		if v.VMID == int(got.Status.VMRef.VMID) {
			vm = &v
		}
	}
	if vm == nil {
		w.t.Fatalf("the claim's VM %d does not exist", got.Status.VMRef.VMID)
	}
	net := vm.Config["net0"]
	if !strings.Contains(net, "bridge=vmbr0") || !strings.Contains(net, fmt.Sprintf("tag=%d", allowedVLAN)) {
		w.t.Errorf("VM %d has net0 %q, want bridge vmbr0 and tag %d", vm.VMID, net, allowedVLAN)
	}
	if vm.Config["cores"] != "2" || vm.Config["memory"] != "2048" {
		w.t.Errorf("VM %d has %s cores and %s MiB, want the authorized 2 and 2048", vm.VMID, vm.Config["cores"], vm.Config["memory"])
	}
	w.t.Logf("VM %d: net0 %q, cores %s, memory %s; clones from %v", vm.VMID, net, vm.Config["cores"], vm.Config["memory"], sources)
}

// TestTemplateEditAfterPlacementNeverReachesTheVM replays the tenant escape
// of docs/security.md, "The placement record": the cluster allows bridge
// vmbr0, VLANs 100-199 and template 9000; as soon as a claim records its VM
// (the clone still running), the tenant edits its template to bridge vmbr9,
// VLAN 4000, template 9001 and 8 cores. The VM must be built from what was
// authorized: a plain claim, a RunnerPool's claim, and a claim whose
// operator stopped right after the write that reserved the VM (its clone
// request lost) and whose template was edited before a new operator took
// over.
func TestTemplateEditAfterPlacementNeverReachesTheVM(t *testing.T) {
	t.Run("claim", func(t *testing.T) {
		w := newPlacementWorld(t, 4*time.Second, nil)
		claim := w.f.newClaim("placed")
		placed := waitPlaced(t, claim)
		w.escape()
		w.stillCloning(placed.Status.VMRef.VMID)
		waitTemplate(t, w.f.template, metav1.ConditionFalse, string(hfv1.NotAllowedByClusterReason))
		w.expectAuthorizedVM(claim)
	})

	t.Run("pool", func(t *testing.T) {
		w := newPlacementWorld(t, 4*time.Second, nil)
		pool := &hfv1.RunnerPool{
			ObjectMeta: metav1.ObjectMeta{Namespace: w.f.namespace, Name: "pool"},
			Spec: hfv1.RunnerPoolSpec{
				TemplateRef: hfv1.ObjectName{Name: w.f.template.Name},
				Workload:    hfv1.Workload{Type: hfv1.WorkloadGitHubActions, GitHub: &hfv1.GitHubWorkload{Labels: []string{"linux"}}},
				Scaling:     hfv1.Scaling{MinReplicas: 1, MaxReplicas: 1},
			},
		}
		w.f.create(pool)
		var claim *hfv1.MachineClaim
		eventually(t, 60*time.Second, "the pool's claim placed", func() error {
			var claims hfv1.MachineClaimList
			if err := env.Client.List(context.Background(), &claims, client.InNamespace(w.f.namespace), client.MatchingLabels{hfv1.RunnerPoolLabel: pool.Name}); err != nil {
				return err
			}
			for i := range claims.Items {
				if claims.Items[i].Status.VMRef != nil {
					claim = &claims.Items[i]
					return nil
				}
			}
			return fmt.Errorf("%d claims, none placed", len(claims.Items))
		})
		w.escape()
		w.stillCloning(claim.Status.VMRef.VMID)
		w.expectAuthorizedVM(claim)
	})

	t.Run("restart", func(t *testing.T) {
		// The first clone request is held until the operator that sent it
		// stopped, then dropped: the claim's only record of its VM is the
		// write before the clone request.
		cloneSent, release := make(chan struct{}), make(chan struct{})
		var once sync.Once
		w := newPlacementWorld(t, 2*time.Second, func(r *http.Request) {
			if r.Method != http.MethodPost || !clonePath.MatchString(r.URL.Path) {
				return
			}
			held := false
			once.Do(func() {
				held = true
				close(cloneSent)
				<-release
			})
			if held {
				panic(http.ErrAbortHandler)
			}
		})
		first := w.op
		claim := w.f.newClaim("restarted")
		select {
		case <-cloneSent:
		case <-time.After(time.Minute):
			t.Fatal("no clone request within a minute")
		}
		first.stop(t)
		close(release)
		stored, err := getClaim(t, claim)
		if err != nil {
			t.Fatal(err)
		}
		if stored.Status.VMRef == nil || stored.Status.PlacementRecord == "" {
			t.Fatalf("want the VM and its placement record stored when the operator stopped; status %+v", stored.Status)
		}
		w.escape()
		w.mu.Lock()
		w.sources = nil // the dropped request never reached the hypervisor
		w.mu.Unlock()
		first.restart(t, operatorOptions{})
		w.expectAuthorizedVM(claim)
		if n := cloneTasks(w.sim); n != 1 {
			t.Errorf("%d clone tasks, want 1", n)
		}
	})
}

// TestEditedPlacementRecordFailsTheClaim: someone who may write the claim's
// status (a tenant may not where the admission policy is installed) and
// rewrites its placement record (status.placementRecord) to the refused
// bridge does not get it: the record no longer verifies, the claim fails
// with PlacementRecordRejected and a warning event, its VM is destroyed,
// and no net0 with the refused bridge was ever written.
func TestEditedPlacementRecordFailsTheClaim(t *testing.T) {
	w := newPlacementWorld(t, 4*time.Second, nil)
	claim := w.f.newClaim("forged")
	placed := waitPlaced(t, claim)
	rec := placed.Status.PlacementRecord
	if !strings.Contains(rec, `"bridge":"vmbr0"`) || !strings.Contains(rec, `"signature":"p3.`) {
		t.Fatalf("the operator wrote placement record %q, want the authorized bridge and a signature", rec)
	}
	// The operator may write the claim between the read and this write:
	// edit the latest version (the record it holds is the one read).
	if err := retry.RetryOnConflict(conflictRetry, func() error {
		cur, err := getClaim(t, claim)
		if err != nil {
			return err
		}
		cur.Status.PlacementRecord = strings.Replace(cur.Status.PlacementRecord, `"bridge":"vmbr0"`, `"bridge":"`+refusedBridge+`"`, 1)
		return env.Client.Status().Update(context.Background(), cur)
	}); err != nil {
		t.Fatal(err)
	}
	w.stillCloning(placed.Status.VMRef.VMID)
	eventually(t, 60*time.Second, "the claim failed and its VM is gone", func() error {
		got, err := getClaim(t, claim)
		if err != nil {
			return err
		}
		why := got.Status.TerminationReason
		if !got.HasFailed() || !strings.HasPrefix(why, string(hfv1.PlacementRecordRejectedReason)+": ") || !strings.Contains(why, "status.placementRecord") {
			return fmt.Errorf("failed %v, terminationReason %q", got.HasFailed(), why)
		}
		if vms := operatorVMs(w.sim); len(vms) != 0 || got.Status.VMRef != nil {
			return fmt.Errorf("VMs %+v, vmRef %+v", vms, got.Status.VMRef)
		}
		return nil
	})
	var events corev1.EventList
	if err := env.Client.List(context.Background(), &events, client.InNamespace(claim.Namespace)); err != nil {
		t.Fatal(err)
	}
	found := false
	for _, e := range events.Items {
		found = found || (e.InvolvedObject.Name == claim.Name && e.Reason == string(hfv1.PlacementRecordRejectedReason) && e.Type == corev1.EventTypeWarning)
	}
	if !found {
		t.Error("no PlacementRecordRejected warning event")
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, net := range w.nets {
		if strings.Contains(net, "bridge="+refusedBridge) {
			t.Errorf("the operator wrote net0 %q from the edited record", net)
		}
	}
}

package controller_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"pgregory.net/rapid"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/testworld/proptest"
	proxmoxsim "github.com/hyperfleet/hyperfleet/internal/testworld/simulator/proxmox"
)

// The controller properties run their cases against one world per test
// (in make test; the -short race run leaves them out, see longScenario):
// a Proxmox VE simulator whose every step still takes a task but only a
// few milliseconds, one operator and one fixture (namespace, cluster,
// template). Each case makes and removes its own objects and checks that
// nothing of it is left before the next one starts.

// propertyLatency keeps every lifecycle step a real task at a few
// milliseconds, so that a case takes well under a second.
func propertyLatency() proxmoxsim.Latency {
	ms := func(n int) proxmoxsim.Duration { return proxmoxsim.Duration(time.Duration(n) * time.Millisecond) }
	return proxmoxsim.Latency{
		CloneBase: ms(20), Config: ms(5), Resize: ms(5), Start: ms(5), Boot: ms(30),
		Stop: ms(5), Shutdown: ms(10), Destroy: ms(10), Upload: ms(5),
	}
}

type propertyWorld struct {
	sim *simulator
	op  *operator
	f   *fixture
	n   int
}

func newPropertyWorld(t *testing.T) *propertyWorld {
	t.Helper()
	sim := startSim(t, func(c *proxmoxsim.Config) {
		c.Latency = propertyLatency()
		c.RefreshInterval = proxmoxsim.Duration(100 * time.Millisecond)
	})
	op := startOperator(t, operatorOptions{maxRetryDelay: time.Second})
	return &propertyWorld{sim: sim, op: op, f: newFixture(t, sim, nil)}
}

// within polls cond until it returns nil or timeout passes; the timeout
// only bounds a hang.
func within(t *rapid.T, timeout time.Duration, what string, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		err := cond()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not reached within %s: %v", what, timeout, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// lazyError is an error whose message is written when it is read: for a
// wait's failure detail that is costly to gather and, on every poll but
// the last, never read.
type lazyError func() string

func (e lazyError) Error() string { return e() }

// logOf is the operator's log lines about the claim named name.
func (w *propertyWorld) logOf(name string) string {
	var lines []string
	for _, l := range strings.Split(w.op.logs.String(), "\n") {
		if strings.Contains(l, `"`+name+`"`) {
			lines = append(lines, l)
		}
	}
	return strings.Join(lines, "\n")
}

// vmsOf are the simulator's VMs whose ownership block names uid.
func (w *propertyWorld) vmsOf(uid string) []proxmoxsim.VMState {
	var out []proxmoxsim.VMState
	for _, vm := range w.sim.VMs() {
		if strings.Contains(vm.Description, "uid: "+uid) {
			out = append(out, vm)
		}
	}
	return out
}

// isosOf are the cloud-init ISOs on the simulator for the VM ids given.
func (w *propertyWorld) isosOf(vmids ...int) []string {
	var out []string
	for _, iso := range isoVolumes(w.sim) {
		for _, id := range vmids {
			if strings.Contains(iso, fmt.Sprintf("-%d", id)) {
				out = append(out, iso)
			}
		}
	}
	return out
}

// deleteAndCheckGone deletes the claim, waits until it is gone and then
// checks that its VM and ISO went before it: the finalizer held it until
// they did.
func (w *propertyWorld) deleteAndCheckGone(t *rapid.T, claim *hfv1.MachineClaim, vmids []int) {
	t.Helper()
	ctx := context.Background()
	if err := env.Client.Delete(ctx, claim); err != nil && !apierrors.IsNotFound(err) {
		t.Fatalf("delete claim %s: %v", claim.Name, err)
	}
	within(t, 60*time.Second, "claim "+claim.Name+" gone", func() error {
		if _, err := getClaim(w.f.t, claim); !apierrors.IsNotFound(err) {
			return fmt.Errorf("still there (%w)", err)
		}
		return nil
	})
	left := func() error {
		if vms := w.vmsOf(string(claim.UID)); len(vms) > 0 {
			return fmt.Errorf("its VM %d is still on the cluster (%s)", vms[0].VMID, vms[0].Status)
		}
		if isos := w.isosOf(vmids...); len(isos) > 0 {
			return fmt.Errorf("its cloud-init ISO %v is still on the cluster", isos)
		}
		return nil
	}
	err := left()
	if err == nil {
		return
	}
	// A claim the API server removed is found by its DELETED event, and
	// handed over by the next reconcile of its name, which runs once the
	// pass in flight (the one that cloned) has ended: that may be a moment
	// after the claim is gone.
	deadline := time.Now().Add(10 * time.Second)
	for !w.vanished(claim) {
		if time.Now().After(deadline) {
			t.Fatalf("claim %s is gone but %v; the operator's log of the claim:\n%s", claim.Name, err, w.logOf(claim.Name))
		}
		if err = left(); err == nil {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	// The API server removed the claim while it carried the finalizer
	// (kubernetes/kubernetes#77988; internal/controller/machineclaim,
	// vanished.go): no deletion pass ran, and the VM went to the orphan
	// sweeper, which destroys it at once.
	within(t, 60*time.Second, "the VM of vanished claim "+claim.Name+" destroyed", left)
}

// vanished reports whether the operator found that the API server removed
// the claim while it still carried the finalizer.
func (w *propertyWorld) vanished(claim *hfv1.MachineClaim) bool {
	return strings.Contains(w.logOf(claim.Name), "Claim removed by the API server while it still carried its finalizer")
}

// strayVMs are the cluster's VMs other than templates, as "vmid (status)".
func (w *propertyWorld) strayVMs() []string {
	var out []string
	for _, vm := range w.sim.VMs() {
		if !vm.Template {
			out = append(out, fmt.Sprintf("%d (%s)", vm.VMID, vm.Status))
		}
	}
	return out
}

// deleteCurrentAndCheckGone reads claim as it is now and deletes it with
// deleteAndCheckGone, checking the ISOs of its recorded VM and of every VM
// that names it.
func (w *propertyWorld) deleteCurrentAndCheckGone(t *rapid.T, claim *hfv1.MachineClaim) {
	t.Helper()
	got, err := getClaim(w.f.t, claim)
	if err != nil {
		t.Fatal(err)
	}
	var vmids []int
	if ref := got.Status.VMRef; ref != nil {
		vmids = append(vmids, int(ref.VMID))
	}
	for _, vm := range w.vmsOf(string(got.UID)) {
		vmids = append(vmids, vm.VMID)
	}
	w.deleteAndCheckGone(t, got, vmids)
}

// phaseRank orders a claim's phases along its life.
var phaseRank = map[hfv1.MachineClaimPhase]int{
	"": 0, hfv1.MachineClaimPending: 1, hfv1.MachineClaimProvisioning: 2, hfv1.MachineClaimBootstrapping: 3,
}

// Feature: hyperfleet-operator, Property 6: VM Lifecycle Management
//
// TestVMLifecycleProperty: for generated machine templates (CPU, memory
// and disk within and beyond what the API allows) and a claim of each, a
// template the API refuses is refused with a message naming the field,
// and a claim of a valid one goes through Pending, Provisioning and
// Bootstrapping in that order, never back, to a running VM with exactly
// the template's resources, its ownership block, the bootstrap data the
// operator injected (one single-use runner credential, placed in the
// guest) and Provisioned=True; deleting it leaves nothing behind.
func TestVMLifecycleProperty(t *testing.T) {
	longScenario(t)
	w := newPropertyWorld(t)
	ctx := context.Background()
	var refused, ran int
	proptest.Check(t, proptest.Minimum, func(rt *rapid.T) {
		w.n++
		name := fmt.Sprintf("p6-%d", w.n)
		cpu := rapid.IntRange(1, 8).Draw(rt, "cpu")
		memMiB := rapid.SampledFrom([]int64{512, 1024, 2048, 3072}).Draw(rt, "memory MiB")
		var disk *resource.Quantity
		if rapid.Bool().Draw(rt, "disk") {
			d := resource.MustParse(fmt.Sprintf("%dGi", rapid.IntRange(32, 64).Draw(rt, "disk GiB")))
			disk = &d
		}
		field := ""
		switch rapid.IntRange(0, 9).Draw(rt, "invalid") {
		case 0:
			cpu, field = rapid.SampledFrom([]int{-1, 0, 513, 1024}).Draw(rt, "bad cpu"), "spec.resources.cpu"
		case 1:
			memMiB, field = rapid.SampledFrom([]int64{1, 64, 255}).Draw(rt, "bad memory MiB"), "resources.memory"
		case 2:
			d := resource.MustParse(rapid.SampledFrom([]string{"1Mi", "512Mi", "65Ti"}).Draw(rt, "bad disk"))
			disk, field = &d, "resources.disk"
		}
		tmpl := w.f.template.DeepCopy()
		tmpl.ObjectMeta = metav1.ObjectMeta{Namespace: w.f.namespace, Name: name}
		tmpl.Spec.Resources = hfv1.MachineResources{CPU: int32(cpu), Memory: *resource.NewQuantity(memMiB<<20, resource.BinarySI), Disk: disk}
		err := env.Client.Create(ctx, tmpl)
		if field != "" {
			if err == nil {
				_ = env.Client.Delete(ctx, tmpl)
				rt.Fatalf("template with cpu %d, memory %d MiB, disk %v accepted; want %s refused", cpu, memMiB, disk, field)
			}
			if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), field) {
				rt.Fatalf("template refused without naming %s: %v", field, err)
			}
			refused++
			return
		}
		if err != nil {
			rt.Fatalf("valid template refused: %v", err)
		}
		defer func() { _ = env.Client.Delete(ctx, tmpl) }()
		ran++
		claim := &hfv1.MachineClaim{
			ObjectMeta: metav1.ObjectMeta{Namespace: w.f.namespace, Name: name},
			Spec:       hfv1.MachineClaimSpec{TemplateRef: hfv1.ObjectName{Name: name}},
		}
		if err := env.Client.Create(ctx, claim); err != nil {
			rt.Fatal(err)
		}
		var seen []hfv1.MachineClaimPhase
		var got *hfv1.MachineClaim
		within(rt, 60*time.Second, "claim "+name+" bootstrapped with its credential delivered", func() error {
			c, err := getClaim(w.f.t, claim)
			if err != nil {
				return err
			}
			got = c
			if p := c.Status.Phase; len(seen) == 0 || seen[len(seen)-1] != p {
				if len(seen) > 0 && phaseRank[p] < phaseRank[seen[len(seen)-1]] {
					rt.Fatalf("claim %s went back from %s to %s (phases seen %v)", name, seen[len(seen)-1], p, seen)
				}
				seen = append(seen, p)
			}
			if b := c.Status.Bootstrap; c.Status.Phase != hfv1.MachineClaimBootstrapping || b == nil || b.CredentialDeliveredAt == nil {
				return fmt.Errorf("phase %s, conditions %v", c.Status.Phase, c.Status.Conditions)
			}
			return nil
		})
		if pt := got.Status.PhaseTimes; pt == nil || pt.Pending == nil || pt.Provisioning == nil || pt.Bootstrapping == nil ||
			pt.Provisioning.Before(pt.Pending) || pt.Bootstrapping.Before(pt.Provisioning) {
			rt.Fatalf("claim %s: phase times %+v are not Pending <= Provisioning <= Bootstrapping", name, pt)
		}
		vmid := int(got.Status.VMRef.VMID)
		vms := w.vmsOf(string(got.UID))
		if len(vms) != 1 || vms[0].VMID != vmid {
			rt.Fatalf("claim %s: VMs on the cluster %v, want exactly VM %d", name, vms, vmid)
		}
		vm := vms[0]
		if rec, err := w.f.signer().Verify(vm.Description, vmid); err != nil || rec.UID != string(got.UID) {
			rt.Fatalf("VM %d's ownership block: %+v, %v", vmid, rec, err)
		}
		if vm.Config["cores"] != fmt.Sprint(cpu) || vm.Config["memory"] != fmt.Sprint(memMiB) {
			rt.Fatalf("VM %d has cores %s and memory %s, the template asks %d and %d MiB", vmid, vm.Config["cores"], vm.Config["memory"], cpu, memMiB)
		}
		if !slices.ContainsFunc(got.Status.Conditions, func(c metav1.Condition) bool {
			return c.Type == string(hfv1.MachineClaimProvisionedCondition) && c.Status == metav1.ConditionTrue
		}) {
			rt.Fatalf("claim %s: Provisioned is not True: %v", name, got.Status.Conditions)
		}
		if n := credentialsIssuedFor(got); n != 1 {
			rt.Fatalf("claim %s: %d runner credentials issued, want exactly one", name, n)
		}
		w.deleteAndCheckGone(rt, got, []int{vmid})
	})
	// rapid draws small choices more often than large ones (it shrinks
	// towards them), so the refused share runs well above the three in ten
	// the choice suggests: 55 of 100 was seen. A quarter of the cases on
	// each side still proves both are generated.
	if cases := refused + ran; refused*4 < cases || ran*4 < cases {
		t.Errorf("the generator made %d templates the API refused and ran %d claims; want at least a quarter of the cases on each side", refused, ran)
	}
}

// Feature: hyperfleet-operator, Property 7: Resource Cleanup with Finalizers
//
// TestFinalizerCleanupProperty: a claim deleted at a generated moment of
// its life (before its clone, while cloning, configuring, booting or
// running) while a generated share of the cluster's stop, destroy and
// storage requests fail, is removed only once its VM and its cloud-init
// ISO are gone from the cluster. The one exception is the API server's:
// a claim it removes while the claim carries the finalizer (a delete that
// raced the finalizer's write, kubernetes/kubernetes#77988) has its VM
// destroyed right after, by the orphan sweeper the claim controller hands
// it to (internal/controller/machineclaim, vanished.go).
func TestFinalizerCleanupProperty(t *testing.T) {
	longScenario(t)
	w := newPropertyWorld(t)
	proptest.Check(t, proptest.Minimum, func(rt *rapid.T) {
		w.n++
		faults := proxmoxsim.Faults{Classes: map[string]proxmoxsim.FaultSpec{}}
		for _, class := range []string{"destroy", "power", "storage", "status"} {
			if rapid.Bool().Draw(rt, class+" faulty") {
				faults.Classes[class] = proxmoxsim.FaultSpec{ErrorRate: float64(rapid.IntRange(5, 50).Draw(rt, class+" error %")) / 100}
			}
		}
		claim := w.f.newClaim(fmt.Sprintf("p7-%d", w.n))
		time.Sleep(time.Duration(rapid.IntRange(0, 400).Draw(rt, "delete after ms")) * time.Millisecond)
		if err := w.sim.SetFaults(faults); err != nil {
			rt.Fatal(err)
		}
		defer func() { _ = w.sim.SetFaults(proxmoxsim.Faults{}) }()
		w.deleteCurrentAndCheckGone(rt, claim)
		// Each case's claim is the cluster's only one: a VM left of any,
		// an unconfigured clone that names no claim included, is a leak.
		within(rt, 60*time.Second, "no VM left after claim "+claim.Name, func() error {
			if vms := w.strayVMs(); len(vms) > 0 {
				return fmt.Errorf("VMs %v are on the cluster", vms)
			}
			return nil
		})
	})
	t.Logf("claims the API server removed while they carried the finalizer: %d of %d",
		strings.Count(w.op.logs.String(), "Claim removed by the API server while it still carried its finalizer"), w.n)
}

// Feature: hyperfleet-operator, Property 27: VM Shutdown Detection and Cleanup
//
// TestShutdownDetectionProperty: a claim's VM powered off from inside its
// guest at a generated moment after it booted (while its credential is
// being delivered, or after), is detected and destroyed, and its claim removed. (How fast
// is measured by the benchmarks, docs/performance.md; here the bound only
// ends a hang.)
func TestShutdownDetectionProperty(t *testing.T) {
	longScenario(t)
	w := newPropertyWorld(t)
	proptest.Check(t, proptest.Minimum, func(rt *rapid.T) {
		w.n++
		claim := w.f.newClaim(fmt.Sprintf("p27-%d", w.n))
		var got *hfv1.MachineClaim
		within(rt, 60*time.Second, "claim "+claim.Name+" bootstrapping", func() error {
			c, err := getClaim(w.f.t, claim)
			if err != nil {
				return err
			}
			if got = c; c.Status.Phase != hfv1.MachineClaimBootstrapping || c.Status.VMRef == nil {
				return fmt.Errorf("phase %s", c.Status.Phase)
			}
			return nil
		})
		time.Sleep(time.Duration(rapid.IntRange(0, 300).Draw(rt, "stop after ms")) * time.Millisecond)
		vmid := int(got.Status.VMRef.VMID)
		if err := w.sim.GuestPowerOff(vmid); err != nil {
			rt.Fatal(err)
		}
		// The cluster is listed every second here: a claim still there a
		// minute after its VM stopped missed its wake-up and waits for its
		// own resync (minutes; the design's bound is 30 s to detect). A
		// claim still there after 30 s is logged with what the operator
		// did with it. (How fast detection is, is measured by the
		// benchmarks, docs/performance.md.)
		stopped, slowLogged := time.Now(), false
		within(rt, time.Minute, "claim "+claim.Name+" removed after its VM stopped", func() error {
			c, err := getClaim(w.f.t, claim)
			if apierrors.IsNotFound(err) {
				return nil
			}
			if err != nil {
				return err
			}
			// The detail (the simulator's VMs, the operator's whole log
			// searched) is written only when it is read: at the 30 s mark
			// and when the wait fails. Built on every 20 ms poll it cost
			// about 6 of the property's 60 CPU-seconds (its API server's
			// included): the log holds every case's lines.
			detail := lazyError(func() string {
				return fmt.Sprintf("still there: phase %s, deleting %v, end %+v, conditions %+v; its VMs %+v; the operator's log of it:\n%s",
					c.Status.Phase, c.DeletionTimestamp != nil, c.Spec.End, c.Status.Conditions, w.vmsOf(string(c.UID)), w.logOf(claim.Name))
			})
			if !slowLogged && time.Since(stopped) > 30*time.Second {
				slowLogged = true
				t.Logf("claim %s not removed 30 s after its VM powered off: %v", claim.Name, detail)
			}
			return detail
		})
		if vms := w.vmsOf(string(got.UID)); len(vms) > 0 {
			rt.Fatalf("claim %s removed but its stopped VM %d is still on the cluster", claim.Name, vms[0].VMID)
		}
	})
}

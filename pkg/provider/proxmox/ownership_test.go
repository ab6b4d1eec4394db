package proxmox

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	proxmoxsim "github.com/hyperfleet/hyperfleet/internal/testworld/simulator/proxmox"
	"github.com/hyperfleet/hyperfleet/pkg/ownership"
	"github.com/hyperfleet/hyperfleet/pkg/provider"
)

// raw sends a form request to the simulator as root, as a human or another
// tool would, and fails the test unless it succeeds.
func (e *env) raw(method, path string, form url.Values) {
	e.t.Helper()
	e.rawAs(e.t, method, path, form)
}

// rawAs is raw reporting to t.
func (e *env) rawAs(t testing.TB, method, path string, form url.Values) {
	t.Helper()
	var body io.Reader
	target := e.srv.URL + "/api2/json" + path
	if method == http.MethodGet || method == http.MethodDelete {
		if len(form) > 0 {
			target += "?" + form.Encode()
		}
	} else {
		body = strings.NewReader(form.Encode())
	}
	req, err := http.NewRequest(method, target, body)
	if err != nil {
		t.Fatal(err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	req.Header.Set("Authorization", "PVEAPIToken=root@pam!sim=00000000-0000-0000-0000-000000000000")
	res, err := e.srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		t.Fatalf("%s %s: %s", method, path, res.Status)
	}
}

// foreignVM clones the template to vmid by hand with description desc and
// this install's tags, and starts it.
func (e *env) foreignVM(vmid string, desc string) {
	e.t.Helper()
	e.raw(http.MethodPost, "/nodes/pve1/qemu/9000/clone", url.Values{"newid": {vmid}, "name": {"foreign-" + vmid}, "description": {desc}})
	e.advance(6 * time.Second)
	e.raw(http.MethodPut, "/nodes/pve1/qemu/"+vmid+"/config", url.Values{"tags": {"hyperfleet;hf-test"}})
	e.raw(http.MethodPost, "/nodes/pve1/qemu/"+vmid+"/status/start", nil)
	e.advance(2 * time.Second)
}

// assertUntouched checks that nothing the provider may do changed a VM it
// does not own: DeleteVM and SetPower refuse with ErrNotOwned, GetVM
// reports no owner, and the VM keeps running with the same config.
func (e *env) assertUntouched(vmid int, owner provider.Owner, want error) {
	e.t.Helper()
	ctx := context.Background()
	before := e.vm(vmid)
	if before == nil || before.Status != "running" {
		e.t.Fatalf("VM %d before: %+v", vmid, before)
	}
	prog := provider.Progress{ID: FormatID(vmid), Node: "pve1"}
	for i := 0; i < 3; i++ {
		if _, err := e.p.DeleteVM(ctx, owner, prog); !errors.Is(err, provider.ErrNotOwned) || provider.Classify(err) != provider.ClassPermanent {
			e.t.Fatalf("DeleteVM of VM %d: %v", vmid, err)
		}
		e.advance(time.Second)
	}
	for _, a := range []provider.PowerAction{provider.PowerOff, provider.PowerShutdown} {
		if task, err := e.p.SetPower(ctx, owner, prog.VMRef(), a); !errors.Is(err, provider.ErrNotOwned) || task != nil {
			e.t.Fatalf("SetPower %s of VM %d: %+v %v", a, vmid, task, err)
		}
	}
	vm, err := e.p.GetVM(ctx, prog.VMRef())
	if err != nil || vm.Owner != nil || !errors.Is(vm.OwnershipError, want) {
		e.t.Fatalf("GetVM of VM %d: %+v %v, want ownership error %v", vmid, vm, err, want)
	}
	e.advance(10 * time.Second)
	after := e.vm(vmid)
	if after == nil || after.Status != "running" || after.Description != before.Description || after.Tags != before.Tags ||
		after.Config["ide2"] != before.Config["ide2"] {
		e.t.Fatalf("VM %d was touched:\nbefore %+v\nafter  %+v", vmid, before, after)
	}
}

func TestForeignMarkersAreNeverTouched(t *testing.T) {
	e := newEnv(t)
	victim := provider.Owner{Namespace: "ci", Name: "victim", UID: "uid-victim", Pool: "linux"}
	rec := ownership.Record{Namespace: "ci", Name: "victim", UID: "uid-victim", Pool: "linux", CreatedAt: t0}

	t.Run("forged with another key", func(t *testing.T) {
		e.t = t
		forger, err := ownership.NewSigner(operatorID, []byte("0123456789abcdef0123456789abcdef-not-the-key"))
		if err != nil {
			t.Fatal(err)
		}
		forger = forger.ForCluster(e.signer.Cluster())
		r := rec
		r.VMID = 1500
		e.foreignVM("1500", forger.Description("looks like ours", r))
		e.assertUntouched(1500, victim, ownership.ErrBadSignature)
	})
	t.Run("another install", func(t *testing.T) {
		e.t = t
		r := rec
		r.VMID = 1501
		e.foreignVM("1501", testSigner(t, "other").Description("", r))
		e.assertUntouched(1501, victim, ownership.ErrForeign)
	})
	t.Run("no marker", func(t *testing.T) {
		e.t = t
		e.foreignVM("1502", "a VM made by hand")
		e.assertUntouched(1502, victim, ownership.ErrNoMarker)
	})
	t.Run("edited", func(t *testing.T) {
		e.t = t
		r := rec
		r.VMID = 1503
		desc := strings.Replace(e.signer.Description("", r), "name: victim", "name: victim2", 1)
		e.foreignVM("1503", desc)
		e.assertUntouched(1503, victim, ownership.ErrBadSignature)
		edited := victim
		edited.Name = "victim2"
		e.assertUntouched(1503, edited, ownership.ErrBadSignature)
	})
	t.Run("copied from an owned VM", func(t *testing.T) {
		e.t = t
		r := rec
		r.VMID = 1504
		e.foreignVM("1504", e.signer.Description("", r))
		// 1504 is genuinely the victim's; its block copied to 1505 is not.
		e.foreignVM("1505", e.vm(1504).Description)
		e.assertUntouched(1505, victim, ownership.ErrBadSignature)
	})
	t.Run("copied from another Proxmox cluster", func(t *testing.T) {
		// Same install, key, HypervisorCluster name and VM id: only the
		// Proxmox cluster differs (the HypervisorCluster was pointed
		// elsewhere, or a block was carried over by hand).
		e.t = t
		r := rec
		r.VMID = 1507
		other := e.signer.Cluster()
		other.HypervisorName = "another-pve"
		e.foreignVM("1507", e.signer.ForCluster(other).Description("", r))
		e.assertUntouched(1507, victim, ownership.ErrOtherCluster)
	})
	t.Run("copied from another HypervisorCluster", func(t *testing.T) {
		e.t = t
		r := rec
		r.VMID = 1508
		other := e.signer.Cluster()
		other.Name = "another-hypervisorcluster"
		e.foreignVM("1508", e.signer.ForCluster(other).Description("", r))
		e.assertUntouched(1508, victim, ownership.ErrOtherCluster)
	})
	t.Run("owned by another claim", func(t *testing.T) {
		e.t = t
		r := rec
		r.VMID, r.UID = 1506, "uid-someone-else"
		e.foreignVM("1506", e.signer.Description("", r))
		before := e.vm(1506)
		ctx := context.Background()
		if _, err := e.p.DeleteVM(ctx, victim, provider.Progress{ID: FormatID(1506), Node: "pve1"}); !errors.Is(err, provider.ErrNotOwned) {
			t.Fatalf("DeleteVM for another claim: %v", err)
		}
		if e.vm(1506).Description != before.Description || e.vm(1506).Status != "running" {
			t.Fatal("VM of another claim touched")
		}
	})
	t.Run("EnsureVM moves away from a foreign VM", func(t *testing.T) {
		e.t = t
		spec := testSpec("victim", "uid-victim")
		before := e.vm(1500)
		res, err := e.p.EnsureVM(context.Background(), spec, provider.Progress{ID: FormatID(1500), Node: "pve1"})
		if err != nil || res.Phase != provider.PhasePlaced || mustVMID(res.Progress.ID) == 1500 || mustVMID(res.Progress.ID) == 0 {
			t.Fatalf("EnsureVM at a foreign id: %+v %v", res, err)
		}
		d := e.ensure(e.p, spec, res.Progress, provider.PhaseRunning, 200)
		after := e.vm(1500)
		if after.Description != before.Description || after.Tags != before.Tags || after.Status != "running" {
			t.Fatal("the foreign VM was touched")
		}
		if mustVMID(d.prog.ID) == 1500 {
			t.Fatal("the claim kept the foreign id")
		}
	})
}

// TestRestartMidClone: the operator restarts while the clone runs and the
// clone's task id was never persisted. The new instance finds the clone in
// progress, never starts a second one, waits for it as Queued (Proxmox's
// clone writes only its lock until it ends, so whose clone it is cannot be
// read before), and finishes the VM.
func TestRestartMidClone(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	spec := testSpec("runner-r", "uid-rest")
	d := e.ensure(e.p, spec, provider.Progress{}, provider.PhaseCloning, 5)
	lost := provider.Progress{ID: FormatID(mustVMID(d.prog.ID)), Node: d.prog.Node}

	// The same instance, called again with the Progress from before the
	// clone, follows its own clone.
	res, err := e.p.EnsureVM(ctx, spec, lost)
	if err != nil || res.Phase != provider.PhaseCloning {
		t.Fatalf("same instance, lost progress: %+v %v", res, err)
	}
	e.advance(time.Second)

	p2 := e.newProvider(e.cfg)
	for i := 0; i < 3; i++ {
		res, err := p2.EnsureVM(ctx, spec, lost)
		if err != nil || res.Phase != provider.PhaseQueued {
			t.Fatalf("after restart: %+v %v", res, err)
		}
	}
	d = e.ensure(p2, spec, lost, provider.PhaseRunning, 200)
	if mustVMID(d.prog.ID) != mustVMID(lost.ID) {
		t.Fatalf("the VM moved to %d", mustVMID(d.prog.ID))
	}
	if n := cloneTasks(e); n != 1 || e.nonTemplateVMs() != 1 {
		t.Fatalf("%d clone tasks, %d VMs; want 1 and 1", n, e.nonTemplateVMs())
	}
}

func cloneTasks(e *env) int {
	n := 0
	for _, task := range e.state().Tasks {
		if task.Type == "qmclone" {
			n++
		}
	}
	return n
}

// TestRestartAtEveryStep: every call is made by a new Provider instance
// with a Progress that lost its task, the worst a crashing operator can do.
// The VM still reaches Running with one clone, and is deleted the same way.
func TestRestartAtEveryStep(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	spec := testSpec("runner-c", "uid-chaos")
	prog := provider.Progress{}
	for i := 0; ; i++ {
		if i > 300 {
			t.Fatalf("no convergence; progress %+v", prog)
		}
		p := e.newProvider(e.cfg)
		res, err := p.EnsureVM(ctx, spec, prog)
		if err != nil {
			if provider.Classify(err) != provider.ClassTransient {
				t.Fatal(err)
			}
			e.advance(time.Second)
			continue
		}
		if res.Phase == provider.PhaseRunning {
			prog = res.Progress
			break
		}
		prog = provider.Progress{ID: FormatID(mustVMID(res.Progress.ID)), Node: res.Progress.Node}
		e.advance(max(res.RetryAfter, 250*time.Millisecond))
	}
	if n := cloneTasks(e); n != 1 || e.nonTemplateVMs() != 1 {
		t.Fatalf("%d clone tasks, %d VMs; want 1 and 1", n, e.nonTemplateVMs())
	}
	if e.volume(e.p.isoVolid(mustVMID(prog.ID), spec.Owner.UID)) != nil {
		t.Fatal("ISO left while Running")
	}
	for i := 0; ; i++ {
		if i > 100 {
			t.Fatal("delete did not converge")
		}
		res, err := e.newProvider(e.cfg).DeleteVM(ctx, spec.Owner, prog)
		if err != nil {
			t.Fatal(err)
		}
		if res.Done {
			break
		}
		prog = provider.Progress{ID: FormatID(mustVMID(res.Progress.ID)), Node: res.Progress.Node}
		e.advance(max(res.RetryAfter, 250*time.Millisecond))
	}
	if e.nonTemplateVMs() != 0 {
		t.Fatal("VM left")
	}
}

// TestTakenVMIDAfterRestart: after a restart a new instance hands out an id
// an earlier placement holds; whoever clones first keeps it, the other
// claim moves, and neither touches the other's VM.
func TestTakenVMIDAfterRestart(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	a, b := testSpec("runner-a", "uid-a"), testSpec("runner-b", "uid-b")
	pa, err := e.p.EnsureVM(ctx, a, provider.Progress{})
	if err != nil {
		t.Fatal(err)
	}
	p2 := e.newProvider(e.cfg)
	pb, err := p2.EnsureVM(ctx, b, provider.Progress{})
	if err != nil {
		t.Fatal(err)
	}
	if mustVMID(pa.Progress.ID) != mustVMID(pb.Progress.ID) {
		t.Skipf("ids differ (%d, %d); nothing to race", mustVMID(pa.Progress.ID), mustVMID(pb.Progress.ID))
	}
	da := e.ensure(p2, b, pb.Progress, provider.PhaseRunning, 200)
	db := e.ensure(e.p, a, pa.Progress, provider.PhaseRunning, 200)
	if mustVMID(da.prog.ID) == mustVMID(db.prog.ID) || e.nonTemplateVMs() != 2 {
		t.Fatalf("claims share VM %d (%d VMs)", mustVMID(da.prog.ID), e.nonTemplateVMs())
	}
	for _, x := range []struct {
		spec *provider.VMSpec
		vmid int
	}{{b, mustVMID(da.prog.ID)}, {a, mustVMID(db.prog.ID)}} {
		rec, err := e.signer.Verify(e.vm(x.vmid).Description, x.vmid)
		if err != nil || rec.UID != x.spec.Owner.UID {
			t.Fatalf("VM %d marker %+v %v", x.vmid, rec, err)
		}
	}
}

// TestOwnershipBoundToStandaloneNode: a node that is not part of a Proxmox
// cluster has no cluster name; blocks are bound to the node instead.
func TestOwnershipBoundToStandaloneNode(t *testing.T) {
	e := newEnv(t, func(sim *proxmoxsim.Config, _ *provider.ClusterConfig) { sim.ClusterName = "" })
	if got := e.signer.Cluster().HypervisorName; got != "node/pve1" {
		t.Fatalf("test identity %q", got)
	}
	owner := provider.Owner{Namespace: "ci", Name: "solo", UID: "uid-solo", CreatedAt: t0}
	e.foreignVM("1510", e.signer.Description("", ownership.Record{Namespace: "ci", Name: "solo", UID: "uid-solo", VMID: 1510, CreatedAt: t0}))
	vm, err := e.p.GetVM(context.Background(), provider.VMRef{ID: FormatID(1510)})
	if err != nil || vm.Owner == nil || vm.Owner.UID != owner.UID {
		t.Fatalf("GetVM on a standalone node: %+v, %v", vm, err)
	}
}

// TestClusterNameNeedsSysAudit: without Sys.Audit on / the provider cannot
// read the cluster name its ownership blocks are bound to; Probe says so
// instead of every VM failing verification later.
func TestClusterNameNeedsSysAudit(t *testing.T) {
	e := newEnv(t, func(sim *proxmoxsim.Config, cfg *provider.ClusterConfig) {
		for i := range sim.Users {
			if sim.Users[i].ID == opUser {
				sim.Users[i].Privileges = proxmoxsim.Privileges{"/vms": {"PVEVMAdmin"}, "/nodes": {"PVEAuditor"}, "/storage": {"PVEDatastoreUser"}}
			}
		}
	})
	_, err := e.p.Probe(context.Background())
	if err == nil || !strings.Contains(err.Error(), "Sys.Audit on /") {
		t.Fatalf("Probe without Sys.Audit on /: %v; want an error naming the privilege", err)
	}
}

package sweeper

import (
	"context"
	"crypto/sha256"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/hyperfleet/hyperfleet/internal/hypervisors"
	proxmoxsim "github.com/hyperfleet/hyperfleet/internal/testworld/simulator/proxmox"
	"github.com/hyperfleet/hyperfleet/pkg/provider"
	"github.com/hyperfleet/hyperfleet/pkg/provider/proxmox"
)

// TestLeakCloneRequestLostBeforePlaceholder, on the Proxmox simulator: the
// clone request is sent, its answer is lost with the operator, and the
// claim is deleted before Proxmox writes the clone's placeholder, so the
// claim's deletion finds nothing and finishes. The clone then completes
// with no tag. The sweeper finds it by its install name, destroys it after
// the grace period, and reports it removed only once it is gone.
func TestLeakCloneRequestLostBeforePlaceholder(t *testing.T) {
	simCfg := proxmoxsim.DefaultConfig()
	simCfg.AuthFailureDelay = 0
	simCfg.Latency.ClonePlaceholder = proxmoxsim.Duration(5 * time.Second)
	simClock := proxmoxsim.NewFakeClock(start)
	sim, err := proxmoxsim.New(simCfg, proxmoxsim.WithClock(simClock))
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(sim)
	srv.StartTLS()
	t.Cleanup(func() {
		srv.Close()
		_ = sim.Close()
	})
	w := newWorld(t, false) // the Kubernetes side, the signer and the clock
	advance := func(d time.Duration) {
		simClock.Advance(d)
		w.clock.Step(d)
	}
	cfg := provider.ClusterConfig{
		Name: w.cluster, Endpoint: srv.URL + "/api2/json", TokenID: "root@pam!sim", TokenSecret: "00000000-0000-0000-0000-000000000000",
		FingerprintSHA256: proxmoxsim.FormatFingerprint(sha256.Sum256(srv.Certificate().Raw)),
		DefaultBridge:     "vmbr0", VMIDStart: 1000, VMIDEnd: 1999, RequestTimeout: 10 * time.Second,
	}
	connect := func() *proxmox.Provider {
		p, err := proxmox.New(cfg, provider.Deps{Signer: w.signer, Clock: w.clock})
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	ctx := context.Background()
	victim := w.claim("victim")
	spec := w.spec(victim)
	spec.Source.Settings = proxmox.TemplateRef{ID: 9000}
	first := connect()
	placed, err := first.EnsureVM(ctx, spec, provider.Progress{})
	if err != nil || placed.Phase != provider.PhasePlaced {
		t.Fatalf("place: %v %+v", err, placed)
	}
	if res, err := first.EnsureVM(ctx, spec, placed.Progress); err != nil || res.Phase != provider.PhaseCloning {
		t.Fatalf("clone request: %v %+v", err, res)
	} // its answer is lost: only the placement was persisted
	vmid := placed.Progress.ID

	// A new operator deletes the claim before the placeholder exists.
	p := connect()
	del, err := p.DeleteVM(ctx, victim, placed.Progress)
	if err != nil || !del.Done {
		t.Fatalf("DeleteVM before the placeholder: %v %+v; this test needs the deletion to find nothing", err, del)
	}
	w.deleteClaim(victim)
	advance(5 * time.Minute) // the clone completes
	vm, err := p.GetVM(ctx, provider.VMRef{ID: vmid})
	if err != nil {
		t.Fatalf("the lost clone did not complete: %v", err)
	}
	if vm.OperatorTagged || !vm.InstallNamed || vm.Owner == nil {
		t.Fatalf("lost clone: tagged %v, install-named %v, owner %v; want only the name and the marker", vm.OperatorTagged, vm.InstallNamed, vm.Owner)
	}

	reg := hypervisors.NewRegistry()
	if _, err := reg.Connect(w.cluster, cfg, func() (provider.Provider, error) { return p, nil }); err != nil {
		t.Fatal(err)
	}
	reg.SetHealth(w.cluster, hypervisors.Health{Ready: true}, w.clock.Now())
	events := w.events
	s := &Sweeper{Client: w.kube, APIReader: w.kube, Registry: reg, Recorder: events, Clock: w.clock, GracePeriod: grace}
	gone := false
	for elapsed := time.Duration(0); elapsed < 3*grace; elapsed += round {
		vms, err := p.ListVMs(ctx)
		if err != nil {
			t.Fatal(err)
		}
		reg.SetListing(w.cluster, vms, w.clock.Now())
		s.SweepAll(ctx)
		for len(events.Events) > 0 {
			e := <-events.Events
			if vmRemovedRE.MatchString(e) {
				if v, err := p.GetVM(ctx, provider.VMRef{ID: vmid}); err == nil {
					t.Errorf("reported removed while VM %s exists (%s): %s", vmid, v.Power, e)
				}
				gone = true
			}
		}
		advance(round)
	}
	if !gone {
		t.Error("the lost clone was never reported removed")
	}
	for _, v := range sim.VMs() {
		if !v.Template {
			t.Errorf("VM %d (%s) is left behind", v.VMID, v.Name)
		}
	}
}

package proxmox

import (
	"context"
	"errors"
	"testing"
	"time"

	proxmoxsim "github.com/hyperfleet/hyperfleet/internal/testworld/simulator/proxmox"
	"github.com/hyperfleet/hyperfleet/pkg/provider"
)

// TestDeleteOtherMissingIsNotGone: every call of the delete path that can
// answer "does not exist" (the VM's config and status reads, the stop and
// destroy requests, the cluster listing) answers it about something other
// than the VM: a storage, a volume, the cloud-init ISO, a pool. DeleteVM
// must never be Done while the VM exists, and finishes once the fault is
// gone. Only qemu-server's "Configuration file ... <vmid>.conf does not
// exist", read back from the listing, means the VM is gone.
func TestDeleteOtherMissingIsNotGone(t *testing.T) {
	messages := []string{
		"storage 'local-lvm' does not exist",
		"volume 'local:iso/hf-test-{vmid}.iso' does not exist",
		"pool 'ci' does not exist",
	}
	cases := []struct {
		class string
		// loseNode drops the node from the Progress, so DeleteVM starts
		// from the cluster listing.
		loseNode bool
		// ownConfig answers with the VM's own "config file does not
		// exist" although the VM exists: the read-back must catch it.
		ownConfig bool
	}{
		// The simulator's "status" class is every read of a VM: its config,
		// its current status and its tasks.
		{class: "status"}, {class: "power"}, {class: "destroy"}, {class: "resources", loseNode: true},
		{class: "status", ownConfig: true}, {class: "power", ownConfig: true}, {class: "destroy", ownConfig: true},
	}
	for _, c := range cases {
		name := c.class
		if c.ownConfig {
			name += "/own config reported missing"
		}
		t.Run(name, func(t *testing.T) {
			e := newEnv(t)
			spec := testSpec("runner-g", "uid-gggg")
			d := e.ensure(e.p, spec, provider.Progress{}, provider.PhaseRunning, 200)
			vmid := mustVMID(d.prog.ID)
			prog := d.prog
			if c.loseNode {
				prog = provider.Progress{ID: FormatID(vmid)}
			}
			msgs := messages
			if c.ownConfig {
				msgs = []string{"Configuration file 'nodes/{node}/qemu-server/{vmid}.conf' does not exist"}
			}
			if err := e.sim.SetFaults(proxmoxsim.Faults{Classes: map[string]proxmoxsim.FaultSpec{c.class: {ErrorRate: 1, Errors: msgs}}}); err != nil {
				t.Fatal(err)
			}
			failures := 0
			for i := 0; i < 30; i++ {
				res, err := e.p.DeleteVM(context.Background(), spec.Owner, prog)
				if err != nil {
					if errors.Is(err, provider.ErrNotFound) && !c.ownConfig {
						t.Errorf("DeleteVM error matches ErrNotFound though the VM exists: %v", err)
					}
					failures++
					e.advance(time.Second)
					continue
				}
				if res.Done {
					t.Fatalf("DeleteVM is Done (%s) while VM %d exists", res.Message, vmid)
				}
				prog = res.Progress
				e.advance(max(res.RetryAfter, time.Millisecond))
			}
			if failures == 0 && !c.ownConfig {
				t.Fatalf("the %s fault never reached DeleteVM", c.class)
			}
			if e.vm(vmid) == nil {
				t.Fatalf("VM %d was destroyed while %s calls failed", vmid, c.class)
			}
			if err := e.sim.SetFaults(proxmoxsim.Faults{}); err != nil {
				t.Fatal(err)
			}
			e.remove(e.p, spec.Owner, prog, 60)
			if e.vm(vmid) != nil {
				t.Fatalf("DeleteVM reported Done and left VM %d", vmid)
			}
		})
	}
}

// TestGetVMOtherMissingIsNotGone: GetVM reports ErrNotFound only for the
// VM's own absence; a read that fails on a missing storage is an error the
// caller retries, never "the VM is gone".
func TestGetVMOtherMissingIsNotGone(t *testing.T) {
	e := newEnv(t)
	spec := testSpec("runner-h", "uid-hhhh")
	d := e.ensure(e.p, spec, provider.Progress{}, provider.PhaseRunning, 200)
	// "status" is the simulator's class of the config and status reads.
	if err := e.sim.SetFaults(proxmoxsim.Faults{Classes: map[string]proxmoxsim.FaultSpec{"status": {ErrorRate: 1, Errors: []string{"storage 'local-lvm' does not exist"}}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.p.GetVM(context.Background(), d.prog.VMRef()); err == nil || errors.Is(err, provider.ErrNotFound) {
		t.Errorf("GetVM with failing reads: %v, want an error that is not ErrNotFound", err)
	}
	if err := e.sim.SetFaults(proxmoxsim.Faults{}); err != nil {
		t.Fatal(err)
	}
	e.remove(e.p, spec.Owner, d.prog, 60)
	if _, err := e.p.GetVM(context.Background(), d.prog.VMRef()); !errors.Is(err, provider.ErrNotFound) {
		t.Fatalf("GetVM after DeleteVM: %v, want ErrNotFound", err)
	}
}

package controller_test

import (
	"bytes"
	"fmt"
	"testing"
	"time"

	"github.com/hyperfleet/hyperfleet/internal/ownership"
)

// TestOrphanSweeper: a VM whose verified owner claim no longer exists is
// destroyed after the grace period; VMs with copied, forged or foreign
// markers are never touched, even though they carry the install's tag.
func TestOrphanSweeper(t *testing.T) {
	sim := startSim(t, nil)
	startOperator(t, operatorOptions{sweepInterval: 300 * time.Millisecond, orphanGrace: time.Second})
	f := newFixture(t, sim, nil)
	waitClusterReady(t, f.cluster, "True")

	tags := "hyperfleet;" + testSigner.OperatorTag()
	rec := ownership.Record{Namespace: f.namespace, Name: "ghost", UID: "00000000-dead-beef-0000-000000000001", VMID: 1500, CreatedAt: time.Now().Add(-time.Hour)}
	orphanDesc := f.signer().Description("left behind by a crash", rec)
	handMadeVM(t, sim, 1500, orphanDesc, tags)
	// The orphan's block copied onto another VM: signed for VM 1500.
	handMadeVM(t, sim, 1501, orphanDesc, tags)
	// A block signed with another install's key but this install's id.
	forger, err := ownership.NewSigner(testSigner.OperatorID(), bytes.Repeat([]byte{7}, ownership.MinKeyLength))
	if err != nil {
		t.Fatal(err)
	}
	forger = forger.ForCluster(f.signer().Cluster())
	forgedRec := rec
	forgedRec.VMID = 1502
	handMadeVM(t, sim, 1502, forger.Description("", forgedRec), tags)
	// An edited block: valid for 1503, then the claim name changed.
	editedRec := rec
	editedRec.VMID = 1503
	edited := bytes.Replace([]byte(f.signer().Description("", editedRec)), []byte("name: ghost"), []byte("name: other"), 1)
	handMadeVM(t, sim, 1503, string(edited), tags)

	eventually(t, 60*time.Second, "orphan 1500 destroyed", func() error {
		for _, vm := range sim.State().VMs {
			if vm.VMID == 1500 {
				return fmt.Errorf("VM 1500 still exists (%s)", vm.Status)
			}
		}
		return nil
	})
	// Give the sweeper several more rounds to do something wrong.
	time.Sleep(2 * time.Second)
	for _, vmid := range []int{1501, 1502, 1503} {
		findVM(t, sim, vmid)
	}
	wantEvents(t, f.cluster, "OrphanFound", "OrphanRemoved")
}

// TestOrphanSweeperDryRun reports but never destroys.
func TestOrphanSweeperDryRun(t *testing.T) {
	sim := startSim(t, nil)
	op := startOperator(t, operatorOptions{sweepInterval: 300 * time.Millisecond, orphanGrace: 300 * time.Millisecond, dryRun: true})
	f := newFixture(t, sim, nil)
	waitClusterReady(t, f.cluster, "True")
	rec := ownership.Record{Namespace: f.namespace, Name: "ghost", UID: "00000000-dead-beef-0000-000000000002", VMID: 1600, CreatedAt: time.Now().Add(-time.Hour)}
	handMadeVM(t, sim, 1600, f.signer().Description("", rec), "hyperfleet;"+testSigner.OperatorTag())
	wantEvents(t, f.cluster, "OrphanFound")
	time.Sleep(2 * time.Second)
	findVM(t, sim, 1600)
	if got := op.components.Sweeper.Orphans(); len(got) != 1 {
		t.Errorf("orphans = %v, want the one VM", got)
	}
	// Remove it by hand so the fixture's cluster can be deleted cleanly.
	simCall(t, sim, "DELETE", "/nodes/pve1/qemu/1600", nil)
}

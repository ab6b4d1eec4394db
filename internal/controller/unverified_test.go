package controller_test

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/metrics"
	"github.com/hyperfleet/hyperfleet/pkg/ownership"
)

// TestUnverifiedVMsSurfaceAsConditionAndMetric: VMs that carry the
// install's tag but a block that does not verify (here: signed with a key
// the ring does not hold, and copied from another cluster) are counted in
// the cluster's UnverifiedVMs condition and in hyperfleet_unverified_vms,
// and the count goes back to zero once they are gone.
func TestUnverifiedVMsSurfaceAsConditionAndMetric(t *testing.T) {
	sim := startSim(t, nil)
	startOperator(t, operatorOptions{sweepInterval: 300 * time.Millisecond, orphanGrace: time.Hour})
	f := newFixture(t, sim, nil)
	waitClusterReady(t, f.cluster, metav1.ConditionTrue)
	waitUnverified(t, f, metav1.ConditionFalse, 0, string(hfv1.AllVerifiedReason))

	tags := "hyperfleet;" + testSigner.OperatorTag()
	rec := ownership.Record{Namespace: f.namespace, Name: "lost", UID: "00000000-dead-beef-0000-0000000000a1", CreatedAt: time.Now().Add(-time.Hour)}
	// Signed with a key that is no longer (or never was) in the ring.
	lostKey, err := ownership.NewKeyRing(testSigner.OperatorID(), []ownership.Key{{ID: 7, Secret: bytes.Repeat([]byte{3}, ownership.MinKeyLength)}})
	if err != nil {
		t.Fatal(err)
	}
	rec.VMID = 1700
	handMadeVM(t, sim, 1700, lostKey.ForCluster(f.signer().Cluster()).Description("", rec), tags)
	// Signed with the install's key for the same VM id on another cluster.
	rec.VMID = 1701
	handMadeVM(t, sim, 1701, testSigner.ForCluster(ownership.ClusterIdentity{Name: "elsewhere"}).Description("", rec), tags)

	c := waitUnverified(t, f, metav1.ConditionTrue, 2, string(hfv1.OwnershipNotVerifiedReason))
	msg := hfv1.FindCondition(c.Status.Conditions, hfv1.HypervisorClusterUnverifiedVMsCondition).Message
	for _, want := range []string{"2 VMs", "VM proxmox://1700: " + ownership.ErrUnknownKey.Error(), "VM proxmox://1701: " + ownership.ErrOtherCluster.Error()} {
		if !strings.Contains(msg, want) {
			t.Errorf("UnverifiedVMs message %q does not contain %q", msg, want)
		}
	}
	// Never touched: both still exist.
	findVM(t, sim, 1700)
	findVM(t, sim, 1701)

	simCall(t, sim, "DELETE", "/nodes/pve1/qemu/1700", nil)
	simCall(t, sim, "DELETE", "/nodes/pve1/qemu/1701", nil)
	waitUnverified(t, f, metav1.ConditionFalse, 0, string(hfv1.AllVerifiedReason))
}

// waitUnverified waits for the cluster's UnverifiedVMs condition and the
// metric to say want and n.
func waitUnverified(t *testing.T, f *fixture, want metav1.ConditionStatus, n int, reason string) *hfv1.HypervisorCluster {
	t.Helper()
	got := &hfv1.HypervisorCluster{}
	eventually(t, 60*time.Second, fmt.Sprintf("UnverifiedVMs=%s with %d VMs", want, n), func() error {
		if err := env.Client.Get(context.Background(), client.ObjectKeyFromObject(f.cluster), got); err != nil {
			return err
		}
		c := hfv1.FindCondition(got.Status.Conditions, hfv1.HypervisorClusterUnverifiedVMsCondition)
		if c == nil || c.Status != want || c.Reason != reason {
			return fmt.Errorf("UnverifiedVMs = %+v", c)
		}
		var m dto.Metric
		if err := metrics.UnverifiedVMs.WithLabelValues(f.cluster.Name).Write(&m); err != nil {
			return err
		}
		if v := m.GetGauge().GetValue(); v != float64(n) {
			return fmt.Errorf("hyperfleet_unverified_vms{cluster=%q} = %v, want %d", f.cluster.Name, v, n)
		}
		return nil
	})
	return got
}

package manager

import (
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	toolscache "k8s.io/client-go/tools/cache"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
)

// TestVMEndpoints: the broker is served while some HypervisorCluster's
// VMs fetch their credential from it (spec.spire without a secrets
// store), the TPM enrollment while some cluster attests with TPMs
// (spec.spire.tpm); neither without such a cluster, and both until the
// clusters are listed, so that a replica that just started refuses no VM.
func TestVMEndpoints(t *testing.T) {
	synced := false
	e := &vmEndpoints{clusters: map[string]clusterEndpoints{}, synced: func() bool { return synced }}
	cluster := func(name string, spire *hfv1.SPIREConfig) *hfv1.HypervisorCluster {
		return &hfv1.HypervisorCluster{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: hfv1.HypervisorClusterSpec{SPIRE: spire}}
	}
	check := func(what string, broker, tpm bool) {
		t.Helper()
		if e.Broker() != broker || e.TPM() != tpm {
			t.Errorf("%s: broker served %v, enrollment served %v; want %v and %v", what, e.Broker(), e.TPM(), broker, tpm)
		}
	}
	check("before the clusters are listed", true, true)
	synced = true
	check("no cluster", false, false)
	e.set(cluster("plain", nil))
	check("a cluster without SPIRE", false, false)
	e.set(cluster("store", &hfv1.SPIREConfig{SecretStore: &hfv1.SecretStoreConfig{}}))
	check("a cluster whose VMs read a secrets store", false, false)
	e.set(cluster("spire", &hfv1.SPIREConfig{}))
	check("a cluster whose VMs use the broker", true, false)
	e.set(cluster("spire", &hfv1.SPIREConfig{TPM: &hfv1.SPIRETPMConfig{}}))
	check("that cluster with TPM attestation", true, true)
	e.remove(toolscache.DeletedFinalStateUnknown{Obj: cluster("spire", nil)})
	check("that cluster deleted", false, false)
	e.set(cluster("store", &hfv1.SPIREConfig{SecretStore: &hfv1.SecretStoreConfig{}, TPM: &hfv1.SPIRETPMConfig{}}))
	check("a TPM cluster whose VMs read a secrets store", false, true)
	e.remove(cluster("store", nil))
	check("every cluster deleted", false, false)
}

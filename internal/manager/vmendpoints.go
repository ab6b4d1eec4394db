package manager

import (
	"context"
	"fmt"
	"sync"

	toolscache "k8s.io/client-go/tools/cache"
	ctrl "sigs.k8s.io/controller-runtime"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
)

// vmEndpoints says whether the agent server serves the credential broker
// and the TPM enrollment now (agentserver.Options.BrokerServed and
// TPMServed): while some HypervisorCluster configures them, as the
// manager's cache sees the clusters (a VM-facing endpoint is mounted
// only when its feature is configured). Until the cache has listed the
// clusters both are served, so that a replica that just started refuses
// no VM it should serve; the endpoints' own checks hold meanwhile.
type vmEndpoints struct {
	// synced reports whether the handler has seen the clusters' first
	// list.
	synced func() bool

	mu sync.Mutex
	// clusters holds what each HypervisorCluster configures, by name.
	clusters map[string]clusterEndpoints
}

// clusterEndpoints is what one HypervisorCluster's VMs need served.
type clusterEndpoints struct{ broker, tpm bool }

// endpointsOf says what the VMs of cluster need: the broker when it
// attests with SPIRE and hands out credentials through it (not through a
// secrets store), the TPM enrollment when it attests with TPMs.
func endpointsOf(cluster *hfv1.HypervisorCluster) clusterEndpoints {
	s := cluster.Spec.SPIRE
	if s == nil {
		return clusterEndpoints{}
	}
	// A TPM VM enrolls, then fetches its credential from the broker too
	// unless a secrets store hands it out.
	return clusterEndpoints{broker: s.SecretStore == nil, tpm: s.TPM != nil}
}

// watchVMEndpoints follows the HypervisorClusters of mgr's cache.
func watchVMEndpoints(ctx context.Context, mgr ctrl.Manager) (*vmEndpoints, error) {
	inf, err := mgr.GetCache().GetInformer(ctx, &hfv1.HypervisorCluster{})
	if err != nil {
		return nil, fmt.Errorf("watch HypervisorClusters for the agent server's endpoints: %w", err)
	}
	e := &vmEndpoints{clusters: map[string]clusterEndpoints{}}
	reg, err := inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc:    e.set,
		UpdateFunc: func(_, obj any) { e.set(obj) },
		DeleteFunc: e.remove,
	})
	if err != nil {
		return nil, fmt.Errorf("watch HypervisorClusters for the agent server's endpoints: %w", err)
	}
	e.synced = reg.HasSynced
	return e, nil
}

func (e *vmEndpoints) set(obj any) {
	c, ok := obj.(*hfv1.HypervisorCluster)
	if !ok {
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	e.clusters[c.Name] = endpointsOf(c)
}

func (e *vmEndpoints) remove(obj any) {
	if t, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
		obj = t.Obj
	}
	c, ok := obj.(*hfv1.HypervisorCluster)
	if !ok {
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	delete(e.clusters, c.Name)
}

// needed reports whether some cluster needs what pick says, or whether the
// clusters are not listed yet.
func (e *vmEndpoints) needed(pick func(clusterEndpoints) bool) bool {
	if e.synced != nil && !e.synced() {
		return true
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, c := range e.clusters {
		if pick(c) {
			return true
		}
	}
	return false
}

// Broker reports whether the credential broker is served now.
func (e *vmEndpoints) Broker() bool {
	return e.needed(func(c clusterEndpoints) bool { return c.broker })
}

// TPM reports whether the TPM enrollment is served now.
func (e *vmEndpoints) TPM() bool { return e.needed(func(c clusterEndpoints) bool { return c.tpm }) }

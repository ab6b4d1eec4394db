package controller

import (
	"context"
	"fmt"
	"maps"
	"strconv"

	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/claimrunner"
	"github.com/hyperfleet/hyperfleet/internal/clusterconfig"
	"github.com/hyperfleet/hyperfleet/pkg/workload"
)

// Field indexes on the manager's cache.
const (
	// claimVMIndex maps "<cluster>/<vmid>" to the claim whose VM it is.
	claimVMIndex = "status.vmRef"
	// claimClusterIndex maps a cluster name to the claims with a VM on it.
	claimClusterIndex = "status.vmRef.hypervisorCluster"
	// claimIPPoolIndex maps an IPPool name to the claims that record an
	// address from it.
	claimIPPoolIndex = "status.network.ipAllocations.poolRef"
	// claimTemplateIndex maps a template name to the claims built from it.
	claimTemplateIndex = "spec.templateRef.name"
	// templateClusterIndex maps a cluster name to the templates using it.
	templateClusterIndex = "spec.hypervisorClusterRef.name"
	// templatePoolIndex maps an IPPool name to the templates using it.
	templatePoolIndex = "spec.network.ipPoolRef.name"
	// clusterSecretIndex maps "<namespace>/<name>" of a Secret to the
	// clusters that reference it.
	clusterSecretIndex = "spec.secretRefs"
	// templateSecretIndex maps a Secret name to the templates (in its
	// namespace) that reference it.
	templateSecretIndex = "spec.secretRefs"
	// claimRunnerIndex maps a runner name to the claim whose VM runs it.
	claimRunnerIndex = "status.bootstrap.runnerName"
	// claimPoolIndex maps a RunnerPool name to its claims.
	claimPoolIndex = "spec.runnerPoolRef.name"
	// jobRunnerIndex maps a runner name to the CIJobs it took.
	jobRunnerIndex = claimrunner.JobRunnerIndex
	// jobPoolIndex maps a RunnerPool name to the CIJobs routed to it.
	jobPoolIndex = "spec.runnerPoolRef.name"
	// poolTemplateIndex maps a template name to the RunnerPools using it.
	poolTemplateIndex = "spec.templateRef.name"
)

func vmKey(cluster string, vmid int) string { return cluster + "/" + strconv.Itoa(vmid) }

// fieldIndex is one field index on the manager's cache.
type fieldIndex struct {
	obj     client.Object
	field   string
	extract client.IndexerFunc
}

// fieldIndexes are the field indexes the controllers use; ws read which
// Secrets a template's CI platform credentials are in. Tests on a fake
// client register the same ones.
func fieldIndexes(ws *workload.Backends) []fieldIndex {
	return []fieldIndex{
		{&hfv1.MachineClaim{}, claimVMIndex, func(o client.Object) []string {
			c := o.(*hfv1.MachineClaim)
			if c.Status.VMRef == nil || c.Status.VMRef.VMID == 0 {
				return nil
			}
			return []string{vmKey(c.Status.VMRef.HypervisorCluster, int(c.Status.VMRef.VMID))}
		}},
		{&hfv1.MachineClaim{}, claimClusterIndex, func(o client.Object) []string {
			c := o.(*hfv1.MachineClaim)
			if c.Status.VMRef == nil {
				return nil
			}
			return []string{c.Status.VMRef.HypervisorCluster}
		}},
		{&hfv1.MachineClaim{}, claimIPPoolIndex, func(o client.Object) []string {
			n := o.(*hfv1.MachineClaim).Status.Network
			if n == nil {
				return nil
			}
			var pools []string
			for _, a := range n.IPAllocations {
				pools = append(pools, a.PoolRef)
			}
			return pools
		}},
		{&hfv1.MachineClaim{}, claimTemplateIndex, func(o client.Object) []string {
			return []string{o.(*hfv1.MachineClaim).Spec.TemplateRef.Name}
		}},
		{&hfv1.MachineClaim{}, claimRunnerIndex, func(o client.Object) []string {
			if b := o.(*hfv1.MachineClaim).Status.Bootstrap; b != nil && b.RunnerName != "" {
				return []string{b.RunnerName}
			}
			return nil
		}},
		{&hfv1.MachineClaim{}, claimPoolIndex, func(o client.Object) []string {
			if ref := o.(*hfv1.MachineClaim).Spec.RunnerPoolRef; ref != nil {
				return []string{ref.Name}
			}
			return nil
		}},
		{&hfv1.CIJob{}, jobRunnerIndex, func(o client.Object) []string {
			if n := o.(*hfv1.CIJob).Status.RunnerName; n != "" {
				return []string{n}
			}
			return nil
		}},
		{&hfv1.CIJob{}, jobPoolIndex, func(o client.Object) []string {
			return []string{o.(*hfv1.CIJob).Spec.RunnerPoolRef.Name}
		}},
		{&hfv1.RunnerPool{}, poolTemplateIndex, func(o client.Object) []string {
			return []string{o.(*hfv1.RunnerPool).Spec.TemplateRef.Name}
		}},
		{&hfv1.HypervisorMachineTemplate{}, templateClusterIndex, func(o client.Object) []string {
			return []string{o.(*hfv1.HypervisorMachineTemplate).Spec.HypervisorClusterRef.Name}
		}},
		{&hfv1.HypervisorMachineTemplate{}, templatePoolIndex, func(o client.Object) []string {
			if ref := o.(*hfv1.HypervisorMachineTemplate).Spec.Network.IPPoolRef; ref != nil {
				return []string{ref.Name}
			}
			return nil
		}},
		{&hfv1.HypervisorMachineTemplate{}, templateSecretIndex, func(o client.Object) []string {
			return templateSecretNames(ws, o.(*hfv1.HypervisorMachineTemplate))
		}},
		{&hfv1.HypervisorCluster{}, clusterSecretIndex, func(o client.Object) []string {
			var out []string
			for _, ref := range clusterconfig.SecretRefs(o.(*hfv1.HypervisorCluster)) {
				out = append(out, ref.Namespace+"/"+ref.Name)
			}
			return out
		}},
	}
}

// SetupIndexes registers the field indexes the controllers use
// (fieldIndexes) on the manager's cache.
func SetupIndexes(ctx context.Context, mgr ctrl.Manager, ws *workload.Backends) error {
	for _, ix := range fieldIndexes(ws) {
		if err := mgr.GetFieldIndexer().IndexField(ctx, ix.obj, ix.field, ix.extract); err != nil {
			return fmt.Errorf("index %T by %s: %w", ix.obj, ix.field, err)
		}
	}
	return nil
}

// templateSecretRefs lists every Secret (in its own namespace) a template
// reads, with the field path that names it.
func templateSecretRefs(ws *workload.Backends, t *hfv1.HypervisorMachineTemplate) map[string]hfv1.LocalSecretKeySelector {
	out := map[string]hfv1.LocalSecretKeySelector{}
	if tpm := t.Spec.Attestation.TPM; tpm != nil && tpm.EKCABundleRef != nil {
		out["spec.attestation.tpm.ekCABundleRef"] = *tpm.EKCABundleRef
	}
	if _, wt, ok := ws.Template(t); ok {
		// The CI platform's credentials.
		maps.Copy(out, wt.Secrets)
	}
	return out
}

func templateSecretNames(ws *workload.Backends, t *hfv1.HypervisorMachineTemplate) []string {
	seen := map[string]bool{}
	var out []string
	for _, ref := range templateSecretRefs(ws, t) {
		if !seen[ref.Name] {
			seen[ref.Name] = true
			out = append(out, ref.Name)
		}
	}
	return out
}

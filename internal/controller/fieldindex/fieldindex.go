// Package fieldindex is the field indexes on the manager's cache that the
// reconcilers list objects by (an index name, the object it indexes and how
// a value is read), registered once by the manager and by the tests that
// run a reconciler on controller-runtime's fake client.
package fieldindex

import (
	"context"
	"fmt"
	"maps"

	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/clusterconfig"
	"github.com/hyperfleet/hyperfleet/pkg/workload"
)

// Field indexes on the manager's cache.
const (
	// ClaimVM maps "<cluster>/<vmid>" to the claim whose VM it is.
	ClaimVM = "status.vmRef"
	// ClaimCluster maps a cluster name to the claims with a VM on it.
	ClaimCluster = "status.vmRef.hypervisorCluster"
	// ClaimIPPool maps an IPPool name to the claims that record an
	// address from it.
	ClaimIPPool = "status.network.ipAllocations.poolRef"
	// ClaimTemplate maps a template name to the claims built from it.
	ClaimTemplate = "spec.templateRef.name"
	// TemplateCluster maps a cluster name to the templates using it.
	TemplateCluster = "spec.hypervisorClusterRef.name"
	// TemplatePool maps an IPPool name to the templates using it
	// (spec.network.ipPoolRef or ipPoolRefs).
	TemplatePool = "spec.network.ipPoolRef.name"
	// ClusterSecret maps "<namespace>/<name>" of a Secret to the
	// clusters that reference it.
	ClusterSecret = "spec.secretRefs"
	// TemplateSecret maps a Secret name to the templates (in its
	// namespace) that reference it.
	TemplateSecret = "spec.secretRefs"
	// ClaimRunner maps a runner name to the claim whose VM runs it.
	ClaimRunner = "status.bootstrap.runnerName"
	// ClaimPool maps a RunnerPool name to its claims.
	ClaimPool = "spec.runnerPoolRef.name"
	// JobRunner maps a runner name to the CIJobs it took.
	JobRunner = "status.runnerName"
	// JobPool maps a RunnerPool name to the CIJobs routed to it.
	JobPool = "spec.runnerPoolRef.name"
	// PoolTemplate maps a template name to the RunnerPools using it: as
	// spec.templateRef or in spec.placement.templates.
	PoolTemplate = "spec.templateRef.name"
)

// VMKey is the ClaimVM index value of the VM with provider ID vm on cluster.
func VMKey(cluster, vm string) string { return cluster + "/" + vm }

// Index is one field index on the manager's cache.
type Index struct {
	Obj     client.Object
	Field   string
	Extract client.IndexerFunc
}

// All are the field indexes the controllers use; ws read which
// Secrets a template's CI platform credentials are in. Tests on a fake
// client register the same ones.
func All(ws *workload.Backends) []Index {
	return []Index{
		{&hfv1.MachineClaim{}, ClaimVM, func(o client.Object) []string {
			c := o.(*hfv1.MachineClaim)
			if c.Status.VMRef.ID() == "" {
				return nil
			}
			return []string{VMKey(c.Status.VMRef.HypervisorCluster, c.Status.VMRef.ID())}
		}},
		{&hfv1.MachineClaim{}, ClaimCluster, func(o client.Object) []string {
			c := o.(*hfv1.MachineClaim)
			if c.Status.VMRef == nil {
				return nil
			}
			return []string{c.Status.VMRef.HypervisorCluster}
		}},
		{&hfv1.MachineClaim{}, ClaimIPPool, func(o client.Object) []string {
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
		{&hfv1.MachineClaim{}, ClaimTemplate, func(o client.Object) []string {
			return []string{o.(*hfv1.MachineClaim).Spec.TemplateRef.Name}
		}},
		{&hfv1.MachineClaim{}, ClaimRunner, func(o client.Object) []string {
			if b := o.(*hfv1.MachineClaim).Status.Bootstrap; b != nil && b.RunnerName != "" {
				return []string{b.RunnerName}
			}
			return nil
		}},
		{&hfv1.MachineClaim{}, ClaimPool, func(o client.Object) []string {
			if ref := o.(*hfv1.MachineClaim).Spec.RunnerPoolRef; ref != nil {
				return []string{ref.Name}
			}
			return nil
		}},
		{&hfv1.CIJob{}, JobRunner, func(o client.Object) []string {
			if n := o.(*hfv1.CIJob).Status.RunnerName; n != "" {
				return []string{n}
			}
			return nil
		}},
		{&hfv1.CIJob{}, JobPool, func(o client.Object) []string {
			return []string{o.(*hfv1.CIJob).Spec.RunnerPoolRef.Name}
		}},
		{&hfv1.RunnerPool{}, PoolTemplate, func(o client.Object) []string {
			pool := o.(*hfv1.RunnerPool)
			names := []string{pool.Spec.TemplateRef.Name}
			if p := pool.Spec.Placement; p != nil {
				for _, t := range p.Templates {
					names = append(names, t.Name)
				}
			}
			return names
		}},
		{&hfv1.HypervisorMachineTemplate{}, TemplateCluster, func(o client.Object) []string {
			return []string{o.(*hfv1.HypervisorMachineTemplate).Spec.HypervisorClusterRef.Name}
		}},
		{&hfv1.HypervisorMachineTemplate{}, TemplatePool, func(o client.Object) []string {
			return o.(*hfv1.HypervisorMachineTemplate).Spec.Network.IPPoolNames()
		}},
		{&hfv1.HypervisorMachineTemplate{}, TemplateSecret, func(o client.Object) []string {
			return templateSecretNames(ws, o.(*hfv1.HypervisorMachineTemplate))
		}},
		{&hfv1.HypervisorCluster{}, ClusterSecret, func(o client.Object) []string {
			var out []string
			c := o.(*hfv1.HypervisorCluster)
			for _, ref := range append(clusterconfig.SecretRefs(c), clusterconfig.DNSSecretRefs(c)...) {
				out = append(out, ref.Namespace+"/"+ref.Name)
			}
			return out
		}},
	}
}

// Setup registers the field indexes the controllers use (All) on the manager's cache.
func Setup(ctx context.Context, mgr ctrl.Manager, ws *workload.Backends) error {
	for _, ix := range All(ws) {
		if err := mgr.GetFieldIndexer().IndexField(ctx, ix.Obj, ix.Field, ix.Extract); err != nil {
			return fmt.Errorf("index %T by %s: %w", ix.Obj, ix.Field, err)
		}
	}
	return nil
}

// TemplateSecretRefs lists every Secret (in its own namespace) a template
// reads, with the field path that names it.
func TemplateSecretRefs(ws *workload.Backends, t *hfv1.HypervisorMachineTemplate) map[string]hfv1.LocalSecretKeySelector {
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
	for _, ref := range TemplateSecretRefs(ws, t) {
		if !seen[ref.Name] {
			seen[ref.Name] = true
			out = append(out, ref.Name)
		}
	}
	return out
}

package externaldns

import (
	"context"
	"fmt"
	"strings"

	authorizationv1 "k8s.io/api/authorization/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// checkObject is the name of the DNSEndpoint Check creates with dry run:
// never stored, and not a name ObjectName gives.
const checkObject = "hyperfleet-dns-check"

// Check implements dnsreg.Checker: it lists DNSEndpoints in the namespace
// (the CRD is installed, the operator may list there), creates one there
// with dry run (the namespace exists, the operator may create, admission
// takes the shape Register writes; nothing is stored), and asks the API
// server whether the operator may update and delete DNSEndpoints there and
// list them in every namespace (what Register's search for a name's other
// records does). It changes nothing.
func (r *Registrar) Check(ctx context.Context) error {
	list := newList()
	if err := r.client.List(ctx, list, client.InNamespace(r.namespace), client.Limit(1)); err != nil {
		return r.apiError("list", "", "", err)
	}
	probe := newObject(r.namespace, checkObject)
	probe.SetLabels(map[string]string{ManagedByLabel: ManagedByValue, ProviderLabel: string(r.provider)})
	name := "hyperfleet-dns-check." + strings.TrimSuffix(r.zone, ".")
	if err := writeSpec(probe, spec{Endpoints: []endpoint{{DNSName: name, RecordType: typeA, Targets: []string{"192.0.2.1"}, RecordTTL: int64(r.ttl.Seconds())}}}); err != nil {
		return err
	}
	if err := r.client.Create(ctx, probe, client.DryRunAll); err != nil {
		return r.apiError("create (dry run)", checkObject, "", err)
	}
	var denied []string
	for _, a := range []authorizationv1.ResourceAttributes{
		{Verb: "update", Namespace: r.namespace},
		{Verb: "delete", Namespace: r.namespace},
		{Verb: "list"}, // every namespace
	} {
		a.Group, a.Version, a.Resource = GroupVersion.Group, GroupVersion.Version, Resource
		review := &authorizationv1.SelfSubjectAccessReview{Spec: authorizationv1.SelfSubjectAccessReviewSpec{ResourceAttributes: &a}}
		if err := r.client.Create(ctx, review); err != nil {
			return r.apiError("self subject access review", "", "", err)
		}
		if !review.Status.Allowed {
			where := "in namespace " + a.Namespace
			if a.Namespace == "" {
				where = "in every namespace"
			}
			denied = append(denied, a.Verb+" "+where)
		}
	}
	if len(denied) > 0 {
		return fmt.Errorf("DNSEndpoints: %w: it may not %s: the operator's ClusterRole needs get, list, create, update and delete on dnsendpoints.externaldns.k8s.io (the chart's has them; docs/networking.md)",
			ErrForbidden, strings.Join(denied, ", nor "))
	}
	return nil
}

package v1alpha1_test

import (
	"context"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// TestIsolationRules: the rules of HypervisorCluster spec.network.isolation
// and of a template's network.isolationPolicy, each broken once, and a
// valid isolation accepted.
func TestIsolationRules(t *testing.T) {
	ctx := context.Background()
	ns := newNamespace(t)
	isolation := func(extra map[string]any) map[string]any {
		iso := map[string]any{
			"operatorCIDRs":   []any{"192.0.2.5"},
			"managementCIDRs": []any{"10.0.0.0/24"},
			"defaultPolicy":   "web",
			"policies": []any{map[string]any{"name": "web", "egress": []any{
				map[string]any{"cidrs": []any{"0.0.0.0/0", "::/0"}, "ports": []any{"443", "8000-8100"}},
				map[string]any{"cidrs": []any{"203.0.113.7"}, "protocol": "ICMP"},
			}}},
		}
		for k, v := range extra {
			iso[k] = v
		}
		return iso
	}
	valid := validCluster()
	valid.SetName("isolation-valid")
	set(isolation(nil), "spec", "network", "isolation")(valid)
	set([]any{"192.0.2.0/24"}, "spec", "network", "vmSubnets")(valid)
	set([]any{map[string]any{
		"namespaceSelector": map[string]any{},
		"templates":         []any{map[string]any{"id": int64(9000)}},
		"isolationPolicies": []any{"web", "default"},
	}}, "spec", "tenancy")(valid)
	if err := env.Client.Create(ctx, valid, client.FieldValidation("Strict")); err != nil {
		t.Fatalf("a valid isolation was rejected: %v", err)
	}
	t.Cleanup(func() { _ = env.Client.Delete(ctx, valid) })
	tmpl := validTemplate()
	tmpl.SetName("isolation-valid")
	tmpl.SetNamespace(ns)
	set("web", "spec", "network", "isolationPolicy")(tmpl)
	if err := env.Client.Create(ctx, tmpl, client.FieldValidation("Strict")); err != nil {
		t.Fatalf("a template naming an isolation policy was rejected: %v", err)
	}
	t.Cleanup(func() { _ = env.Client.Delete(ctx, tmpl) })

	egress := func(rule map[string]any) map[string]any {
		return isolation(map[string]any{"policies": []any{map[string]any{"name": "web", "egress": []any{rule}}}})
	}
	isolated := func() *unstructured.Unstructured {
		c := validCluster()
		set([]any{"192.0.2.0/24"}, "spec", "network", "vmSubnets")(c)
		return c
	}
	cases := []invalidCase{
		{name: "no vm subnets", base: validCluster, mutate: set(isolation(nil), "spec", "network", "isolation"), want: "network.isolation needs network.vmSubnets"},
		{name: "no operator cidrs", base: isolated, mutate: set(isolation(map[string]any{"operatorCIDRs": []any{}}), "spec", "network", "isolation"), want: "spec.network.isolation.operatorCIDRs: Invalid value"},
		{name: "operator cidr not an address", base: isolated, mutate: set(isolation(map[string]any{"operatorCIDRs": []any{"operator.example.com"}}), "spec", "network", "isolation"), want: "each of network.isolation.operatorCIDRs must be an address or a CIDR"},
		{name: "management cidr not a cidr", base: isolated, mutate: set(isolation(map[string]any{"managementCIDRs": []any{"10.0.0.0/33"}}), "spec", "network", "isolation"), want: "each of network.isolation.managementCIDRs must be an address or a CIDR"},
		{name: "default policy undefined", base: isolated, mutate: set(isolation(map[string]any{"defaultPolicy": "strict"}), "spec", "network", "isolation"), want: "network.isolation.defaultPolicy names no policy of network.isolation.policies"},
		{name: "duplicate policy", base: isolated, mutate: set(isolation(map[string]any{"policies": []any{map[string]any{"name": "web"}, map[string]any{"name": "web"}}}), "spec", "network", "isolation"), want: "Duplicate value"},
		{name: "egress without cidrs", base: isolated, mutate: set(egress(map[string]any{"cidrs": []any{}}), "spec", "network", "isolation"), want: "spec.network.isolation.policies[0].egress[0].cidrs: Invalid value"},
		{name: "egress bad cidr", base: isolated, mutate: set(egress(map[string]any{"cidrs": []any{"example.com"}}), "spec", "network", "isolation"), want: "each egress cidrs entry must be an address or a CIDR"},
		{name: "egress ports with icmp", base: isolated, mutate: set(egress(map[string]any{"cidrs": []any{"0.0.0.0/0"}, "protocol": "ICMP", "ports": []any{"443"}}), "spec", "network", "isolation"), want: "egress ports need protocol TCP or UDP"},
		{name: "egress bad port", base: isolated, mutate: set(egress(map[string]any{"cidrs": []any{"0.0.0.0/0"}, "ports": []any{"https"}}), "spec", "network", "isolation"), want: "spec.network.isolation.policies[0].egress[0].ports[0]: Invalid value"},
		{name: "egress bad protocol", base: isolated, mutate: set(egress(map[string]any{"cidrs": []any{"0.0.0.0/0"}, "protocol": "SCTP"}), "spec", "network", "isolation"), want: "Unsupported value: \"SCTP\""},
		{name: "tenancy bad policy name", base: validCluster, mutate: set([]any{map[string]any{"namespaceSelector": map[string]any{}, "templates": []any{map[string]any{"id": int64(9000)}}, "isolationPolicies": []any{"Web"}}}, "spec", "tenancy"), want: "spec.tenancy[0].isolationPolicies[0]: Invalid value"},
		{name: "template bad policy name", base: validTemplate, mutate: set("Web_1", "spec", "network", "isolationPolicy"), want: "spec.network.isolationPolicy: Invalid value"},
	}
	createRejected(t, ns, "isolation-case", cases)
}

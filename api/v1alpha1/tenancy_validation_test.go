package v1alpha1_test

import (
	"context"
	"fmt"
	"testing"

	"sigs.k8s.io/controller-runtime/pkg/client"
)

// TestTenancyAndMetadataRules: the rules of HypervisorCluster spec.tenancy,
// of a template's spec.metadata and of network.dhcp.clientIdentifier, each
// broken once, and a valid tenancy accepted.
func TestTenancyAndMetadataRules(t *testing.T) {
	ctx := context.Background()
	ns := newNamespace(t)
	rule := func(extra map[string]any) []any {
		r := map[string]any{
			"namespaceSelector": map[string]any{"matchLabels": map[string]any{"team": "a"}},
			"templates":         []any{map[string]any{"id": int64(9000)}},
		}
		for k, v := range extra {
			r[k] = v
		}
		return []any{r}
	}
	valid := validCluster()
	valid.SetName("tenancy-valid")
	set(rule(map[string]any{
		"bridges": []any{"vmbr1"}, "vlans": []any{map[string]any{"start": int64(100), "end": int64(199)}},
		"storages": []any{"local-lvm"}, "resourcePools": []any{"ci"},
	}), "spec", "tenancy")(valid)
	if err := env.Client.Create(ctx, valid, client.FieldValidation("Strict")); err != nil {
		t.Fatalf("a valid tenancy was rejected: %v", err)
	}
	t.Cleanup(func() { _ = env.Client.Delete(ctx, valid) })
	// clientIdentifier hostname is accepted, with sendHostname explicit or
	// defaulted.
	for i, dhcp := range []map[string]any{{"clientIdentifier": "hostname", "sendHostname": true}, {"clientIdentifier": "hostname"}} {
		tmpl := validTemplate()
		tmpl.SetName(fmt.Sprintf("dhcp-hostname-%d", i))
		tmpl.SetNamespace(ns)
		set(dhcp, "spec", "network", "dhcp")(tmpl)
		if err := env.Client.Create(ctx, tmpl, client.FieldValidation("Strict")); err != nil {
			t.Fatalf("network.dhcp %v was rejected: %v", dhcp, err)
		}
		t.Cleanup(func() { _ = env.Client.Delete(ctx, tmpl) })
	}

	cases := []invalidCase{
		{name: "tenancy template id and name", base: validCluster, mutate: set(rule(map[string]any{"templates": []any{map[string]any{"id": int64(9000), "name": "debian"}}}), "spec", "tenancy"), want: "set exactly one of id, name and tag in a tenancy templates entry"},
		{name: "tenancy no templates", base: validCluster, mutate: set(rule(map[string]any{"templates": []any{}}), "spec", "tenancy"), want: "spec.tenancy[0].templates: Invalid value"},
		{name: "tenancy reversed vlans", base: validCluster, mutate: set(rule(map[string]any{"vlans": []any{map[string]any{"start": int64(200), "end": int64(100)}}}), "spec", "tenancy"), want: "a tenancy vlans range must have start <= end"},
		{name: "tenancy vlan out of range", base: validCluster, mutate: set(rule(map[string]any{"vlans": []any{map[string]any{"start": int64(1), "end": int64(4095)}}}), "spec", "tenancy"), want: "spec.tenancy[0].vlans[0].end: Invalid value: 4095"},
		{name: "tenancy duplicate bridge", base: validCluster, mutate: set(rule(map[string]any{"bridges": []any{"vmbr0", "vmbr0"}}), "spec", "tenancy"), want: "spec.tenancy[0].bridges[1]: Duplicate value"},
		{name: "template metadata hyperfleet label", base: validTemplate, mutate: set(map[string]any{"labels": map[string]any{"hyperfleet.io/runner-pool": "other"}}, "spec", "metadata"), want: "metadata.labels must not set hyperfleet.io/ keys"},
		{name: "template metadata hyperfleet annotation", base: validTemplate, mutate: set(map[string]any{"annotations": map[string]any{"hyperfleet.io/fail-reason": "x"}}, "spec", "metadata"), want: "metadata.annotations must not set hyperfleet.io/ keys"},
		{name: "template dhcp client identifier hostname without sendHostname", base: validTemplate, mutate: set(map[string]any{"clientIdentifier": "hostname", "sendHostname": false}, "spec", "network", "dhcp"), want: "network.dhcp.clientIdentifier hostname identifies the VM by its host name; it needs sendHostname true"},
	}
	createRejected(t, ns, "tenancy-case", cases)
}

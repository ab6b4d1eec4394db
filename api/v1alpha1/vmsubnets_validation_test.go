package v1alpha1_test

import (
	"context"
	"fmt"
	"testing"

	"sigs.k8s.io/controller-runtime/pkg/client"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
)

// TestVMSubnetsRules: a HypervisorCluster's spec.network.vmSubnets takes
// IPv4 and IPv6 CIDRs, and refuses what is not one, a subnet that would
// trust every address (/0), a duplicate and more than 32 entries, each
// with a message that names the field.
func TestVMSubnetsRules(t *testing.T) {
	ctx := context.Background()
	valid := validCluster()
	valid.SetName("vmsubnets-valid")
	set([]any{"192.0.2.0/24", "2001:db8:10::/64", "10.99.0.0/16"}, "spec", "network", "vmSubnets")(valid)
	if err := env.Client.Create(ctx, valid, client.FieldValidation("Strict")); err != nil {
		t.Fatalf("valid vmSubnets were rejected: %v", err)
	}
	t.Cleanup(func() { _ = env.Client.Delete(ctx, valid) })
	got := &hfv1.HypervisorCluster{}
	if err := env.Client.Get(ctx, client.ObjectKey{Name: valid.GetName()}, got); err != nil {
		t.Fatal(err)
	}
	if n := got.Spec.Network; n == nil || len(n.VMSubnets) != 3 || n.VMSubnets[1] != "2001:db8:10::/64" {
		t.Fatalf("vmSubnets read back as %+v", got.Spec.Network)
	}

	many := make([]any, 33)
	for i := range many {
		many[i] = fmt.Sprintf("10.%d.0.0/24", i)
	}
	for i, tc := range []struct {
		name    string
		subnets []any
		want    string
	}{
		{"an address without a prefix length", []any{"192.0.2.10"}, "each of network.vmSubnets must be a CIDR"},
		{"not an address", []any{"vm-network"}, "each of network.vmSubnets must be a CIDR"},
		{"every IPv4 address", []any{"0.0.0.0/0"}, "network.vmSubnets must not hold 0.0.0.0/0 or ::/0"},
		{"every IPv6 address", []any{"192.0.2.0/24", "::/0"}, "network.vmSubnets must not hold 0.0.0.0/0 or ::/0"},
		{"a duplicate", []any{"192.0.2.0/24", "192.0.2.0/24"}, "spec.network.vmSubnets[1]: Duplicate value"},
		{"too many", many, "spec.network.vmSubnets: Too many"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			obj := validCluster()
			obj.SetName(fmt.Sprintf("vmsubnets-case-%d", i))
			set(tc.subnets, "spec", "network", "vmSubnets")(obj)
			err := env.Client.Create(ctx, obj, client.FieldValidation("Strict"))
			if err == nil {
				_ = env.Client.Delete(ctx, obj)
			}
			assertRejected(t, err, tc.want)
		})
	}
}

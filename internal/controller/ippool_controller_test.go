package controller_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
)

// staticTemplate creates "static", the fixture's template with addresses
// from pool (and, for a dual-stack template, from the pool of the other
// family in dualStack), and waits until it is Ready.
func (f *fixture) staticTemplate(t *testing.T, pool *hfv1.IPPool, dualStack ...*hfv1.IPPool) *hfv1.HypervisorMachineTemplate {
	t.Helper()
	static := f.template.DeepCopy()
	static.ObjectMeta = metav1.ObjectMeta{Namespace: f.namespace, Name: "static"}
	static.Status = hfv1.HypervisorMachineTemplateStatus{}
	static.Spec.Network = hfv1.MachineNetwork{Mode: hfv1.NetworkModeStatic, IPPoolRef: &hfv1.ObjectName{Name: pool.Name}}
	if len(dualStack) > 0 {
		// Dual stack: the pools in ipPoolRefs.
		static.Spec.Network.IPPoolRef = nil
		for _, p := range append([]*hfv1.IPPool{pool}, dualStack...) {
			static.Spec.Network.IPPoolRefs = append(static.Spec.Network.IPPoolRefs, hfv1.ObjectName{Name: p.Name})
		}
	}
	f.create(static)
	waitTemplate(t, static, metav1.ConditionTrue, "")
	return static
}

// TestStaticAddresses: claims of a static-mode template get distinct
// addresses from the pool, recorded in status; an exhausted pool makes the
// next claim wait and say why; a deleted claim's address returns to the
// pool; a restarted operator rebuilds the pool from the claims and never
// hands out an address twice.
func TestStaticAddresses(t *testing.T) {
	sim := startSim(t, nil)
	op := startOperator(t, operatorOptions{})
	f := newFixture(t, sim, nil)
	pool := &hfv1.IPPool{
		ObjectMeta: metav1.ObjectMeta{Name: "pool-" + f.namespace},
		Spec: hfv1.IPPoolSpec{
			// .0 is the network, .7 the broadcast, .1 the gateway: five
			// addresses are left.
			Addresses: []string{"10.20.0.0/29"}, Prefix: 29,
			Gateways: []string{"10.20.0.1"}, Nameservers: []string{"10.20.0.53"},
		},
	}
	f.create(pool)
	t.Cleanup(func() { _ = env.Client.Delete(context.Background(), pool) })
	static := f.staticTemplate(t, pool)

	newStaticClaim := func(name string) *hfv1.MachineClaim {
		c := &hfv1.MachineClaim{
			ObjectMeta: metav1.ObjectMeta{Namespace: f.namespace, Name: name},
			Spec:       hfv1.MachineClaimSpec{TemplateRef: hfv1.ObjectName{Name: static.Name}},
		}
		f.create(c)
		return c
	}
	addressOf := func(c *hfv1.MachineClaim) string {
		got, err := getClaim(t, c)
		if err != nil || got.Status.Network == nil || len(got.Status.Network.IPAllocations) != 1 {
			t.Fatalf("claim %s allocations: %+v (%v)", c.Name, got.Status.Network, err)
		}
		a := got.Status.Network.IPAllocations[0]
		if a.PoolRef != pool.Name || a.Gateway != "10.20.0.1" {
			t.Errorf("allocation %+v", a)
		}
		return a.Address
	}

	var claims []*hfv1.MachineClaim
	for i := range 5 {
		claims = append(claims, newStaticClaim(fmt.Sprintf("static-%d", i)))
	}
	seen := map[string]string{}
	for _, c := range claims {
		waitPhase(t, c, hfv1.MachineClaimBootstrapping, 60*time.Second)
		a := addressOf(c)
		if other, dup := seen[a]; dup {
			t.Fatalf("address %s given to %s and %s", a, other, c.Name)
		}
		seen[a] = c.Name
	}
	for _, want := range []string{"10.20.0.2/29", "10.20.0.3/29", "10.20.0.4/29", "10.20.0.5/29", "10.20.0.6/29"} {
		if seen[want] == "" {
			t.Errorf("address %s not allocated (have %v)", want, seen)
		}
	}
	eventually(t, 30*time.Second, "pool exhausted", func() error {
		var p hfv1.IPPool
		if err := env.Client.Get(context.Background(), client.ObjectKeyFromObject(pool), &p); err != nil {
			return err
		}
		if p.Status.Total != 5 || p.Status.Allocated != 5 || p.Status.Free != 0 || !hfv1.IsConditionTrue(p.Status.Conditions, hfv1.IPPoolExhaustedCondition) {
			return fmt.Errorf("pool status %+v", p.Status)
		}
		return nil
	})

	waiting := newStaticClaim("static-waits")
	eventually(t, 30*time.Second, "claim waits for an address", func() error {
		got, err := getClaim(t, waiting)
		if err != nil {
			return err
		}
		if c := hfv1.FindCondition(got.Status.Conditions, hfv1.MachineClaimProvisionedCondition); c == nil || c.Reason != string(hfv1.IPPoolExhaustedReason) {
			return fmt.Errorf("Provisioned = %+v", c)
		}
		return nil
	})

	// A restarted operator rebuilds the pool from the claims; the freed
	// address is the only one it can hand out.
	op.restart(t, operatorOptions{})
	freed := addressOf(claims[2])
	if err := env.Client.Delete(context.Background(), claims[2]); err != nil {
		t.Fatal(err)
	}
	waitPhase(t, waiting, hfv1.MachineClaimBootstrapping, 90*time.Second)
	if got := addressOf(waiting); got != freed {
		t.Fatalf("waiting claim got %s, want the freed %s", got, freed)
	}
}

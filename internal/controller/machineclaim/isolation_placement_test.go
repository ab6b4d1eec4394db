package machineclaim

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/controller-runtime/pkg/client"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
)

// isolatedCluster gives the sim world's cluster network isolation: policy
// web (TCP 443 anywhere) by default, and the namespace may use web only;
// policy open (everything) exists for other teams.
func isolatedCluster(c *hfv1.HypervisorCluster) {
	c.Spec.Network = &hfv1.ClusterNetworkSettings{
		VMSubnets: []string{"10.99.0.0/24"},
		Isolation: &hfv1.NetworkIsolation{
			OperatorCIDRs: []string{"198.51.100.5"}, ManagementCIDRs: []string{"10.0.0.0/24"}, DefaultPolicy: "web",
			Policies: []hfv1.IsolationPolicy{
				{Name: "web", Egress: []hfv1.EgressRule{{CIDRs: []string{"0.0.0.0/0"}, Protocol: hfv1.IsolationTCP, Ports: []string{"443"}}}},
				{Name: "open", Egress: []hfv1.EgressRule{{CIDRs: []string{"0.0.0.0/0", "::/0"}, Protocol: hfv1.IsolationAny}}},
			},
		},
	}
	c.Spec.Tenancy[0].IsolationPolicies = []string{"web"}
}

// TestIsolationEditAfterPlacementNeverReachesTheVM: a claim placed under
// policy web keeps it whatever happens between its placement and its
// VM's configuration: its tenant naming policy open (which its namespace
// may not use) and the platform team rewriting web's egress. The VM's one
// firewall rule names the security group of the rules it was placed with,
// whose egress is web's old one; a claim placed after the edit gets the
// new rules in a group of its own, and a claim of a template naming open
// is refused before any VM is made.
func TestIsolationEditAfterPlacementNeverReachesTheVM(t *testing.T) {
	w := newSimWorld(t, simOptions{cluster: isolatedCluster})
	claim := w.newClaim("runner-1")
	placed := w.runUntil(claim, "a VM", func(c *hfv1.MachineClaim) bool { return c.Status.VMRef != nil })
	if !strings.Contains(placed.Status.PlacementRecord, `"isolation":`) {
		t.Fatalf("the placement record holds no isolation policy: %s", placed.Status.PlacementRecord)
	}
	w.editTemplate(func(tm *hfv1.HypervisorMachineTemplate) { tm.Spec.Network.IsolationPolicy = "open" })
	w.editCluster(func(c *hfv1.HypervisorCluster) {
		c.Spec.Network.Isolation.Policies[0].Egress[0].Ports = []string{"443", "22"}
	})
	got := w.runUntil(claim, "a running VM", provisioned)
	vmid := int(got.Status.VMRef.VMID)
	group := w.vmGroup(vmid)
	if rules := w.groupRules(group); !slices.Contains(rules, "out ACCEPT 0.0.0.0/0 tcp 443") || slices.ContainsFunc(rules, func(r string) bool {
		return strings.Contains(r, "443,22") || strings.Contains(r, "ACCEPT 0.0.0.0/0  ") || strings.Contains(r, "::/0")
	}) {
		t.Fatalf("the VM placed under web is held to group %s with rules %q: want web's rules of its placement only", group, rules)
	}

	// The tenant's edit is refused for new claims; the platform team's
	// reaches them, in a group of its own.
	refused := w.newClaim("runner-2")
	r2 := w.runUntil(refused, "a refusal", func(c *hfv1.MachineClaim) bool {
		cond := hfv1.FindCondition(c.Status.Conditions, hfv1.MachineClaimProvisionedCondition)
		return cond != nil && strings.Contains(cond.Message, "isolation")
	})
	if r2.Status.VMRef != nil {
		t.Fatalf("a claim of a template naming a policy its namespace may not use got VM %+v", r2.Status.VMRef)
	}
	w.editTemplate(func(tm *hfv1.HypervisorMachineTemplate) { tm.Spec.Network.IsolationPolicy = "" })
	later := w.runUntil(w.newClaim("runner-3"), "a running VM", provisioned)
	if g := w.vmGroup(int(later.Status.VMRef.VMID)); g == group || !slices.Contains(w.groupRules(g), "out ACCEPT 0.0.0.0/0 tcp 443,22") {
		t.Fatalf("a claim placed after the edit is held to group %s with rules %q: want the new rules in a group of their own", g, w.groupRules(g))
	}
}

// editCluster changes the HypervisorCluster as its platform team would.
func (w *simWorld) editCluster(mutate func(*hfv1.HypervisorCluster)) {
	w.t.Helper()
	c := &hfv1.HypervisorCluster{}
	if err := w.kube.Get(context.Background(), client.ObjectKey{Name: simCluster}, c); err != nil {
		w.t.Fatal(err)
	}
	mutate(c)
	if err := w.kube.Update(context.Background(), c); err != nil {
		w.t.Fatal(err)
	}
}

// simGet reads path from the simulator's API as its root token.
func (w *simWorld) simGet(path string, out any) {
	w.t.Helper()
	req := httptest.NewRequest(http.MethodGet, "https://pve/api2/json"+path, nil)
	req.Header.Set("Authorization", "PVEAPIToken=root@pam!sim=00000000-0000-0000-0000-000000000000")
	rec := httptest.NewRecorder()
	w.sim.ServeHTTP(rec, req)
	if rec.Code != http.StatusOK {
		w.t.Fatalf("GET %s: %d %s", path, rec.Code, rec.Body)
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &struct{ Data any }{out}); err != nil {
		w.t.Fatalf("GET %s: %v", path, err)
	}
}

// vmGroup is the security group VM vmid's one firewall rule names.
func (w *simWorld) vmGroup(vmid int) string {
	w.t.Helper()
	var rules []struct{ Type, Action string }
	w.simGet(fmt.Sprintf("/nodes/%s/qemu/%d/firewall/rules", simNode, vmid), &rules)
	if len(rules) != 1 || rules[0].Type != "group" {
		w.t.Fatalf("VM %d's firewall rules %+v: want one group rule", vmid, rules)
	}
	return rules[0].Action
}

// groupRules are a security group's rules, "<type> <action> <dest> <proto> <dport>".
func (w *simWorld) groupRules(group string) []string {
	w.t.Helper()
	var rules []struct{ Type, Action, Dest, Proto, Dport string }
	w.simGet("/cluster/firewall/groups/"+group, &rules)
	var out []string
	for _, r := range rules {
		out = append(out, strings.Join([]string{r.Type, r.Action, r.Dest, r.Proto, r.Dport}, " "))
	}
	return out
}

package manager

import (
	"os"
	"slices"
	"testing"

	rbacv1 "k8s.io/api/rbac/v1"
	"sigs.k8s.io/yaml"
)

// TestClusterRoleCannotCreateOrDeletePlatformObjects reads the ClusterRole
// generated from the markers in internal/controller/doc.go (make manifests)
// and checks that the operator cannot create or delete the objects people
// own: a compromised or buggy operator must not be able to add a cluster,
// a template, a pool or an address range, nor remove one.
func TestClusterRoleCannotCreateOrDeletePlatformObjects(t *testing.T) {
	role := managerRole(t)
	protected := []string{"hypervisorclusters", "hypervisormachinetemplates", "runnerpools", "ippools"}
	forbidden := []string{"create", "delete", "deletecollection", "*"}
	for _, rule := range role.Rules {
		if !slices.Contains(rule.APIGroups, "hyperfleet.io") && !slices.Contains(rule.APIGroups, "*") {
			continue
		}
		for _, res := range rule.Resources {
			if !slices.Contains(protected, res) && res != "*" {
				continue
			}
			for _, verb := range rule.Verbs {
				if slices.Contains(forbidden, verb) {
					t.Errorf("the ClusterRole grants %q on %s; the operator never does that (fix the markers in internal/controller/doc.go, then make manifests)", verb, res)
				}
			}
		}
	}
}

// TestClusterRoleHoldsWhatClaimsUse: the operator adds and removes the
// in-use finalizers of HypervisorClusters, HypervisorMachineTemplates and
// IPPools (update and patch on them, update on their finalizers
// subresource), and nothing more on RunnerPools than it did.
func TestClusterRoleHoldsWhatClaimsUse(t *testing.T) {
	role := managerRole(t)
	for _, res := range []string{"hypervisorclusters", "hypervisormachinetemplates", "ippools"} {
		for _, verb := range []string{"get", "list", "watch", "update", "patch"} {
			if !grants(role, res, verb) {
				t.Errorf("the ClusterRole does not grant %q on %s: its in-use finalizer cannot be written", verb, res)
			}
		}
		if !grants(role, res+"/finalizers", "update") {
			t.Errorf("the ClusterRole does not grant update on %s/finalizers", res)
		}
	}
	for _, verb := range []string{"update", "patch"} {
		if grants(role, "runnerpools", verb) {
			t.Errorf("the ClusterRole grants %q on runnerpools; the operator writes only their status", verb)
		}
	}
}

// managerRole reads the ClusterRole generated from the markers in
// internal/controller/doc.go (make manifests).
func managerRole(t *testing.T) rbacv1.ClusterRole {
	t.Helper()
	raw, err := os.ReadFile("../../config/rbac/role.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var role rbacv1.ClusterRole
	if err := yaml.Unmarshal(raw, &role); err != nil {
		t.Fatal(err)
	}
	if role.Name != "hyperfleet-manager" || len(role.Rules) == 0 {
		t.Fatalf("config/rbac/role.yaml is not the manager's ClusterRole: %s with %d rules", role.Name, len(role.Rules))
	}
	return role
}

// grants reports whether a rule of role grants verb on the hyperfleet.io
// resource res.
func grants(role rbacv1.ClusterRole, res, verb string) bool {
	for _, rule := range role.Rules {
		if slices.Contains(rule.APIGroups, "hyperfleet.io") && slices.Contains(rule.Resources, res) && slices.Contains(rule.Verbs, verb) {
			return true
		}
	}
	return false
}

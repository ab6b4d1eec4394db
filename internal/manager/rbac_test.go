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

package workloads

import (
	"cmp"
	"fmt"
	"slices"
	"strings"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/pkg/workload"
)

// ReusableCredential says whether tmpl's VMs (through the template's own
// scope or the pools using it) receive an organization registration
// token, and explains the answer naming the fields to change.
func ReusableCredential(ws *workload.Backends, tmpl *hfv1.HypervisorMachineTemplate, pools []hfv1.RunnerPool) (bool, string) {
	b := tmpl.Spec.Bootstrap
	if b.Method != hfv1.BootstrapRunnerToken {
		return false, "Each VM receives a single-use credential for its own runner only (spec.bootstrap.method " + string(cmp.Or(b.Method, hfv1.BootstrapJITConfig)) + ")"
	}
	var where []string
	if _, t, ok := ws.Template(tmpl); ok && organizationScope(t.Scope) {
		where = append(where, fmt.Sprintf("%s (%s)", t.ScopeField, t.Scope.Owner))
	}
	for i := range pools {
		p := &pools[i]
		if p.Spec.TemplateRef.Name != tmpl.Name {
			continue
		}
		if _, ps, ok := ws.Pool(p, tmpl); ok && ps.OwnScope && organizationScope(ps.Scope) {
			where = append(where, fmt.Sprintf("RunnerPool %s %s (%s)", p.Name, ps.ScopeField, ps.Scope.Owner))
		}
	}
	if len(where) == 0 {
		return false, "spec.bootstrap.method is runner-token with repository scope: a VM's registration token registers runners of that repository only, for an hour"
	}
	slices.Sort(where)
	return true, fmt.Sprintf("spec.bootstrap.method is runner-token with organization scope (%s): each VM receives a registration token that, for an hour, "+
		"registers any number of runners anywhere in the organization; set spec.bootstrap.method: jit-config, which gives each VM one pre-registered, single-job runner",
		strings.Join(where, ", "))
}

// organizationScope reports whether s is a whole organization (and not no
// scope at all).
func organizationScope(s workload.Scope) bool { return !s.IsZero() && s.IsOrganization() }

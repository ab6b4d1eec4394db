package workloads

import (
	"fmt"
	"slices"
	"strings"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/pkg/workload"
)

// ReusableCredential says whether the credential tmpl's VMs receive can
// serve more than one job on the CI platform's side, as the back-end of
// the template's platform says (workload.Template.CredentialReuse: what the
// credential allows, what limits it, the single-job method where there is
// one), and explains the answer. A reusable credential reaches every
// repository of its scope, so the message names the organization-wide
// scopes it has: the template's own, and those of the RunnerPools using
// the template that name their own.
func ReusableCredential(ws *workload.Backends, tmpl *hfv1.HypervisorMachineTemplate, pools []hfv1.RunnerPool) (bool, string) {
	be, t, ok := ws.Template(tmpl)
	switch {
	case !ok:
		return false, "The template configures no CI platform this operator runs: its VMs receive no runner credential"
	case !workload.HasRunner(be):
		return false, fmt.Sprintf("VMs of %s run no CI platform's runner and receive no runner credential", t.Field)
	case t.CredentialReuse == "":
		return false, fmt.Sprintf("Each VM receives a credential that %s serves one job only", be.Name())
	}
	var where []string
	if organizationScope(t.Scope) {
		where = append(where, fmt.Sprintf("%s (%s)", t.ScopeField, t.Scope))
	}
	for i := range pools {
		p := &pools[i]
		if p.Spec.TemplateRef.Name != tmpl.Name {
			continue
		}
		if _, ps, ok := ws.Pool(p, tmpl); ok && ps.OwnScope && organizationScope(ps.Scope) {
			where = append(where, fmt.Sprintf("RunnerPool %s %s (%s)", p.Name, ps.ScopeField, ps.Scope))
		}
	}
	msg := be.Name() + ": " + t.CredentialReuse
	if len(where) > 0 {
		slices.Sort(where)
		msg += fmt.Sprintf(". It reaches every repository of a whole organization or group: %s", strings.Join(where, ", "))
	}
	return true, msg
}

// organizationScope reports whether s is a whole organization, group or
// instance (and not no scope at all).
func organizationScope(s workload.Scope) bool { return !s.IsZero() && s.IsOrganization() }

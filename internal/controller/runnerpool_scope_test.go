package controller_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	githubsim "github.com/hyperfleet/hyperfleet/internal/testworld/simulator/github"
)

// tenantPAT belongs to a user who manages only tenant-org's runners.
const tenantPAT = "ghp_tenantTokenThatOnlyReachesTenantOrg00"

// TestRunnerPoolTenantIsolation: a tenant whose credentials reach only its
// own organization creates a pool that claims another tenant's
// organization, with the same labels and a namespace that sorts first
// (which used to win routing ties) and minReplicas 1. It gets no job, no
// VM, no runner credential and no event about the other tenant's jobs; its
// ScopeVerified condition says which field is wrong and why. The pool of
// the organization's own credentials serves the job.
func TestRunnerPoolTenantIsolation(t *testing.T) {
	w := startPoolWorld(t, poolWorldOptions{github: func(c *githubsim.Config) {
		c.Organizations = append(c.Organizations, githubsim.OrgConfig{Login: "tenant-org"})
		c.Repositories = append(c.Repositories, githubsim.RepoConfig{Name: "tenant-org/site"})
		c.PATs = append(c.PATs, githubsim.PATConfig{Token: tenantPAT, Login: "tenant", Owners: []string{"tenant-org"}})
	}})
	ctx := context.Background()
	victim := w.newPool("shared", nil)

	// The tenant: its namespace sorts before the victim's ("t<n>-...").
	ns := "a-" + w.f.namespace
	w.f.create(&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns, Labels: map[string]string{"hyperfleet.io/tenant": "yes"}}})
	w.f.create(&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "github"}, StringData: map[string]string{"token": tenantPAT}})
	tmpl := &hfv1.HypervisorMachineTemplate{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: w.f.template.Name}, Spec: *w.f.template.Spec.DeepCopy()}
	tmpl.Spec.Bootstrap.GitHub.Owner, tmpl.Spec.Bootstrap.GitHub.Organization = "tenant-org", "tenant-org"
	w.f.create(tmpl)
	capture := &hfv1.RunnerPool{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "shared"},
		Spec: hfv1.RunnerPoolSpec{
			TemplateRef: hfv1.ObjectName{Name: tmpl.Name},
			Workload: hfv1.Workload{Type: hfv1.WorkloadGitHubActions, GitHub: &hfv1.GitHubWorkload{
				Organization: "octo-org", Labels: []string{"shared"}}},
			Scaling: hfv1.Scaling{MinReplicas: 1, MaxReplicas: 2, ScaleDownDelay: &metav1.Duration{}},
		},
	}
	w.f.create(capture)
	t.Cleanup(func() {
		_ = env.Client.DeleteAllOf(ctx, &hfv1.RunnerPool{}, client.InNamespace(ns))
		_ = env.Client.DeleteAllOf(ctx, &hfv1.MachineClaim{}, client.InNamespace(ns))
	})

	w.waitPool(capture, "the capturing pool refused, with its template ready", 60*time.Second, func(p *hfv1.RunnerPool) error {
		sv := hfv1.FindCondition(p.Status.Conditions, hfv1.RunnerPoolScopeVerifiedCondition)
		capacity := hfv1.FindCondition(p.Status.Conditions, hfv1.RunnerPoolCapacityCondition)
		if !hfv1.IsConditionTrue(p.Status.Conditions, hfv1.ReadyCondition) {
			return fmt.Errorf("template not ready yet")
		}
		if sv == nil || sv.Status != metav1.ConditionFalse || sv.Reason != string(hfv1.ScopeNotReachableReason) ||
			!strings.Contains(sv.Message, "spec.workload.github.organization (octo-org)") || !strings.Contains(sv.Message, tmpl.Name) {
			return fmt.Errorf("ScopeVerified %+v", sv)
		}
		if capacity == nil || capacity.Reason != string(hfv1.ScopeNotVerifiedReason) || p.Status.ScopeVerification != nil {
			return fmt.Errorf("CapacityAvailable %+v, scopeVerification %+v", capacity, p.Status.ScopeVerification)
		}
		return nil
	})
	w.waitPool(victim, "the organization's own pool verified", 30*time.Second, func(p *hfv1.RunnerPool) error {
		if !hfv1.IsConditionTrue(p.Status.Conditions, hfv1.RunnerPoolScopeVerifiedCondition) || p.Status.ScopeVerification == nil ||
			p.Status.ScopeVerification.Scope != "octo-org" {
			return fmt.Errorf("not verified")
		}
		return nil
	})

	ids := w.enqueue("shared", 1, time.Second)
	jobs := w.waitJobs(ids, 2*time.Minute)
	if r := jobs[0].RunnerName; !strings.HasPrefix(r, "shared-") {
		t.Errorf("job ran on %q", r)
	}
	var cj hfv1.CIJob
	if err := env.Client.Get(ctx, client.ObjectKey{Namespace: victim.Namespace, Name: hfv1.CIJobName(hfv1.WorkloadGitHubActions, strconv.FormatInt(ids[0], 10))}, &cj); err != nil {
		t.Errorf("the victim's pool has no record of its job: %v", err)
	}

	// Nothing reached the tenant: no demand record, no claim (so no VM and
	// no credential), no runner issued with its token, no event naming
	// the other tenant's job.
	var cijobs hfv1.CIJobList
	var claims hfv1.MachineClaimList
	if err := env.Client.List(ctx, &cijobs, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	if err := env.Client.List(ctx, &claims, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	if len(cijobs.Items) != 0 || len(claims.Items) != 0 {
		t.Errorf("the capturing pool got %d CIJobs and %d MachineClaims", len(cijobs.Items), len(claims.Items))
	}
	for _, r := range w.gs.Sim.Runners() {
		if strings.HasPrefix(r.Scope, "tenant-org") || !strings.HasPrefix(r.Name, "shared-") {
			t.Errorf("runner %s in %s", r.Name, r.Scope)
		}
	}
	got := poolEventReasons(t, capture)
	if got["NoMatchingRunnerPool"] != 0 || got[string(hfv1.AmbiguousJobRoutingReason)] != 0 || got[string(hfv1.ScopeNotReachableReason)] == 0 {
		t.Errorf("capturing pool events %v: want a ScopeNotReachable warning and nothing about the other tenant's jobs", got)
	}
}

package controller_test

import (
	"fmt"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	githubsim "github.com/hyperfleet/hyperfleet/internal/testworld/simulator/github"
)

// TestEnterprisePoolServesItsGroupsOrganizations: a template of
// enterprise runners (enterprise octo-ent, runner group hyperfleet, which
// serves octo-org only) and a pool for octo-org run a job of
// octo-org/app on a fresh VM whose runner registered at the enterprise; a
// pool for outside-org, an organization of the enterprise the group does
// not serve, is not verified, and outside-org's job is not served.
func TestEnterprisePoolServesItsGroupsOrganizations(t *testing.T) {
	w := startPoolWorld(t, poolWorldOptions{sharedSecret: true, github: func(c *githubsim.Config) {
		c.Organizations = append(c.Organizations, githubsim.OrgConfig{Login: "outside-org"})
		c.Repositories = append(c.Repositories, githubsim.RepoConfig{Name: "outside-org/app"})
		c.Enterprises = []githubsim.EnterpriseConfig{{Slug: "octo-ent", Organizations: []string{"octo-org", "outside-org"},
			RunnerGroups: []githubsim.EnterpriseRunnerGroupConfig{{ID: 3, Name: "hyperfleet", Visibility: "selected", SelectedOrganizations: []string{"octo-org"}}}}}
		c.PATs[0].Scopes = []string{"repo", "manage_runners:enterprise"}
	}})
	w.f.useGitHub(w.gs, func(b *hfv1.Bootstrap) {
		b.GitHub.Owner, b.GitHub.Repository, b.GitHub.Organization = "", "", ""
		b.GitHub.Enterprise, b.GitHub.RunnerGroup = "octo-ent", "hyperfleet"
	})
	pool := w.newPool("ent", func(p *hfv1.RunnerPool) { p.Spec.Workload.GitHub.Organization = "octo-org" })

	outsidePool := &hfv1.RunnerPool{
		ObjectMeta: metav1.ObjectMeta{Namespace: w.f.namespace, Name: "ent-outside"},
		Spec: hfv1.RunnerPoolSpec{
			TemplateRef: hfv1.ObjectName{Name: w.f.template.Name},
			Workload:    hfv1.Workload{Type: hfv1.WorkloadGitHubActions, GitHub: &hfv1.GitHubWorkload{Organization: "outside-org", Labels: []string{"ent-outside"}}},
			Scaling:     hfv1.Scaling{MinReplicas: 0, MaxReplicas: 1, ScaleDownDelay: &metav1.Duration{}},
		},
	}
	w.f.create(outsidePool)
	w.waitPool(outsidePool, "outside-org's pool refused", 30*time.Second, func(p *hfv1.RunnerPool) error {
		c := hfv1.FindCondition(p.Status.Conditions, hfv1.RunnerPoolScopeVerifiedCondition)
		if c == nil || c.Status != metav1.ConditionFalse {
			return fmt.Errorf("ScopeVerified %+v", c)
		}
		return nil
	})

	outside, err := w.gs.Sim.EnqueueJob(githubsim.JobRequest{Repository: "outside-org/app", Labels: []string{"self-hosted", "ent-outside"}, Duration: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	ids := w.enqueue("ent", 1, time.Second)
	jobs := w.waitJobs(ids, 3*time.Minute)
	if j := jobs[0]; j.Conclusion != "success" {
		t.Errorf("octo-org's job concluded %q on %s, want success", j.Conclusion, j.RunnerName)
	}
	// The job ran in the enterprise's group, on a runner registered at
	// the enterprise (removed since: it was ephemeral).
	if jobs[0].RunnerGroupName != "hyperfleet" {
		t.Errorf("octo-org's job ran in runner group %q, want hyperfleet", jobs[0].RunnerGroupName)
	}
	found := false
	for _, r := range w.gs.Sim.AllRunners() {
		if r.Name == jobs[0].RunnerName {
			found = true
			if r.Scope != "enterprises/octo-ent" {
				t.Errorf("runner %s registered at %s, want enterprises/octo-ent", r.Name, r.Scope)
			}
		}
	}
	if !found {
		t.Errorf("no runner %q in the simulator", jobs[0].RunnerName)
	}
	if j, _ := w.gs.Sim.Job(outside.ID); j.Status != "queued" || j.RunnerName != "" {
		t.Errorf("outside-org's job = %+v; want it queued", j)
	}
	if n := len(w.claims(outsidePool)); n != 0 {
		t.Errorf("outside-org's pool made %d claims", n)
	}
	w.assertDrained(pool, 2*time.Minute)
}

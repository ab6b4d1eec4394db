package demand

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"pgregory.net/rapid"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/testworld/proptest"
	gitlabsim "github.com/hyperfleet/hyperfleet/internal/testworld/simulator/gitlab"
	"github.com/hyperfleet/hyperfleet/internal/testworld/simulator/gitlab/gitlabsimtest"
	"github.com/hyperfleet/hyperfleet/pkg/workload"
	"github.com/hyperfleet/hyperfleet/test/testenv"
)

// glCand is a verified GitLab pool candidate whose runners carry exactly
// tags (GitLab adds no default labels).
func glCand(name string, scope workload.Scope, untagged bool, tags ...string) Candidate {
	return Candidate{Pool: nn("ci", name), Platform: hfv1.WorkloadGitLabCI, Scope: scope, RunnerLabels: tags, Verified: true, RunUntagged: untagged}
}

// TestChooseUntagged: a job that asks for no labels goes only to a pool
// whose runners take untagged jobs; the others are told why (Untagged).
// A job whose labels are unknown goes nowhere.
func TestChooseUntagged(t *testing.T) {
	group := workload.Scope{Owner: "acme"}
	tagged, untagged := glCand("tagged", group, false, "linux"), glCand("untagged", group, true, "linux", "big")
	job := workload.Job{ID: "1", Platform: hfv1.WorkloadGitLabCI, Repository: "acme/app"}
	d := Choose([]Candidate{tagged, untagged}, job)
	if d.Pool == nil || d.Pool.Pool.Name != "untagged" || len(d.Unmatched) != 1 || !d.Unmatched[0].Untagged || len(d.Unmatched[0].Missing) != 0 {
		t.Fatalf("untagged job: %+v", d)
	}
	if d := Choose([]Candidate{tagged}, job); d.Pool != nil || !d.InScope() {
		t.Fatalf("untagged job with only a tagged-only pool: %+v", d)
	}
	job.Labels = []string{"linux"}
	if d := Choose([]Candidate{tagged, untagged}, job); d.Pool == nil || d.Pool.Pool.Name != "tagged" {
		t.Fatalf("tagged job: %+v (want the pool with fewer tags)", d)
	}
	job.Labels, job.LabelsUnknown = nil, true
	if d := Choose([]Candidate{tagged, untagged}, job); d.Pool != nil || d.InScope() || !d.Job.LabelsUnknown {
		t.Fatalf("job with unknown labels: %+v", d)
	}
}

// TestChooseEnterpriseRanksLast: of GitHub pools that cover a job equally
// well by labels, the repository's wins over the organization's, and the
// organization's own runners over its enterprise's; an enterprise pool of
// another organization does not take the job at all.
func TestChooseEnterpriseRanksLast(t *testing.T) {
	cand := func(name string, scope workload.Scope) Candidate {
		return Candidate{Pool: nn("ci", name), Platform: hfv1.WorkloadGitHubActions, Scope: scope, RunnerLabels: []string{"linux"}, Verified: true, RunUntagged: true}
	}
	repo := cand("repo", workload.Scope{Owner: "octo", Repository: "app"})
	org := cand("org", workload.Scope{Owner: "octo"})
	ent := cand("ent", workload.Scope{Enterprise: "acme", Owner: "octo"})
	other := cand("other", workload.Scope{Enterprise: "acme", Owner: "widgets"})
	job := workload.Job{ID: "1", Platform: hfv1.WorkloadGitHubActions, Repository: "octo/app", Labels: []string{"linux"}}
	for _, tc := range []struct {
		cands []Candidate
		want  string
	}{
		{[]Candidate{ent, org, repo, other}, "repo"},
		{[]Candidate{ent, org, other}, "org"},
		{[]Candidate{other, ent}, "ent"},
		{[]Candidate{other}, ""},
	} {
		d := Choose(tc.cands, job)
		got := ""
		if d.Pool != nil {
			got = d.Pool.Pool.Name
		}
		if got != tc.want || len(d.Ambiguous) != 0 {
			t.Errorf("pools %d: chose %q (ambiguous %d), want %q", len(tc.cands), got, len(d.Ambiguous), tc.want)
		}
	}
}

// TestChooseNestedScopesProperty checks on generated GitLab pools (rapid,
// 2,000 cases) over nested groups, projects and the instance that the
// chosen pool serves the job (scope, tags, untagged), that no other
// qualifying pool has fewer labels or, with as many, a more specific scope
// by an independent ranking (the project, then groups deepest first, then
// the instance), and that ties are reported as ambiguous, never chosen.
func TestChooseNestedScopesProperty(t *testing.T) {
	scopes := []workload.Scope{{Instance: true}, {Owner: "a"}, {Owner: "a/b"}, {Owner: "A/b/C"}, {Owner: "a/b/c", Repository: "p"},
		{Owner: "a/x"}, {Owner: "other"}, {Owner: "a/b", Repository: "q"}}
	repos := []string{"a/b/c/p", "a/b/q", "a/x/y", "a/b/c/d/e", "zz/top"}
	vocab := []string{"linux", "LINUX", "big", "gpu"}
	// rank is the independent oracle: lower is more specific.
	rank := func(s workload.Scope) int {
		switch {
		case s.Instance:
			return 1000
		case s.Repository != "":
			return 0
		}
		return 100 - len(strings.Split(s.Owner, "/"))
	}
	var id int64
	proptest.Check(t, 2000, func(rt *rapid.T) {
		rng := proptest.Draws{T: rt}
		pick := func(n int) []string {
			var out []string
			for range n {
				out = append(out, vocab[rng.IntN(len(vocab))])
			}
			return out
		}
		var cands []Candidate
		for p := range rng.IntN(7) {
			c := glCand(fmt.Sprintf("pool%d", p), scopes[rng.IntN(len(scopes))], rng.IntN(2) == 0, pick(rng.IntN(3))...)
			c.Verified = rng.IntN(5) != 0
			cands = append(cands, c)
		}
		id++
		job := workload.Job{ID: strconv.FormatInt(id, 10), Platform: hfv1.WorkloadGitLabCI, Repository: repos[rng.IntN(len(repos))], Labels: pick(rng.IntN(3))}
		d := Choose(cands, job)
		fail := func(format string, args ...any) {
			rt.Helper()
			rt.Fatalf("job %+v, pools %+v, decision %+v: %s", job, cands, d, fmt.Sprintf(format, args...))
		}
		serves := func(c Candidate) bool {
			return c.Verified && c.Scope.Contains(job.Repository) && workload.Covers(c.RunnerLabels, job.Labels) &&
				(len(job.Labels) > 0 || c.RunUntagged)
		}
		key := func(c Candidate) [2]int { return [2]int{len(c.RunnerLabels), rank(c.Scope)} }
		less := func(a, b [2]int) bool { return a[0] < b[0] || a[0] == b[0] && a[1] < b[1] }
		var best []Candidate
		for _, c := range cands {
			if !serves(c) {
				continue
			}
			switch {
			case len(best) == 0 || less(key(c), key(best[0])):
				best = []Candidate{c}
			case key(c) == key(best[0]):
				best = append(best, c)
			}
		}
		switch len(best) {
		case 0:
			if d.Pool != nil || len(d.Ambiguous) > 0 {
				fail("no pool serves the job, yet one was chosen or tied")
			}
		case 1:
			if d.Pool == nil || d.Pool.Pool != best[0].Pool {
				fail("want %s chosen", best[0].Pool)
			}
		default:
			if d.Pool != nil || len(d.Ambiguous) != len(best) {
				fail("want the %d tied pools %v ambiguous", len(best), best)
			}
		}
		for _, m := range d.Unmatched {
			if serves(m.Candidate) || m.Untagged != (len(job.Labels) == 0 && !m.RunUntagged) {
				fail("unmatched %s serves the job, or its Untagged is wrong", m.Pool)
			}
		}
	})
}

// simJobReaders reads jobs with one GitLab provider for every pool and
// counts the reads.
type simJobReaders struct {
	reader workload.JobReader
	reads  []types.NamespacedName
	err    error
}

func (s *simJobReaders) JobReaderFor(_ context.Context, pool types.NamespacedName) (workload.JobReader, error) {
	s.reads = append(s.reads, pool)
	if s.err != nil {
		return nil, s.err
	}
	return s.reader, nil
}

// TestRouteGitLabJobHooksReadsTags: the GitLab simulator's Job Hook
// deliveries, parsed by the GitLab back-end's parser, carry no job tags
// (LabelsUnknown); the Router reads each job with a verified pool's
// account and routes it by its real tags: a tagged job to the pool with
// its tags, an untagged one to the pool that runs untagged jobs, a job of a
// project no pool serves nowhere (and without a read). Unreadable: an
// error, so the receiver retries.
func TestRouteGitLabJobHooksReadsTags(t *testing.T) {
	const token = "glpat-router"
	sim, err := gitlabsim.New(gitlabsim.Config{
		Groups:   []gitlabsim.GroupConfig{{Path: "acme/platform"}},
		Projects: []gitlabsim.ProjectConfig{{Path: "acme/platform/app"}, {Path: "else/where"}},
		Users:    []gitlabsim.UserConfig{{Username: "owner", Members: map[string]int{"acme": gitlabsim.Owner, "else": gitlabsim.Owner}}},
		Tokens:   []gitlabsim.TokenConfig{{Token: token, User: "owner", Scopes: []string{"api"}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sim.Close()
	api := httptest.NewServer(sim)
	defer api.Close()
	hooks := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) }))
	defer hooks.Close()
	for _, g := range []string{"acme", "else"} {
		if _, err := sim.AddHook(gitlabsim.HookConfig{URL: hooks.URL, Token: "tok-" + g, Group: g}); err != nil {
			t.Fatal(err)
		}
	}
	pl, err := sim.CreatePipeline(gitlabsim.PipelineRequest{Project: "acme/platform/app", Jobs: []gitlabsim.JobConfig{
		{Name: "gpu", Script: []string{"true"}, Tags: []string{"linux", "gpu"}},
		{Name: "plain", Script: []string{"true"}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	other, err := sim.CreatePipeline(gitlabsim.PipelineRequest{Project: "else/where", Jobs: []gitlabsim.JobConfig{{Name: "x", Script: []string{"true"}, Tags: []string{"linux"}}}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := sim.FlushWebhooks(ctx); err != nil {
		t.Fatal(err)
	}

	scheme, err := testenv.NewScheme()
	if err != nil {
		t.Fatal(err)
	}
	backends, err := workload.NewBackends(gitlabsimtest.Workloads(), workload.Dependencies{})
	if err != nil {
		t.Fatal(err)
	}
	be, _ := backends.For(hfv1.WorkloadGitLabCI)
	tmpl := &hfv1.HypervisorMachineTemplate{ObjectMeta: metav1.ObjectMeta{Namespace: "ci", Name: "gl"}, Spec: hfv1.HypervisorMachineTemplateSpec{
		Bootstrap: hfv1.Bootstrap{GitLab: &hfv1.GitLabBootstrap{URL: api.URL, Group: "acme",
			Credentials: hfv1.GitLabCredentials{Token: hfv1.LocalSecretKeySelector{Name: "gl", Key: "token"}}}}}}
	tt, _ := be.Template(tmpl)
	pool := func(name string, w hfv1.GitLabWorkload) *hfv1.RunnerPool {
		p := &hfv1.RunnerPool{ObjectMeta: metav1.ObjectMeta{Namespace: "ci", Name: name}, Spec: hfv1.RunnerPoolSpec{
			TemplateRef: hfv1.ObjectName{Name: "gl"}, Workload: hfv1.Workload{Type: hfv1.WorkloadGitLabCI, GitLab: &w}}}
		wp, _ := be.Pool(p, tmpl)
		p.Status.Conditions = []metav1.Condition{{Type: string(hfv1.RunnerPoolScopeVerifiedCondition), Status: metav1.ConditionTrue,
			Reason: string(hfv1.ScopeVerifiedReason), LastTransitionTime: metav1.Now()}}
		p.Status.ScopeVerification = &hfv1.ScopeVerification{Scope: wp.Scope.String(), Template: "gl", Credentials: tt.CredentialsKey}
		return p
	}
	yes := true
	c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(tmpl,
		pool("gpu", hfv1.GitLabWorkload{Tags: []string{"linux", "gpu"}}),
		pool("linux", hfv1.GitLabWorkload{Tags: []string{"linux"}}),
		pool("untagged", hfv1.GitLabWorkload{Tags: []string{"linux", "big"}, Group: "acme/platform", RunUntagged: &yes}),
	).WithStatusSubresource(&hfv1.RunnerPool{}).Build()
	prov, err := be.Provider(context.Background(), tmpl, workload.Scope{Owner: "acme"}, func(context.Context, string, string, hfv1.LocalSecretKeySelector) ([]byte, error) {
		return []byte(token), nil
	})
	if err != nil {
		t.Fatal(err)
	}
	readers := &simJobReaders{reader: prov}
	router := NewRouter(c, backends).ReadJobsWith(readers)

	parser := be.(workload.WebhookReceiver).WebhookParser(nil, map[string][]byte{
		gitlabsimtest.OwnerKey("acme"): []byte("tok-acme"), gitlabsimtest.OwnerKey("else"): []byte("tok-else")})
	format := be.(workload.WebhookReceiver).WebhookFormat()
	want := map[string]string{ // job id → pool
		strconv.FormatInt(pl.Jobs[0], 10): "gpu", strconv.FormatInt(pl.Jobs[1], 10): "untagged", strconv.FormatInt(other.Jobs[0], 10): "",
	}
	routed := 0
	for _, dl := range sim.Deliveries() {
		h := http.Header{}
		h.Set(format.SignatureHeader, "tok-acme")
		if strings.Contains(string(dl.Payload), "else/where") {
			h.Set(format.SignatureHeader, "tok-else")
		}
		h.Set(format.EventHeader, format.Events[0])
		h.Set(format.DeliveryHeader, dl.EventUUID)
		ev, err := parser.Parse(h, dl.Payload)
		if errors.Is(err, workload.ErrIgnoredEvent) {
			continue
		}
		if err != nil {
			t.Fatalf("delivery %+v: %v", dl, err)
		}
		// The receiver stamps a delivery with the host whose secrets
		// verified it (internal/manager's hostParsers): the simulator's.
		ev.Job.Host = tt.Scope.Host
		if !ev.Job.LabelsUnknown || len(ev.Job.Labels) != 0 {
			t.Fatalf("a Job Hook's job has labels %v (unknown %v); GitLab sends the runner's tags, not the job's", ev.Job.Labels, ev.Job.LabelsUnknown)
		}
		reads := len(readers.reads)
		d, err := router.Route(ctx, ev.Job)
		if err != nil {
			t.Fatal(err)
		}
		wantPool, known := want[ev.Job.ID]
		if !known {
			t.Fatalf("a delivery about job %s", ev.Job.ID)
		}
		routed++
		switch {
		case wantPool == "":
			if d.Pool != nil || d.InScope() || len(readers.reads) != reads {
				t.Fatalf("job %s of else/where: %+v, %d reads; want no pool and no read", ev.Job.ID, d, len(readers.reads)-reads)
			}
		case d.Pool == nil || d.Pool.Pool.Name != wantPool || d.Job.LabelsUnknown:
			t.Fatalf("job %s routed to %+v; want pool %s", ev.Job.ID, d, wantPool)
		case wantPool == "gpu" && !slices.Equal(d.Job.Labels, []string{"linux", "gpu"}):
			t.Fatalf("job %s routed with labels %v", ev.Job.ID, d.Job.Labels)
		}
	}
	if routed < 3 {
		t.Fatalf("routed %d pending deliveries; want one per job", routed)
	}
	readers.err = errors.New("no account")
	if _, err := router.Route(ctx, workload.Job{ID: "1", Platform: hfv1.WorkloadGitLabCI, Host: tt.Scope.Host, Repository: "acme/platform/app", LabelsUnknown: true}); err == nil {
		t.Fatal("a job no pool could read was routed without an error")
	}
}

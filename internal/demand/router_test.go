package demand

import (
	"context"
	"fmt"
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
	"github.com/hyperfleet/hyperfleet/internal/testworld/simulator/github/githubsimtest"
	"github.com/hyperfleet/hyperfleet/pkg/workload"
	"github.com/hyperfleet/hyperfleet/test/testenv"
)

func nn(ns, name string) types.NamespacedName { return types.NamespacedName{Namespace: ns, Name: name} }

// ciPlatforms are the CI platform back-ends routing is tested with: GitHub
// Actions, registered by workload type as the operator binary registers it.
var ciPlatforms = func() *workload.Backends {
	b, err := workload.NewBackends(githubsimtest.Workloads(), workload.Dependencies{})
	if err != nil {
		panic(err)
	}
	return b
}()

// credentialsKey is the key of tmpl's GitHub credentials.
func credentialsKey(tmpl *hfv1.HypervisorMachineTemplate) string {
	be, _ := ciPlatforms.For(hfv1.WorkloadGitHubActions)
	t, _ := be.Template(tmpl)
	return t.CredentialsKey
}

func TestMissingLabels(t *testing.T) {
	tests := []struct {
		runner, job, want []string
	}{
		{[]string{"self-hosted", "Linux", "X64", "hyperfleet"}, []string{"self-hosted", "linux"}, nil},
		{[]string{"self-hosted", "Linux"}, []string{"SELF-HOSTED", "gpu", "GPU", "big"}, []string{"gpu", "big"}},
		{nil, []string{"a"}, []string{"a"}},
		{[]string{"a"}, nil, nil},
	}
	for _, tc := range tests {
		if got := MissingLabels(tc.runner, tc.job); !slices.Equal(got, tc.want) {
			t.Errorf("MissingLabels(%v, %v) = %v, want %v", tc.runner, tc.job, got, tc.want)
		}
	}
}

func cand(ns, name string, scope workload.Scope, labels ...string) Candidate {
	return Candidate{Pool: nn(ns, name), Scope: scope, RunnerLabels: workload.RunnerLabels([]string{"Linux", "X64"}, labels), Verified: true}
}

// unverified is cand for a pool whose scope was not verified.
func unverified(c Candidate) Candidate {
	c.Verified = false
	return c
}

func TestChoose(t *testing.T) {
	org := workload.Scope{Owner: "octo"}
	app := workload.Scope{Owner: "octo", Repository: "app"}
	other := workload.Scope{Owner: "elsewhere"}
	job := func(labels ...string) workload.Job {
		return workload.Job{ID: "1", Repository: "Octo/App", Labels: labels}
	}
	tests := []struct {
		name      string
		cands     []Candidate
		job       workload.Job
		want      *types.NamespacedName
		unmatched map[string][]string // pool name -> missing
		ambiguous []string            // pool names
	}{
		{
			name:  "fewest labels wins",
			cands: []Candidate{cand("a", "gpu", org, "gpu"), cand("a", "plain", org), cand("a", "gpu-big", org, "gpu", "big")},
			job:   job("self-hosted", "linux"),
			want:  ptrTo(nn("a", "plain")),
		},
		{
			name:      "only the covering pool",
			cands:     []Candidate{cand("a", "gpu", org, "gpu"), cand("a", "plain", org), cand("a", "gpu-big", org, "gpu", "big")},
			job:       job("self-hosted", "gpu", "big"),
			want:      ptrTo(nn("a", "gpu-big")),
			unmatched: map[string][]string{"gpu": {"big"}, "plain": {"gpu", "big"}},
		},
		{
			name:  "a repository pool beats an organization pool with as many labels",
			cands: []Candidate{cand("b", "x", org, "gpu"), cand("c", "z", app, "gpu"), cand("a", "y", org, "gpu")},
			job:   job("gpu"),
			want:  ptrTo(nn("c", "z")),
		},
		{
			name:      "equally specific pools: none is chosen, whatever their names",
			cands:     []Candidate{cand("b", "x", org, "gpu"), cand("a", "y", org, "gpu"), cand("c", "w", org, "gpu", "big")},
			job:       job("gpu"),
			want:      nil,
			ambiguous: []string{"y", "x"},
		},
		{
			name:  "a pool listening to a scale set that covers the job wins over a pool with fewer labels",
			cands: []Candidate{cand("a", "plain", org), withFeed(cand("z", "scaleset", org, "scaleset"))},
			job:   job("self-hosted"),
			want:  ptrTo(nn("z", "scaleset")),
		},
		{
			name:      "a scale-set pool that does not cover the job does not win",
			cands:     []Candidate{cand("a", "plain", org), withFeed(cand("z", "scaleset", org, "scaleset"))},
			job:       job("gpu"),
			want:      nil,
			unmatched: map[string][]string{"plain": {"gpu"}, "scaleset": {"gpu"}},
		},
		{
			name:  "an unverified pool never wins, even with fewer labels and a smaller namespace",
			cands: []Candidate{unverified(cand("aaa", "capture", org)), cand("zzz", "victim", org, "gpu")},
			job:   job("self-hosted"),
			want:  ptrTo(nn("zzz", "victim")),
		},
		{
			name:  "an unverified pool is neither chosen nor told about the job",
			cands: []Candidate{unverified(cand("aaa", "capture", org)), unverified(cand("aaa", "capture-gpu", org, "gpu"))},
			job:   job("gpu"),
			want:  nil,
		},
		{
			name:  "out of scope pools are not candidates",
			cands: []Candidate{cand("a", "other", other), cand("a", "web", workload.Scope{Owner: "octo", Repository: "web"})},
			job:   job("self-hosted"),
			want:  nil,
		},
		{
			name:      "in scope but no pool covers",
			cands:     []Candidate{cand("a", "plain", org), cand("a", "other", other, "windows")},
			job:       job("self-hosted", "windows"),
			want:      nil,
			unmatched: map[string][]string{"plain": {"windows"}},
		},
		{
			name:  "GitHub-hosted labels",
			cands: []Candidate{cand("a", "plain", app)},
			job:   job("ubuntu-latest"),
			want:  nil, unmatched: map[string][]string{"plain": {"ubuntu-latest"}},
		},
		{
			name:  "no candidates",
			job:   job("self-hosted"),
			cands: nil,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d := Choose(tc.cands, tc.job)
			switch {
			case tc.want == nil && d.Pool != nil:
				t.Fatalf("chose %s, want none", d.Pool.Pool)
			case tc.want != nil && (d.Pool == nil || d.Pool.Pool != *tc.want):
				t.Fatalf("chose %+v, want %s", d.Pool, *tc.want)
			}
			got := map[string][]string{}
			for _, m := range d.Unmatched {
				got[m.Pool.Name] = m.Missing
			}
			if len(got) != len(tc.unmatched) {
				t.Fatalf("unmatched = %v, want %v", got, tc.unmatched)
			}
			for name, missing := range tc.unmatched {
				if !slices.Equal(got[name], missing) {
					t.Fatalf("pool %s lacks %v, want %v", name, got[name], missing)
				}
			}
			var ambiguous []string
			for _, c := range d.Ambiguous {
				ambiguous = append(ambiguous, c.Pool.Name)
			}
			if !slices.Equal(ambiguous, tc.ambiguous) {
				t.Fatalf("ambiguous = %v, want %v", ambiguous, tc.ambiguous)
			}
			if d.InScope() != (d.Pool != nil || len(tc.unmatched) > 0 || len(tc.ambiguous) > 0) {
				t.Fatalf("InScope = %v", d.InScope())
			}
		})
	}
}

func ptrTo[T any](v T) *T { return &v }

// Feature: hyperfleet-operator, Property 13: Webhook-Based Autoscaling
//
// TestChooseProperty checks on generated pools and jobs (rapid, 2,000 cases) that the chosen pool
// is verified, in scope and covers the job, that no other verified covering
// pool in scope is as specific (else the job is ambiguous and every tied
// pool is listed), that unverified pools are never considered, that a job
// no pool covers gets no pool, and that every verified in-scope pool is
// chosen, ambiguous or reported with the labels it lacks.
func TestChooseProperty(t *testing.T) {
	vocab := []string{"self-hosted", "Linux", "linux", "X64", "ARM64", "gpu", "GPU", "big", "small", "db", "hyperfleet", "windows"}
	scopes := []workload.Scope{{Owner: "octo"}, {Owner: "octo", Repository: "app"}, {Owner: "octo", Repository: "web"}, {Owner: "other"}}
	repos := []string{"octo/app", "OCTO/web", "other/x", "nobody/y"}
	const cases = 2000
	var id int64
	proptest.Check(t, cases, func(rt *rapid.T) {
		rng := proptest.Draws{T: rt}
		pick := func(n int) []string {
			var out []string
			for range n {
				out = append(out, vocab[rng.IntN(len(vocab))])
			}
			return out
		}
		var cands []Candidate
		for p := range rng.IntN(6) {
			c := cand(fmt.Sprintf("ns%d", rng.IntN(3)), fmt.Sprintf("pool%d", p), scopes[rng.IntN(len(scopes))], pick(rng.IntN(4))...)
			c.Verified = rng.IntN(4) != 0
			cands = append(cands, c)
		}
		id++
		job := workload.Job{ID: strconv.FormatInt(id, 10), Repository: repos[rng.IntN(len(repos))], Labels: pick(1 + rng.IntN(3))}
		d := Choose(cands, job)
		fail := func(format string, args ...any) {
			rt.Helper()
			rt.Fatalf("job %+v, pools %+v: %s", job, cands, fmt.Sprintf(format, args...))
		}
		inScope := 0
		for _, c := range cands {
			if !c.Scope.Contains(job.Repository) {
				continue
			}
			if !c.Verified {
				if (d.Pool != nil && d.Pool.Pool == c.Pool && !d.Pool.Verified) ||
					slices.ContainsFunc(d.Unmatched, func(m Mismatch) bool { return m.Pool == c.Pool && !m.Verified }) ||
					slices.ContainsFunc(d.Ambiguous, func(a Candidate) bool { return a.Pool == c.Pool && !a.Verified }) {
					fail("unverified pool %s was considered", c.Pool)
				}
				continue
			}
			inScope++
			covers := workload.Covers(c.RunnerLabels, job.Labels)
			if covers && d.Pool == nil && len(d.Ambiguous) < 2 {
				fail("pool %s covers the job but none was chosen and there is no ambiguity", c.Pool)
			}
			if covers && d.Pool != nil && compareSpecificity(&c, d.Pool) <= 0 && c.Pool != d.Pool.Pool {
				fail("pool %s covers and is at least as specific as chosen %s", c.Pool, d.Pool.Pool)
			}
			if covers && len(d.Ambiguous) > 0 {
				if cmpA := compareSpecificity(&c, &d.Ambiguous[0]); cmpA < 0 ||
					(cmpA == 0 && !slices.ContainsFunc(d.Ambiguous, func(a Candidate) bool { return a.Pool == c.Pool })) {
					fail("pool %s is more specific than, or tied with but missing from, the ambiguous %v", c.Pool, d.Ambiguous)
				}
			}
			if !covers && !slices.ContainsFunc(d.Unmatched, func(m Mismatch) bool { return m.Pool == c.Pool }) {
				fail("pool %s in scope does not cover the job and is not reported", c.Pool)
			}
		}
		if d.Pool != nil {
			if !d.Pool.Scope.Contains(job.Repository) || !workload.Covers(d.Pool.RunnerLabels, job.Labels) {
				fail("chosen pool %s does not serve the job", d.Pool.Pool)
			}
		}
		for _, m := range d.Unmatched {
			if len(m.Missing) == 0 || workload.Covers(m.RunnerLabels, job.Labels) {
				fail("unmatched pool %s covers the job", m.Pool)
			}
			for _, l := range m.Missing {
				if workload.Covers(m.RunnerLabels, []string{l}) {
					fail("pool %s reported lacking %q, which it has", m.Pool, l)
				}
			}
		}
		chosen := 0
		if d.Pool != nil {
			chosen = 1
		}
		// Pools with duplicate names (random) may be counted twice; only
		// check when names are unique.
		if d.Pool != nil && len(d.Ambiguous) > 0 {
			fail("both a chosen pool and ambiguous pools")
		}
		if len(d.Ambiguous) == 1 {
			fail("an ambiguity of one pool")
		}
		for _, a := range d.Ambiguous {
			if compareSpecificity(&a, &d.Ambiguous[0]) != 0 || !workload.Covers(a.RunnerLabels, job.Labels) {
				fail("ambiguous pool %s does not tie or does not cover", a.Pool)
			}
		}
		if uniqueNames(cands) && chosen+len(d.Unmatched)+len(d.Ambiguous) > inScope {
			fail("%d chosen + %d unmatched + %d ambiguous > %d in scope", chosen, len(d.Unmatched), len(d.Ambiguous), inScope)
		}
	})
}

func uniqueNames(cs []Candidate) bool {
	seen := map[types.NamespacedName]bool{}
	for _, c := range cs {
		if seen[c.Pool] {
			return false
		}
		seen[c.Pool] = true
	}
	return true
}

// TestRouterCandidates reads pools and templates through a client: pools
// of other workloads, pools being deleted and pools whose template is
// missing are left out; the template's runner OS and architecture shape
// the labels; a pool is verified only while its status vouches for the
// scope it names now.
func TestRouterCandidates(t *testing.T) {
	scheme, err := testenv.NewScheme()
	if err != nil {
		t.Fatal(err)
	}
	tmpl := func(ns, name string, b hfv1.GitHubBootstrap) *hfv1.HypervisorMachineTemplate {
		return &hfv1.HypervisorMachineTemplate{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
			Spec:       hfv1.HypervisorMachineTemplateSpec{Bootstrap: hfv1.Bootstrap{GitHub: &b}},
		}
	}
	pool := func(ns, name, template string, w hfv1.Workload) *hfv1.RunnerPool {
		return &hfv1.RunnerPool{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID("uid-" + name)},
			Spec:       hfv1.RunnerPoolSpec{TemplateRef: hfv1.ObjectName{Name: template}, Workload: w},
		}
	}
	gha := func(labels ...string) hfv1.Workload {
		return hfv1.Workload{Type: hfv1.WorkloadGitHubActions, GitHub: &hfv1.GitHubWorkload{Labels: labels}}
	}
	verify := func(p *hfv1.RunnerPool, scope, template string) *hfv1.RunnerPool {
		p.Status.Conditions = []metav1.Condition{{Type: string(hfv1.RunnerPoolScopeVerifiedCondition), Status: metav1.ConditionTrue,
			Reason: string(hfv1.ScopeVerifiedReason), ObservedGeneration: p.Generation, LastTransitionTime: metav1.Now()}}
		// Every template here has the same (empty) credentials.
		p.Status.ScopeVerification = &hfv1.ScopeVerification{Scope: scope, Template: template, Credentials: credentialsKey(&hfv1.HypervisorMachineTemplate{Spec: hfv1.HypervisorMachineTemplateSpec{Bootstrap: hfv1.Bootstrap{GitHub: &hfv1.GitHubBootstrap{}}}})}
		return p
	}
	// Verified for octo/app, then edited to claim another organization.
	edited := verify(pool("a", "edited", "plain-a", hfv1.Workload{Type: hfv1.WorkloadGitHubActions,
		GitHub: &hfv1.GitHubWorkload{Organization: "elsewhere", Labels: []string{"db"}}}), "octo/app", "plain-a")
	deleting := pool("a", "deleting", "arm", gha("x"))
	deleting.DeletionTimestamp = &metav1.Time{Time: time.Now()}
	deleting.Finalizers = []string{"test"}
	c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(
		tmpl("a", "arm", hfv1.GitHubBootstrap{Owner: "octo", Organization: "octo", Runner: &hfv1.RunnerSoftware{OS: "linux", Arch: "arm64"}}),
		tmpl("b", "plain", hfv1.GitHubBootstrap{Owner: "octo", Repository: "app"}),
		tmpl("a", "plain-a", hfv1.GitHubBootstrap{Owner: "octo", Repository: "app"}),
		verify(pool("a", "arm", "arm", gha("big")), "octo", "arm"),
		pool("a", "generic", "arm", hfv1.Workload{Type: hfv1.WorkloadGeneric}),
		pool("a", "orphan", "missing", gha("x")),
		pool("a", "unchecked", "plain-a", gha("db")),
		edited,
		deleting,
		verify(pool("b", "plain", "plain", gha("db")), "OCTO/app", "plain"),
	).WithStatusSubresource(&hfv1.RunnerPool{}).Build()
	r := NewRouter(c, ciPlatforms)
	cands, err := r.Candidates(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, c := range cands {
		got = append(got, fmt.Sprintf("%s %s [%s] %s verified=%v", c.Pool, c.Scope, strings.Join(c.RunnerLabels, ","), c.UID, c.Verified))
	}
	want := []string{
		"a/arm octo [self-hosted,Linux,ARM64,hyperfleet,big] uid-arm verified=true",
		"a/edited elsewhere [self-hosted,Linux,X64,hyperfleet,db] uid-edited verified=false",
		"a/unchecked octo/app [self-hosted,Linux,X64,hyperfleet,db] uid-unchecked verified=false",
		"b/plain octo/app [self-hosted,Linux,X64,hyperfleet,db] uid-plain verified=true",
	}
	if !slices.Equal(got, want) {
		t.Fatalf("candidates:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	job := workload.Job{ID: "7", Platform: hfv1.WorkloadGitHubActions, Repository: "octo/app", Labels: []string{"self-hosted", "db"}}
	d, err := r.Route(context.Background(), job)
	if err != nil {
		t.Fatal(err)
	}
	if d.Pool == nil || d.Pool.Pool != nn("b", "plain") || len(d.Unmatched) != 1 || d.Unmatched[0].Pool != nn("a", "arm") {
		t.Fatalf("Route = %+v", d)
	}
	// Another platform's job of a repository of the same name, with the
	// same labels, is not for GitHub's pools.
	job.Platform = hfv1.WorkloadGitLabCI
	if d, err := r.Route(context.Background(), job); err != nil || d.Pool != nil || len(d.Unmatched) != 0 {
		t.Fatalf("a GitLab job was routed among GitHub pools: %+v, %v", d, err)
	}
}

// TestScopeVerifiedFollowsCredentials: a verification stands across
// template edits that keep its GitHub credentials, and not across a change
// of credentials, scope or pool generation.
func TestScopeVerifiedFollowsCredentials(t *testing.T) {
	tmpl := &hfv1.HypervisorMachineTemplate{ObjectMeta: metav1.ObjectMeta{Name: "t", Generation: 3}, Spec: hfv1.HypervisorMachineTemplateSpec{
		Bootstrap: hfv1.Bootstrap{GitHub: &hfv1.GitHubBootstrap{Owner: "octo", Organization: "octo",
			Credentials: hfv1.GitHubCredentials{PAT: &hfv1.LocalSecretKeySelector{Name: "github", Key: "token"}}}}}}
	pool := &hfv1.RunnerPool{ObjectMeta: metav1.ObjectMeta{Name: "p", Generation: 2}}
	pool.Status.Conditions = []metav1.Condition{{Type: string(hfv1.RunnerPoolScopeVerifiedCondition), Status: metav1.ConditionTrue, ObservedGeneration: 2}}
	pool.Status.ScopeVerification = &hfv1.ScopeVerification{Scope: "octo", Template: "t", Credentials: credentialsKey(tmpl)}
	octo := workload.Scope{Owner: "octo"}
	verified := func(p *hfv1.RunnerPool, tm *hfv1.HypervisorMachineTemplate, scope workload.Scope) bool {
		return ScopeVerified(p, tm.Name, credentialsKey(tm), scope)
	}
	if !verified(pool, tmpl, octo) {
		t.Fatal("not verified as recorded")
	}
	edited := tmpl.DeepCopy()
	edited.Generation++
	edited.Spec.Bootstrap.GitHub.RunnerGroup = "big"
	if !verified(pool, edited, octo) {
		t.Error("an edit that keeps the credentials dropped the verification")
	}
	for name, mut := range map[string]func(*hfv1.HypervisorMachineTemplate, *hfv1.RunnerPool) workload.Scope{
		"other Secret": func(t *hfv1.HypervisorMachineTemplate, _ *hfv1.RunnerPool) workload.Scope {
			t.Spec.Bootstrap.GitHub.Credentials.PAT.Name = "stolen"
			return octo
		},
		"other API": func(t *hfv1.HypervisorMachineTemplate, _ *hfv1.RunnerPool) workload.Scope {
			t.Spec.Bootstrap.GitHub.APIBaseURL = "https://ghes.example/api/v3"
			return octo
		},
		"other template": func(t *hfv1.HypervisorMachineTemplate, _ *hfv1.RunnerPool) workload.Scope { t.Name = "t2"; return octo },
		"other scope": func(*hfv1.HypervisorMachineTemplate, *hfv1.RunnerPool) workload.Scope {
			return workload.Scope{Owner: "victim"}
		},
		"pool edited": func(_ *hfv1.HypervisorMachineTemplate, p *hfv1.RunnerPool) workload.Scope {
			p.Generation++
			return octo
		},
		"condition False": func(_ *hfv1.HypervisorMachineTemplate, p *hfv1.RunnerPool) workload.Scope {
			p.Status.Conditions[0].Status = metav1.ConditionFalse
			return octo
		},
	} {
		tm, p := tmpl.DeepCopy(), pool.DeepCopy()
		scope := mut(tm, p)
		if verified(p, tm, scope) {
			t.Errorf("%s: still verified", name)
		}
	}
}

// TestChoosePending: an unverified pool whose check has not concluded and
// that covers the job makes the job worth routing again; a refused one,
// or one that does not cover the job, does not; neither is ever chosen.
func TestChoosePending(t *testing.T) {
	org := workload.Scope{Owner: "octo"}
	pending := unverified(cand("a", "new", org, "gpu"))
	pending.Pending = true
	refused := unverified(cand("a", "capture", org, "gpu"))
	other := unverified(cand("a", "cpu", org, "cpu"))
	other.Pending = true
	d := Choose([]Candidate{pending, refused, other}, workload.Job{ID: "1", Repository: "octo/app", Labels: []string{"gpu"}})
	if d.Pool != nil || d.Pending != 1 || d.Unverified != 3 || len(d.Unmatched) != 0 {
		t.Fatalf("Choose = %+v", d)
	}
	d = Choose([]Candidate{refused}, workload.Job{ID: "1", Repository: "octo/app", Labels: []string{"gpu"}})
	if d.Pending != 0 {
		t.Fatalf("a refused pool counted as pending: %+v", d)
	}
}

func TestVerificationPending(t *testing.T) {
	cond := func(status metav1.ConditionStatus, reason string, gen int64) []metav1.Condition {
		return []metav1.Condition{{Type: string(hfv1.RunnerPoolScopeVerifiedCondition), Status: status, Reason: reason, ObservedGeneration: gen}}
	}
	tests := []struct {
		name  string
		conds []metav1.Condition
		want  bool
	}{
		{"never checked", nil, true},
		{"checked for an older generation", cond(metav1.ConditionFalse, string(hfv1.ScopeNotReachableReason), 1), true},
		{"refused for this generation", cond(metav1.ConditionFalse, string(hfv1.ScopeNotReachableReason), 2), false},
		{"template missing", cond(metav1.ConditionFalse, string(hfv1.TemplateNotReadyReason), 2), false},
		{"check failed transiently", cond(metav1.ConditionFalse, string(hfv1.ScopeCheckFailedReason), 2), true},
		{"verified for other credentials", cond(metav1.ConditionTrue, string(hfv1.ScopeVerifiedReason), 2), true},
	}
	for _, tc := range tests {
		p := &hfv1.RunnerPool{ObjectMeta: metav1.ObjectMeta{Generation: 2}}
		p.Status.Conditions = tc.conds
		if got := verificationPending(p); got != tc.want {
			t.Errorf("%s: pending %v, want %v", tc.name, got, tc.want)
		}
	}
}

// withFeed makes c a pool listening to a job feed.
func withFeed(c Candidate) Candidate {
	c.Feed = true
	return c
}

package metrics

import (
	"fmt"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	dto "github.com/prometheus/client_model/go"
	"pgregory.net/rapid"
	crmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/hyperfleet/hyperfleet/internal/testworld/proptest"
)

// TestLabelLimiterBounded (a property test): job metric labels stay bounded.
// Whatever repositories and workflows a CI platform sends, a pool's label
// values stay within the limiter's bound (2*limit+1 repository and workflow
// pairs, limit+1 repositories), are valid UTF-8 of bounded length, and a
// value once given out is given out again for the same input: a series
// never changes name mid-life.
func TestLabelLimiterBounded(t *testing.T) {
	proptest.Check(t, 300, func(t *rapid.T) {
		limit := rapid.IntRange(1, 8).Draw(t, "limit")
		l := NewLabelLimiter(limit)
		value := rapid.OneOf(
			rapid.SampledFrom([]string{"octo/app", "octo/lib", "group/sub/project", "", "__other__", "CI", "build"}),
			rapid.StringN(0, 200, -1),
			rapid.Map(rapid.SliceOfN(rapid.Byte(), 0, 40), func(b []byte) string { return string(b) }), // invalid UTF-8 too
		)
		type out struct{ repository, workflow string }
		pairs := map[string]map[out]bool{}
		repositories := map[string]map[string]bool{}
		// Keys are arrays, not joined strings: a repository "\x00" and a
		// workflow "" joined with "\x00" collided with a repository "" and a
		// workflow "\x00" (CI's seed 17811998465356171147), two jobs the
		// limiter rightly tells apart.
		given := map[[3]string]out{}
		givenRepository := map[[2]string]string{}
		n := rapid.IntRange(1, 120).Draw(t, "events")
		for i := range n {
			pool := rapid.SampledFrom([]string{"a", "b", "c"}).Draw(t, fmt.Sprintf("pool%d", i))
			repository, workflow := value.Draw(t, fmt.Sprintf("repository%d", i)), value.Draw(t, fmt.Sprintf("workflow%d", i))
			var r, w string
			if rapid.Bool().Draw(t, fmt.Sprintf("chargeback%d", i)) {
				r, w = l.Repository("ns", pool, repository), ""
				key := [2]string{pool, repository}
				if prev, ok := givenRepository[key]; ok && prev != r {
					t.Fatalf("repository %q of pool %s was %q, now %q", repository, pool, prev, r)
				}
				givenRepository[key] = r
			} else {
				r, w = l.Job("ns", pool, repository, workflow)
				key := [3]string{pool, repository, workflow}
				if prev, ok := given[key]; ok && prev != (out{r, w}) {
					t.Fatalf("job %q %q of pool %s was %v, now %v", repository, workflow, pool, prev, out{r, w})
				}
				given[key] = out{r, w}
				if pairs[pool] == nil {
					pairs[pool] = map[out]bool{}
				}
				pairs[pool][out{r, w}] = true
			}
			for _, v := range []string{r, w} {
				if !utf8.ValidString(v) || utf8.RuneCountInString(v) > maxLabelValueLength {
					t.Fatalf("label value %q: invalid UTF-8 or longer than %d characters", v, maxLabelValueLength)
				}
			}
			if repositories[pool] == nil {
				repositories[pool] = map[string]bool{}
			}
			repositories[pool][r] = true
			if got := len(pairs[pool]); got > 2*limit+1 {
				t.Fatalf("pool %s has %d repository and workflow pairs, bound %d", pool, got, 2*limit+1)
			}
			if got := len(repositories[pool]); got > limit+1 {
				t.Fatalf("pool %s has %d repositories, bound %d", pool, got, limit+1)
			}
		}
	})
}

// TestLabelLimiterKeepsTheFirst: the first repositories and pairs of a pool
// keep their names, later pairs of a named repository lose only the
// workflow, later repositories both; another pool has its own budget, and
// a forgotten pool starts afresh.
func TestLabelLimiterKeepsTheFirst(t *testing.T) {
	l := NewLabelLimiter(2)
	check := func(pool, repository, workflow, wantRepository, wantWorkflow string) {
		t.Helper()
		if r, w := l.Job("ns", pool, repository, workflow); r != wantRepository || w != wantWorkflow {
			t.Errorf("Job(%s, %s, %s) = %s, %s; want %s, %s", pool, repository, workflow, r, w, wantRepository, wantWorkflow)
		}
	}
	check("p", "octo/app", "CI", "octo/app", "CI")
	check("p", "octo/app", "Release", "octo/app", "Release")
	check("p", "octo/app", "Nightly", "octo/app", OtherLabel)
	check("p", "octo/lib", "CI", "octo/lib", OtherLabel)
	check("p", "octo/web", "CI", OtherLabel, OtherLabel)
	check("p", "octo/app", "CI", "octo/app", "CI")
	check("q", "octo/web", "CI", "octo/web", "CI")
	if got := l.Repository("ns", "p", "octo/lib"); got != "octo/lib" {
		t.Errorf("Repository(octo/lib) = %s, want it kept", got)
	}
	if got := l.Repository("ns", "p", "octo/web"); got != OtherLabel {
		t.Errorf("Repository(octo/web) = %s, want %s", got, OtherLabel)
	}
	l.Forget("ns", "p")
	check("p", "octo/web", "CI", "octo/web", "CI")
	long := strings.Repeat("é", 300)
	if r := l.Repository("ns", "r", long); utf8.RuneCountInString(r) != maxLabelValueLength {
		t.Errorf("a %d-character repository is %d characters as a label", 300, utf8.RuneCountInString(r))
	}
}

// TestJobMetricsSeries: observations through the package's functions end
// up in series bounded by the limit, idle VMs under IdleLabel, and a
// deleted pool's series go.
func TestJobMetricsSeries(t *testing.T) {
	saved := JobLabels
	t.Cleanup(func() { JobLabels = saved })
	if err := SetJobLabelLimit(0); err == nil {
		t.Fatal("a limit of 0 was accepted")
	}
	if err := SetJobLabelLimit(3); err != nil {
		t.Fatal(err)
	}
	const ns = "job-metrics-test"
	for i := range 20 {
		j := Job{Namespace: ns, Pool: "gpu", Platform: "github-actions", Repository: fmt.Sprintf("octo/repo%d", i%7), Workflow: fmt.Sprintf("wf%d", i)}
		ObserveJobQueue(j, time.Duration(i)*time.Second)
		ObserveJobRun(j, time.Minute)
		AddVMSeconds(ns, "gpu", j.Repository, 90*time.Second)
	}
	ObserveJobRun(Job{Namespace: ns, Pool: "gpu", Repository: "octo/repo0"}, -time.Second)
	AddVMSeconds(ns, "gpu", "", 30*time.Second)
	AddVMSeconds(ns, "gpu", UnknownLabel, 10*time.Second)

	queue, run, vm := series(t, "hyperfleet_job_queue_seconds", ns), series(t, "hyperfleet_job_run_seconds", ns), series(t, "hyperfleet_vm_seconds_total", ns)
	if len(queue) > 2*3+1 || len(run) != len(queue) {
		t.Errorf("%d queue and %d run series, want at most %d each and as many", len(queue), len(run), 2*3+1)
	}
	var observed uint64
	for _, m := range run {
		observed += m.GetHistogram().GetSampleCount()
	}
	if observed != 20 {
		t.Errorf("%d run times observed, want 20 (a negative one is not)", observed)
	}
	byRepository := map[string]float64{}
	for _, m := range vm {
		byRepository[label(m, "repository")] += m.GetCounter().GetValue()
	}
	want := map[string]float64{"octo/repo0": 3 * 90, "octo/repo1": 3 * 90, "octo/repo2": 3 * 90, OtherLabel: 11 * 90, IdleLabel: 30, UnknownLabel: 10}
	if fmt.Sprint(byRepository) != fmt.Sprint(want) {
		t.Errorf("VM-seconds by repository %v, want %v", byRepository, want)
	}
	ForgetPool(ns, "gpu")
	if n := len(series(t, "hyperfleet_job_queue_seconds", ns)) + len(series(t, "hyperfleet_vm_seconds_total", ns)); n != 0 {
		t.Errorf("%d series of a deleted pool remain", n)
	}
}

// series gathers the metric's series of namespace ns.
func series(t *testing.T, name, ns string) []*dto.Metric {
	t.Helper()
	families, err := crmetrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var out []*dto.Metric
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			if label(m, "namespace") == ns {
				out = append(out, m)
			}
		}
	}
	return out
}

func label(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hyperfleet/hyperfleet/internal/testworld/devenv"
	githubsim "github.com/hyperfleet/hyperfleet/internal/testworld/simulator/github"
	proxmoxsim "github.com/hyperfleet/hyperfleet/internal/testworld/simulator/proxmox"
	"github.com/hyperfleet/hyperfleet/test/monitoring"
)

// monitoringJobs is how many jobs the monitoring scenario runs: enough for
// every phase, outcome and call to be observed, few enough to stay short.
const monitoringJobs = 4

// TestMonitoringScrape: Debian's prometheus scrapes the operator every
// second while jobs run through the world, with HyperFleet's rules loaded.
// Every VM configuration call fails (a 500 the provider does not retry by
// itself) until a provisioning error is counted, and a second webhook with
// a stale secret sends deliveries the receiver refuses, and a second pool
// listens to a runner scale set (its listener's metrics feed an alert; it
// runs no job here: the scale-set scenario runs them). Afterwards
// every metric an expression of the dashboard or the rules selects has had
// series, every expression runs without error, every dashboard expression
// returns series, and every rule evaluates healthy. A panel or alert over
// a metric the operator does not export fails here.
func TestMonitoringScrape(t *testing.T) {
	exprs, err := monitoring.AllExpressions()
	if err != nil {
		t.Fatal(err)
	}
	w, watch := startWorld(t, func(o *devenv.Options) { o.MetricsAddr = "127.0.0.1:0" })
	prom := startPrometheus(t, w.MetricsURL)
	const scaleSetPool = "scaleset"
	if err := w.AddPool(context.Background(), devenv.PoolSpec{Name: scaleSetPool, Cluster: devenv.ClusterName, Label: scaleSetPool, MaxReplicas: 1, ScaleSet: "hf-monitoring"}); err != nil {
		t.Fatal(err)
	}
	// The counters are the process's: earlier scenarios counted too. What
	// the first scrape shows, before any job, is the baseline.
	before := map[string]float64{}
	eventually(t, 30*time.Second, "a first scrape of the operator", func() error {
		if res, err := prom.Query(`up{job="hyperfleet"} == 1`); err != nil || len(res) == 0 {
			return errors.Join(errors.New("the operator's target is not up yet"), err)
		}
		for _, q := range append(slices.Concat(slices.Collect(maps.Keys(runCounts)), faultCounts), chargebackSums...) {
			v, err := prom.Value(q)
			if err != nil {
				return err
			}
			before[q] = v
		}
		return nil
	})

	eventually(t, 2*time.Minute, "Prometheus has scraped the scale-set pool listening", func() error {
		v, err := prom.Value(fmt.Sprintf(`max(hyperfleet_feed_listening{pool=%q}) or vector(0)`, scaleSetPool))
		if err != nil || v != 1 {
			return errors.Join(fmt.Errorf("hyperfleet_feed_listening{pool=%q} is %v", scaleSetPool, v), err)
		}
		return nil
	})

	hooks := w.GitHub.Webhooks()
	if len(hooks) != 1 {
		t.Fatalf("%d webhooks on the GitHub simulator, want the operator's", len(hooks))
	}
	if _, err := w.GitHub.AddWebhook(githubsim.Webhook{URL: hooks[0].URL, Secret: "a-stale-secret"}); err != nil {
		t.Fatal(err)
	}
	if err := w.Proxmox.SetFaults(proxmoxsim.Faults{Classes: map[string]proxmoxsim.FaultSpec{
		"config": {ErrorRate: 1, Errors: []string{"unexpected failure"}},
	}}); err != nil {
		t.Fatal(err)
	}
	if _, err := w.EnqueueJobs(monitoringJobs, jobDuration); err != nil {
		t.Fatal(err)
	}
	eventually(t, 2*time.Minute, "Prometheus has scraped a provisioning error and a refused delivery", func() error {
		var errs []error
		for _, q := range faultCounts {
			if v, err := prom.Value(q); err != nil || v <= before[q] {
				errs = append(errs, errors.Join(fmt.Errorf("%s is %v, was %v", q, v, before[q]), err))
			}
		}
		return errors.Join(errs...)
	})
	if err := w.Proxmox.SetFaults(proxmoxsim.Faults{}); err != nil {
		t.Fatal(err)
	}
	waitDone(t, w, 10*time.Minute)
	watch.stop()

	if res, err := prom.Query(`up{job="hyperfleet"} == 1`); err != nil || len(res) != 1 {
		t.Fatalf("the operator's scrape target is not up: %v %v", res, err)
	}
	// The last scrapes take in the end state; the sweeper's counters come
	// with its first sweep (every 10 s in the world).
	var missing map[string][]string
	deadline := time.Now().Add(time.Minute)
	for {
		missing = neverScraped(t, prom, exprs)
		if len(missing) == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(2 * time.Second)
	}
	// The scrape saw the run: every job started once, and every runner VM
	// got a credential and ended (a VM that failed is replaced, so there
	// may be more VMs than jobs).
	eventually(t, 30*time.Second, "the last scrape counts every job", func() error {
		var errs []error
		for q, exact := range runCounts {
			v, err := prom.Value(q)
			if d := v - before[q]; err != nil || d < monitoringJobs || exact && d != monitoringJobs {
				errs = append(errs, errors.Join(fmt.Errorf("%s grew by %v, want %d or more (exactly: %v)", q, d, monitoringJobs, exact), err))
			}
		}
		return errors.Join(errs...)
	})
	checkChargeback(t, prom, before)
	for _, name := range slices.Sorted(maps.Keys(missing)) {
		t.Errorf("metric %s was never scraped from the operator; used by:\n  %s", name, strings.Join(missing[name], "\n  "))
	}
	for _, e := range exprs {
		res, err := prom.Query(e.Query)
		switch {
		case err != nil:
			t.Errorf("%s: %v", e.Where, err)
		case len(res) == 0 && strings.HasPrefix(e.Where, "dashboard"):
			t.Errorf("%s: %s returns no series after the run", e.Where, e.Query)
		}
	}
	checkRulesHealthy(t, prom)
	scrapes, err := prom.Value(`count_over_time(up{job="hyperfleet"}[1h])`)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d expressions checked against %.0f scrapes", len(exprs), scrapes)
}

// faultCounts are counters the scenario's faults raise: provisioning
// errors and refused deliveries.
var faultCounts = []string{
	`sum(hyperfleet_machineclaim_errors_total) or vector(0)`,
	`sum(hyperfleet_webhook_deliveries_total{result="bad_signature"}) or vector(0)`,
}

// runCounts are counters a run of monitoringJobs jobs raises by that much
// (true: exactly) or more (false).
var runCounts = map[string]bool{
	`sum(hyperfleet_job_queue_seconds_count) or vector(0)`:                             true,
	`sum(hyperfleet_job_run_seconds_count) or vector(0)`:                               true,
	`sum(hyperfleet_runner_outcomes_total) or vector(0)`:                               false,
	`sum(hyperfleet_runner_credentials_issued_total) or vector(0)`:                     false,
	`sum(hyperfleet_machineclaim_transitions_total{phase="Terminating"}) or vector(0)`: false,
}

// chargebackSums are the VMs' lives and the jobs' run times, all pools
// and repositories together.
var chargebackSums = []string{
	`sum(hyperfleet_vm_seconds_total) or vector(0)`,
	`sum(hyperfleet_job_run_seconds_sum) or vector(0)`,
}

// checkChargeback: the VM-seconds the run added cover the run times of its
// jobs (each job ran inside its VM's life), every VM-second is charged to
// the jobs' repository or to __idle__ (VMs that failed to provision ran no
// job), and the jobs' run times are plausible: about the simulator's job
// duration each at least, and less than the whole scenario.
func checkChargeback(t *testing.T, prom *monitoring.Prometheus, before map[string]float64) {
	t.Helper()
	vm, err := prom.Value(chargebackSums[0])
	if err != nil {
		t.Fatal(err)
	}
	run, err := prom.Value(chargebackSums[1])
	if err != nil {
		t.Fatal(err)
	}
	vm, run = vm-before[chargebackSums[0]], run-before[chargebackSums[1]]
	// The platform's times may have whole seconds only: a job lasting
	// jobDuration may show a second less.
	if least := (jobDuration - time.Second).Seconds(); run < monitoringJobs*least || run > monitoringJobs*(10*time.Minute).Seconds() {
		t.Errorf("the %d jobs ran %.1fs in all, want at least %.0fs each and less than the scenario", monitoringJobs, run, least)
	}
	if vm < run {
		t.Errorf("VMs lived %.1fs in all, less than their jobs ran (%.1fs)", vm, run)
	}
	res, err := prom.Query(`sum by (repository) (hyperfleet_vm_seconds_total)`)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range res {
		var s struct {
			Metric map[string]string `json:"metric"`
		}
		if err := json.Unmarshal(r, &s); err != nil {
			t.Fatal(err)
		}
		if repo := s.Metric["repository"]; repo != "__idle__" && !strings.Contains(repo, "/") {
			t.Errorf("VM-seconds charged to %q, neither a repository nor __idle__", repo)
		}
	}
	t.Logf("chargeback: VMs lived %.1fs for %.1fs of job run time", vm, run)
}

// neverScraped returns, by metric name, the expressions selecting a metric
// Prometheus has no series of.
func neverScraped(t *testing.T, prom *monitoring.Prometheus, exprs []monitoring.Expression) map[string][]string {
	t.Helper()
	missing := map[string][]string{}
	seen := map[string]bool{}
	for _, e := range exprs {
		parsed, err := e.Parse()
		if err != nil {
			t.Fatal(err)
		}
		names, err := monitoring.MetricNames(parsed)
		if err != nil {
			t.Fatalf("%s: %v", e.Where, err)
		}
		for _, name := range names {
			if !seen[name] {
				res, err := prom.Query(fmt.Sprintf(`count(last_over_time({__name__=%q}[1h]))`, name))
				if err != nil {
					t.Fatal(err)
				}
				seen[name] = len(res) > 0
			}
			if !seen[name] {
				missing[name] = append(missing[name], e.Where)
			}
		}
	}
	return missing
}

// checkRulesHealthy: Prometheus loaded every rule of the rule file and its
// latest evaluation raised no error (a vector matching error only shows
// at evaluation).
func checkRulesHealthy(t *testing.T, prom *monitoring.Prometheus) {
	t.Helper()
	var rules struct {
		Groups []struct {
			Name  string `json:"name"`
			Rules []struct {
				Name      string `json:"name"`
				Health    string `json:"health"`
				LastError string `json:"lastError"`
			} `json:"rules"`
		} `json:"groups"`
	}
	if err := prom.Get("/api/v1/rules", nil, &rules); err != nil {
		t.Fatal(err)
	}
	file, err := monitoring.LoadRules()
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]bool{}
	for _, g := range file.Groups {
		for _, r := range g.Rules {
			want[r.Name()] = true
		}
	}
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			delete(want, r.Name)
			if r.Health != "ok" {
				t.Errorf("rule %s (group %s): health %q, last error %q", r.Name, g.Name, r.Health, r.LastError)
			}
		}
	}
	for name := range want {
		t.Errorf("Prometheus did not load rule %s", name)
	}
}

// startPrometheus runs prometheus (monitoring.StartPrometheus) scraping
// target (a /metrics URL) every second, with HyperFleet's rules.
func startPrometheus(t *testing.T, target string) *monitoring.Prometheus {
	t.Helper()
	u, err := url.Parse(target)
	if err != nil || u.Host == "" {
		t.Fatalf("metrics URL %q: %v", target, err)
	}
	return monitoring.StartPrometheus(t, fmt.Sprintf(`global:
  scrape_interval: 1s
  scrape_timeout: 1s
  evaluation_interval: 1s
rule_files:
  - %q
scrape_configs:
  - job_name: hyperfleet
    metrics_path: %q
    static_configs:
      - targets: [%q]
`, monitoring.Path(monitoring.RulesPath), u.Path, u.Host))
}

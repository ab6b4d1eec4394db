package monitoring

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/prometheus/promql/parser"
	"sigs.k8s.io/yaml"
)

// TestPromtoolCheckRules: Prometheus' own checker accepts the rule file.
func TestPromtoolCheckRules(t *testing.T) {
	promtool := Program(t, "promtool")
	out, err := exec.Command(promtool, "check", "rules", Path(RulesPath)).CombinedOutput()
	if err != nil {
		t.Fatalf("promtool check rules %s: %v\n%s", RulesPath, err, out)
	}
	t.Logf("%s", out)
}

// ruleTestFiles returns the promtool unit test files.
func ruleTestFiles(t *testing.T) []string {
	t.Helper()
	files, err := filepath.Glob(Path(RuleTestsGlob))
	if err != nil || len(files) == 0 {
		t.Fatalf("no rule unit tests match %s (%v)", RuleTestsGlob, err)
	}
	return files
}

// TestPromtoolTestRules runs the alerts' unit tests.
func TestPromtoolTestRules(t *testing.T) {
	promtool := Program(t, "promtool")
	out, err := exec.Command(promtool, append([]string{"test", "rules"}, ruleTestFiles(t)...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("promtool test rules: %v\n%s", err, out)
	}
	t.Logf("%s", out)
}

// ruleTests is the part of a promtool unit test file read here.
type ruleTests struct {
	RuleFiles []string `json:"rule_files"`
	Tests     []struct {
		Name          string `json:"name"`
		AlertRuleTest []struct {
			EvalTime  string           `json:"eval_time"`
			AlertName string           `json:"alertname"`
			ExpAlerts []map[string]any `json:"exp_alerts"`
		} `json:"alert_rule_test"`
	} `json:"tests"`
}

// TestEveryAlertIsUnitTested: every alert has a unit test where it fires
// and one where it stays quiet, every unit test names an alert that
// exists (promtool passes a test that expects no alert of a misspelt
// name), and the test files load the rule file.
func TestEveryAlertIsUnitTested(t *testing.T) {
	rules, err := LoadRules()
	if err != nil {
		t.Fatal(err)
	}
	fires, quiet := map[string]int{}, map[string]int{}
	exists := map[string]bool{}
	for _, a := range rules.Alerts() {
		exists[a.Alert] = true
	}
	for _, file := range ruleTestFiles(t) {
		data, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		var rt ruleTests
		if err := yaml.Unmarshal(data, &rt); err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		rel, _ := filepath.Rel(filepath.Dir(file), Path(RulesPath))
		if !slices.Contains(rt.RuleFiles, rel) {
			t.Errorf("%s: rule_files %v, want %s", filepath.Base(file), rt.RuleFiles, rel)
		}
		for _, tc := range rt.Tests {
			for _, at := range tc.AlertRuleTest {
				if !exists[at.AlertName] {
					t.Errorf("%s: a test at %s names alert %q, which %s does not define", filepath.Base(file), at.EvalTime, at.AlertName, RulesPath)
				}
				if len(at.ExpAlerts) > 0 {
					fires[at.AlertName]++
				} else {
					quiet[at.AlertName]++
				}
			}
		}
	}
	for _, a := range rules.Alerts() {
		if fires[a.Alert] == 0 {
			t.Errorf("alert %s has no unit test where it fires (an alert_rule_test with exp_alerts in %s)", a.Alert, RuleTestsGlob)
		}
		if quiet[a.Alert] == 0 {
			t.Errorf("alert %s has no unit test where it stays quiet (an alert_rule_test with exp_alerts: [] in %s)", a.Alert, RuleTestsGlob)
		}
	}
}

// headingAnchors returns the GitHub anchors of a Markdown file's headings.
func headingAnchors(t *testing.T, path string) map[string]bool {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	anchors := map[string]bool{}
	drop := regexp.MustCompile(`[^\p{L}\p{N} _-]`)
	inFence := false
	s := bufio.NewScanner(f)
	for s.Scan() {
		line := s.Text()
		if strings.HasPrefix(line, "```") {
			inFence = !inFence
		}
		if inFence || !strings.HasPrefix(line, "#") {
			continue
		}
		title := strings.TrimSpace(strings.TrimLeft(line, "#"))
		anchor := strings.ReplaceAll(drop.ReplaceAllString(strings.ToLower(title), ""), " ", "-")
		anchors[anchor] = true
	}
	if err := s.Err(); err != nil {
		t.Fatal(err)
	}
	return anchors
}

// TestAlertConventions: every alert is named HyperFleet*, once; has a
// severity the chart's Alertmanager routes can match on, a summary and a
// description; and its runbook_url points at its own section of
// docs/troubleshooting.md.
func TestAlertConventions(t *testing.T) {
	rules, err := LoadRules()
	if err != nil {
		t.Fatal(err)
	}
	anchors := headingAnchors(t, Path(RunbookPath))
	seen := map[string]bool{}
	alerts := rules.Alerts()
	if len(alerts) == 0 {
		t.Fatalf("%s defines no alerts", RulesPath)
	}
	for _, a := range alerts {
		if seen[a.Alert] {
			t.Errorf("alert %s is defined twice", a.Alert)
		}
		seen[a.Alert] = true
		if !strings.HasPrefix(a.Alert, "HyperFleet") {
			t.Errorf("alert %s: names start with HyperFleet", a.Alert)
		}
		if s := a.Labels["severity"]; !slices.Contains([]string{"critical", "warning", "info"}, s) {
			t.Errorf("alert %s: severity %q, want critical, warning or info", a.Alert, s)
		}
		for _, k := range []string{"summary", "description"} {
			if strings.TrimSpace(a.Annotations[k]) == "" {
				t.Errorf("alert %s has no %s annotation", a.Alert, k)
			}
		}
		anchor := strings.ToLower(a.Alert)
		if want := RunbookBase + "#" + anchor; a.Annotations["runbook_url"] != want {
			t.Errorf("alert %s: runbook_url %q, want %q", a.Alert, a.Annotations["runbook_url"], want)
		}
		if !anchors[anchor] {
			t.Errorf("alert %s: %s has no section %q (a heading \"%s\")", a.Alert, RunbookPath, anchor, a.Alert)
		}
	}
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			if r.Record != "" {
				t.Errorf("group %s: recording rule %s: the dashboard and alerts query the operator's metrics directly, so that test/e2e can check them against a scrape", g.Name, r.Record)
			}
		}
	}
}

// TestExpressionsParse: every PromQL expression of the dashboard (panel
// targets, template variables) and of the rules parses after the Grafana
// variables are substituted, and selects at least one metric by name.
func TestExpressionsParse(t *testing.T) {
	exprs, err := AllExpressions()
	if err != nil {
		t.Fatal(err)
	}
	if len(exprs) < 50 {
		t.Fatalf("only %d expressions found in the dashboard and rules", len(exprs))
	}
	for _, e := range exprs {
		expr, err := e.Parse()
		if err != nil {
			t.Error(err)
			continue
		}
		names, err := MetricNames(expr)
		if err != nil {
			t.Errorf("%s: %v", e.Where, err)
		} else if len(names) == 0 {
			t.Errorf("%s: %q selects no metric", e.Where, e.Query)
		}
	}
}

// TestSubstitute: Grafana's variable syntaxes are all replaced, and an
// undefined variable is an error rather than a query that parses by luck.
func TestSubstitute(t *testing.T) {
	d, err := LoadDashboard()
	if err != nil {
		t.Fatal(err)
	}
	got, err := d.Substitute(`rate(x{job=~"$job", pool=~"${pool}", hypervisor_cluster=~"${hypervisor_cluster:regex}", ns=~"[[namespace]]"}[$__rate_interval])`)
	if err != nil {
		t.Fatal(err)
	}
	if want := `rate(x{job=~".*", pool=~".*", hypervisor_cluster=~".*", ns=~".*"}[5m])`; got != want {
		t.Errorf("Substitute = %s, want %s", got, want)
	}
	if _, err := d.Substitute(`x{a=~"$undefined"}`); err == nil || !strings.Contains(err.Error(), "undefined") {
		t.Errorf("an undefined variable: err %v", err)
	}
}

// TestHistogramsUsedCorrectly: histogram_quantile is only applied to a sum
// by le (and other labels) of rate() or increase() of a _bucket series,
// and _bucket series appear nowhere else but in such a sum (a heatmap's).
func TestHistogramsUsedCorrectly(t *testing.T) {
	exprs, err := AllExpressions()
	if err != nil {
		t.Fatal(err)
	}
	quantiles := 0
	for _, e := range exprs {
		expr, err := e.Parse()
		if err != nil {
			t.Error(err)
			continue
		}
		parser.Inspect(expr, func(node parser.Node, path []parser.Node) error {
			switch n := node.(type) {
			case *parser.Call:
				if n.Func.Name == "histogram_quantile" {
					quantiles++
					if err := checkBucketSum(n.Args[1]); err != nil {
						t.Errorf("%s: histogram_quantile over %s: %v", e.Where, n.Args[1], err)
					}
				}
			case *parser.VectorSelector:
				if strings.HasSuffix(n.Name, "_bucket") && !insideBucketSum(path) {
					t.Errorf("%s: %s is used outside sum by (le) (rate|increase(...))", e.Where, n.Name)
				}
			}
			return nil
		})
	}
	if quantiles == 0 {
		t.Fatal("no histogram_quantile in the dashboard or the rules")
	}
}

// checkBucketSum checks that e is sum by (..., le, ...) (rate|increase(x_bucket[...])).
func checkBucketSum(e parser.Expr) error {
	for {
		p, ok := e.(*parser.ParenExpr)
		if !ok {
			break
		}
		e = p.Expr
	}
	agg, ok := e.(*parser.AggregateExpr)
	if !ok || agg.Op != parser.SUM || agg.Without || !slices.Contains(agg.Grouping, "le") {
		return fmt.Errorf("want sum by (le, ...)")
	}
	call, ok := agg.Expr.(*parser.Call)
	if !ok || (call.Func.Name != "rate" && call.Func.Name != "increase") {
		return fmt.Errorf("want a sum of rate() or increase()")
	}
	ms, ok := call.Args[0].(*parser.MatrixSelector)
	if !ok {
		return fmt.Errorf("want rate() of a range selector")
	}
	if name := ms.VectorSelector.(*parser.VectorSelector).Name; !strings.HasSuffix(name, "_bucket") {
		return fmt.Errorf("want a _bucket series, not %s", name)
	}
	return nil
}

// insideBucketSum reports whether a selector's ancestors (outermost
// first) put it in sum by (le) (rate|increase(...)).
func insideBucketSum(path []parser.Node) bool {
	for i := len(path) - 1; i >= 0; i-- {
		if agg, ok := path[i].(*parser.AggregateExpr); ok {
			return checkBucketSum(agg) == nil
		}
	}
	return false
}

// TestDashboardShape: the dashboard is provisionable as it is: a uid, the
// data source as a variable of type prometheus that every panel and target
// uses, unique panel ids, panels on the 24-column grid, and every
// panel with at least one query.
func TestDashboardShape(t *testing.T) {
	d, err := LoadDashboard()
	if err != nil {
		t.Fatal(err)
	}
	if d.UID == "" || d.Title == "" {
		t.Errorf("uid %q, title %q: both are required", d.UID, d.Title)
	}
	var ds *Variable
	for i, v := range d.Templating.List {
		if v.Name == "datasource" {
			ds = &d.Templating.List[i]
		}
	}
	if ds == nil {
		t.Fatal("no template variable datasource")
	}
	if q, _ := ds.QueryString(); ds.Type != "datasource" || q != "prometheus" {
		t.Fatalf("variable datasource: type %q, query %q; want type datasource, query prometheus", ds.Type, q)
	}
	for _, v := range d.Templating.List {
		if v.Type == "query" && (v.Datasource == nil || v.Datasource.UID != "${datasource}") {
			t.Errorf("variable %s: datasource %+v, want uid ${datasource}", v.Name, v.Datasource)
		}
	}
	ids := map[int]string{}
	for _, p := range d.AllPanels() {
		if other, dup := ids[p.ID]; dup || p.ID == 0 {
			t.Errorf("panel %q: id %d (also %q)", p.Title, p.ID, other)
		}
		ids[p.ID] = p.Title
		if g := p.GridPos; g.W <= 0 || g.H <= 0 || g.X < 0 || g.X+g.W > 24 {
			t.Errorf("panel %q: gridPos %+v is off the 24-column grid", p.Title, g)
		}
		if p.Type == "row" {
			continue
		}
		if p.Title == "" || len(p.Targets) == 0 {
			t.Errorf("panel %d: title %q, %d targets", p.ID, p.Title, len(p.Targets))
		}
		if p.Datasource == nil || p.Datasource.Type != "prometheus" || p.Datasource.UID != "${datasource}" {
			t.Errorf("panel %q: datasource %+v, want prometheus ${datasource}", p.Title, p.Datasource)
		}
		for _, tg := range p.Targets {
			if tg.Datasource == nil || tg.Datasource.UID != "${datasource}" {
				t.Errorf("panel %q target %s: datasource %+v, want ${datasource}", p.Title, tg.RefID, tg.Datasource)
			}
			if strings.TrimSpace(tg.Expr) == "" {
				t.Errorf("panel %q target %s has no expression", p.Title, tg.RefID)
			}
		}
	}
}

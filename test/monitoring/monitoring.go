// Package monitoring reads HyperFleet's observability assets, the Grafana
// dashboard (charts/hyperfleet/files/dashboards/hyperfleet.json) and the
// Prometheus rules (charts/hyperfleet/files/rules), and turns every PromQL
// expression in them into something a test can parse or send to a real
// Prometheus. Its tests check the assets on their own (promtool, the PromQL
// parser, conventions); test/e2e queries every expression against a
// Prometheus that scraped the operator through a run of jobs. The tests
// also keep the runbook, docs/troubleshooting.md, whole: a section per
// alert, and an entry per condition reason (reasons_test.go).
package monitoring

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql/parser"
	"sigs.k8s.io/yaml"

	"github.com/hyperfleet/hyperfleet/test/testenv"
)

// Paths of the assets, relative to the repository root.
const (
	DashboardPath = "charts/hyperfleet/files/dashboards/hyperfleet.json"
	RulesPath     = "charts/hyperfleet/files/rules/hyperfleet-rules.yaml"
	RuleTestsGlob = "charts/hyperfleet/files/rules/tests/*.yaml"
	RunbookPath   = "docs/troubleshooting.md"
)

// RunbookBase is what every alert's runbook_url starts with; the rest is
// "#" and the anchor of the alert's section in RunbookPath.
const RunbookBase = "https://github.com/hyperfleet/hyperfleet/blob/main/" + RunbookPath

// Path returns an asset's absolute path.
func Path(rel string) string { return filepath.Join(testenv.RepoRoot(), rel) }

// Program returns the path of one of the programs Debian's prometheus
// package installs (prometheus, promtool), failing the test, never
// skipping it, when it is missing.
func Program(t testing.TB, name string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		t.Fatalf("%s is not installed (%v): run `make test-deps` (hack/test-deps.sh installs Debian's prometheus package, which has prometheus and promtool)", name, err)
	}
	return p
}

// Expression is one PromQL expression of the assets and where it is.
type Expression struct {
	// Where names it for messages: the panel and target, the template
	// variable, or the alert.
	Where string
	// Raw is the expression as written (with Grafana variables).
	Raw string
	// Query is Raw with the variables substituted: valid PromQL.
	Query string
}

// Parse parses the expression's Query.
func (e Expression) Parse() (parser.Expr, error) {
	expr, err := parser.ParseExpr(e.Query)
	if err != nil {
		return nil, fmt.Errorf("%s: %q does not parse: %w", e.Where, e.Query, err)
	}
	return expr, nil
}

// Dashboard is the part of Grafana's dashboard JSON model the tests read.
type Dashboard struct {
	UID        string  `json:"uid"`
	Title      string  `json:"title"`
	Panels     []Panel `json:"panels"`
	Templating struct {
		List []Variable `json:"list"`
	} `json:"templating"`
}

// Panel is a dashboard panel; rows hold their collapsed panels in Panels.
type Panel struct {
	ID         int      `json:"id"`
	Type       string   `json:"type"`
	Title      string   `json:"title"`
	Datasource *DataRef `json:"datasource"`
	GridPos    GridPos  `json:"gridPos"`
	Targets    []Target `json:"targets"`
	Panels     []Panel  `json:"panels"`
	Collapsed  bool     `json:"collapsed"`
}

// GridPos is a panel's place on the dashboard's 24-column grid.
type GridPos struct {
	H, W, X, Y int
}

// Target is one query of a panel.
type Target struct {
	RefID      string   `json:"refId"`
	Expr       string   `json:"expr"`
	Datasource *DataRef `json:"datasource"`
}

// DataRef points a panel, target or variable at a data source.
type DataRef struct {
	Type string `json:"type"`
	UID  string `json:"uid"`
}

// Variable is a template variable. A query variable's query is a string
// or, in newer Grafana versions, an object with the string in "query".
type Variable struct {
	Name       string          `json:"name"`
	Type       string          `json:"type"`
	Query      json.RawMessage `json:"query"`
	Datasource *DataRef        `json:"datasource"`
	AllValue   string          `json:"allValue"`
	IncludeAll bool            `json:"includeAll"`
	Current    struct {
		Value json.RawMessage `json:"value"`
	} `json:"current"`
	Options []struct {
		Value string `json:"value"`
	} `json:"options"`
}

// QueryString returns a variable's query whichever form it has.
func (v Variable) QueryString() (string, error) {
	if len(v.Query) == 0 {
		return "", nil
	}
	var s string
	if err := json.Unmarshal(v.Query, &s); err == nil {
		return s, nil
	}
	var o struct {
		Query string `json:"query"`
	}
	if err := json.Unmarshal(v.Query, &o); err != nil {
		return "", fmt.Errorf("variable %s: query is neither a string nor an object with a query: %w", v.Name, err)
	}
	return o.Query, nil
}

// load decodes the asset at rel (a path relative to the repository root).
func load[T any](rel string, decode func([]byte, any) error) (*T, error) {
	data, err := os.ReadFile(Path(rel))
	if err != nil {
		return nil, err
	}
	var v T
	if err := decode(data, &v); err != nil {
		return nil, fmt.Errorf("%s: %w", rel, err)
	}
	return &v, nil
}

// LoadDashboard reads the dashboard.
func LoadDashboard() (*Dashboard, error) { return load[Dashboard](DashboardPath, json.Unmarshal) }

// AllPanels returns every panel, those inside rows included.
func (d *Dashboard) AllPanels() []Panel {
	var out []Panel
	var walk func([]Panel)
	walk = func(ps []Panel) {
		for _, p := range ps {
			out = append(out, p)
			walk(p.Panels)
		}
	}
	walk(d.Panels)
	return out
}

// Grafana's global variables and the values the tests give them. The
// range-like ones must cover a whole test scrape, so that a rate over them
// sees every sample.
var globalVariables = map[string]string{
	"__rate_interval": "5m",
	"__interval":      "1m",
	"__range":         "1h",
	"__range_s":       "3600",
	"__range_ms":      "3600000",
	"__interval_ms":   "60000",
}

// variableRef matches $name, ${name}, ${name:format} and [[name]].
var variableRef = regexp.MustCompile(`\$\{([A-Za-z0-9_]+)(?::[^}]*)?\}|\$([A-Za-z0-9_]+)|\[\[([A-Za-z0-9_]+)\]\]`)

// values returns the value each dashboard variable stands for in the
// tests: a multi-value variable's "All" (its allValue, a regular
// expression matching every value), else its current or first value.
func (d *Dashboard) values() map[string]string {
	out := map[string]string{}
	for k, v := range globalVariables {
		out[k] = v
	}
	for _, v := range d.Templating.List {
		switch {
		case v.Type == "datasource":
			out[v.Name] = "prometheus"
		case v.IncludeAll && v.AllValue != "":
			out[v.Name] = v.AllValue
		case len(v.Options) > 0:
			out[v.Name] = v.Options[0].Value
		default:
			var s string
			if json.Unmarshal(v.Current.Value, &s) == nil && s != "" {
				out[v.Name] = s
			}
		}
	}
	return out
}

// Substitute replaces the Grafana variables in s with the values the tests
// give them. A variable the dashboard does not define is an error.
func (d *Dashboard) Substitute(s string) (string, error) {
	vals := d.values()
	var missing []string
	out := variableRef.ReplaceAllStringFunc(s, func(ref string) string {
		m := variableRef.FindStringSubmatch(ref)
		name := m[1] + m[2] + m[3]
		v, ok := vals[name]
		if !ok {
			missing = append(missing, name)
			return ref
		}
		return v
	})
	if len(missing) > 0 {
		return "", fmt.Errorf("uses variables the dashboard does not define: %s", strings.Join(missing, ", "))
	}
	return out, nil
}

// labelValuesCall and queryResultCall match Grafana's Prometheus variable functions whose
// argument is PromQL: label_values(<selector>, <label>) and
// query_result(<query>).
var (
	labelValuesCall = regexp.MustCompile(`^\s*label_values\(\s*(.+)\s*,\s*[A-Za-z_][A-Za-z0-9_]*\s*\)\s*$`)
	queryResultCall = regexp.MustCompile(`^\s*query_result\(\s*(.+)\s*\)\s*$`)
)

// variableExpression returns the PromQL inside a variable's query, or ""
// when it has none (label_values(label), metrics(regex)).
func variableExpression(q string) string {
	if m := labelValuesCall.FindStringSubmatch(q); m != nil {
		return m[1]
	}
	if m := queryResultCall.FindStringSubmatch(q); m != nil {
		return m[1]
	}
	return ""
}

// Expressions returns every PromQL expression of the dashboard: the
// targets of every panel and the queries of the template variables.
func (d *Dashboard) Expressions() ([]Expression, error) {
	var out []Expression
	add := func(where, raw string) error {
		q, err := d.Substitute(raw)
		if err != nil {
			return fmt.Errorf("%s: %w", where, err)
		}
		out = append(out, Expression{Where: where, Raw: raw, Query: q})
		return nil
	}
	for _, p := range d.AllPanels() {
		for _, t := range p.Targets {
			if err := add(fmt.Sprintf("dashboard panel %d %q target %s", p.ID, p.Title, t.RefID), t.Expr); err != nil {
				return nil, err
			}
		}
	}
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		q, err := v.QueryString()
		if err != nil {
			return nil, err
		}
		expr := variableExpression(q)
		if expr == "" {
			return nil, fmt.Errorf("dashboard variable %s: query %q holds no PromQL (want label_values(<selector>, <label>) or query_result(<query>))", v.Name, q)
		}
		if err := add(fmt.Sprintf("dashboard variable %s", v.Name), expr); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// RuleFile is a Prometheus rule file.
type RuleFile struct {
	Groups []RuleGroup `json:"groups"`
}

// RuleGroup is one group of rules.
type RuleGroup struct {
	Name  string `json:"name"`
	Rules []Rule `json:"rules"`
}

// Rule is an alerting or recording rule.
type Rule struct {
	Alert       string            `json:"alert"`
	Record      string            `json:"record"`
	Expr        string            `json:"expr"`
	For         string            `json:"for"`
	Labels      map[string]string `json:"labels"`
	Annotations map[string]string `json:"annotations"`
}

// Name is the alert's or the recorded series' name.
func (r Rule) Name() string { return r.Alert + r.Record }

// LoadRules reads the rule file; a field Prometheus would not know is an
// error.
func LoadRules() (*RuleFile, error) {
	return load[RuleFile](RulesPath, func(data []byte, v any) error { return yaml.UnmarshalStrict(data, v) })
}

// Alerts returns every alerting rule.
func (f *RuleFile) Alerts() []Rule {
	var out []Rule
	for _, g := range f.Groups {
		for _, r := range g.Rules {
			if r.Alert != "" {
				out = append(out, r)
			}
		}
	}
	return out
}

// Expressions returns every rule's expression (rules use no variables).
func (f *RuleFile) Expressions() []Expression {
	var out []Expression
	for _, g := range f.Groups {
		for _, r := range g.Rules {
			out = append(out, Expression{Where: fmt.Sprintf("rule %s (group %s)", r.Name(), g.Name), Raw: r.Expr, Query: r.Expr})
		}
	}
	return out
}

// AllExpressions returns the dashboard's and the rules' expressions.
func AllExpressions() ([]Expression, error) {
	d, err := LoadDashboard()
	if err != nil {
		return nil, err
	}
	out, err := d.Expressions()
	if err != nil {
		return nil, err
	}
	rules, err := LoadRules()
	if err != nil {
		return nil, err
	}
	return append(out, rules.Expressions()...), nil
}

// MetricNames returns the metric names expr selects, sorted and once each:
// the name of every vector selector, written as a name or as a
// __name__="..." matcher. A selector without a fixed name is an error, as
// nothing could say which metric it needs.
func MetricNames(expr parser.Expr) ([]string, error) {
	var names []string
	var err error
	parser.Inspect(expr, func(node parser.Node, _ []parser.Node) error {
		vs, ok := node.(*parser.VectorSelector)
		if !ok {
			return nil
		}
		name := vs.Name
		for _, m := range vs.LabelMatchers {
			if m.Name == labels.MetricName && m.Type == labels.MatchEqual {
				name = m.Value
			}
		}
		if name == "" {
			err = fmt.Errorf("selector %s has no fixed metric name", vs)
			return err
		}
		names = append(names, name)
		return nil
	})
	if err != nil {
		return nil, err
	}
	slices.Sort(names)
	return slices.Compact(names), nil
}

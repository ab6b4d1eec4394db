package chart_test

import (
	"encoding/json"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/hyperfleet/hyperfleet/test/testenv"
)

// schemaNode is the part of a JSON schema the tests below read.
type schemaNode struct {
	Type                 any                    `json:"type"`
	Properties           map[string]*schemaNode `json:"properties"`
	AdditionalProperties any                    `json:"additionalProperties"`
	Items                *schemaNode            `json:"items"`
}

// TestSchemaDescribesEveryValue: values.schema.json is kept by hand beside
// values.yaml, so the two must name the same values: every value of
// values.yaml is a property of the schema, and every property the schema
// lists is a value of values.yaml. Where the schema lists a map's
// properties it lists all of them, and closes the map
// (additionalProperties: false), so that a misspelt value is refused
// rather than ignored; maps it leaves open (Kubernetes objects passed
// through, such as resources or affinity) are not walked. Every property
// has a type.
func TestSchemaDescribesEveryValue(t *testing.T) {
	dir := filepath.Join(testenv.RepoRoot(), chartDir)
	var values map[string]any
	readYAML(t, filepath.Join(dir, "values.yaml"), &values)
	raw, err := os.ReadFile(filepath.Join(dir, "values.schema.json"))
	if err != nil {
		t.Fatal(err)
	}
	var schema schemaNode
	if err := json.Unmarshal(raw, &schema); err != nil {
		t.Fatalf("values.schema.json: %v", err)
	}
	if len(schema.Properties) == 0 {
		t.Fatal("values.schema.json lists no properties")
	}
	compareSchema(t, "", values, &schema)
}

// compareSchema checks the values map at path against its schema node.
func compareSchema(t *testing.T, path string, values map[string]any, node *schemaNode) {
	t.Helper()
	name := path
	if name == "" {
		name = "the top level"
	}
	if node.AdditionalProperties != false {
		t.Errorf("values.schema.json: %s lists its properties but does not close the map (additionalProperties: false)", name)
	}
	for _, k := range slices.Sorted(maps.Keys(values)) {
		if _, ok := node.Properties[k]; !ok {
			t.Errorf("values.yaml has %s%s, values.schema.json does not describe it", path, k)
		}
	}
	for _, k := range slices.Sorted(maps.Keys(node.Properties)) {
		prop := node.Properties[k]
		v, ok := values[k]
		if !ok {
			t.Errorf("values.schema.json describes %s%s, values.yaml has no such value", path, k)
			continue
		}
		if prop.Type == nil {
			t.Errorf("values.schema.json: %s%s has no type", path, k)
		}
		if m, isMap := v.(map[string]any); isMap && len(prop.Properties) > 0 {
			compareSchema(t, path+k+".", m, prop)
		}
	}
}

// TestSchemaRefusesWrongValues: helm lint --strict and helm template both
// refuse values of the wrong type, outside their range or not among their
// choices, and misspelt names, with a message naming the value.
func TestSchemaRefusesWrongValues(t *testing.T) {
	cases := []struct {
		name string
		set  []string // --set
		str  []string // --set-string
		want []string // every one is in the message
	}{
		{name: "a string for an integer", set: []string{"replicaCount=two"}, want: []string{"/replicaCount", "got string, want integer"}},
		{name: "a string for a bool", str: []string{"crds.keep=true"}, want: []string{"/crds/keep", "got string, want boolean"}},
		{name: "a string for a bool, deep", str: []string{"agentServer.tls.withCA=yes"}, want: []string{"/agentServer/tls/withCA", "want boolean"}},
		{name: "a bool for a string", set: []string{"agentServer.url=true"}, want: []string{"/agentServer/url", "got boolean, want string"}},
		{name: "zero replicas", set: []string{"replicaCount=0"}, want: []string{"/replicaCount", "minimum"}},
		{name: "a proxy with credentials", set: []string{"proxy.httpsProxy=http://ci:secret@proxy.example.com:3128"}, want: []string{"/proxy/httpsProxy", "does not match pattern"}},
		{name: "port out of range", set: []string{"metrics.port=70000"}, want: []string{"/metrics/port", "maximum"}},
		{name: "connections below -1", set: []string{"webhook.maxConns=-2"}, want: []string{"/webhook/maxConns", "minimum"}},
		{name: "unknown anti-affinity", set: []string{"podAntiAffinity=sometimes"}, want: []string{"/podAntiAffinity", "'soft'", "'hard'"}},
		{name: "unknown pull policy", set: []string{"image.pullPolicy=Sometimes"}, want: []string{"/image/pullPolicy", "IfNotPresent"}},
		{name: "unknown Service type", set: []string{"webhook.service.type=Ingress"}, want: []string{"/webhook/service/type", "LoadBalancer"}},
		{name: "unknown log level", set: []string{"logLevel=verbose"}, want: []string{"/logLevel", "debug|info|error"}},
		{name: "a tag for a digest", set: []string{"image.digest=latest"}, want: []string{"/image/digest", "sha256"}},
		{name: "an agent URL over HTTP", set: []string{"agentServer.url=http://agents.example.com"}, want: []string{"/agentServer/url", "https://"}},
		{name: "a namespace that is not a name", set: []string{"secretNamespaces={Team_A}"}, want: []string{"/secretNamespaces/0", "does not match pattern"}},
		{name: "a script user that is not a user name", set: []string{"generic.scriptUser=Runner"}, want: []string{"/generic/scriptUser", "does not match pattern"}},
		{name: "a misspelt value", set: []string{"replicas=2"}, want: []string{"additional properties 'replicas' not allowed"}},
		{name: "a misspelt value, deep", set: []string{"metrics.serviceMonitor.enable=true"}, want: []string{"/metrics/serviceMonitor", "'enable' not allowed"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var flags []string
			for _, s := range tc.set {
				flags = append(flags, "--set", s)
			}
			for _, s := range tc.str {
				flags = append(flags, "--set-string", s)
			}
			lint := append([]string{"lint", "--strict", chartDir, "--namespace", defaults.namespace}, flags...)
			for what, args := range map[string][]string{"helm lint --strict": lint, "helm template": templateArgs(defaults, flags...)} {
				_, err := testenv.Helm(t, args...)
				if err == nil {
					t.Errorf("%s with %v %v passed, want a refusal", what, tc.set, tc.str)
					continue
				}
				for _, w := range tc.want {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("%s with %v %v: %v\nwant a refusal saying %q", what, tc.set, tc.str, err, w)
					}
				}
			}
		})
	}
}

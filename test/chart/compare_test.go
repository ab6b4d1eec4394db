package chart_test

import (
	"path/filepath"
	"reflect"
	"sort"
	"testing"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"

	"github.com/hyperfleet/hyperfleet/test/testenv"
)

// kustomize renders config/default with the kustomize API, as
// `kubectl apply -k config/default` does.
func kustomize(t *testing.T) []*unstructured.Unstructured {
	t.Helper()
	k := krusty.MakeKustomizer(krusty.MakeDefaultOptions())
	resources, err := k.Run(filesys.MakeFsOnDisk(), filepath.Join(testenv.RepoRoot(), "config", "default"))
	if err != nil {
		t.Fatalf("kustomize build config/default: %v", err)
	}
	stream, err := resources.AsYaml()
	if err != nil {
		t.Fatal(err)
	}
	objs, err := testenv.DecodeObjects(stream)
	if err != nil {
		t.Fatalf("kustomize build config/default: %v", err)
	}
	return objs
}

// The objects only one of the two installs has, and why.
var (
	onlyInKustomize = map[string]string{
		"Namespace /hyperfleet-system": "Helm installs into the release's namespace and does not own it " +
			"(helm install --namespace hyperfleet-system --create-namespace)",
	}
	onlyInChart = map[string]string{
		"ConfigMap hyperfleet-system/hyperfleet-config": "the manager's settings (values: config), read with --config; " +
			"config/ runs the manager with its flags' defaults",
		"PodDisruptionBudget hyperfleet-system/hyperfleet-manager": "a node drain takes down at most one replica at a time " +
			"(podDisruptionBudget); config/ runs a single replica",
	}
)

// clusterScopedUnknownToKustomize are cluster-scoped kinds that kustomize
// takes for namespaced ones.
var clusterScopedUnknownToKustomize = map[string]bool{
	"ValidatingAdmissionPolicy":        true,
	"ValidatingAdmissionPolicyBinding": true,
}

// A difference is something the chart's object has that config/'s has
// not. undo takes it out of the chart's object (a copy), given config/'s,
// and reports whether it was there: the test fails on any other
// difference, and on a listed one that no longer occurs.
type difference struct {
	what, why string
	undo      func(chart, config *unstructured.Unstructured) bool
}

const (
	instanceLabel = "app.kubernetes.io/instance"
	configArg     = "--config=/etc/hyperfleet/config/config.yaml"
)

var differences = []difference{
	{
		what: "every object carries Helm's labels (helm.sh/chart, app.kubernetes.io/instance, app.kubernetes.io/version, app.kubernetes.io/managed-by) besides config/'s",
		why:  "the labels Helm charts carry; config/'s labels are all kept",
		undo: func(chart, config *unstructured.Unstructured) bool {
			changed := undoExtraLabels(chart, config, "metadata", "labels")
			return undoExtraLabels(chart, config, "spec", "template", "metadata", "labels") || changed
		},
	},
	{
		what: "the Deployment's and the Services' selectors also match app.kubernetes.io/instance",
		why:  "two releases never select each other's pods",
		undo: func(chart, config *unstructured.Unstructured) bool {
			changed := dropKey(chart, config, instanceLabel, "spec", "selector", "matchLabels")
			return (chart.GetKind() == "Service" && dropKey(chart, config, instanceLabel, "spec", "selector")) || changed
		},
	},
	{
		what: "the Deployment's image is ghcr.io/hyperfleet/hyperfleet:<appVersion> (config/: :latest) with imagePullPolicy IfNotPresent",
		why:  "a chart release installs the operator of its appVersion",
		undo: func(chart, config *unstructured.Unstructured) bool {
			return editContainers(chart, config, func(c, want map[string]any) bool {
				changed := false
				for _, field := range []string{"image", "imagePullPolicy"} {
					if !reflect.DeepEqual(c[field], want[field]) {
						c[field], changed = want[field], true
						if want[field] == nil {
							delete(c, field)
						}
					}
				}
				return changed
			})
		},
	},
	{
		what: "the CRDs carry the annotation helm.sh/resource-policy: keep (crds.keep)",
		why:  "helm uninstall leaves the CRDs, and so every claim, in place; deleting a CRD deletes its objects",
		undo: func(chart, config *unstructured.Unstructured) bool {
			return chart.GetKind() == "CustomResourceDefinition" && dropKey(chart, config, "helm.sh/resource-policy", "metadata", "annotations")
		},
	},
	{
		what: "the Deployment's pods carry the annotation checksum/config",
		why:  "a change of values: config restarts the manager",
		undo: func(chart, config *unstructured.Unstructured) bool {
			return dropKey(chart, config, "checksum/config", "spec", "template", "metadata", "annotations")
		},
	},
	{
		what: "the Deployment's pods prefer different nodes (podAntiAffinity: soft)",
		why:  "with two replicas, a node's loss leaves one",
		undo: func(chart, config *unstructured.Unstructured) bool {
			return dropKey(chart, config, "affinity", "spec", "template", "spec")
		},
	},
	{
		what: "the manager runs with " + configArg + ", the ConfigMap hyperfleet-config mounted as volume config",
		why:  "the chart sets the manager's settings from values: config",
		undo: func(chart, config *unstructured.Unstructured) bool {
			podSpec, ok, _ := unstructured.NestedFieldNoCopy(chart.Object, "spec", "template", "spec")
			if !ok || chart.GetKind() != "Deployment" {
				return false
			}
			changed := removeFromList(podSpec.(map[string]any), "volumes", func(v map[string]any) bool { return v["name"] == "config" })
			return editContainers(chart, config, func(c, _ map[string]any) bool {
				args, _ := c["args"].([]any)
				kept := args[:0:0]
				for _, a := range args {
					if a != configArg {
						kept = append(kept, a)
					}
				}
				c["args"] = kept
				mount := removeFromList(c, "volumeMounts", func(m map[string]any) bool { return m["name"] == "config" })
				return len(kept) != len(args) || mount
			}) || changed
		},
	},
}

// TestChartAndKustomizeInstallTheSameObjects: the chart with its default
// values, released as hyperfleet in hyperfleet-system, and config/default
// install the same objects (kind, namespace, name) with the same content,
// but for onlyInKustomize, onlyInChart and differences.
func TestChartAndKustomizeInstallTheSameObjects(t *testing.T) {
	chartObjs := map[string]*unstructured.Unstructured{}
	for _, o := range render(t, defaults) {
		chartObjs[key(o)] = o
	}
	configObjs := map[string]*unstructured.Unstructured{}
	quirk := false
	for _, o := range kustomize(t) {
		// kustomize's built-in schema predates the admission policy
		// kinds, so config/default's namespace lands on them too; the
		// API server drops it, as they are cluster-scoped.
		if clusterScopedUnknownToKustomize[o.GetKind()] && o.GetNamespace() != "" {
			o.SetNamespace("")
			quirk = true
		}
		configObjs[key(o)] = o
	}
	if !quirk {
		t.Errorf("kustomize no longer sets a namespace on %v: take them off clusterScopedUnknownToKustomize", clusterScopedUnknownToKustomize)
	}
	checkOnlyIn(t, "config/default", configObjs, chartObjs, onlyInKustomize)
	checkOnlyIn(t, "the chart", chartObjs, configObjs, onlyInChart)

	seen := make([]bool, len(differences))
	for _, k := range sortedKeys(configObjs) {
		chartObj, ok := chartObjs[k]
		if !ok {
			continue
		}
		config, chart := configObjs[k], chartObj.DeepCopy()
		for i, d := range differences {
			if d.undo(chart, config) {
				seen[i] = true
			}
		}
		if diff := cmp.Diff(config.Object, chart.Object); diff != "" {
			t.Errorf("%s differs between config/default (-) and the chart (+) beyond the listed differences:\n%s", k, diff)
		}
	}
	for i, d := range differences {
		t.Logf("deliberate difference: %s (%s)", d.what, d.why)
		if !seen[i] {
			t.Errorf("listed difference %q no longer occurs: take it off the list in compare_test.go", d.what)
		}
	}
}

// checkOnlyIn fails for each object of objs missing from others that is
// not listed, and for each listed one that is no longer missing.
func checkOnlyIn(t *testing.T, where string, objs, others map[string]*unstructured.Unstructured, listed map[string]string) {
	t.Helper()
	for _, k := range sortedKeys(objs) {
		if _, ok := others[k]; !ok && listed[k] == "" {
			t.Errorf("only %s installs %s: install it in both, or list it with the reason in compare_test.go", where, k)
		}
	}
	for k := range listed {
		if _, ok := others[k]; ok || objs[k] == nil {
			t.Errorf("%s is listed as installed only by %s, but it is not (any more): update compare_test.go", k, where)
		}
	}
}

func sortedKeys(m map[string]*unstructured.Unstructured) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// undoExtraLabels makes the chart's labels at path config/'s when they are
// a superset of them; it reports whether they were.
func undoExtraLabels(chart, config *unstructured.Unstructured, path ...string) bool {
	got, _, _ := unstructured.NestedStringMap(chart.Object, path...)
	want, _, _ := unstructured.NestedStringMap(config.Object, path...)
	if len(got) <= len(want) {
		return false
	}
	for k, v := range want {
		if got[k] != v {
			return false
		}
	}
	if len(want) == 0 {
		unstructured.RemoveNestedField(chart.Object, path...)
	} else {
		_ = unstructured.SetNestedStringMap(chart.Object, want, path...)
	}
	return true
}

// dropKey removes key from the map at path in the chart's object when
// config/'s map lacks it (and the map itself if that empties it); it
// reports whether it did.
func dropKey(chart, config *unstructured.Unstructured, key string, path ...string) bool {
	m, ok, _ := unstructured.NestedFieldNoCopy(chart.Object, path...)
	got, isMap := m.(map[string]any)
	if !ok || !isMap {
		return false
	}
	if _, has := got[key]; !has {
		return false
	}
	if want, _, _ := unstructured.NestedFieldNoCopy(config.Object, append(path, key)...); want != nil {
		return false
	}
	delete(got, key)
	if len(got) == 0 {
		unstructured.RemoveNestedField(chart.Object, path...)
	}
	return true
}

// editContainers calls edit with each container of the chart's Deployment
// and config/'s container of the same name; it reports whether any edit
// changed something.
func editContainers(chart, config *unstructured.Unstructured, edit func(c, want map[string]any) bool) bool {
	if chart.GetKind() != "Deployment" {
		return false
	}
	got, _, _ := unstructured.NestedFieldNoCopy(chart.Object, "spec", "template", "spec", "containers")
	want, _, _ := unstructured.NestedSlice(config.Object, "spec", "template", "spec", "containers")
	changed := false
	for _, c := range asMaps(got) {
		for _, w := range asMaps(want) {
			if w["name"] == c["name"] && edit(c, w) {
				changed = true
			}
		}
	}
	return changed
}

// removeFromList removes the items of the list m[field] that drop
// matches; it reports whether there were any.
func removeFromList(m map[string]any, field string, drop func(map[string]any) bool) bool {
	var kept []any
	removed := false
	for _, item := range asMaps(m[field]) {
		if drop(item) {
			removed = true
			continue
		}
		kept = append(kept, item)
	}
	if removed {
		m[field] = kept
	}
	return removed
}

func asMaps(v any) []map[string]any {
	list, _ := v.([]any)
	out := make([]map[string]any, 0, len(list))
	for _, item := range list {
		if m, ok := item.(map[string]any); ok {
			out = append(out, m)
		}
	}
	return out
}

//go:build deploy

package deploy

import (
	"os"
	"path/filepath"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"

	"github.com/hyperfleet/hyperfleet/test/testenv"
)

const (
	// chartDir is the Helm chart, from the repository's root.
	chartDir = "charts/hyperfleet"
	// releaseName gives the release config/'s object names
	// (hyperfleet-manager, ...), as the chart's README installs it.
	releaseName = "hyperfleet"
)

// values are the chart's values (charts/hyperfleet/values.yaml) the test
// sets; the chart's defaults hold for the rest.
type values map[string]any

// renderManifests returns what `helm install` of the chart with v into
// namespace would install, in order (helm sorts the CRDs, templates of
// the chart, first): `helm template` with a values file holding v.
func renderManifests(t *testing.T, namespace string, v values) []*unstructured.Unstructured {
	t.Helper()
	data, err := yaml.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "values.yaml")
	if err := os.WriteFile(file, data, 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := testenv.Helm(t, "template", releaseName, chartDir, "--namespace", namespace, "--values", file)
	if err != nil {
		t.Fatalf("render the chart: %v", err)
	}
	objs, err := testenv.DecodeObjects([]byte(out))
	if err != nil {
		t.Fatalf("render the chart: %v", err)
	}
	return objs
}

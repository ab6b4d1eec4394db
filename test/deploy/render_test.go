//go:build deploy

package deploy

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"

	"github.com/hyperfleet/hyperfleet/test/testenv"
)

// values are the install's settings, what a chart's values.yaml would
// hold: the image and extra manager flags, appended to the Deployment's
// own (the manager's flags take the last of repeated occurrences).
type values struct {
	// Image is repository:tag.
	Image string
	// ExtraArgs are appended to the manager container's args.
	ExtraArgs []string
}

// shippedImage is the image config/manager/manager.yaml names.
const shippedImage = "ghcr.io/hyperfleet/hyperfleet"

// renderManifests turns the shipped manifests into the objects to apply,
// with v. It is the only place that knows how they are packaged: today
// config/default through kustomize's Go API (an overlay setting the image
// and appending the args); `helm template` of the chart with the same
// values can replace it without touching the rest of the test.
func renderManifests(t *testing.T, v values) []*unstructured.Unstructured {
	t.Helper()
	repo, tag, ok := strings.Cut(v.Image, ":")
	if i := strings.LastIndex(v.Image, ":"); ok && i > 0 {
		repo, tag = v.Image[:i], v.Image[i+1:]
	}
	dir := t.TempDir()
	// kustomize takes a base's path relative to the overlay only.
	base, err := filepath.Rel(dir, filepath.Join(testenv.RepoRoot(), "config", "default"))
	if err != nil {
		t.Fatal(err)
	}
	overlay := map[string]any{
		"apiVersion": "kustomize.config.k8s.io/v1beta1",
		"kind":       "Kustomization",
		"resources":  []string{base},
		"images":     []map[string]string{{"name": shippedImage, "newName": repo, "newTag": tag}},
	}
	if len(v.ExtraArgs) > 0 {
		ops := make([]map[string]any, 0, len(v.ExtraArgs))
		for _, a := range v.ExtraArgs {
			ops = append(ops, map[string]any{"op": "add", "path": "/spec/template/spec/containers/0/args/-", "value": a})
		}
		patch, err := yaml.Marshal(ops)
		if err != nil {
			t.Fatal(err)
		}
		overlay["patches"] = []map[string]any{{
			"target": map[string]string{"group": "apps", "version": "v1", "kind": "Deployment", "name": "hyperfleet-manager"},
			"patch":  string(patch),
		}}
	}
	data, err := yaml.Marshal(overlay)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "kustomization.yaml"), data, 0o600); err != nil {
		t.Fatal(err)
	}
	res, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), dir)
	if err != nil {
		t.Fatalf("render config/default with kustomize: %v", err)
	}
	out := make([]*unstructured.Unstructured, 0, len(res.Resources()))
	for _, r := range res.Resources() {
		data, err := r.MarshalJSON()
		if err != nil {
			t.Fatal(err)
		}
		u := &unstructured.Unstructured{}
		if err := u.UnmarshalJSON(data); err != nil {
			t.Fatal(err)
		}
		out = append(out, u)
	}
	return out
}

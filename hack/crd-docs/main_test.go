package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

const widgetCRD = `apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: widgets.example.com
spec:
  group: example.com
  names:
    kind: Widget
    listKind: WidgetList
    plural: widgets
    singular: widget
  scope: Namespaced
  versions:
  - name: v1
    served: true
    storage: true
    schema:
      openAPIV3Schema:
        description: Widget is a test kind.
        type: object
        properties:
          spec:
            description: spec is the widget.
            type: object
            properties:
              size:
                SIZE_DESCRIPTION
                type: integer
              parts:
                description: parts are the widget's parts.
                type: array
                items:
                  type: object
                  properties:
                    name:
                      PART_DESCRIPTION
                      type: string
`

func writeWidget(t *testing.T, sizeDoc, partDoc string) (crds, samples, out string) {
	t.Helper()
	dir := t.TempDir()
	crds, samples, out = filepath.Join(dir, "crds"), filepath.Join(dir, "samples"), filepath.Join(dir, "out")
	for _, d := range []string{crds, samples} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	body := strings.NewReplacer("SIZE_DESCRIPTION", sizeDoc, "PART_DESCRIPTION", partDoc).Replace(widgetCRD)
	if err := os.WriteFile(filepath.Join(crds, "widgets.yaml"), []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	return crds, samples, out
}

// TestRunRefusesUndocumentedFields: a field without a description fails
// the generator, which names every such field by its path.
func TestRunRefusesUndocumentedFields(t *testing.T) {
	crds, samples, out := writeWidget(t, "description: ''", "description: ''")
	err := run(crds, samples, out)
	if err == nil {
		t.Fatal("run accepted a CRD with undocumented fields")
	}
	for _, want := range []string{"Widget spec.size", "Widget spec.parts[].name", "2 CRD fields have no description"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not name %q", err, want)
		}
	}
	if _, serr := os.Stat(filepath.Join(out, "widget.md")); serr == nil {
		t.Error("a page was written for a CRD with undocumented fields")
	}
}

func TestRunWritesDocumentedFields(t *testing.T) {
	crds, samples, out := writeWidget(t, "description: size is how big the widget is.", "description: name names the part.")
	if err := run(crds, samples, out); err != nil {
		t.Fatalf("run: %v", err)
	}
	page, err := os.ReadFile(filepath.Join(out, "widget.md"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(page), "size is how big the widget is.") {
		t.Errorf("the page lacks the field's description:\n%s", page)
	}
}

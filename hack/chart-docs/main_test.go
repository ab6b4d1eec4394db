package main

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

const values = `# The file's own comment, not a value's.

# -- The name.
name: ""
image:
  # -- The repository.
  repository: example.com/op
  # Not a description: no marker.
  # -- (int) The tag, a number
  # on two lines.
  tag: 3
# -- Resources; the keys below are covered.
resources:
  limits:
    memory: 256Mi
# -- Pipes | escaped, and a list.
args: [--a, "--b=|"]
empty: {}
`

func TestParseValues(t *testing.T) {
	rows, err := parseValues([]byte(strings.Replace(values, "empty: {}\n", "# -- An empty map.\nempty: {}\n", 1)))
	if err != nil {
		t.Fatal(err)
	}
	want := []row{
		{key: "name", typ: "string", def: `""`, description: "The name."},
		{key: "image.repository", typ: "string", def: `"example.com/op"`, description: "The repository."},
		{key: "image.tag", typ: "int", def: `3`, description: "The tag, a number on two lines."},
		{key: "resources", typ: "object", def: `{"limits":{"memory":"256Mi"}}`, description: "Resources; the keys below are covered."},
		{key: "args", typ: "list", def: `["--a","--b=|"]`, description: "Pipes | escaped, and a list."},
		{key: "empty", typ: "object", def: `{}`, description: "An empty map."},
	}
	if !reflect.DeepEqual(rows, want) {
		t.Errorf("rows\n%+v\nwant\n%+v", rows, want)
	}
	table := renderTable(rows)
	for _, line := range []string{
		"| `image.tag` | int | `3` | The tag, a number on two lines. |",
		"| `args` | list | `[\"--a\",\"--b=\\|\"]` | Pipes \\| escaped, and a list. |",
	} {
		if !strings.Contains(table, line+"\n") {
			t.Errorf("table lacks the line\n%s\nin\n%s", line, table)
		}
	}
}

func TestUndocumentedValuesAreRefused(t *testing.T) {
	_, err := parseValues([]byte(values + "other:\n  # A comment without the marker.\n  leaf: 1\n"))
	if err == nil || !strings.Contains(err.Error(), "2 values") || !strings.Contains(err.Error(), "empty, other.leaf") {
		t.Fatalf("got %v, want the two undocumented values named", err)
	}
}

func TestRunReplacesOnlyTheTable(t *testing.T) {
	dir := t.TempDir()
	valuesPath, readmePath := filepath.Join(dir, "values.yaml"), filepath.Join(dir, "README.md")
	if err := os.WriteFile(valuesPath, []byte("# -- A flag.\nflag: true\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	readme := "# Chart\n\nIntro.\n\n" + beginMarker + "\nstale table\n" + endMarker + "\n\nAfter.\n"
	if err := os.WriteFile(readmePath, []byte(readme), 0o644); err != nil {
		t.Fatal(err)
	}
	for range 2 { // the second run changes nothing
		if err := run(valuesPath, readmePath); err != nil {
			t.Fatal(err)
		}
	}
	got, _ := os.ReadFile(readmePath)
	want := "# Chart\n\nIntro.\n\n" + beginMarker + "\n| Key | Type | Default | Description |\n|---|---|---|---|\n" +
		"| `flag` | bool | `true` | A flag. |\n" + endMarker + "\n\nAfter.\n"
	if string(got) != want {
		t.Errorf("README\n%s\nwant\n%s", got, want)
	}

	if err := os.WriteFile(readmePath, []byte("no markers\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := run(valuesPath, readmePath); err == nil || !strings.Contains(err.Error(), beginMarker) {
		t.Errorf("a README without markers: %v, want an error naming them", err)
	}
}

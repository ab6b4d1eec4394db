package main

import (
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/hyperfleet/hyperfleet/hack/internal/markers"
)

// TestArchitectureTableIsCurrent lists this repository's packages and
// fails when one has no doc comment (loadPackages' error names it) or when
// docs/architecture.md's table is not what they say (a package without a
// row, a row of a package that is gone, a doc comment or an import that
// changed): `make docs` rewrites it.
func TestArchitectureTableIsCurrent(t *testing.T) {
	pkgs := repoPackages(t)
	table, err := renderTables(pkgs)
	if err != nil {
		t.Fatal(err)
	}
	page, err := os.ReadFile("../../docs/architecture.md")
	if err != nil {
		t.Fatal(err)
	}
	want, err := markers.Replace(page, beginMarker, endMarker, []byte(table))
	if err != nil {
		t.Fatal(err)
	}
	if string(want) != string(page) {
		for _, p := range pkgs {
			if !strings.Contains(string(page), "| `"+p.Path+"` |") {
				t.Errorf("docs/architecture.md has no row for %s", p.Path)
			}
		}
		t.Fatal("docs/architecture.md's package table is out of date: run `make docs` (go run ./hack/pkg-docs)")
	}
}

// repoPackages lists this repository's packages once for every test.
var repoPackages = func() func(t *testing.T) []pkg {
	load := sync.OnceValues(func() ([]pkg, error) { return loadPackages("../..", defaultTags) })
	return func(t *testing.T) []pkg {
		t.Helper()
		pkgs, err := load()
		if err != nil {
			t.Fatal(err)
		}
		if len(pkgs) < 50 {
			t.Fatalf("listed %d packages, expected the repository's (more than 50)", len(pkgs))
		}
		return pkgs
	}
}()

// TestTestWorldUnderOneRoot fails when an internal package that no product
// binary links sits outside internal/testworld, or one under it is linked:
// the test world has one root, so that the product's checks
// (cmd/hyperfleet/deps_test.go, the depguard rule in .golangci.yml) name it
// by one prefix.
func TestTestWorldUnderOneRoot(t *testing.T) {
	for _, p := range repoPackages(t) {
		inTestWorld := strings.HasPrefix(p.Path, testWorldRoot+"/")
		switch {
		case p.Product && inTestWorld:
			t.Errorf("%s is linked by a product binary but sits under %s", p.Path, testWorldRoot)
		case !p.Product && !inTestWorld && strings.HasPrefix(p.Path, "internal/"):
			t.Errorf("%s is linked by no product binary (test world): move it under %s/", p.Path, testWorldRoot)
		}
	}
}

// TestLoadPackages runs the lister on a module of its own: a package
// without a doc comment is an error that names it, a package of tests only
// is described by its test files, and what the product commands link is
// the product.
func TestLoadPackages(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) {
		t.Helper()
		path := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("go.mod", "module example.com/m\n\ngo 1.22\n")
	write("cmd/hyperfleet/main.go", "// Command hyperfleet is the product.\npackage main\n\nimport _ \"example.com/m/internal/a\"\n\nfunc main() {}\n")
	write("cmd/hyperfleet-agent/main.go", "// Command hyperfleet-agent is the agent.\npackage main\n\nfunc main() {}\n")
	write("internal/a/a.go", "// Package a is linked by the product.\n//\n// Not this paragraph.\npackage a\n\nimport _ \"example.com/m/pkg/b\"\n")
	write("pkg/b/b.go", "// Package b is a list:\n//   - one;\n//   - two.\npackage b\n")
	write("internal/sim/sim.go", "// Package sim is test world.\npackage sim\n\nimport _ \"example.com/m/internal/a\"\n")
	write("test/suite/suite_test.go", "// Package suite_test is a suite of tests only.\npackage suite_test\n\nimport (\n\t\"testing\"\n\n\t_ \"example.com/m/internal/sim\"\n)\n\nfunc TestX(t *testing.T) {}\n")
	write("hack/tool/main.go", "package main\n\nfunc main() {}\n")
	write("internal/tagged/tagged.go", "//go:build e2e\n\n// Package tagged is built with a tag only.\npackage tagged\n")

	pkgs, err := loadPackages(dir, defaultTags)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]pkg{}
	for _, p := range pkgs {
		got[p.Path] = p
	}
	want := map[string]pkg{
		"cmd/hyperfleet":       {Doc: "Command hyperfleet is the product.", Imports: []string{"internal/a"}, Product: true},
		"cmd/hyperfleet-agent": {Doc: "Command hyperfleet-agent is the agent.", Product: true},
		"internal/a":           {Doc: "Package a is linked by the product.", Imports: []string{"pkg/b"}, Product: true},
		"pkg/b":                {Doc: "Package b is a list: one; two.", Product: true},
		"internal/sim":         {Doc: "Package sim is test world.", Imports: []string{"internal/a"}},
		"test/suite":           {Doc: "Package suite_test is a suite of tests only.", Imports: []string{"internal/sim"}},
		"internal/tagged":      {Doc: "Package tagged is built with a tag only."},
	}
	if len(got) != len(want) {
		t.Errorf("listed %d packages, want %d (hack/ is not listed): %v", len(got), len(want), got)
	}
	for path, w := range want {
		g, ok := got[path]
		if !ok {
			t.Errorf("%s: not listed", path)
			continue
		}
		if g.Doc != w.Doc || g.Product != w.Product || strings.Join(g.Imports, ",") != strings.Join(w.Imports, ",") {
			t.Errorf("%s = %+v, want doc %q, imports %v, product %v", path, g, w.Doc, w.Imports, w.Product)
		}
	}

	write("internal/nodoc/nodoc.go", "package nodoc\n")
	_, err = loadPackages(dir, defaultTags)
	if err == nil || !strings.Contains(err.Error(), "internal/nodoc: no doc comment") {
		t.Fatalf("a package without a doc comment: error %v, want one naming internal/nodoc", err)
	}
}

func TestCompact(t *testing.T) {
	cases := []struct {
		in   []string
		want string
	}{
		{nil, "no project package"},
		{[]string{"pkg/provider"}, "`pkg/provider`"},
		{[]string{"api/v1alpha1", "internal/a", "internal/b", "internal/sim/x", "pkg/provider"},
			"`api/v1alpha1`, `internal/{a,b}`, `internal/sim/x`, `pkg/provider`"},
	}
	for _, tc := range cases {
		if got := compact(tc.in); got != tc.want {
			t.Errorf("compact(%v) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

func TestFirstParagraph(t *testing.T) {
	cases := map[string]string{
		"Package x does\na thing.\n\nMore.\n":                        "Package x does a thing.",
		"Package x is the API.\n+kubebuilder:object:generate=true\n": "Package x is the API.",
		"Package x has:\n  - a;\n  - b.\n\nMore.\n":                  "Package x has: a; b.",
		"Package x shows:\n\n\tcode\n":                               "Package x shows:",
	}
	for in, want := range cases {
		if got := firstParagraph(in); got != want {
			t.Errorf("firstParagraph(%q) = %q, want %q", in, got, want)
		}
	}
}

package docs_test

import (
	"go/ast"
	"go/build/constraint"
	"go/parser"
	"go/token"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// taggedRun is a make target's go test of the tests a build tag adds to a
// package, selected by name because the package's others ran elsewhere.
type taggedRun struct {
	dir, tag string
	// run is the target's -run pattern, as the Makefile spells it.
	run string
}

// taggedRuns are the Makefile's selections by name (make test-spire):
// internal/agent's spire tests (make test runs the package's others) and
// the SPIFFE end-to-end scenarios (make test-e2e runs the e2e tag's).
var taggedRuns = []taggedRun{
	{dir: "internal/agent", tag: "spire", run: "SPIRE$$"},
	{dir: "test/e2e", tag: "spire", run: "SPIFFE"},
}

// TestTaggedTestsRunInTheirTarget fails when a test that only a build tag
// adds does not match the -run pattern of the target that runs that tag:
// such a test runs nowhere (TestGenericScriptFetchesItsSVID, tagged
// e2e && spire, never ran in CI until it was named for -run SPIFFE).
func TestTaggedTestsRunInTheirTarget(t *testing.T) {
	makefile := read(t, "Makefile")
	for _, r := range taggedRuns {
		if !strings.Contains(makefile, "-run '"+r.run+"' ./"+r.dir+"/") && !strings.Contains(makefile, "-run "+r.run+" ./"+r.dir+"/") {
			t.Errorf("the Makefile no longer runs ./%s/ with -run %s: update taggedRuns", r.dir, r.run)
			continue
		}
		pattern := regexp.MustCompile(strings.ReplaceAll(r.run, "$$", "$"))
		files, err := filepath.Glob(filepath.Join(repoRoot, r.dir, "*_test.go"))
		if err != nil {
			t.Fatal(err)
		}
		found := 0
		for _, name := range files {
			f, err := parser.ParseFile(token.NewFileSet(), name, nil, parser.ParseComments)
			if err != nil {
				t.Fatal(err)
			}
			if !addedBy(f, r.tag) {
				continue
			}
			for _, d := range f.Decls {
				fn, ok := d.(*ast.FuncDecl)
				if !ok || fn.Recv != nil || !strings.HasPrefix(fn.Name.Name, "Test") {
					continue
				}
				found++
				if !pattern.MatchString(fn.Name.Name) {
					t.Errorf("%s: %s is built only with the %s tag and does not match -run %s, so it never runs", filepath.Base(name), fn.Name.Name, r.tag, r.run)
				}
			}
		}
		if found == 0 {
			t.Errorf("./%s: no test built only with the %s tag: -run %s selects nothing", r.dir, r.tag, r.run)
		}
	}
}

// addedBy reports whether f's build constraint admits it on Linux with tag
// (and every other tag) and not without tag.
func addedBy(f *ast.File, tag string) bool {
	for _, g := range f.Comments {
		if g.Pos() > f.Package {
			break
		}
		for _, c := range g.List {
			if !constraint.IsGoBuild(c.Text) {
				continue
			}
			expr, err := constraint.Parse(c.Text)
			if err != nil {
				return false
			}
			on := func(withTag bool) bool {
				return expr.Eval(func(t string) bool {
					switch t {
					case "linux", "unix", "amd64":
						return true
					case tag:
						return withTag
					}
					return !strings.HasPrefix(t, "windows") && t != "darwin" && t != "arm64"
				})
			}
			return on(true) && !on(false)
		}
	}
	return false
}

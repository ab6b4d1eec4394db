package repo

import (
	"go/ast"
	"go/build/constraint"
	"go/parser"
	"go/token"
	"os/exec"
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

// TestGuestSmallRunNamesScenarios reads the Makefile's GUEST_SMALL_RUN,
// the real-guest scenarios CI runs, and fails when a name in it is no
// test of test/guest (a renamed scenario would silently leave CI's run)
// or when it names them all (then the full set and CI's would be one and
// the Makefile's description of what CI leaves to make test-guest wrong).
func TestGuestSmallRunNamesScenarios(t *testing.T) {
	m := regexp.MustCompile(`(?m)^GUEST_SMALL_RUN := \^\(([A-Za-z0-9|]+)\)\$\$$`).FindStringSubmatch(read(t, "Makefile"))
	if m == nil {
		t.Fatal("the Makefile has no GUEST_SMALL_RUN := ^(TestA|TestB)$$ line")
	}
	files, err := filepath.Glob(filepath.Join(repoRoot, "test/guest", "*_test.go"))
	if err != nil {
		t.Fatal(err)
	}
	scenarios := map[string]bool{}
	for _, name := range files {
		f, err := parser.ParseFile(token.NewFileSet(), name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range f.Decls {
			if fn, ok := d.(*ast.FuncDecl); ok && fn.Recv == nil && strings.HasPrefix(fn.Name.Name, "Test") && fn.Name.Name != "TestMain" {
				scenarios[fn.Name.Name] = true
			}
		}
	}
	names := strings.Split(m[1], "|")
	for _, n := range names {
		if !scenarios[n] {
			t.Errorf("GUEST_SMALL_RUN names %s, which is no test of test/guest", n)
		}
	}
	if len(names) >= len(scenarios) {
		t.Errorf("GUEST_SMALL_RUN names %d of test/guest's %d scenarios: CI's set is the full one", len(names), len(scenarios))
	}
}

// raceSkipMayLink are the packages of this module a RACE_SKIP package's
// test may link: the API types, the test world's API server wrapper and
// its helpers, the pure functions the types' validation tests call, the
// doc generators' comment markers and the Proxmox privilege table (data
// the role generator prints).
var raceSkipMayLink = map[string]bool{
	"api/v1alpha1": true, "test/testenv": true, "internal/testworld/repodir": true,
	"internal/testworld/proptest": true, "internal/agentconfig": true, "internal/tpmdevid": true,
	"hack/internal/markers": true, "pkg/provider/proxmox/privileges": true,
}

// TestRaceSkipLinksNoConcurrentCode reads the Makefile's RACE_SKIP, the
// packages the race run leaves out because their tests run no concurrent
// code of the operator's, and fails when one of their tests links a
// package of this module beyond raceSkipMayLink (a controller, the
// manager, a simulator): then the race run must cover it again.
func TestRaceSkipLinksNoConcurrentCode(t *testing.T) {
	m := regexp.MustCompile(`(?m)^RACE_SKIP := ((?:.*\\\n)*.*)$`).FindStringSubmatch(read(t, "Makefile"))
	if m == nil {
		t.Fatal("the Makefile has no RACE_SKIP := line")
	}
	const module = "github.com/hyperfleet/hyperfleet/"
	pkgs := strings.Fields(strings.ReplaceAll(m[1], "\\\n", " "))
	if len(pkgs) == 0 {
		t.Fatal("RACE_SKIP is empty")
	}
	for _, pkg := range pkgs {
		rel, ok := strings.CutPrefix(pkg, module)
		if !ok {
			t.Errorf("RACE_SKIP names %s, which is not a package of this module", pkg)
			continue
		}
		cmd := exec.Command("go", "list", "-test", "-deps", "-f", "{{.ImportPath}}", "./"+rel)
		cmd.Dir = repoRoot
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("go list -test -deps ./%s: %v", rel, err)
		}
		for _, dep := range strings.Fields(string(out)) {
			d, ok := strings.CutPrefix(dep, module)
			if !ok || strings.HasSuffix(d, ".test") {
				continue
			}
			d, _, _ = strings.Cut(d, " ") // a package's test variant: "p [p.test]"
			d = strings.TrimSuffix(d, "_test")
			if d != rel && !raceSkipMayLink[d] {
				t.Errorf("RACE_SKIP's %s: its tests link %s, which the race run should watch; take it out of RACE_SKIP or widen raceSkipMayLink with the reason", rel, d)
			}
		}
	}
}

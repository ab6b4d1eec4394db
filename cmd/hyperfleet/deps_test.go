package main

import (
	"bytes"
	"errors"
	"fmt"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// testWorld matches the packages the operator binary must not link:
// internal/testworld (the simulators, the local world of cmd/hyperfleet-dev
// and its spire-server, test helpers and doubles), everything under test/
// (test/testenv starts an API server), the public test doubles of the
// provider contract (pkg/provider/fake, pkg/provider/providertest),
// envtest, and testing packages (the standard library's and any
// .../testing). A binary that links them ships code written for tests, not
// reviewed as product, in the operator's image; envtest even starts an API
// server. hack/pkg-docs's TestTestWorldUnderOneRoot keeps every internal
// package the product does not link under internal/testworld.
var testWorld = regexp.MustCompile(`envtest|/testing$|^testing$` +
	`|^github\.com/hyperfleet/hyperfleet/(internal/testworld|test)/` +
	`|^github\.com/hyperfleet/hyperfleet/pkg/provider/(fake|providertest)$`)

// upstreamTestImports are testing packages a dependency links into every
// binary that uses it, each with the only packages allowed to import it.
// client-go keeps a generic fake client (gentype/fake.go) in the same
// package as the real one (gentype/type.go), so k8s.io/client-go/gentype
// imports k8s.io/client-go/testing; every typed clientset uses gentype and
// controller-runtime's manager uses one for leader election. It cannot be
// cut from here; any other importer of it still fails the test.
var upstreamTestImports = map[string][]string{
	"k8s.io/client-go/testing": {"k8s.io/client-go/gentype"},
}

// TestOperatorLinksNoTestWorld lists what the operator binary links (the
// package, not its tests) and fails on any test-world package, naming the
// import chain that brings it in.
func TestOperatorLinksNoTestWorld(t *testing.T) {
	// go test puts the go command of the toolchain running the test first
	// on PATH (since Go 1.19), so this is the same toolchain; without it
	// the check cannot run, which is a failure, not a skip.
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the go command is needed to list the operator's dependencies: %v", err)
	}
	var stdout, stderr bytes.Buffer
	cmd := exec.Command(goTool, "list", "-deps", "-f", "{{.DepOnly}} {{.ImportPath}} {{join .Imports \" \"}}", ".")
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("go list -deps: %v\n%s", err, stderr.String())
	}
	root, imports, err := parseDeps(stdout.String())
	if err != nil {
		t.Fatal(err)
	}
	if len(imports) < 100 {
		// The operator links hundreds of packages; a short list means the
		// listing, not the binary, is wrong.
		t.Fatalf("go list -deps listed %d packages for %s, expected hundreds:\n%s", len(imports), root, stdout.String())
	}
	for _, p := range testWorldLinks(root, imports) {
		t.Error(p)
	}
}

// parseDeps reads go list -deps lines "<DepOnly> <import path> <imports...>"
// into an import graph and the listed (not DepOnly) package.
func parseDeps(out string) (root string, imports map[string][]string, err error) {
	imports = map[string][]string{}
	for line := range strings.SplitSeq(strings.TrimSpace(out), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 {
			return "", nil, fmt.Errorf("unexpected go list line %q", line)
		}
		imports[f[1]] = f[2:]
		if f[0] == "false" {
			root = f[1]
		}
	}
	if root == "" {
		return "", nil, errors.New("go list printed no line for the listed package")
	}
	return root, imports, nil
}

// testWorldLinks returns, for each test-world package root links, why:
// the shortest import chain from root to it (or, for an upstream testing
// package, to each importer that is not its allowed one).
func testWorldLinks(root string, imports map[string][]string) []string {
	// Breadth first, so that each package's parent is on a shortest chain.
	parent := map[string]string{root: ""}
	order := []string{root}
	for i := 0; i < len(order); i++ {
		for _, dep := range imports[order[i]] {
			if _, seen := parent[dep]; !seen {
				parent[dep] = order[i]
				order = append(order, dep)
			}
		}
	}
	chain := func(pkg string) string {
		var c []string
		for p := pkg; p != ""; p = parent[p] {
			c = append(c, p)
		}
		slices.Reverse(c)
		return strings.Join(c, " -> ")
	}
	var problems []string
	for _, pkg := range order {
		if !testWorld.MatchString(pkg) {
			continue
		}
		allowed, upstream := upstreamTestImports[pkg]
		if !upstream {
			problems = append(problems, root+" links test package "+pkg+": "+chain(pkg)+
				" (move the code that needs it next to its tests, or into cmd/hyperfleet-dev)")
			continue
		}
		for _, importer := range order {
			if slices.Contains(imports[importer], pkg) && !slices.Contains(allowed, importer) {
				problems = append(problems, root+" links test package "+pkg+" through "+importer+
					", not only through "+strings.Join(allowed, ", ")+": "+chain(importer)+" -> "+pkg)
			}
		}
	}
	return problems
}

func TestTestWorldLinksNamesTheChain(t *testing.T) {
	const (
		root    = "github.com/hyperfleet/hyperfleet/cmd/hyperfleet"
		manager = "github.com/hyperfleet/hyperfleet/internal/manager"
		devenv  = "github.com/hyperfleet/hyperfleet/internal/testworld/devenv"
		testenv = "github.com/hyperfleet/hyperfleet/test/testenv"
		gentype = "k8s.io/client-go/gentype"
		fakes   = "k8s.io/client-go/testing"
	)
	cases := []struct {
		name    string
		imports map[string][]string
		want    []string
	}{
		{
			name: "client-go's own fake through gentype is allowed",
			imports: map[string][]string{
				root: {manager}, manager: {"sigs.k8s.io/controller-runtime/pkg/manager"},
				"sigs.k8s.io/controller-runtime/pkg/manager": {gentype}, gentype: {fakes},
			},
		},
		{
			name: "a product package importing the local world",
			imports: map[string][]string{
				root: {manager}, manager: {devenv}, devenv: {testenv}, testenv: {"sigs.k8s.io/controller-runtime/pkg/envtest"},
			},
			want: []string{
				"links test package " + devenv + ": " + root + " -> " + manager + " -> " + devenv + " (",
				"links test package " + testenv + ": " + root + " -> " + manager + " -> " + devenv + " -> " + testenv + " (",
				"links test package sigs.k8s.io/controller-runtime/pkg/envtest: ",
			},
		},
		{
			name:    "client-go's fake imported by a product package",
			imports: map[string][]string{root: {manager, gentype}, manager: {fakes}, gentype: {fakes}},
			want:    []string{"links test package " + fakes + " through " + manager + ", not only through " + gentype + ": " + root + " -> " + manager + " -> " + fakes},
		},
		{
			name:    "the standard library's testing package",
			imports: map[string][]string{root: {manager}, manager: {"testing"}},
			want:    []string{"links test package testing: " + root + " -> " + manager + " -> testing"},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := testWorldLinks(root, tc.imports)
			if len(got) != len(tc.want) {
				t.Fatalf("got %d problems, want %d:\n%s", len(got), len(tc.want), strings.Join(got, "\n"))
			}
			for i, want := range tc.want {
				if !strings.Contains(got[i], want) {
					t.Errorf("problem %d = %q, want it to contain %q", i, got[i], want)
				}
			}
		})
	}
}

func TestParseDeps(t *testing.T) {
	root, imports, err := parseDeps("true fmt errors io\ntrue errors\nfalse example.com/cmd fmt\n")
	if err != nil {
		t.Fatal(err)
	}
	if root != "example.com/cmd" || !slices.Equal(imports["fmt"], []string{"errors", "io"}) || len(imports["errors"]) != 0 {
		t.Fatalf("root %q, imports %v", root, imports)
	}
	if _, _, err := parseDeps("true fmt\n"); err == nil {
		t.Fatal("a listing without the listed package was accepted")
	}
}

// This test checks that each CI platform speaks only for itself: its
// names (the workload type the agent config carries, its runner
// credentials' methods) are spelled as string literals in its own packages
// and the API's enums only, so that shared code reaches a platform through
// its back-end, its agent config spec and its in-VM runner, and one more
// platform is its own packages and a registration line (docs/architecture.md,
// "CI platforms as plug-ins").

package repo

import (
	"go/scanner"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// platformLiterals are the platforms' names, each with the directories
// (slash-separated, relative to the repository, with their subdirectories)
// whose product code may spell it: the platform's own packages, and the
// API's enums (spec.workload.type, spec.bootstrap.method).
var platformLiterals = map[string][]string{
	"github-actions":    {"api/v1alpha1/", "pkg/workload/github/"},
	"jit-config":        {"api/v1alpha1/", "pkg/workload/github/"},
	"runner-token":      {"api/v1alpha1/", "pkg/workload/github/"},
	"gitlab-ci":         {"api/v1alpha1/", "pkg/workload/gitlab/"},
	"runner-auth-token": {"pkg/workload/gitlab/"},
	"buildkite":         {"api/v1alpha1/", "pkg/workload/buildkite/"},
	"agent-token":       {"pkg/workload/buildkite/"},
	"job-token":         {"pkg/workload/buildkite/"},
}

// literalExceptions are single files that may still spell a name, each
// with why.
var literalExceptions = map[string]map[string]string{
	// GitHub's two methods under the agent config's old names, which
	// packages outside the CI platforms' (the secrets store's tests, the
	// local world, machineclaim's secrets store) still use; the agent
	// config cannot import the API's enum without linking Kubernetes into
	// the agent.
	"internal/agentconfig/compat.go": {"jit-config": "deprecated alias", "runner-token": "deprecated alias"},
}

// notProduct are the trees whose code is not the product's: the test
// world and the binaries built from it (the platforms' simulators, the
// local dev environment), which stand in for the platforms and speak for
// them, the end-to-end tests and the tool modules.
var notProduct = []string{
	"internal/testworld/", "test/", "hack/",
	"cmd/hyperfleet-dev/", "cmd/github-sim/", "cmd/gitlab-sim/", "cmd/buildkite-sim/", "cmd/proxmox-sim/",
}

// TestPlatformNamesStayInTheirPackages fails when a product .go file
// (tests excluded) spells a CI platform's name or credential method as a
// string literal outside that platform's own packages and the API's enums.
func TestPlatformNamesStayInTheirPackages(t *testing.T) {
	found := 0
	err := filepath.WalkDir(repoRoot, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel := filepath.ToSlash(strings.TrimPrefix(path, repoRoot+string(filepath.Separator)))
		if d.IsDir() {
			if name := d.Name(); name == ".git" || name == "testdata" || name == "vendor" || name == "node_modules" || hasPrefix(rel+"/", notProduct) {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(rel, ".go") || strings.HasSuffix(rel, "_test.go") {
			return nil
		}
		for _, lit := range stringLiterals(t, path) {
			allowed, ok := platformLiterals[lit.value]
			if !ok {
				continue
			}
			found++
			if hasPrefix(rel, allowed) || literalExceptions[rel][lit.value] != "" {
				continue
			}
			t.Errorf("%s:%d spells %q, a CI platform's name: only %s may (declare it there and use the platform's constant)", rel, lit.line, lit.value, strings.Join(allowed, ", "))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// The platforms' own declarations are there: a walk that found none
	// looked at the wrong tree.
	if found < len(platformLiterals) {
		t.Fatalf("found %d of the platforms' names in the product code; the walk of %s is wrong", found, repoRoot)
	}
}

type literal struct {
	value string
	line  int
}

// stringLiterals are the string literals of the Go file at path (comments
// and identifiers are not looked at).
func stringLiterals(t *testing.T, path string) []literal {
	t.Helper()
	src, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	var s scanner.Scanner
	s.Init(fset.AddFile(path, -1, len(src)), src, func(pos token.Position, msg string) { t.Errorf("%s: %s", pos, msg) }, 0)
	var out []literal
	for {
		pos, tok, lit := s.Scan()
		if tok == token.EOF {
			return out
		}
		if tok != token.STRING {
			continue
		}
		if v, err := strconv.Unquote(lit); err == nil {
			out = append(out, literal{value: v, line: fset.Position(pos).Line})
		}
	}
}

func hasPrefix(s string, prefixes []string) bool {
	for _, p := range prefixes {
		if strings.HasPrefix(s, p) {
			return true
		}
	}
	return false
}

// Package testdeps finds the external artifacts tests read (installed by
// hack/test-deps.sh, outside the repository). A missing artifact fails the
// test with a pointer to `make test-deps`; it never skips.
package testdeps

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
)

// NPMDir is where hack/test-deps.sh installs npm packages: the
// node_modules directory under $HYPERFLEET_CACHE/npm.
func NPMDir() string { return filepath.Join(cacheRoot(), "npm", "node_modules") }

// PowerShellGrammarDir is the node_modules directory with web-tree-sitter
// and tree-sitter-powershell (hack/test-deps.sh), which
// hack/powershell-parse/parse.mjs loads; it fails the test when they are
// missing.
func PowerShellGrammarDir(t testing.TB) string {
	t.Helper()
	dir := filepath.Join(cacheRoot(), "npm-powershell", "node_modules")
	for _, rel := range []string{"web-tree-sitter/package.json", "tree-sitter-powershell/tree-sitter-powershell.wasm"} {
		if _, err := os.Stat(filepath.Join(dir, rel)); err != nil {
			t.Fatalf("the PowerShell grammar is not installed (%v): run `make test-deps` (hack/test-deps.sh installs it into %s)", err, dir)
		}
	}
	return dir
}

// cacheRoot is $HYPERFLEET_CACHE, by default ~/.cache/hyperfleet.
func cacheRoot() string {
	root := os.Getenv("HYPERFLEET_CACHE")
	if root == "" {
		cache := os.Getenv("XDG_CACHE_HOME")
		if cache == "" {
			home, _ := os.UserHomeDir()
			cache = filepath.Join(home, ".cache")
		}
		root = filepath.Join(cache, "hyperfleet")
	}
	return root
}

// NPMFile returns the path of a file inside an installed npm package, such
// as NPMFile(t, "@octokit/openapi", "generated/api.github.com.json"), and
// fails the test when it is missing.
func NPMFile(t testing.TB, pkg, rel string) string {
	t.Helper()
	p := filepath.Join(NPMDir(), pkg, rel)
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("npm package %s is not installed (%v): run `make test-deps` (hack/test-deps.sh installs it into %s)", pkg, err, NPMDir())
	}
	return p
}

// WebhookExamples returns GitHub's published webhook examples of one event
// (such as workflow_job) from @octokit/webhooks-examples, failing the test
// when the package is missing or holds none.
func WebhookExamples(t testing.TB, event string) []json.RawMessage {
	t.Helper()
	path := NPMFile(t, "@octokit/webhooks-examples", "api.github.com/index.json")
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var index []struct {
		Name     string            `json:"name"`
		Examples []json.RawMessage `json:"examples"`
	}
	if err := json.Unmarshal(data, &index); err != nil {
		t.Fatalf("decode %s: %v", path, err)
	}
	for _, e := range index {
		if e.Name == event {
			if len(e.Examples) == 0 {
				t.Fatalf("the %s entry of %s has no examples", event, path)
			}
			return e.Examples
		}
	}
	t.Fatalf("no %s entry in %s", event, path)
	return nil
}

package repodir

import (
	"os"
	"path/filepath"
	"testing"
)

func TestRootHoldsTheModule(t *testing.T) {
	root := Root()
	if _, err := os.Stat(filepath.Join(root, "internal", "testworld", "repodir", "repodir.go")); err != nil {
		t.Fatalf("Root() = %s, which does not hold this package: %v", root, err)
	}
	if got := Path("config/crd/bases"); got != filepath.Join(root, "config", "crd", "bases") {
		t.Fatalf("Path = %s", got)
	}
}

func TestIsRootSkipsOtherModules(t *testing.T) {
	dir := t.TempDir()
	if isRoot(dir) {
		t.Fatal("a directory without go.mod is the root")
	}
	if err := os.WriteFile(filepath.Join(dir, "go.mod"), []byte("// a tool module\nmodule github.com/hyperfleet/hyperfleet/hack/spire\n\ngo 1.26\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if isRoot(dir) {
		t.Fatal("a tool module under hack/ is taken for the root")
	}
	if err := os.WriteFile(filepath.Join(dir, "go.mod"), []byte("module "+Module+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if !isRoot(dir) {
		t.Fatal("the module's go.mod is not recognised")
	}
}

// Built with -trimpath, runtime.Caller names files by import path; Root
// then finds the module from the working directory, as go test sets it.
func TestRootFromTheWorkingDirectory(t *testing.T) {
	want := Root()
	t.Chdir(filepath.Join(want, "internal", "testworld"))
	if got := rootFrom(Module + "/internal/testworld/repodir/repodir.go"); got != want {
		t.Fatalf("the root of a -trimpath build, from a subdirectory = %s, want %s", got, want)
	}
}

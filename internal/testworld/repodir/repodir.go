// Package repodir finds files of this repository from tests and test-world
// programs, however they were built.
//
// The usual way, runtime.Caller's file name, is a path on disk only for a
// build without -trimpath. CI builds with -trimpath (.ci/run) so that the Go
// build cache serves a fresh clone in a new directory: its file names are
// then import paths (github.com/hyperfleet/hyperfleet/...), so Root falls
// back to the working directory, which go test sets to the package's.
package repodir

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
)

// Module is this repository's module path.
const Module = "github.com/hyperfleet/hyperfleet"

// Root is the repository's top directory: the one whose go.mod declares
// Module, found from this file's path when it is one on disk, otherwise by
// walking up from the working directory. It panics when neither finds it:
// a test run outside the repository cannot find its fixtures either.
func Root() string {
	_, file, _, _ := runtime.Caller(0)
	return rootFrom(file)
}

// rootFrom is Root given this file's name as the build recorded it.
func rootFrom(file string) string {
	if filepath.IsAbs(file) {
		dir := filepath.Clean(filepath.Join(filepath.Dir(file), "..", "..", ".."))
		if isRoot(dir) {
			return dir
		}
	}
	wd, err := os.Getwd()
	if err != nil {
		panic(fmt.Sprintf("repodir: working directory: %v", err))
	}
	for dir := wd; ; dir = filepath.Dir(dir) {
		if isRoot(dir) {
			return dir
		}
		if filepath.Dir(dir) == dir {
			panic(fmt.Sprintf("repodir: no go.mod of %s in %s or above it", Module, wd))
		}
	}
}

// Path is the repository file or directory at rel, a slash-separated path
// from the top.
func Path(rel string) string {
	return filepath.Join(Root(), filepath.FromSlash(rel))
}

// isRoot reports whether dir holds the go.mod of Module (hack/'s tool
// modules have go.mod files of their own).
func isRoot(dir string) bool {
	data, err := os.ReadFile(filepath.Join(dir, "go.mod"))
	if err != nil {
		return false
	}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		if f := strings.Fields(sc.Text()); len(f) == 2 && f[0] == "module" {
			return f[1] == Module
		}
	}
	return false
}

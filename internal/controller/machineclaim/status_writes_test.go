package machineclaim

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// conditionWrite matches a write of a condition list: the helpers that
// set or remove a condition, and an assignment or append to a status's
// conditions.
var conditionWrite = regexp.MustCompile(`conditions\.Set\(|meta\.SetStatusCondition\(|meta\.RemoveStatusCondition\(|Status\.Conditions\s*=[^=]|append\([^)]*Status\.Conditions`)

// TestConditionWritesOnlyInStatus: status.go is the one place the claim's
// conditions are written (docs/architecture.md, "The claim's reconcile");
// phases, services and the stuck detector record facts. It reads every
// non-test Go file of the package and its subpackages and fails on a
// condition write anywhere else.
func TestConditionWritesOnlyInStatus(t *testing.T) {
	var writes []string
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") || path == "status.go" {
			return err
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for i, line := range strings.Split(string(src), "\n") {
			if code, _, _ := strings.Cut(line, "//"); conditionWrite.MatchString(code) {
				writes = append(writes, fmt.Sprintf("%s:%d: %s", path, i+1, strings.TrimSpace(line)))
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(writes) > 0 {
		t.Errorf("claim conditions written outside status.go (record a fact on the scope instead):\n%s", strings.Join(writes, "\n"))
	}
}

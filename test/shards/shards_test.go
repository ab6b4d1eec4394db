// Package shards checks hack/go-test-shards.sh, which runs the controller
// suite in make test and the race run and the real-guest scenarios in make
// test-guest: a failing test fails the run, and the failed shard's output
// ends with the failure itself, not with the logs that came after it
// (docs/testing.md).
package shards

import (
	"bytes"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/hyperfleet/hyperfleet/internal/testworld/repodir"
)

// TestFailedShardEndsWithItsFailure runs a package of one passing test and
// one that fails and then logs 200 lines (as a controller test's operator
// log does): the run fails, the passing test's shard says ok, and after
// the failed shard's whole output come its test lines again, the failure
// message with its second line and the operator log's file, without the
// logged JSON or the log's tail.
func TestFailedShardEndsWithItsFailure(t *testing.T) {
	cmd := exec.Command("hack/go-test-shards.sh", "-n", "2", "./test/shards/testdata/suite")
	cmd.Dir = repodir.Root()
	// The durations the script records go to a cache of this test's own;
	// the package builds static as every build here does, also under the
	// race run (which turns cgo on for itself).
	cmd.Env = append(os.Environ(), "HYPERFLEET_CACHE="+t.TempDir(), "CGO_ENABLED=0")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	got := out.String()
	if err == nil {
		t.Fatalf("a failing test, and the run succeeded:\n%s", got)
	}
	if !strings.Contains(got, "ok  \tgithub.com/hyperfleet/hyperfleet/test/shards/testdata/suite (shard ") {
		t.Errorf("no ok line for the passing shard:\n%s", got)
	}
	_, why, found := strings.Cut(got, "== why shard ")
	if !found {
		t.Fatalf("no == why shard section:\n%s", got)
	}
	for _, want := range []string{"the reason the shard failed", "its second line, 2", "a line the test logs before it fails",
		"operator log: /tmp/hyperfleet-TestFailsThenLogs.log", "--- FAIL: TestFailsThenLogs"} {
		if !strings.Contains(why, want) {
			t.Errorf("the why section lacks %q:\n%s", want, why)
		}
	}
	for _, never := range []string{`"level"`, "operator log tail", "ileStopped"} {
		if strings.Contains(why, never) {
			t.Errorf("the why section repeats the logged %q:\n%s", never, why)
		}
	}
	if strings.Index(got, "the reason the shard failed") > strings.Index(got, `"n":199`) {
		t.Fatalf("the test's output is not printed whole before the why section:\n%s", got)
	}
}

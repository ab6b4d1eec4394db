// Package suite is the package shards_test runs through
// hack/go-test-shards.sh: one test passes, one fails and then logs as a
// failed controller test does (its operator's JSON lines, from a cleanup).
// It is under testdata, so `go test ./...` never runs it.
package suite

import (
	"fmt"
	"testing"
)

func TestPasses(t *testing.T) {}

func TestFailsThenLogs(t *testing.T) {
	t.Cleanup(func() {
		for i := range 200 {
			t.Logf(`{"level":"info","msg":"Shutdown signal received","n":%d}`, i)
		}
		// As the controller suite's writeLogOnFailure ends a failed test:
		// the whole log's file, then its tail, cut mid-line.
		t.Log("operator log: /tmp/hyperfleet-TestFailsThenLogs.log")
		t.Logf("operator log tail:\n%s", `ileStopped","n":1}`+"\n"+`{"level":"info","msg":"Wait completed"}`)
	})
	t.Log("a line the test logs before it fails")
	t.Errorf("the reason the shard failed\n%s", fmt.Sprintf("its second line, %d", 2))
}

// Package shards checks hack/go-test-shards.sh, which runs the controller
// suite in make test and the race run and the real-guest scenarios in make
// test-guest: a failing test fails the run, and the failed shard's output
// ends with the failure itself, not with the logs that came after it
// (docs/testing.md); and hack/go-test-longest-first.sh, which gives go test
// the other packages longest first by their recorded times.
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

// TestRunSelectsTestsAndKeepsTheOthersDurations runs only the passing test
// (-run, as make test-guest-small does): the run passes although the
// package has a failing test, and the durations file, which held both
// tests, now holds the one that ran with its new time and the other with
// the time recorded before.
func TestRunSelectsTestsAndKeepsTheOthersDurations(t *testing.T) {
	cache := t.TempDir()
	durations := cache + "/test-durations/github.com_hyperfleet_hyperfleet_test_shards_testdata_suite___.tsv"
	if err := os.MkdirAll(cache+"/test-durations", 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(durations, []byte("42.00 TestPasses\n17.50 TestFailsThenLogs\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("hack/go-test-shards.sh", "-n", "2", "-run", "^TestPasses$", "./test/shards/testdata/suite")
	cmd.Dir = repodir.Root()
	cmd.Env = append(os.Environ(), "HYPERFLEET_CACHE="+cache, "CGO_ENABLED=0")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("-run selected only the passing test, and the run failed: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "(shard 0 of 1: 1 tests)") {
		t.Errorf("want one shard of one test:\n%s", out)
	}
	got, err := os.ReadFile(durations)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(got)), "\n")
	if len(lines) != 2 || !strings.HasSuffix(lines[0], " TestPasses") || strings.HasPrefix(lines[0], "42.00 ") || lines[1] != "17.50 TestFailsThenLogs" {
		t.Errorf("durations after the run:\n%s\nwant TestPasses's new time, then TestFailsThenLogs's 17.50 kept", got)
	}
	cmd = exec.Command("hack/go-test-shards.sh", "-run", "^TestNone$", "./test/shards/testdata/suite")
	cmd.Dir = repodir.Root()
	cmd.Env = append(os.Environ(), "HYPERFLEET_CACHE="+cache, "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err == nil || !strings.Contains(string(out), "lists no tests matching ^TestNone$") {
		t.Errorf("a -run that matches nothing: err %v, output:\n%s", err, out)
	}
}

// TestLongestFirstOrdersByRecordedTimes runs two packages through
// hack/go-test-longest-first.sh with recorded times that put the second
// first: go test prints its packages in the order it was given them, so
// suite's FAIL line comes before quick's ok line; the run fails as suite's
// test does, and the times file then holds both packages' new times and
// the time of a package the run left out, as it was.
func TestLongestFirstOrdersByRecordedTimes(t *testing.T) {
	const (
		quick = "github.com/hyperfleet/hyperfleet/test/shards/testdata/quick"
		suite = "github.com/hyperfleet/hyperfleet/test/shards/testdata/suite"
		other = "github.com/hyperfleet/hyperfleet/elsewhere"
	)
	cache := t.TempDir()
	durations := cache + "/test-durations/packages_-count_1_-p_2_.tsv"
	if err := os.MkdirAll(cache+"/test-durations", 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(durations, []byte("1.00 "+quick+"\n90.00 "+suite+"\n33.00 "+other+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("hack/go-test-longest-first.sh", "-count", "1", "-p", "2", "--", quick, suite)
	cmd.Dir = repodir.Root()
	cmd.Env = append(os.Environ(), "HYPERFLEET_CACHE="+cache, "CGO_ENABLED=0")
	out, err := cmd.CombinedOutput()
	if err == nil {
		t.Fatalf("suite's test fails, and the run succeeded:\n%s", out)
	}
	got := string(out)
	failAt, okAt := strings.Index(got, "FAIL\t"+suite+"\t"), strings.Index(got, "ok  \t"+quick+"\t")
	if failAt < 0 || okAt < 0 || failAt > okAt {
		t.Errorf("want suite (90 s last time) run before quick (1 s): FAIL line at %d, ok line at %d:\n%s", failAt, okAt, got)
	}
	recorded, err := os.ReadFile(durations)
	if err != nil {
		t.Fatal(err)
	}
	times := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(recorded)), "\n") {
		secs, pkg, _ := strings.Cut(line, " ")
		times[pkg] = secs
	}
	if len(times) != 3 || times[quick] == "" || times[quick] == "1.00" || times[suite] == "" || times[suite] == "90.00" || times[other] != "33.00" {
		t.Errorf("times after the run:\n%s\nwant quick's and suite's new times and elsewhere's 33.00 kept", recorded)
	}
}

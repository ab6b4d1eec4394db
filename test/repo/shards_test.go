// These tests check hack/go-test-shards.sh, which runs the controller
// suite in make test and the race run and the real-guest scenarios in make
// test-guest: a failing test fails the run, and the failed shard's output
// ends with the failure itself, not with the logs that came after it
// (docs/testing.md); and hack/go-test-longest-first.sh, which gives go test
// the other packages longest first by their recorded times.

package repo

import (
	"bytes"
	"fmt"
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
	cmd := exec.Command("hack/go-test-shards.sh", "-n", "2", "./test/repo/testdata/suite")
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
	if !strings.Contains(got, "ok  \tgithub.com/hyperfleet/hyperfleet/test/repo/testdata/suite (shard ") {
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
	durations := cache + "/test-durations/github.com_hyperfleet_hyperfleet_test_repo_testdata_suite___.tsv"
	if err := os.MkdirAll(cache+"/test-durations", 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(durations, []byte("42.00 TestPasses\n17.50 TestFailsThenLogs\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("hack/go-test-shards.sh", "-n", "2", "-run", "^TestPasses$", "./test/repo/testdata/suite")
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
	cmd = exec.Command("hack/go-test-shards.sh", "-run", "^TestNone$", "./test/repo/testdata/suite")
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
		quick = "github.com/hyperfleet/hyperfleet/test/repo/testdata/quick"
		suite = "github.com/hyperfleet/hyperfleet/test/repo/testdata/suite"
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

// TestDealEvenWithNothingRecorded deals 127 tests into 3 shards as a fresh
// clone does, with no durations recorded (hack/longest-first.awk): each
// shard gets 42 or 43 of them. Before, every test weighed the mean of no
// times, 0 s, and the first shard, always the least loaded, got all of
// them: make test on a new machine ran 125 of the controller suite's 127
// tests in one process. Tests recorded at 0 s count too: they still take
// a place in a shard each.
func TestDealEvenWithNothingRecorded(t *testing.T) {
	for _, recorded := range []string{"", "0.00 Test0\n0.00 Test1\n"} {
		var in strings.Builder
		in.WriteString(recorded)
		for i := range 127 {
			fmt.Fprintf(&in, "- Test%d\n", i)
		}
		cmd := exec.Command("awk", "-v", "groups=3", "-f", "hack/longest-first.awk")
		cmd.Dir = repodir.Root()
		cmd.Stdin = strings.NewReader(in.String())
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("awk: %v", err)
		}
		groups := strings.Split(strings.TrimSuffix(string(out), "\n"), "\n")
		if len(groups) != 3 {
			t.Fatalf("recorded %q: want 3 groups, got %d:\n%s", recorded, len(groups), out)
		}
		for i, g := range groups {
			if n := len(strings.Split(g, "|")); n < 42 || n > 43 {
				t.Errorf("recorded %q: shard %d has %d of 127 tests, want 42 or 43", recorded, i, n)
			}
		}
	}
}

// TestStressListsEachFailure runs hack/test-stress.sh (make test-stress)
// over a package whose test fails and one that passes, twice each: the run
// fails and its table names the failing test, in both runs, with their
// logs, and nothing of the passing package.
func TestStressListsEachFailure(t *testing.T) {
	out := t.TempDir()
	cmd := exec.Command("hack/test-stress.sh")
	cmd.Dir = repodir.Root()
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "STRESS_COUNT=2", "STRESS_PROCS=2", "STRESS_OUT="+out,
		"STRESS_PKGS=./test/repo/testdata/suite ./test/repo/testdata/quick")
	got, err := cmd.CombinedOutput()
	if err == nil {
		t.Fatalf("a test fails in every run, and the stress run succeeded:\n%s", got)
	}
	table, rerr := os.ReadFile(out + "/failures.txt")
	if rerr != nil {
		t.Fatalf("no failure table: %v\n%s", rerr, got)
	}
	if lines := strings.Split(strings.TrimSpace(string(table)), "\n"); len(lines) != 1 ||
		!strings.HasPrefix(lines[0], "TestFailsThenLogs failed in 2 run(s): ") || strings.Count(lines[0], "-run") != 2 {
		t.Errorf("failure table:\n%s\nwant one line: TestFailsThenLogs failed in 2 run(s) with its two logs", table)
	}
	if !strings.Contains(string(got), "test/repo/testdata/quick run 2: ok") {
		t.Errorf("the passing package's runs are not reported ok:\n%s", got)
	}
}

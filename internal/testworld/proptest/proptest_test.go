package proptest

import (
	"os"
	"os/exec"
	"strings"
	"testing"

	"pgregory.net/rapid"
)

// TestFailingPropertyRepeatsItsMessageLast runs a property that fails in
// a child process (this test binary again) and checks that the failure's
// message is the test's last line, after rapid's replay of the case: a CI
// log that keeps only the end of a failing test's output still says why.
func TestFailingPropertyRepeatsItsMessageLast(t *testing.T) {
	if os.Getenv("PROPTEST_CHILD") == "1" {
		Check(t, Minimum, func(rt *rapid.T) {
			n := rapid.IntRange(0, 1000).Draw(rt, "n")
			if n > 10 {
				rt.Fatalf("n is %d, above 10", n)
			}
		})
		return
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestFailingPropertyRepeatsItsMessageLast$", "-test.v", "-rapid.nofailfile")
	cmd.Env = append(os.Environ(), "PROPTEST_CHILD=1")
	out, err := cmd.CombinedOutput()
	if err == nil {
		t.Fatalf("the child's property passed; want it to fail:\n%s", out)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	failAt := -1
	for i, l := range lines {
		if strings.HasPrefix(l, "--- FAIL: TestFailingPropertyRepeatsItsMessageLast") {
			failAt = i
			break
		}
	}
	if failAt < 2 {
		t.Fatalf("no --- FAIL line after the test's output:\n%s", out)
	}
	// The repeated message is the last log entry before the FAIL line: its
	// header, then rapid's message, whose first line names the failure.
	tail := strings.Join(lines[max(0, failAt-8):failAt], "\n")
	header := strings.LastIndex(tail, "proptest: the property failed")
	if header < 0 || !strings.Contains(tail[header:], "n is 11, above 10") {
		t.Fatalf("the last lines before the FAIL line do not repeat the failure (shrunk to n = 11):\n%s", tail)
	}
}

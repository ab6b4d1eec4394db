package main

import (
	"bytes"
	"errors"
	"slices"
	"strings"
	"testing"
)

func TestReadCommands(t *testing.T) {
	cases := []struct {
		name   string
		input  string
		queued []int
		quit   bool
		says   string
		failed error
	}{
		{name: "enter queues one", input: "\n\n", queued: []int{1, 1}},
		{name: "a number queues that many", input: "3\n 12 \n", queued: []int{3, 12}},
		{name: "q stops and ignores the rest", input: "2\nq\n5\n", queued: []int{2}, quit: true},
		{name: "quit stops", input: "quit\n", quit: true},
		{name: "nonsense is explained", input: "many\n0\n1001\n", says: "a number (1-1000) queues that many"},
		{name: "queue errors are shown", input: "\n", queued: []int{1}, failed: errors.New("simulator down"), says: "queue: simulator down"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var queued []int
			enqueue := func(n int) error { queued = append(queued, n); return tc.failed }
			quit := make(chan struct{})
			var out bytes.Buffer
			readCommands(strings.NewReader(tc.input), enqueue, quit, &out)

			if !slices.Equal(queued, tc.queued) {
				t.Errorf("queued %v, want %v", queued, tc.queued)
			}
			closed := false
			select {
			case <-quit:
				closed = true
			default:
			}
			if closed != tc.quit {
				t.Errorf("quit closed = %v, want %v", closed, tc.quit)
			}
			if tc.says != "" && !strings.Contains(out.String(), tc.says) {
				t.Errorf("output %q lacks %q", out.String(), tc.says)
			}
			if tc.says == "" && out.Len() > 0 {
				t.Errorf("unexpected output %q", out.String())
			}
		})
	}
}

func TestDevRejectsBadFlagsBeforeStarting(t *testing.T) {
	for args, want := range map[string]string{
		"--jobs=-1":                         "--jobs must not be negative",
		"--max-replicas=0":                  "need 0 <= min <= max",
		"--min-replicas=3 --max-replicas=2": "need 0 <= min <= max",
		"--platform=jenkins":                `--platform "jenkins": use github, buildkite or gitlab`,
		// Every platform passes the platform check and reaches the next
		// one, before anything starts.
		"--platform=github --jobs=-1":    "--jobs must not be negative",
		"--platform=buildkite --jobs=-1": "--jobs must not be negative",
		"--platform=gitlab --jobs=-1":    "--jobs must not be negative",
	} {
		err := run(strings.Fields(args))
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("run(%s) = %v, want an error containing %q", args, err, want)
		}
	}
}

package githubsim

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"
)

// lockedBuffer is an io.Writer safe for the runner goroutine and the test.
type lockedBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestJITRunner: the in-process runner lives the life run.sh --jitconfig
// lives (TestRunnerScriptsJIT): online, one job, the same lines printed,
// the job's webhooks naming it, removed after its job.
func TestJITRunner(t *testing.T) {
	f := newTLSFixture(t)
	out := f.mustCall("POST", "/orgs/octo-org/actions/runners/generate-jitconfig", testPAT,
		map[string]any{"name": "jit-go-1", "runner_group_id": 2, "labels": []string{"self-hosted", "Linux", "X64", "hyperfleet"}}, 201)
	var printed lockedBuffer
	r := &JITRunner{Client: f.srv.Client(), Out: &printed, PollWait: time.Second}
	type result struct {
		conclusion string
		err        error
	}
	done := make(chan result, 1)
	go func() {
		c, err := r.Run(context.Background(), out["encoded_jit_config"].(string))
		done <- result{c, err}
	}()
	waitFor(t, 20*time.Second, "jit-go-1 online", func() bool {
		rn, ok := f.sim.RunnerByName("jit-go-1")
		return ok && rn.Status == "online"
	})
	job, err := f.sim.EnqueueJob(JobRequest{Repository: "octo-org/app", Labels: []string{"self-hosted", "hyperfleet"}, Duration: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	var res result
	select {
	case res = <-done:
	case <-time.After(30 * time.Second):
		t.Fatalf("the runner did not finish; it printed:\n%s", printed.String())
	}
	if res.err != nil || res.conclusion != "success" {
		t.Fatalf("Run = %q, %v; printed:\n%s", res.conclusion, res.err, printed.String())
	}
	for _, want := range []string{"√ Connected to GitHub", "Listening for Jobs", "Running job: build", "Job build completed with result: Succeeded"} {
		if !strings.Contains(printed.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, printed.String())
		}
	}
	got, _ := f.sim.Job(job.ID)
	if got.Status != "completed" || got.Conclusion != "success" || got.RunnerName != "jit-go-1" {
		t.Errorf("job = %+v", got)
	}
	if _, ok := f.sim.RunnerByName("jit-go-1"); ok {
		t.Error("runner jit-go-1 still registered after its job")
	}
	f.flush()
	if hs := f.hooks.forJob(t, job.ID); actions(hs) != "queued,in_progress,completed" || hs[1].runner != "jit-go-1" {
		t.Errorf("webhooks = %s", actions(hs))
	}

	// A configuration the server does not know is refused, not retried.
	if _, err := r.Run(context.Background(), out["encoded_jit_config"].(string)); err == nil || !strings.Contains(err.Error(), "HTTP") {
		t.Errorf("a removed runner's second run: %v", err)
	}
	for in, want := range map[string]string{"%%%": "not valid base64", "e30=": "has no .runner"} {
		if _, err := DecodeJITConfig(in); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("DecodeJITConfig(%q) = %v, want %q", in, err, want)
		}
	}
}

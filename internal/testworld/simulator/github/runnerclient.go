package githubsim

import (
	"cmp"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// JITRunner runs one just-in-time runner in the calling process: the same
// protocol and the same output lines as the runner package's run.sh
// --jitconfig (connect, "Listening for Jobs", long poll, "Running job:",
// job status until completed), without a shell, curl or sed per step.
// Simulated VMs that must cost the machine nothing but the protocol use it
// (the churn benchmark's in-process guests, test/bench); run.sh stays the
// runner of every guest that runs the real agent.
type JITRunner struct {
	// Client calls the simulator (it must trust its CA).
	Client *http.Client
	// Out receives what run.sh prints on standard output.
	Out io.Writer
	// PollWait is the long polls' wait, for a job and for its status
	// (run.sh's HF_SIM_POLL_WAIT); zero means 20 s.
	PollWait time.Duration
}

// RunnerConfig is what a JIT configuration says about its runner.
type RunnerConfig struct {
	ID        int64
	Name      string
	ServerURL string
	Ephemeral bool
	secret    string
}

// DecodeJITConfig reads an encoded_jit_config (base64 JSON of file name ->
// base64 content) as run.sh's write_config does.
func DecodeJITConfig(encoded string) (RunnerConfig, error) {
	var rc RunnerConfig
	outer, err := base64.StdEncoding.DecodeString(encoded)
	if err != nil {
		return rc, fmt.Errorf("the JIT configuration is not valid base64: %w", err)
	}
	var files map[string]string
	if err := json.Unmarshal(outer, &files); err != nil {
		return rc, fmt.Errorf("the JIT configuration is not a JSON object of files: %w", err)
	}
	file := func(name string, into any) error {
		raw, err := base64.StdEncoding.DecodeString(files[name])
		if err != nil || len(raw) == 0 {
			return fmt.Errorf("the JIT configuration has no %s", name)
		}
		if err := json.Unmarshal(raw, into); err != nil {
			return fmt.Errorf("the JIT configuration's %s: %w", name, err)
		}
		return nil
	}
	var runner struct {
		AgentID   int64  `json:"agentId"`
		AgentName string `json:"agentName"`
		ServerURL string `json:"serverUrl"`
		Ephemeral bool   `json:"ephemeral"`
	}
	var creds struct {
		Data struct {
			Secret string `json:"simRunnerSecret"`
		} `json:"data"`
	}
	if err := file(".runner", &runner); err != nil {
		return rc, err
	}
	if err := file(".credentials", &creds); err != nil {
		return rc, err
	}
	if runner.AgentID == 0 || runner.ServerURL == "" || creds.Data.Secret == "" {
		return rc, errors.New("the JIT configuration is incomplete (agentId, serverUrl, simRunnerSecret)")
	}
	return RunnerConfig{ID: runner.AgentID, Name: runner.AgentName, ServerURL: runner.ServerURL, Ephemeral: runner.Ephemeral, secret: creds.Data.Secret}, nil
}

// Run connects the runner of encoded, takes one job and waits for it to
// complete (an ephemeral runner then exits, as here). It returns the job's
// conclusion, or an error when the server refuses the runner or ctx ends.
func (r *JITRunner) Run(ctx context.Context, encoded string) (string, error) {
	rc, err := DecodeJITConfig(encoded)
	if err != nil {
		return "", err
	}
	base := fmt.Sprintf("%s%srunners/%d", strings.TrimSuffix(rc.ServerURL, "/"), runnerAPIPrefix, rc.ID)
	form, code, err := r.call(ctx, rc, http.MethodPost, base+"/session", url.Values{"os": {"Linux"}})
	if err != nil {
		return "", err
	}
	if code != http.StatusOK {
		return "", fmt.Errorf("connecting runner %s failed (HTTP %d): %s", rc.Name, code, form.Get("error"))
	}
	session := form.Get("session_id")
	r.printf("√ Connected to GitHub\n\nCurrent runner version: 'simulator'\n%s: Listening for Jobs\n", stamp())
	wait := r.pollWait()
	for {
		q := url.Values{"session": {session}, "wait": {strconv.FormatFloat(wait.Seconds(), 'f', -1, 64)}}
		form, code, err := r.call(ctx, rc, http.MethodGet, base+"/message?"+q.Encode(), nil)
		if err != nil {
			return "", err
		}
		switch code {
		case http.StatusNoContent:
			continue
		case http.StatusOK:
		default:
			return "", fmt.Errorf("polling for jobs failed (HTTP %d): %s", code, form.Get("error"))
		}
		return r.runJob(ctx, rc, base, form.Get("job_id"), form.Get("job_name"))
	}
}

// pollWait is the long polls' wait: PollWait, or run.sh's default.
func (r *JITRunner) pollWait() time.Duration { return cmp.Or(max(r.PollWait, 0), 20*time.Second) }

// runJob "runs" the job: it long-polls its status until the simulator says
// it completed.
func (r *JITRunner) runJob(ctx context.Context, rc RunnerConfig, base, id, name string) (string, error) {
	r.printf("%s: Running job: %s\n", stamp(), name)
	wait := strconv.FormatFloat(r.pollWait().Seconds(), 'f', -1, 64)
	for {
		form, code, err := r.call(ctx, rc, http.MethodGet, base+"/jobs/"+url.PathEscape(id)+"?wait="+wait, nil)
		if err != nil {
			return "", err
		}
		if code != http.StatusOK {
			return "", fmt.Errorf("job %s: HTTP %d: %s", id, code, form.Get("error"))
		}
		if form.Get("status") == "completed" {
			result := map[string]string{"success": "Succeeded", "failure": "Failed", "cancelled": "Canceled"}[form.Get("conclusion")]
			r.printf("%s: Job %s completed with result: %s\n", stamp(), name, cmp.Or(result, form.Get("conclusion")))
			return form.Get("conclusion"), nil
		}
		if err := ctx.Err(); err != nil {
			return "", err
		}
	}
}

// call sends one runner API request and reads the key=value answer.
func (r *JITRunner) call(ctx context.Context, rc RunnerConfig, method, u string, form url.Values) (url.Values, int, error) {
	var body io.Reader
	if form != nil {
		body = strings.NewReader(form.Encode())
	}
	req, err := http.NewRequestWithContext(ctx, method, u, body)
	if err != nil {
		return nil, 0, err
	}
	req.Header.Set("Authorization", "Bearer "+rc.secret)
	if form != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	resp, err := r.Client.Do(req)
	if err != nil {
		return nil, 0, fmt.Errorf("runner %s: %w", rc.Name, err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return nil, resp.StatusCode, fmt.Errorf("runner %s: read the answer: %w", rc.Name, err)
	}
	out := url.Values{}
	if resp.StatusCode/100 != 2 {
		// A refusal is one line of text (runnerFail).
		out.Set("error", strings.TrimSpace(string(raw)))
		return out, resp.StatusCode, nil
	}
	for _, line := range strings.Split(string(raw), "\n") {
		if k, v, ok := strings.Cut(line, "="); ok {
			out.Add(k, v)
		}
	}
	return out, resp.StatusCode, nil
}

func (r *JITRunner) printf(format string, args ...any) {
	if r.Out != nil {
		fmt.Fprintf(r.Out, format, args...)
	}
}

func stamp() string { return time.Now().UTC().Format("2006-01-02 15:04:05Z") }

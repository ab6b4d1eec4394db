//go:build !windows

package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/hyperfleet/hyperfleet/internal/agentconfig"
	"github.com/hyperfleet/hyperfleet/internal/testworld/proptest"
	githubsim "github.com/hyperfleet/hyperfleet/internal/testworld/simulator/github"
	"github.com/hyperfleet/hyperfleet/internal/testworld/simulator/github/githubsimtest"
)

// issueOnSim asks the GitHub simulator's REST API, with the PAT, for what
// the operator issues a VM: a JIT configuration or a registration token.
func issueOnSim(gs *githubsimtest.Server, path string, body any) (map[string]any, error) {
	var rd io.Reader
	if body != nil {
		raw, err := json.Marshal(body)
		if err != nil {
			return nil, err
		}
		rd = bytes.NewReader(raw)
	}
	req, err := http.NewRequest(http.MethodPost, gs.URL+path, rd)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "token "+simPAT)
	req.Header.Set("Accept", "application/vnd.github+json")
	resp, err := gs.Client().Do(req)
	if err != nil {
		return nil, fmt.Errorf("POST %s: %w", path, err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusCreated {
		return nil, fmt.Errorf("POST %s: HTTP %d: %s", path, resp.StatusCode, raw)
	}
	out := map[string]any{}
	if err := json.Unmarshal(raw, &out); err != nil {
		return nil, fmt.Errorf("POST %s: %w", path, err)
	}
	return out, nil
}

// registrations counts the runners of that name the simulator ever
// registered (live and removed).
func registrations(gs *githubsimtest.Server, name string) (n int, last githubsim.Runner) {
	st := gs.Sim.State()
	for _, r := range append(st.Runners, st.RemovedRunners...) {
		if r.Name == name {
			n++
			last = r
		}
	}
	return n, last
}

// Feature: hyperfleet-operator, Property 11: CI/CD Platform Integration via VM Bootstrap Service
//
// TestBootstrapServiceProperty: for generated VMs (a JIT configuration or
// a registration token issued on the GitHub simulator as the operator
// issues them), generated deliveries of the credential by the operator
// (before the agent starts, late while it waits, first cut off mid-write
// then whole, or whole and then again after the agent took it) and
// generated outcomes (a job that ends in success, failure or cancellation,
// or no job and an idle timeout of a generated length), the in-VM agent
// with the simulator's own runner package retrieves its credential,
// registers exactly one runner, the job runs on it and ends as GitHub
// ended it, and the agent then cleans up (runner files, work directory,
// downloaded package) and powers the VM off exactly once: with ExitOK after
// the job, ExitIdle after the idle timeout, the runner taking no job; the
// credential never appears in its log.
//
// Not parallel: it sets SSL_CERT_FILE (the simulator's CA), which the
// agent's default HTTP client trusts.
func TestBootstrapServiceProperty(t *testing.T) {
	gs, pkgURL, pkgSHA := startRunnerSimulator(t)

	n := 0
	proptest.Check(t, proptest.Minimum, func(rt *rapid.T) {
		n++
		name := fmt.Sprintf("p11-vm-%d", n)
		token := rapid.Bool().Draw(rt, "registration token")
		delivery := rapid.SampledFrom([]string{"before start", "late", "cut off then whole", "twice"}).Draw(rt, "delivery")
		outcome := rapid.SampledFrom([]string{"success", "failure", "cancelled", "idle"}).Draw(rt, "outcome")

		v := newVM(t)
		v.holdCredential = true
		c := v.baseConfig()
		c.Runner.Software.DownloadURL, c.Runner.Software.DownloadSHA256 = pkgURL, pkgSHA
		if token {
			out, err := issueOnSim(gs, "/repos/octo-org/app/actions/runners/registration-token", nil)
			if err != nil {
				rt.Fatal(err)
			}
			v.secret, _ = out["token"].(string)
			c.BootstrapMethod = agentconfig.BootstrapRunnerToken
			c.RegistrationURL = gs.URL + "/octo-org/app"
			c.Runner.Name, c.Runner.Labels = name, []string{"hyperfleet", name}
		} else {
			out, err := issueOnSim(gs, "/orgs/octo-org/actions/runners/generate-jitconfig",
				map[string]any{"name": name, "runner_group_id": 1, "labels": []string{"self-hosted", "hyperfleet", name}, "work_folder": "_work"})
			if err != nil {
				rt.Fatal(err)
			}
			v.secret, _ = out["encoded_jit_config"].(string)
		}
		if v.secret == "" {
			rt.Fatal("the simulator issued no credential")
		}
		v.writeConfig(c)
		v.opts.DownloadTimeout = time.Minute
		v.opts.IdleTimeout = time.Minute
		if outcome == "idle" {
			v.opts.IdleTimeout = time.Duration(rapid.IntRange(300, 1500).Draw(rt, "idle timeout ms")) * time.Millisecond
		}
		doc, err := json.Marshal(secretsOf(c.BootstrapMethod, v.secret))
		if err != nil {
			rt.Fatal(err)
		}
		secretsPath := filepath.Join(v.root, agentconfig.SecretsFile)
		place := func(b []byte) {
			if err := os.MkdirAll(filepath.Dir(secretsPath), 0o700); err != nil {
				rt.Fatal(err)
			}
			if err := os.WriteFile(secretsPath, b, 0o666); err != nil {
				rt.Fatal(err)
			}
		}
		var job githubsim.Job
		if outcome != "idle" {
			if job, err = gs.Sim.EnqueueJob(githubsim.JobRequest{Repository: "octo-org/app", Labels: []string{"self-hosted", name}, Duration: time.Hour}); err != nil {
				rt.Fatal(err)
			}
		}
		if delivery == "before start" {
			place(doc)
		}
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		done := make(chan int, 1)
		go func() { done <- Run(ctx, v.opts) }()
		switch delivery {
		case "late":
			time.Sleep(time.Duration(rapid.IntRange(0, 400).Draw(rt, "delay ms")) * time.Millisecond)
			place(doc)
		case "cut off then whole":
			place(doc[:rapid.IntRange(0, len(doc)-1).Draw(rt, "cut at")])
			time.Sleep(time.Duration(rapid.IntRange(0, 200).Draw(rt, "write gap ms")) * time.Millisecond)
			place(doc)
		case "twice":
			place(doc)
			for deadline := time.Now().Add(30 * time.Second); !strings.Contains(v.log.String(), "secrets received"); time.Sleep(10 * time.Millisecond) {
				if time.Now().After(deadline) {
					rt.Fatalf("the agent never took its secrets:\n%s", v.log.String())
				}
			}
			place(doc)
		}

		if outcome != "idle" {
			for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(20 * time.Millisecond) {
				j, _ := gs.Sim.Job(job.ID)
				if j.Status == "in_progress" {
					if j.RunnerName != name {
						rt.Fatalf("job taken by %q, want %q", j.RunnerName, name)
					}
					break
				}
				select {
				case code := <-done:
					rt.Fatalf("agent exited %d before the job started (job %+v):\n%s", code, j, v.log.String())
				default:
				}
				if time.Now().After(deadline) {
					rt.Fatalf("the runner did not take the job: %+v\n%s", j, v.log.String())
				}
			}
			if err := gs.Sim.CompleteJob(job.ID, outcome); err != nil {
				rt.Fatal(err)
			}
		}
		var code int
		select {
		case code = <-done:
		case <-time.After(60 * time.Second):
			cancel()
			<-done
			rt.Fatalf("the agent did not finish (outcome %s):\n%s", outcome, v.log.String())
		}

		want := ExitOK
		if outcome == "idle" {
			want = ExitIdle
		}
		if code != want {
			rt.Fatalf("agent exited %d, want %d (outcome %s):\n%s", code, want, outcome, v.log.String())
		}
		if off := v.poweredOff(); off != 1 {
			rt.Fatalf("the VM was powered off %d times, want once", off)
		}
		regs, r := registrations(gs, name)
		if regs != 1 {
			rt.Fatalf("%d runners registered as %s, want exactly one", regs, name)
		}
		if outcome == "idle" {
			if r.JobsRun != 0 || r.Busy {
				rt.Fatalf("the idle runner ran %d jobs (busy %v)", r.JobsRun, r.Busy)
			}
		} else {
			if j, _ := gs.Sim.Job(job.ID); j.Status != "completed" || j.Conclusion != outcome || j.RunnerName != name {
				rt.Fatalf("job %+v, want completed with %s on %s", j, outcome, name)
			}
			if r.JobsRun != 1 {
				rt.Fatalf("runner %s ran %d jobs, want one", name, r.JobsRun)
			}
		}
		if _, err := os.Stat(v.cfgPath); !errors.Is(err, os.ErrNotExist) {
			rt.Fatalf("the agent's config file is still there: %v", err)
		}
		if strings.Contains(v.log.String(), v.secret) {
			rt.Fatalf("the credential is in the agent's log")
		}
		for _, f := range []string{".runner", ".credentials", ".credentials_rsaparams"} {
			if _, err := os.Lstat(filepath.Join(v.install(), f)); !errors.Is(err, os.ErrNotExist) {
				rt.Fatalf("runner credential file %s left behind (%v)", f, err)
			}
		}
		if _, err := os.Lstat(v.install()); !errors.Is(err, os.ErrNotExist) {
			rt.Fatalf("downloaded runner not removed: %v", err)
		}
		if entries, err := os.ReadDir(v.work()); err == nil && len(entries) != 0 {
			rt.Fatalf("work directory not emptied: %v", entries)
		}
	})
}

// secretsOf is the document the operator places for a credential.
func secretsOf(method agentconfig.BootstrapMethod, secret string) agentconfig.GuestSecrets {
	if method == agentconfig.BootstrapRunnerToken {
		return agentconfig.GuestSecrets{RegistrationToken: secret}
	}
	return agentconfig.GuestSecrets{JITConfig: secret}
}

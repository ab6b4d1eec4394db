//go:build !windows

package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"os"
	"os/user"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/hyperfleet/hyperfleet/internal/agentconfig"
	buildkitesim "github.com/hyperfleet/hyperfleet/internal/testworld/simulator/buildkite"
	"github.com/hyperfleet/hyperfleet/internal/testworld/simulator/buildkite/buildkitesimtest"
	"github.com/hyperfleet/hyperfleet/pkg/workload/buildkite/buildkitevm"
)

// TestBuildkiteSimulator runs the agent of a platform buildkite VM against
// the Buildkite simulator with the real buildkite-agent (hack/buildkite-agent),
// downloaded as the simulator's release tarball and checked against its
// SHA-256. Every VM gets a job acquisition token with the job it is for,
// placed as the operator places it:
//
//   - a warm VM, whose config names no job, learns its job from the
//     credential and runs it with `buildkite-agent start --acquire-job`
//     (although another job of its queue came first); buildkite-agent runs
//     as the agent's own user and the job as the runner user (--run-as
//     nobody here), through the hidden buildkite-bootstrap command. The job
//     sees its own access token only, and cannot read buildkite-agent's
//     environment; that token, used from elsewhere, asks for no work,
//     acquires no other job, registers no agent and calls no Stacks API.
//     The agent reports the job, removes the downloaded agent, empties the
//     build path and powers off; the token never appears on a command line
//     or in the log;
//   - a job token whose issuing cluster token was deleted registers
//     nothing: the agent exits ExitRunnerFailed and the job waits;
//   - a credential for another job than its token's acquires nothing (the
//     real agent exits 27, the agent ExitRunnerFailed), and one for another
//     job than the config names is refused before anything runs.
//
// Not parallel: it sets SSL_CERT_FILE (the simulator's CA), which the
// agent's download client and buildkite-agent trust.
func TestBuildkiteSimulator(t *testing.T) {
	bk := buildkitesimtest.Start(t, buildkitesim.Config{})
	caFile := filepath.Join(t.TempDir(), "sim-ca.pem")
	if err := os.WriteFile(caFile, bk.CAPEM, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Setenv("SSL_CERT_FILE", caFile)
	cluster := bk.Sim.CreateCluster("hyperfleet")
	if _, err := bk.Sim.CreateQueue(cluster.ID, "linux"); err != nil {
		t.Fatal(err)
	}
	if err := bk.Sim.CreatePipeline("app", cluster.ID); err != nil {
		t.Fatal(err)
	}
	sum, err := bk.Sim.AgentTarballSHA256()
	if err != nil {
		t.Fatal(err)
	}
	pkgURL := bk.URL + "/_sim/agent/" + buildkitesim.TarballName(bk.Sim.AgentVersion())
	issuer, err := bk.Sim.CreateToken(cluster.ID, "hyperfleet agent stack", time.Now().Add(30*time.Minute))
	if err != nil {
		t.Fatal(err)
	}

	// config is a warm VM's: bootstrapMethod job-token and no job; acquire
	// names one, as for a VM made for a job.
	config := func(v *vm, name, acquire string) *agentconfig.Config {
		c := v.baseConfig()
		c.Platform, c.BootstrapMethod = buildkitevm.Platform, buildkitevm.MethodJobToken
		c.RegistrationURL = bk.URL + "/v3"
		c.Runner = agentconfig.Runner{Name: name, Labels: []string{"queue=linux", "os=linux"}, AcquireJob: acquire, Software: agentconfig.Software{
			DownloadURL: pkgURL, DownloadSHA256: sum, InstallPath: "/opt/buildkite-agent", RunScript: "buildkite-agent",
			WorkDir: "/var/lib/hyperfleet/builds", OS: "linux", Arch: "amd64",
		}}
		v.opts.IdleTimeout, v.opts.DownloadTimeout = time.Minute, time.Minute
		return c
	}
	// run places the credential (token, for job) as the operator does,
	// runs the agent and returns its exit code.
	run := func(v *vm, c *agentconfig.Config, token, job string) int {
		v.secret, v.holdCredential = token, true
		v.writeConfig(c)
		v.placeSecrets(agentconfig.GuestSecrets{RegistrationToken: token, Job: job})
		ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
		defer cancel()
		return v.run(ctx)
	}

	t.Run("warm VM learns its job, which runs as the runner user", func(t *testing.T) {
		b, err := bk.Sim.CreateBuild("app", "warm", []buildkitesim.Step{
			{Key: "first", Command: "echo first", Agents: []string{"queue=linux"}},
			{Key: "bound", Agents: []string{"queue=linux", "os=linux"}, Command: `echo "hello from $(uname -s)"
echo "uid=$(id -u)"
echo "registration token: ${BUILDKITE_AGENT_TOKEN-unset}"
echo "access token: $BUILDKITE_AGENT_ACCESS_TOKEN"
if cat /proc/$BUILDKITE_AGENT_PID/environ >/dev/null 2>&1; then echo "agent environment: read"; else echo "agent environment: refused"; fi
test -d "$PWD"`},
		})
		if err != nil {
			t.Fatal(err)
		}
		first, job := b.JobIDs[0], b.JobIDs[1]
		jat, err := bk.Sim.IssueJobToken(issuer.Secret, "linux", job, 10*time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		v := newVM(t)
		nobody := runnerUser(t, v)
		code := run(v, config(v, "vm-1", ""), jat, job)
		v.checkCommon(code, ExitOK, 1)
		info, _ := bk.Sim.Job(job)
		if info.State != "passed" || info.ExitStatus == nil || *info.ExitStatus != 0 || info.Agent != "vm-1" {
			t.Fatalf("job = %+v; agent log:\n%s", info, v.log.String())
		}
		if other, _ := bk.Sim.Job(first); other.State != "scheduled" || other.Agent != "" {
			t.Errorf("the agent of a job token took another job: %+v", other)
		}
		for _, want := range []string{"hello from Linux", "uid=" + nobody.Uid, "registration token: unset", "access token: " + info.AccessToken} {
			if !strings.Contains(info.Log, want) {
				t.Errorf("the job's log lacks %q:\n%s", want, info.Log)
			}
		}
		if !regexp.MustCompile(`(?m)^agent environment: refused$`).MatchString(info.Log) || strings.Contains(info.Log, jat) {
			t.Errorf("the job read buildkite-agent's environment or its token:\n%s", info.Log)
		}
		m := regexp.MustCompile(`access token: (\S+)`).FindStringSubmatch(info.Log)
		if m == nil || m[1] == "" {
			t.Fatalf("the job saw no access token of its own:\n%s", info.Log)
		}
		stolen := m[1]
		// The job's token, used from elsewhere, serves no other job.
		other, err := bk.Sim.CreateBuild("app", "other", []buildkitesim.Step{{Key: "o", Command: "echo o", Agents: []string{"queue=linux"}}})
		if err != nil {
			t.Fatal(err)
		}
		for _, call := range []struct{ method, path string }{
			{http.MethodGet, "ping"}, {http.MethodPost, "register"},
			{http.MethodPut, "jobs/" + other.JobIDs[0] + "/acquire"}, {http.MethodPut, "jobs/" + first + "/acquire"},
			{http.MethodPost, "stacks/register"}, {http.MethodPut, "jobs/" + job + "/start"},
		} {
			if code := agentAPI(t, bk, call.method, call.path, stolen); code != http.StatusUnauthorized {
				t.Errorf("%s %s with the job's access token: HTTP %d, want 401", call.method, call.path, code)
			}
		}
		for _, id := range []string{first, other.JobIDs[0]} {
			if j, _ := bk.Sim.Job(id); j.State != "scheduled" || j.Agent != "" {
				t.Errorf("job %s after the attack: %+v", id, j)
			}
		}
		for _, a := range bk.Sim.Agents() {
			if a.Name == "vm-1" && (a.State != "disconnected" || a.AcquireJob != job) {
				t.Errorf("agent vm-1 after its job: %+v", a)
			}
		}
		if _, err := os.Lstat(filepath.Join(v.root, "/opt/buildkite-agent")); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("downloaded agent not removed: %v", err)
		}
		if entries, err := os.ReadDir(filepath.Join(v.root, "/var/lib/hyperfleet/builds")); err != nil || len(entries) != 0 {
			t.Errorf("build path not emptied: %v %v", entries, err)
		}
		log := v.log.String()
		for _, want := range []string{"runner package verified", "buildkite-agent online", "job started", "Finished job", "downloaded runner removed", "--bootstrap-script"} {
			if !strings.Contains(log, want) {
				t.Errorf("log lacks %q", want)
			}
		}
	})

	t.Run("revoked job token", func(t *testing.T) {
		revoker, err := bk.Sim.CreateToken(cluster.ID, "hyperfleet agent vm-2", time.Now().Add(30*time.Minute))
		if err != nil {
			t.Fatal(err)
		}
		waiting, err := bk.Sim.CreateBuild("app", "never run", []buildkitesim.Step{{Key: "w", Command: "echo never", Agents: []string{"queue=linux"}}})
		if err != nil {
			t.Fatal(err)
		}
		jat, err := bk.Sim.IssueJobToken(revoker.Secret, "linux", waiting.JobIDs[0], 10*time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		if err := bk.Sim.DeleteToken(cluster.ID, revoker.ID); err != nil {
			t.Fatal(err)
		}
		v := newVM(t)
		v.checkCommon(run(v, config(v, "vm-2", ""), jat, waiting.JobIDs[0]), ExitRunnerFailed, 1)
		if info, _ := bk.Sim.Job(waiting.JobIDs[0]); info.State != "scheduled" || info.Agent != "" {
			t.Errorf("a job ran with a revoked token: %+v", info)
		}
	})

	t.Run("made for the job", func(t *testing.T) {
		b, err := bk.Sim.CreateBuild("app", "bound", []buildkitesim.Step{{Key: "only", Command: "echo second job", Agents: []string{"queue=linux"}}})
		if err != nil {
			t.Fatal(err)
		}
		jat, err := bk.Sim.IssueJobToken(issuer.Secret, "linux", b.JobIDs[0], 10*time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		v := newVM(t)
		v.checkCommon(run(v, config(v, "vm-3", b.JobIDs[0]), jat, b.JobIDs[0]), ExitOK, 1)
		if info, _ := bk.Sim.Job(b.JobIDs[0]); info.State != "passed" || info.Agent != "vm-3" || !strings.Contains(info.Log, "second job") {
			t.Fatalf("bound job = %+v; agent log:\n%s", info, v.log.String())
		}
		if log := v.log.String(); !strings.Contains(log, "job started") || strings.Contains(log, "without a line saying its job started") {
			t.Errorf("the agent did not see the acquired job start:\n%s", log)
		}
	})

	t.Run("credential for another job", func(t *testing.T) {
		b, err := bk.Sim.CreateBuild("app", "mismatch", []buildkitesim.Step{
			{Key: "x", Command: "echo x", Agents: []string{"queue=linux"}},
			{Key: "y", Command: "echo y", Agents: []string{"queue=linux"}},
		})
		if err != nil {
			t.Fatal(err)
		}
		jat, err := bk.Sim.IssueJobToken(issuer.Secret, "linux", b.JobIDs[0], 10*time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		// The token is x's, the credential says y: buildkite-agent asks
		// for y, which the token cannot acquire.
		v := newVM(t)
		v.checkCommon(run(v, config(v, "vm-4", ""), jat, b.JobIDs[1]), ExitRunnerFailed, 1)
		// The config names x, the credential y: refused before anything.
		v = newVM(t)
		v.checkCommon(run(v, config(v, "vm-5", b.JobIDs[0]), jat, b.JobIDs[1]), ExitBadConfig, 1)
		if !strings.Contains(v.log.String(), "runner.acquireJob names job") {
			t.Errorf("the refusal does not say why:\n%s", v.log.String())
		}
		for _, id := range b.JobIDs {
			if info, _ := bk.Sim.Job(id); info.State != "scheduled" || info.Agent != "" {
				t.Errorf("a job ran with a credential for another job: %+v", info)
			}
		}
	})
}

// runnerUser makes v's jobs run as nobody (--run-as) and its root
// reachable by that user, as a VM's / is: the job's build path and the
// agent binary it runs lie under it.
func runnerUser(t *testing.T, v *vm) *user.User {
	t.Helper()
	if os.Getuid() != 0 {
		t.Fatal("this test switches users and must run as root (as the agent does in a VM)")
	}
	u, err := user.Lookup("nobody")
	if err != nil {
		t.Fatal(err)
	}
	openToAll(t, v.root)
	v.opts.RunAs = u.Username
	return u
}

// openToAll lets every user read and enter dir and the directories above
// it (a test's temporary directories are its own user's alone).
func openToAll(t *testing.T, dir string) {
	t.Helper()
	for ; dir != "/" && dir != "."; dir = filepath.Dir(dir) {
		if info, err := os.Stat(dir); err == nil && info.Mode().Perm()&0o005 != 0o005 {
			if err := os.Chmod(dir, info.Mode().Perm()|0o005); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// agentAPI makes one agent-API call to the simulator with token, as a
// process outside the VM that stole it would, and returns the status.
func agentAPI(t *testing.T, bk *buildkitesimtest.Server, method, path, token string) int {
	t.Helper()
	body, _ := json.Marshal(map[string]any{"name": "thief", "key": "thief", "type": "custom", "queue_key": "linux"})
	req, err := http.NewRequest(method, bk.URL+"/v3/"+path, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Token "+token)
	req.Header.Set("Content-Type", "application/json")
	resp, err := bk.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

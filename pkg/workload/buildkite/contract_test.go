package buildkite_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	bksim "github.com/hyperfleet/hyperfleet/internal/testworld/simulator/buildkite"
	"github.com/hyperfleet/hyperfleet/internal/testworld/simulator/buildkite/buildkitesimtest"
	"github.com/hyperfleet/hyperfleet/pkg/workload"
	"github.com/hyperfleet/hyperfleet/pkg/workload/buildkite"
	"github.com/hyperfleet/hyperfleet/pkg/workload/workloadtest"
)

// TestContract runs the workload contract suite, shared with every CI
// platform's back-end, against the Buildkite simulator over HTTPS, for an
// organization-scoped cluster whose runners are the real buildkite-agent
// (hack/buildkite-agent) started as a HyperFleet VM starts it: with the job
// acquisition token of the job its runner is bound to, --acquire-job,
// --disconnect-after-job and the pool's tags. Buildkite's differences from
// GitHub and GitLab are its Capabilities (pkg/workload/workloadtest's
// documentation): every credential binds its runner to one job.
func TestContract(t *testing.T) {
	workloadtest.Run(t, func(t *testing.T) workloadtest.Harness {
		srv := buildkitesimtest.Start(t, bksim.Config{APITokens: []bksim.APIToken{{Token: apiToken, Scopes: bksim.Scopes()}}})
		sim := srv.Sim
		c := sim.CreateCluster("linux")
		if _, err := sim.CreateQueue(c.ID, "linux"); err != nil {
			t.Fatal(err)
		}
		// acme/other is a pipeline of another cluster: outside the scope.
		other := sim.CreateCluster("other")
		for slug, cluster := range map[string]string{"app": c.ID, "other": other.ID} {
			if err := sim.CreatePipeline(slug, cluster); err != nil {
				t.Fatal(err)
			}
		}
		p, err := buildkite.New(buildkite.Config{
			APIURL: srv.URL, AgentEndpoint: srv.URL + "/v3", Organization: "acme", Cluster: c.ID,
			Scope: workload.Scope{Owner: "acme"}, Token: apiToken, Transport: srv.Client().Transport, HTTPTimeout: 5 * time.Second,
		})
		if err != nil {
			t.Fatal(err)
		}
		caFile := filepath.Join(t.TempDir(), "ca.pem")
		if err := os.WriteFile(caFile, srv.CAPEM, 0o600); err != nil {
			t.Fatal(err)
		}
		labels := buildkite.AgentTags("linux", nil)
		var mu sync.Mutex
		started := map[string]bool{}
		start := func(t *testing.T, cred workload.Credential) {
			mu.Lock()
			defer mu.Unlock()
			if !started[cred.RunnerName] {
				started[cred.RunnerName] = true
				startAgent(t, cred, caFile, labels)
			}
		}
		return workloadtest.Harness{
			Capabilities: workloadtest.Capabilities{Expiring: true, EventualRemoval: true, BindsJobs: true},
			Provider:     p,
			Repository:   "acme/app",
			Outside:      "acme/other",
			UnknownJobID: "0190a1b2-0000-4000-8000-000000000001",
			Spec:         workload.RunnerSpec{Labels: labels, Method: buildkite.MethodJobToken, WorkFolder: "/var/lib/hyperfleet/builds"},
			QueueJob: func(t *testing.T, repository string, labels []string) string {
				_, slug, _ := strings.Cut(repository, "/")
				// Long enough to be running while the suite looks; the
				// agent's process group ends with the test.
				b, err := sim.CreateBuild(slug, "contract", []bksim.Step{{Key: "contract", Command: "sleep 30", Agents: labels}})
				if err != nil {
					t.Fatal(err)
				}
				return b.JobIDs[0]
			},
			StartRunner: func(t *testing.T, cred workload.Credential) {
				start(t, cred)
				waitFor(t, 20*time.Second, "the agent is connected", func() bool {
					for _, a := range sim.Agents() {
						if a.Name == cred.RunnerName && a.State == "connected" {
							return true
						}
					}
					return false
				})
			},
			TakeJob: func(t *testing.T, cred workload.Credential, id string) {
				start(t, cred)
				waitFor(t, 20*time.Second, "the agent runs the job", func() bool {
					j, _ := sim.Job(id)
					return j.State == "running" && j.Agent == cred.RunnerName
				})
			},
		}
	})
}

// startAgent starts buildkite-agent for cred until the test ends, as
// internal/agent's Buildkite runner does in a VM (internal/agent/
// buildkite.go), trusting the simulator's CA.
func startAgent(t *testing.T, cred workload.Credential, caFile string, tags []string) {
	t.Helper()
	cmd := exec.Command(buildkitesimtest.AgentBinary(t), "start", "--disconnect-after-job", "--endpoint", cred.RegistrationURL,
		"--name", cred.RunnerName, "--build-path", t.TempDir(), "--tags", strings.Join(tags, ","), "--acquire-job", cred.Job)
	cmd.Env = append(os.Environ(), "BUILDKITE_AGENT_TOKEN="+cred.Secret.Reveal(), "SSL_CERT_FILE="+caFile)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	var out strings.Builder
	var outMu sync.Mutex
	cmd.Stdout = writerFunc(func(b []byte) (int, error) { outMu.Lock(); defer outMu.Unlock(); return out.Write(b) })
	cmd.Stderr = cmd.Stdout
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		// A second SIGTERM makes buildkite-agent cancel its job, which
		// runs in a process group of its own, and exit; a kill of the
		// agent alone would leave the job's process behind.
		for range 2 {
			_ = cmd.Process.Signal(syscall.SIGTERM)
			time.Sleep(100 * time.Millisecond)
		}
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
		if t.Failed() {
			outMu.Lock()
			t.Logf("buildkite-agent %s:\n%s", cred.RunnerName, out.String())
			outMu.Unlock()
		}
	})
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(b []byte) (int, error) { return f(b) }

func waitFor(t *testing.T, d time.Duration, what string, ok func() bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	for !ok() {
		select {
		case <-ctx.Done():
			t.Fatalf("timed out after %v waiting until %s", d, what)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

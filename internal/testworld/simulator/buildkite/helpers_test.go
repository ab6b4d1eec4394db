package buildkitesim

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hyperfleet/hyperfleet/internal/testworld/repodir"
)

// agentBuildScript builds the agent binary the real-agent tests run.
const agentBuildScript = "hack/buildkite-agent/build.sh"

var (
	agentOnce sync.Once
	agentPath string
	agentErr  string
)

// agentBinary returns the test-world buildkite-agent: $BUILDKITE_AGENT
// when set (the Makefile's test targets set it), else what
// hack/buildkite-agent/build.sh prints (building it the first time, a few
// minutes). A binary that cannot be found or built fails the test; it never
// skips.
func agentBinary(t *testing.T) string {
	t.Helper()
	agentOnce.Do(func() {
		path := os.Getenv("BUILDKITE_AGENT")
		if path == "" {
			root := repodir.Root()
			var stdout, stderr bytes.Buffer
			cmd := exec.Command("bash", filepath.Join(root, filepath.FromSlash(agentBuildScript)))
			cmd.Stdout, cmd.Stderr = &stdout, io.MultiWriter(&stderr, os.Stderr)
			if err := cmd.Run(); err != nil {
				agentErr = "building buildkite-agent with " + agentBuildScript + ": " + err.Error() + "\n" + stderr.String()
				return
			}
			path = strings.TrimSpace(stdout.String())
		}
		if info, err := os.Stat(path); err != nil || info.IsDir() || info.Mode()&0o111 == 0 {
			agentErr = "buildkite-agent is not an executable at " + path + " (BUILDKITE_AGENT=" + os.Getenv("BUILDKITE_AGENT") + "; run " + agentBuildScript + ", or make buildkite-agent, and set BUILDKITE_AGENT to the path it prints)"
			return
		}
		agentPath = path
	})
	if agentErr != "" {
		t.Fatal(agentErr)
	}
	return agentPath
}

// world is a simulator behind an HTTP server with one cluster, its token
// and one pipeline.
type world struct {
	sim      *Simulator
	srv      *httptest.Server
	cluster  Cluster
	token    Token
	pipeline string
}

func newWorld(t *testing.T, cfg Config) *world {
	t.Helper()
	// Short intervals, so that an agent's ping after its job and its job
	// status checks do not make the test wait.
	if cfg.PingInterval == 0 {
		cfg.PingInterval = 1
	}
	if cfg.JobStatusInterval == 0 {
		cfg.JobStatusInterval = 1
	}
	sim := New(cfg)
	t.Cleanup(sim.Close)
	srv := httptest.NewServer(sim)
	t.Cleanup(srv.Close)
	c := sim.CreateCluster("hyperfleet")
	tok, err := sim.CreateToken(c.ID, "test", time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	if err := sim.CreatePipeline("app", c.ID); err != nil {
		t.Fatal(err)
	}
	return &world{sim: sim, srv: srv, cluster: c, token: tok, pipeline: "app"}
}

// runAgent runs `buildkite-agent start` with args against the world and
// returns its exit code and output.
func (w *world) runAgent(t *testing.T, token string, args ...string) (int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	full := append([]string{"start", "--endpoint", w.srv.URL + "/v3", "--build-path", t.TempDir()}, args...)
	cmd := exec.CommandContext(ctx, agentBinary(t), full...)
	cmd.Env = append(os.Environ(), "BUILDKITE_AGENT_TOKEN="+token)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	if ctx.Err() != nil {
		t.Fatalf("buildkite-agent %v did not exit within 60 s:\n%s", args, out.String())
	}
	code := 0
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("run buildkite-agent: %v", err)
	}
	if os.Getenv("BK_DEBUG_AGENT") != "" {
		t.Log(out.String())
	}
	return code, out.String()
}

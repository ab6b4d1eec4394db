package gitlabsim

import (
	"crypto/sha256"
	_ "embed"
	"encoding/hex"
	"fmt"
	"net/http"
	"strconv"
	"strings"
)

// runnerStandIn is the test world's stand-in for the gitlab-runner binary
// (runner/gitlab-runner, POSIX sh): it takes `run-single`'s flags for the
// shell executor, and `run`'s (--config, --working-directory, --user), and
// speaks the runner API. The real binary cannot be built here (README.md,
// "Validated against reality").
//
//go:embed runner/gitlab-runner
var runnerStandIn []byte

// runnerPkgPrefix serves the stand-in without authentication, as GitLab's
// runner downloads (gitlab-runner-downloads.s3.amazonaws.com/<version>/
// binaries/gitlab-runner-linux-amd64, with release.sha256 beside it) are.
const runnerPkgPrefix = "/_sim/gitlab-runner/"

// RunnerBinaryNames are the file names served under /_sim/gitlab-runner/,
// the names of GitLab's own Linux runner downloads; all are the same
// script.
var RunnerBinaryNames = []string{"gitlab-runner-linux-amd64", "gitlab-runner-linux-arm64"}

// RunnerStandIn returns the stand-in script and its SHA-256 (hex), which
// /_sim/gitlab-runner/release.sha256 publishes.
func RunnerStandIn() ([]byte, string) {
	sum := sha256.Sum256(runnerStandIn)
	return append([]byte(nil), runnerStandIn...), hex.EncodeToString(sum[:])
}

func (s *Simulator) serveRunnerPackage(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
	name := strings.TrimPrefix(r.URL.Path, runnerPkgPrefix)
	body, sum := RunnerStandIn()
	switch {
	case name == "release.sha256":
		// sha256sum's format, as GitLab's release.sha256 lists its binaries.
		var b strings.Builder
		for _, n := range RunnerBinaryNames {
			fmt.Fprintf(&b, "%s *binaries/%s\n", sum, n)
		}
		body = []byte(b.String())
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	case isRunnerBinary(name):
		w.Header().Set("Content-Type", "application/octet-stream")
	default:
		http.Error(w, "no such file; use gitlab-runner-linux-amd64 or release.sha256", http.StatusNotFound)
		return
	}
	w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	_, _ = w.Write(body)
}

func isRunnerBinary(name string) bool {
	for _, n := range RunnerBinaryNames {
		if n == name {
			return true
		}
	}
	return false
}

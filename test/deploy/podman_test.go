//go:build deploy

package deploy

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hyperfleet/hyperfleet/test/testenv"
)

// podman runs Debian's podman with the settings of hack/podman/setup.sh.
type podman struct {
	env []string
}

// newPodman finds podman and its containers.conf: the test fails, never
// skips, without them.
func newPodman(t *testing.T) *podman {
	t.Helper()
	if _, err := exec.LookPath("podman"); err != nil {
		t.Fatalf("podman is not installed: run hack/podman/setup.sh (make test-deploy does): %v", err)
	}
	conf := os.Getenv("CONTAINERS_CONF")
	if conf == "" {
		// podman is there, so the script only writes the settings.
		out, err := exec.Command(filepath.Join(testenv.RepoRoot(), "hack", "podman", "setup.sh")).Output()
		if err != nil {
			t.Fatalf("hack/podman/setup.sh: %v", err)
		}
		conf = strings.TrimSpace(string(out))
	}
	return &podman{env: append(os.Environ(), "CONTAINERS_CONF="+conf)}
}

// run runs podman with args and returns its standard output; the error
// carries its standard error.
func (p *podman) run(ctx context.Context, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, "podman", args...)
	cmd.Env = p.env
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("podman %s: %w\n%s", strings.Join(args, " "), err, stderr.String())
	}
	return stdout.String(), nil
}

// The image is built once per test binary, for every test that runs it.
var (
	imageOnce sync.Once
	imageErr  error
)

// buildImage builds the image (image) with `make image`, as a developer
// would, once.
func buildImage(t *testing.T, p *podman) {
	t.Helper()
	imageOnce.Do(func() {
		start := time.Now()
		cmd := exec.Command("make", "image", "IMAGE="+image, "CONTAINER_TOOL=podman")
		cmd.Dir = testenv.RepoRoot()
		cmd.Env = p.env
		out, err := cmd.CombinedOutput()
		if err != nil {
			imageErr = fmt.Errorf("make image: %w\n%s", err, out)
			return
		}
		t.Logf("make image built %s in %s", image, time.Since(start).Round(time.Second))
	})
	if imageErr != nil {
		t.Fatal(imageErr)
	}
}

// playedPod is a pod podman kube play started.
type playedPod struct {
	pod, container string
}

// play starts the objects of file and returns the pod and its (only)
// container, as podman 4.3 prints them.
func (p *podman) play(ctx context.Context, file string) (playedPod, error) {
	out, err := p.run(ctx, "kube", "play", file)
	if err != nil {
		return playedPod{}, err
	}
	var pp playedPod
	section := ""
	for _, line := range strings.Split(out, "\n") {
		line = strings.TrimSpace(line)
		switch {
		case line == "Pod:" || line == "Container:" || line == "Containers:":
			section = line
		case line == "":
		case section == "Pod:":
			pp.pod = line
		case section != "" && pp.container == "":
			pp.container = line
		}
	}
	if pp.pod == "" || pp.container == "" {
		return pp, fmt.Errorf("podman kube play printed no pod and container:\n%s", out)
	}
	return pp, nil
}

// logs returns the container's log, both streams.
func (p *podman) logs(ctx context.Context, container string) string {
	cmd := exec.CommandContext(ctx, "podman", "logs", container)
	cmd.Env = p.env
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Sprintf("%s\n(podman logs: %v)", out, err)
	}
	return string(out)
}

//go:build guest

// Package guest boots real Linux guests: the Debian image that
// hack/guest-image builds from docs/templates.md's recipe, in QEMU, behind
// the Proxmox simulator. It proves what the process guests of the other
// tests cannot: that HyperFleet's NoCloud ISO boots, that cloud-init
// applies its user-data and network-config, that the agent starts under
// systemd and reaches the simulators over a real network stack, and that
// the QEMU guest agent reports the addresses. Run with `make test-guest`;
// a missing QEMU or image builder fails the run, never skips it.
package guest

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	proxmoxsim "github.com/hyperfleet/hyperfleet/internal/testworld/simulator/proxmox"
	"github.com/hyperfleet/hyperfleet/test/testenv"
)

var (
	// agentBinary is the hyperfleet-agent built for the guests.
	agentBinary string
	// image is the template image with that agent at
	// /usr/local/bin/hyperfleet-agent (agentSource Image).
	image proxmoxsim.GuestImage
	// operatorImage is the template without an agent (agentSource
	// Operator).
	operatorImage proxmoxsim.GuestImage
)

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	for _, bin := range []string{"qemu-system-x86_64", "qemu-img", "debootstrap", "debugfs", "dnsmasq", "ip"} {
		if _, err := exec.LookPath(bin); err != nil {
			fmt.Fprintf(os.Stderr, "%s is missing: hack/test-deps.sh --guest installs it (make test-guest runs it)\n", bin)
			return 1
		}
	}
	dir, err := os.MkdirTemp("", "hyperfleet-guest-agent-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	agentBinary = filepath.Join(dir, "hyperfleet-agent")
	// Without -buildvcs=false a build in a git checkout stamps the commit
	// into the binary (CI's GOFLAGS override the machine's go env), so every
	// commit made a new agent image and a new saved state: about 30
	// CPU-seconds of QEMU in each CI run although the agent had not changed.
	// The image and its state now change only when the agent does.
	build := exec.Command("go", "build", "-trimpath", "-buildvcs=false", "-o", agentBinary, "./cmd/hyperfleet-agent")
	build.Dir = testenv.RepoRoot()
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "build hyperfleet-agent: %v\n%s", err, out)
		return 1
	}
	start := time.Now()
	if err := buildImage(&image, "--agent", agentBinary); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Fprintf(os.Stderr, "guest image ready in %s: %s\n", time.Since(start).Round(time.Second), image.Disk)
	if err := buildImage(&operatorImage); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return m.Run()
}

// buildImage runs hack/guest-image (which reuses its cache) and reads the
// image it prints.
func buildImage(img *proxmoxsim.GuestImage, args ...string) error {
	cmd := exec.Command("go", append([]string{"run", "./hack/guest-image"}, args...)...)
	cmd.Dir = testenv.RepoRoot()
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, os.Stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("hack/guest-image %v: %w", args, err)
	}
	if err := json.Unmarshal(out.Bytes(), img); err != nil {
		return fmt.Errorf("hack/guest-image %v printed no image: %w\n%s", args, err, out.Bytes())
	}
	return nil
}

// savedStates are the images with their saved state (resumable), built
// at most once per test process, by their hack/guest-image arguments.
var savedStates sync.Map

type savedState struct {
	once sync.Once
	img  proxmoxsim.GuestImage
	err  error
}

// resumable is the image hack/guest-image builds from args with its saved
// state (--state): the image booted once to where it waits for its
// configuration and saved there, which the Proxmox simulator's clones
// resume instead of booting when their machine and seed allow
// (internal/testworld/simulator/proxmox/realguest_resume.go). The state is
// made on first use, then cached with the image (docs/guest-snapshots.md);
// scenarios that test the boot itself use the images without it.
func resumable(t *testing.T, args ...string) proxmoxsim.GuestImage {
	t.Helper()
	v, _ := savedStates.LoadOrStore(strings.Join(args, "\x00"), &savedState{})
	st := v.(*savedState)
	st.once.Do(func() {
		start := time.Now()
		st.err = buildImage(&st.img, append(args, "--state")...)
		if st.err == nil && st.img.State == nil {
			st.err = fmt.Errorf("hack/guest-image %v printed no state", args)
		}
		if st.err != nil {
			return
		}
		t.Logf("saved state ready in %s: %s", time.Since(start).Round(time.Second), st.img.State.File)
	})
	if st.err != nil {
		t.Fatal(st.err)
	}
	return st.img
}

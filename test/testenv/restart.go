package testenv

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"k8s.io/client-go/kubernetes"
)

// RestartAPIServer kills the API server process (SIGKILL, as a crashed or
// fenced control plane node), leaves it down for down, and starts it again
// with the same arguments, certificates and etcd, then waits until it is
// ready: what the operator sees when its control plane restarts. The
// clients made from Config keep working after it. etcd is not touched.
//
// envtest keeps its process handle private, so the process is found by its
// --secure-port (from Config.Host) under /proc and its command line and
// environment are read from there; the restarted process is stopped by
// Stop.
func (e *Environment) RestartAPIServer(ctx context.Context, down time.Duration) error {
	u, err := url.Parse(e.Config.Host)
	if err != nil {
		return fmt.Errorf("testenv: API server URL %q: %w", e.Config.Host, err)
	}
	pid, args, env, err := findAPIServer(u.Port())
	if err != nil {
		return err
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		return fmt.Errorf("testenv: kill the API server (pid %d): %w", pid, err)
	}
	if err := waitGone(ctx, pid); err != nil {
		return err
	}
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(down):
	}
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Env = env
	// Gone with the test process if it dies before Stop.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("testenv: start the API server again: %w", err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	e.restarted = append(e.restarted, restartedProcess{cmd: cmd, done: done})
	return e.waitReady(ctx, done)
}

// restartedProcess is an API server RestartAPIServer started.
type restartedProcess struct {
	cmd  *exec.Cmd
	done chan struct{}
}

// stopRestarted stops the API servers RestartAPIServer started (SIGTERM,
// then SIGKILL after 30 s), before etcd stops.
func (e *Environment) stopRestarted() {
	for _, p := range e.restarted {
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(30 * time.Second):
			_ = p.cmd.Process.Kill()
			<-p.done
		}
	}
	e.restarted = nil
}

// waitReady waits until the API server answers /readyz with ok.
func (e *Environment) waitReady(ctx context.Context, exited <-chan struct{}) error {
	cs, err := kubernetes.NewForConfig(e.Config)
	if err != nil {
		return fmt.Errorf("testenv: %w", err)
	}
	deadline := time.Now().Add(2 * time.Minute)
	for {
		body, err := cs.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
		if err == nil && bytes.Equal(bytes.TrimSpace(body), []byte("ok")) {
			return nil
		}
		select {
		case <-exited:
			return errors.New("testenv: the restarted API server exited before it was ready")
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("testenv: the restarted API server not ready within 2 minutes: %w", err)
		}
	}
}

// findAPIServer is the kube-apiserver process serving on port, with its
// command line and environment.
func findAPIServer(port string) (pid int, args, env []string, err error) {
	procs, err := filepath.Glob("/proc/[0-9]*/cmdline")
	if err != nil {
		return 0, nil, nil, err
	}
	for _, p := range procs {
		b, err := os.ReadFile(p)
		if err != nil || len(b) == 0 {
			continue
		}
		a := strings.Split(strings.TrimSuffix(string(b), "\x00"), "\x00")
		if filepath.Base(a[0]) != "kube-apiserver" || !hasArg(a, "--secure-port="+port) {
			continue
		}
		dir := filepath.Dir(p)
		pid, err = strconv.Atoi(filepath.Base(dir))
		if err != nil {
			continue
		}
		eb, err := os.ReadFile(filepath.Join(dir, "environ"))
		if err != nil {
			return 0, nil, nil, fmt.Errorf("testenv: read the API server's environment: %w", err)
		}
		return pid, a, strings.Split(strings.TrimSuffix(string(eb), "\x00"), "\x00"), nil
	}
	return 0, nil, nil, fmt.Errorf("testenv: no kube-apiserver process with --secure-port=%s", port)
}

func hasArg(args []string, want string) bool {
	for _, a := range args {
		if a == want {
			return true
		}
	}
	return false
}

// waitGone waits until process pid has exited (a zombie counts: its
// parent, envtest, reaps it).
func waitGone(ctx context.Context, pid int) error {
	for range 500 {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			return nil //nolint:nilerr // no /proc entry: the process is gone, which is what was waited for
		}
		if f := strings.Fields(string(b)); len(f) > 2 && f[2] == "Z" {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
	return fmt.Errorf("testenv: the API server (pid %d) did not exit within 5 s of SIGKILL", pid)
}

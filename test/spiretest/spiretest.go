// Package spiretest runs the real SPIRE in tests: a spire-server with the
// join_token node attestor, a trust domain and its admin API on a unix
// socket (StartServer), and, for each simulated VM, a spire-agent attested
// with a join token and serving the Workload API on a unix socket of its own
// (StartAgent).
//
// The binaries are built from the github.com/spiffe/spire module by
// hack/spire/build.sh into a cache directory outside the repository
// (docs/testing.md). They come from SPIRE_DIR when it is set (the Makefile's
// test-spire target sets it), and otherwise from that script, which builds
// them on first use. A missing binary fails the test, never skips it: a
// suite that silently skips its SPIRE tests proves nothing.
//
// Every process writes its log to a file in the test's temporary directory;
// when the test fails, the logs are written to the test's output. Processes
// are stopped by t.Cleanup, agents before the server they attest to.
package spiretest

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// BuildScript builds the binaries and prints their directory; a path from
// the repository's root.
const BuildScript = "hack/spire/build.sh"

var (
	dirOnce sync.Once
	dir     string
	dirErr  error
)

// SpireDir returns the directory holding spire-server and spire-agent:
// $SPIRE_DIR when set, else what hack/spire/build.sh prints (it builds them
// on first use, which takes about 15 minutes on 2 cores). A missing binary,
// or a build that fails, fails the test.
func SpireDir(t testing.TB) string {
	t.Helper()
	dirOnce.Do(func() { dir, dirErr = findSpireDir() })
	if dirErr != nil {
		t.Fatalf("no SPIRE binaries: %v", dirErr)
	}
	return dir
}

func findSpireDir() (string, error) {
	d := os.Getenv("SPIRE_DIR")
	if d == "" {
		script := filepath.Join(repoRoot(), filepath.FromSlash(BuildScript))
		var stdout, stderr bytes.Buffer
		cmd := exec.Command("bash", script)
		cmd.Stdout = &stdout
		// The first build takes minutes: its progress goes to the test
		// binary's standard error as well.
		cmd.Stderr = io.MultiWriter(&stderr, os.Stderr)
		if err := cmd.Run(); err != nil {
			return "", fmt.Errorf("building spire-server and spire-agent with %s: %w\n%s", BuildScript, err, stderr.String())
		}
		d = strings.TrimSpace(stdout.String())
	}
	for _, bin := range []string{"spire-server", "spire-agent"} {
		info, err := os.Stat(filepath.Join(d, bin))
		if err != nil || info.IsDir() || info.Mode()&0o111 == 0 {
			return "", fmt.Errorf("%s is not an executable in %s (SPIRE_DIR=%q; run %s, or make spire, and set SPIRE_DIR to the directory it prints)",
				bin, d, os.Getenv("SPIRE_DIR"), BuildScript)
		}
	}
	return d, nil
}

// repoRoot is the repository's top directory, found from this file's path
// (as test/testenv's RepoRoot does) so that tests work from any directory.
func repoRoot() string {
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		panic("spiretest: cannot find the source file's path")
	}
	return filepath.Clean(filepath.Join(filepath.Dir(file), "..", ".."))
}

// process is a SPIRE binary running with its output in a log file.
type process struct {
	name    string
	logPath string
	cmd     *exec.Cmd
	done    chan struct{}
	// err is what Wait returned; read it only after done is closed.
	err      error
	stopOnce sync.Once
}

// startProcess runs bin with args, its standard output and error going to
// logPath. t.Cleanup stops it and, when the test failed, writes its log to
// the test's output.
func startProcess(t testing.TB, name, logPath, bin string, args ...string) *process {
	t.Helper()
	logFile, err := os.Create(logPath)
	if err != nil {
		t.Fatalf("creating the %s log: %v", name, err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout = logFile
	cmd.Stderr = logFile
	// Its own process group, so that a terminal's Ctrl-C reaches the test
	// binary, which stops the process itself.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		_ = logFile.Close()
		t.Fatalf("starting %s: %v", name, err)
	}
	p := &process{name: name, logPath: logPath, cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		_ = logFile.Close()
		close(p.done)
	}()
	t.Cleanup(func() {
		p.stop()
		if t.Failed() {
			t.Logf("%s log (%s):\n%s", name, logPath, p.log())
		}
	})
	return p
}

// stop ends the process: SIGTERM, then SIGKILL after 10 seconds. It waits
// for the process to exit and may be called more than once.
func (p *process) stop() {
	p.stopOnce.Do(func() {
		select {
		case <-p.done:
			return
		default:
		}
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(10 * time.Second):
			_ = p.cmd.Process.Kill()
			<-p.done
		}
	})
}

// exitErr returns nil while the process runs, else how it ended.
func (p *process) exitErr() error {
	select {
	case <-p.done:
		if p.err == nil {
			return fmt.Errorf("%s exited with status 0", p.name)
		}
		return fmt.Errorf("%s exited: %w", p.name, p.err)
	default:
		return nil
	}
}

// maxLogDump bounds what a failed test prints of one log: its end, where
// the failure is.
const maxLogDump = 64 << 10

// log returns the process's log so far, its last maxLogDump bytes when
// longer.
func (p *process) log() string {
	b, err := os.ReadFile(p.logPath)
	if err != nil {
		return fmt.Sprintf("(reading %s: %v)", p.logPath, err)
	}
	if len(b) > maxLogDump {
		return fmt.Sprintf("(first %d bytes left out)\n%s", len(b)-maxLogDump, b[len(b)-maxLogDump:])
	}
	return string(b)
}

// socketDir returns a new directory for unix sockets. A socket's path is
// limited to 107 bytes, which a t.TempDir() path (named after the test)
// can come close to, so sockets live in a short directory of their own,
// removed by t.Cleanup.
func socketDir(t testing.TB) string {
	t.Helper()
	d, err := os.MkdirTemp("", "spire")
	if err != nil {
		t.Fatalf("creating a socket directory: %v", err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(d) })
	return d
}

// freeLoopbackAddress returns a 127.0.0.1 address whose port was free a
// moment ago.
func freeLoopbackAddress(t testing.TB) *net.TCPAddr {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("finding a free loopback port: %v", err)
	}
	addr := l.Addr().(*net.TCPAddr)
	if err := l.Close(); err != nil {
		t.Fatalf("finding a free loopback port: %v", err)
	}
	return addr
}

// writeFile writes a configuration or bundle file, failing the test on
// error.
func writeFile(t testing.TB, path string, content []byte) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, content, 0o600); err != nil {
		t.Fatal(err)
	}
}

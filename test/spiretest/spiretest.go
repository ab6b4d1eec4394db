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
	"os"
	"testing"

	"github.com/hyperfleet/hyperfleet/internal/testworld/spireworld"
)

// SpireDir returns the directory holding spire-server and spire-agent:
// $SPIRE_DIR when set, else what hack/spire/build.sh prints (it builds them
// on first use, which takes about 4 minutes on 2 cores). A missing binary,
// or a build that fails, fails the test.
func SpireDir(t testing.TB) string {
	t.Helper()
	dir, err := spireworld.Dir()
	if err != nil {
		t.Fatalf("no SPIRE binaries: %v", err)
	}
	return dir
}

// process is a SPIRE binary running with its output in a log file.
type process = spireworld.Process

// startProcess runs bin with args, its standard output and error going to
// logPath. t.Cleanup stops it and, when the test failed, writes its log to
// the test's output.
func startProcess(t testing.TB, name, logPath, bin string, args ...string) *process {
	t.Helper()
	p, err := spireworld.StartProcess(name, logPath, bin, args...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stopAndDump(t, name, logPath, p) })
	return p
}

// stopAndDump stops p and, when the test failed, writes its log to the
// test's output.
func stopAndDump(t testing.TB, name, logPath string, p *process) {
	p.Stop()
	if t.Failed() {
		t.Logf("%s log (%s):\n%s", name, logPath, p.Log())
	}
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

// writeFile writes a configuration or bundle file, failing the test on
// error.
func writeFile(t testing.TB, path string, content []byte) {
	t.Helper()
	if err := spireworld.WriteFile(path, content); err != nil {
		t.Fatal(err)
	}
}

// Package extdns is external-dns for tests: its DNSEndpoint CRD (a copy of
// the one external-dns v0.21.0 releases, which the tests install into their
// API server; HyperFleet's chart does not ship it) and the real external-dns
// binary, run against a test's API server and a real DNS server
// (internal/testworld/dnsserver) with its rfc2136 provider, as
// docs/networking.md ("DNS registration through external-dns") tells a
// platform team to run it.
//
// The binary comes from EXTERNAL_DNS when it is set (the Makefile sets it),
// else from hack/external-dns/build.sh, which builds it from external-dns's
// Go module on first use and caches it outside the repository. A missing
// binary fails the test, never skips it.
package extdns

import (
	"bytes"
	_ "embed"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/yaml"

	"github.com/hyperfleet/hyperfleet/internal/testworld/repodir"
)

// BuildScript builds the binary (from the repository's root).
const BuildScript = "hack/external-dns/build.sh"

//go:embed dnsendpoints.externaldns.k8s.io.yaml
var crdYAML []byte

// CRD is external-dns's DNSEndpoint CustomResourceDefinition.
func CRD() (*apiextensionsv1.CustomResourceDefinition, error) {
	crd := &apiextensionsv1.CustomResourceDefinition{}
	if err := yaml.UnmarshalStrict(crdYAML, crd); err != nil {
		return nil, fmt.Errorf("the DNSEndpoint CRD: %w", err)
	}
	return crd, nil
}

// CRDDir is the directory holding the CRD's manifest, and nothing else a
// CRD installer reads: for test/testenv's StartWithCRDs.
func CRDDir() string { return repodir.Path("internal/testworld/extdns") }

// InstallCRD installs the DNSEndpoint CRD into the API server cfg reaches
// and waits until it is served; installing it again changes nothing.
func InstallCRD(t testing.TB, cfg *rest.Config) {
	t.Helper()
	crd, err := CRD()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := envtest.InstallCRDs(cfg, envtest.CRDInstallOptions{CRDs: []*apiextensionsv1.CustomResourceDefinition{crd}}); err != nil {
		t.Fatalf("install the DNSEndpoint CRD: %v", err)
	}
}

var (
	binOnce sync.Once
	binPath string
	binErr  error
)

// Binary returns the external-dns binary: $EXTERNAL_DNS when set, else
// what BuildScript prints (building it the first time, a few minutes).
func Binary() (string, error) {
	binOnce.Do(func() { binPath, binErr = findBinary() })
	return binPath, binErr
}

func findBinary() (string, error) {
	path := os.Getenv("EXTERNAL_DNS")
	if path == "" {
		script := filepath.Join(repoRoot(), filepath.FromSlash(BuildScript))
		var stdout, stderr bytes.Buffer
		cmd := exec.Command("bash", script)
		cmd.Stdout = &stdout
		cmd.Stderr = io.MultiWriter(&stderr, os.Stderr)
		if err := cmd.Run(); err != nil {
			return "", fmt.Errorf("building external-dns with %s: %w\n%s", BuildScript, err, stderr.String())
		}
		path = strings.TrimSpace(stdout.String())
	}
	if info, err := os.Stat(path); err != nil || info.IsDir() || info.Mode()&0o111 == 0 {
		return "", fmt.Errorf("external-dns is not an executable at %s (EXTERNAL_DNS=%q; run %s, or make external-dns, and set EXTERNAL_DNS to the path it prints)",
			path, os.Getenv("EXTERNAL_DNS"), BuildScript)
	}
	return path, nil
}

// repoRoot is the repository's top directory, found from this file's path.
func repoRoot() string {
	return filepath.Clean(filepath.Join(CRDDir(), "..", "..", ".."))
}

// Options say what an external-dns publishes, and where.
type Options struct {
	// KubeConfig is a kubeconfig file's content reaching the API server
	// (test/testenv's Environment.KubeConfig).
	KubeConfig []byte
	// Namespace limits it to the DNSEndpoints of one namespace; empty
	// watches every namespace.
	Namespace string
	// LabelFilter limits it to the DNSEndpoints with these labels (a
	// label selector, such as hyperfleet.io/dns-provider=external-dns).
	LabelFilter string
	// Server is the DNS server's address, host:port; Zones are the zones
	// it serves that external-dns may change (forward and reverse).
	Server string
	Zones  []string
	// KeyName and KeySecret are the TSIG key (HMAC-SHA256) that may update
	// and transfer the zones.
	KeyName, KeySecret string
	// OwnerID is its TXT registry's owner id; empty means "hyperfleet-test".
	OwnerID string
}

// Process is a running external-dns; it stops at the end of the test.
type Process struct {
	out *logBuffer
}

// Logs returns what it printed so far.
func (p *Process) Logs() string { return p.out.String() }

// Start runs external-dns as a platform team would for HyperFleet
// (docs/networking.md): the CRD source, the rfc2136 provider with zone
// transfers, the TXT registry, policy sync, and A, AAAA and PTR managed;
// here syncing every second rather than every minute. It fails the test
// when the binary is missing or exits.
func Start(t testing.TB, o Options) *Process {
	t.Helper()
	bin, err := Binary()
	if err != nil {
		t.Fatalf("no external-dns: %v", err)
	}
	dir := t.TempDir()
	kubeconfig := filepath.Join(dir, "kubeconfig")
	if err := os.WriteFile(kubeconfig, o.KubeConfig, 0o600); err != nil {
		t.Fatal(err)
	}
	host, port, err := net.SplitHostPort(o.Server)
	if err != nil {
		t.Fatalf("DNS server %q: %v", o.Server, err)
	}
	if _, err := strconv.Atoi(port); err != nil {
		t.Fatalf("DNS server %q: %v", o.Server, err)
	}
	owner := o.OwnerID
	if owner == "" {
		owner = "hyperfleet-test"
	}
	args := []string{
		"--kubeconfig=" + kubeconfig,
		"--source=crd",
		"--crd-source-apiversion=externaldns.k8s.io/v1alpha1",
		"--crd-source-kind=DNSEndpoint",
		"--provider=rfc2136",
		"--rfc2136-host=" + host,
		"--rfc2136-port=" + port,
		"--rfc2136-tsig-keyname=" + strings.TrimSuffix(o.KeyName, "."),
		"--rfc2136-tsig-secret=" + o.KeySecret,
		"--rfc2136-tsig-secret-alg=hmac-sha256",
		"--rfc2136-tsig-axfr",
		"--registry=txt",
		"--txt-owner-id=" + owner,
		"--policy=sync",
		"--managed-record-types=A",
		"--managed-record-types=AAAA",
		"--managed-record-types=PTR",
		"--interval=1s",
		"--min-event-sync-interval=1s",
		"--metrics-address=127.0.0.1:0",
		"--log-level=debug",
	}
	for _, z := range o.Zones {
		z = strings.TrimSuffix(z, ".")
		args = append(args, "--rfc2136-zone="+z, "--domain-filter="+z)
	}
	if o.Namespace != "" {
		args = append(args, "--namespace="+o.Namespace)
	}
	if o.LabelFilter != "" {
		args = append(args, "--label-filter="+o.LabelFilter)
	}
	out := &logBuffer{}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = out, out
	// No cloud credentials or proxies of the machine's: nothing here
	// talks to anything but the test's API server and DNS server.
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + dir}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start external-dns: %v", err)
	}
	done := make(chan struct{})
	var waitErr error
	go func() { waitErr = cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		select {
		case <-done:
			t.Errorf("external-dns exited during the test: %v\n%s", waitErr, out)
			return
		default:
		}
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
		if t.Failed() {
			t.Logf("external-dns output:\n%s", out)
		}
	})
	return &Process{out: out}
}

// logBuffer collects a process's output.
type logBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

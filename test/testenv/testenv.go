// Package testenv starts a real kube-apiserver and etcd with HyperFleet's
// CRDs installed, for tests that need the API server's own validation,
// defaulting and watch behaviour.
//
// The binaries come from KUBEBUILDER_ASSETS when it is set (the Makefile
// sets it), and otherwise from hack/envtest/build.sh, which builds them from
// source on first use and caches them outside the repository. A missing
// binary is a test failure, never a skip: a suite that silently skips its
// API-server tests proves nothing. The helm CLI that renders the chart for
// the chart's tests and the deployment test comes the same way from HELM or
// hack/helm/build.sh (HelmPath, Helm).
package testenv

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/testworld/repodir"
)

// Environment is a running API server with the HyperFleet CRDs installed.
type Environment struct {
	// Config reaches the API server as a cluster administrator.
	Config *rest.Config
	// Client is a direct (uncached) client with the HyperFleet scheme.
	Client client.Client
	// Scheme knows the built-in kinds and HyperFleet's.
	Scheme *k8sruntime.Scheme

	env *envtest.Environment
	// restarted are the API servers RestartAPIServer started.
	restarted []restartedProcess
}

// RepoRoot is the repository's top directory, so that tests work from any
// package directory (internal/testworld/repodir: also in -trimpath builds).
func RepoRoot() string { return repodir.Root() }

// AssetsDir returns the directory holding kube-apiserver and etcd, building
// them if needed.
func AssetsDir() (string, error) {
	return AssetsDirWithProgress(nil)
}

// AssetsDirWithProgress is AssetsDir that also copies the build script's
// progress messages to progress (when not nil): the first build takes
// minutes and a user should see why they wait.
func AssetsDirWithProgress(progress io.Writer) (string, error) {
	if dir := os.Getenv("KUBEBUILDER_ASSETS"); dir != "" {
		return dir, checkAssets(dir)
	}
	dir, err := runBuildScript("hack/envtest/build.sh", "the envtest binaries", progress)
	if err != nil {
		return "", err
	}
	return dir, checkAssets(dir)
}

// HelmPath returns the helm CLI that the chart's tests run: $HELM when set
// (the Makefile sets it), else the binary hack/helm/build.sh builds from
// helm's Go module on first use and caches outside the repository.
func HelmPath() (string, error) {
	path := os.Getenv("HELM")
	if path == "" {
		var err error
		if path, err = runBuildScript("hack/helm/build.sh", "helm", nil); err != nil {
			return "", err
		}
	}
	if info, err := os.Stat(path); err != nil || info.IsDir() || info.Mode()&0o111 == 0 {
		return "", fmt.Errorf("helm is not an executable at %s (HELM=%q; run hack/helm/build.sh, or make helm, and set HELM to the path it prints)", path, os.Getenv("HELM"))
	}
	return path, nil
}

// runBuildScript runs one of the repository's build scripts (a path from
// the repository's root) and returns what it prints, the path of what it
// built; its progress messages go to progress too when not nil.
func runBuildScript(script, what string, progress io.Writer) (string, error) {
	path := filepath.Join(RepoRoot(), filepath.FromSlash(script))
	var stdout, stderr bytes.Buffer
	cmd := exec.Command("bash", path)
	cmd.Stdout = &stdout
	cmd.Stderr = &stderr
	if progress != nil {
		cmd.Stderr = io.MultiWriter(&stderr, progress)
	}
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("building %s with %s: %w\n%s", what, script, err, stderr.String())
	}
	return strings.TrimSpace(stdout.String()), nil
}

func checkAssets(dir string) error {
	for _, bin := range []string{"kube-apiserver", "etcd"} {
		if _, err := os.Stat(filepath.Join(dir, bin)); err != nil {
			return fmt.Errorf("envtest binary %s missing in %s (run `make envtest`): %w", bin, dir, err)
		}
	}
	return nil
}

// NewScheme returns a scheme with the built-in kinds and HyperFleet's.
func NewScheme() (*k8sruntime.Scheme, error) {
	scheme := k8sruntime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		return nil, fmt.Errorf("adding the built-in kinds to the scheme: %w", err)
	}
	if err := hfv1.AddToScheme(scheme); err != nil {
		return nil, fmt.Errorf("adding the HyperFleet kinds to the scheme: %w", err)
	}
	return scheme, nil
}

// Start starts etcd and kube-apiserver and installs the CRDs from
// config/crd/bases. Call Stop when done.
func Start() (*Environment, error) {
	return StartWithProgress(nil)
}

// StartWithProgress is Start that reports the first build of the binaries
// to progress (see AssetsDirWithProgress).
func StartWithProgress(progress io.Writer) (*Environment, error) {
	return start(progress, []string{filepath.Join(RepoRoot(), "config", "crd", "bases")})
}

// StartWithCRDs is Start that also installs the CRDs of extraCRDDirs,
// such as external-dns's DNSEndpoint (internal/testworld/extdns.CRDDir):
// kinds of other projects that HyperFleet writes.
func StartWithCRDs(extraCRDDirs ...string) (*Environment, error) {
	return start(nil, append([]string{filepath.Join(RepoRoot(), "config", "crd", "bases")}, extraCRDDirs...))
}

// StartWithoutCRDs starts etcd and kube-apiserver with no CRD installed,
// for tests that install the CRDs the way a user does (test/chart installs,
// upgrades and uninstalls the chart with helm). Call Stop when done.
func StartWithoutCRDs() (*Environment, error) {
	return start(nil, nil)
}

// start starts the API server and installs the CRDs of crdDirs (none when
// empty).
func start(progress io.Writer, crdDirs []string) (*Environment, error) {
	// envtest logs through controller-runtime's logger; without one it
	// prints a warning with a stack trace instead.
	logf.SetLogger(logr.Discard())
	assets, err := AssetsDirWithProgress(progress)
	if err != nil {
		return nil, err
	}
	scheme, err := NewScheme()
	if err != nil {
		return nil, err
	}
	env := &envtest.Environment{
		CRDDirectoryPaths:     crdDirs,
		ErrorIfCRDPathMissing: true,
		// Generous: with every test package starting its own API server
		// on two loaded cores, the default 20 s is sometimes not enough.
		ControlPlaneStartTimeout: 3 * time.Minute,
		ControlPlaneStopTimeout:  time.Minute,
		BinaryAssetsDirectory:    assets,
		Scheme:                   scheme,
	}
	// API Priority and Fairness sorts each request into a flow and a
	// queue and accounts for its seats: bookkeeping the tests' few clients
	// never need, which cost about 8 % of the CPU of the controller suite's
	// API server and test process together (two property tests, twice each
	// way, 64 and 68 CPU-s with it, 61 and 59 without: docs/testing.md, "CI
	// timings"). Every test package, world and CI step starts its API
	// servers here, and CI's steps are bound by the cores.
	env.ControlPlane.GetAPIServer().Configure().Set("enable-priority-and-fairness", "false")
	cfg, err := env.Start()
	if err != nil {
		return nil, fmt.Errorf("starting kube-apiserver and etcd from %s: %w", assets, err)
	}
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		_ = env.Stop()
		return nil, fmt.Errorf("creating a client for the test API server: %w", err)
	}
	return &Environment{Config: cfg, Client: c, Scheme: scheme, env: env}, nil
}

// Stop stops the API server and etcd and removes their data.
func (e *Environment) Stop() error {
	if e == nil || e.env == nil {
		return nil
	}
	e.stopRestarted()
	if err := e.env.Stop(); err != nil {
		return fmt.Errorf("stopping the test API server: %w", err)
	}
	return nil
}

// KubeConfig is a kubeconfig file's content that reaches the API server
// as a cluster administrator.
func (e *Environment) KubeConfig() []byte { return e.env.KubeConfig }

// CRDNames lists the CRDs the environment installed.
func (e *Environment) CRDNames() []string {
	names := make([]string, 0, len(e.env.CRDs))
	for _, crd := range e.env.CRDs {
		names = append(names, crd.Name)
	}
	return names
}

// Run is a TestMain body: it starts an environment (with the CRDs of
// extraCRDDirs too, see StartWithCRDs), stores it in *env, runs the
// package's tests and stops the environment. A failure to start fails the
// package.
func Run(m *testing.M, env **Environment, extraCRDDirs ...string) int {
	started, err := StartWithCRDs(extraCRDDirs...)
	if err != nil {
		fmt.Fprintf(os.Stderr, "FAIL: %v\n", err)
		return 1
	}
	*env = started
	code := m.Run()
	if err := started.Stop(); err != nil {
		fmt.Fprintf(os.Stderr, "%v\n", err)
		if code == 0 {
			code = 1
		}
	}
	return code
}

// Lazy starts an environment on first use, so that a package's unit and
// fuzz tests run without an API server. Use Get in tests and Main as the
// TestMain body.
type Lazy struct {
	once sync.Once
	env  *Environment
	err  error
}

// Get returns the environment, starting it on the first call; a failure to
// start fails the test.
func (l *Lazy) Get(t testing.TB) *Environment {
	t.Helper()
	l.once.Do(func() { l.env, l.err = Start() })
	if l.err != nil {
		t.Fatalf("starting the test API server: %v", l.err)
	}
	return l.env
}

// Main runs the package's tests and stops the environment if one started.
func (l *Lazy) Main(m *testing.M) int {
	code := m.Run()
	if l.env != nil {
		if err := l.env.Stop(); err != nil {
			fmt.Fprintf(os.Stderr, "%v\n", err)
			if code == 0 {
				code = 1
			}
		}
	}
	return code
}

// Watch watches list's kind, with opts, for as long as t runs: the
// diagnostics that tell what each write of an object changed.
func (e *Environment) Watch(t testing.TB, list client.ObjectList, opts ...client.ListOption) watch.Interface {
	t.Helper()
	c, err := client.NewWithWatch(e.Config, client.Options{Scheme: e.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	wi, err := c.Watch(ctx, list, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return wi
}

// Package managerproc runs the manager binary built from cmd/hyperfleet as
// its own process against an internal/testworld/devenv World (Options.ExternalOperator),
// with the flags a Deployment gives it, the agent server included: what the
// benchmarks (test/bench) and the flood test (test/flood) measure, as in
// production, its RSS from /proc. It is test code: nothing in cmd/ imports it.
package managerproc

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"syscall"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/hyperfleet/hyperfleet/internal/agentserver"
	"github.com/hyperfleet/hyperfleet/internal/testworld/bench"
	"github.com/hyperfleet/hyperfleet/internal/testworld/devenv"
	"github.com/hyperfleet/hyperfleet/test/testenv"
)

// Process is the manager binary running as its own process.
type Process struct {
	Cmd *exec.Cmd
	// MetricsURL is its /metrics (plain HTTP), PprofURL its
	// /debug/pprof.
	MetricsURL, PprofURL string
	// WebhookURL is the webhook receiver's https:// URL (path
	// /webhooks/github), WebhookAddr its host:port.
	WebhookURL, WebhookAddr string
	// AgentServerAddr is the agent server's host:port (its URL is
	// https://AgentServerAddr).
	AgentServerAddr string
	// ReadyzURL is its readiness endpoint (/readyz, plain HTTP; verbose
	// with ?verbose).
	ReadyzURL string
	// LogFile is the manager's log.
	LogFile string

	// exited is closed once the process has exited.
	exited chan struct{}
}

// Options say what to run.
type Options struct {
	// Binary is the manager binary (GoBuild of ./cmd/hyperfleet).
	Binary string
	// AgentBinary is the hyperfleet-agent binary the agent server
	// serves, as hyperfleet-agent-linux-<GOARCH>.
	AgentBinary string
	// CAFile is what the manager trusts for GitHub (SSL_CERT_FILE).
	CAFile string
	// Args are more flags.
	Args []string
	// LeaderElect runs the replicas with --leader-elect (off by default:
	// one process).
	LeaderElect bool
	// AgentServerURL is the agent server's URL as the VMs reach it
	// (--agent-server-url): a Service in front of the replicas. Empty:
	// the replica's own address.
	AgentServerURL string
}

// GoBuild builds pkg (such as ./cmd/hyperfleet) into dir and returns the
// binary's path.
func GoBuild(t testing.TB, dir, pkg string) string {
	t.Helper()
	out := filepath.Join(dir, filepath.Base(pkg))
	cmd := exec.Command("go", "build", "-o", out, pkg)
	cmd.Dir = testenv.RepoRoot()
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build %s: %v\n%s", pkg, err, b)
	}
	return out
}

// FreeAddr is a loopback address with a port nothing listens on now.
func FreeAddr(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// Start runs the manager against the world with the flags a Deployment
// would give it, the agent server on (as the chart's agentServer.enabled:
// it serves the agent and takes the guests' power-off notices), and waits
// until its metrics endpoint answers. The process is interrupted when the
// test ends.
func Start(t testing.TB, w *devenv.World, o Options) *Process {
	t.Helper()
	return Prepare(t, w, o).Start(t)
}

// Deployment is what the manager's replicas share, as a Deployment's pods
// do: the webhook Secret, the serving certificates, the agent binaries.
type Deployment struct {
	w        *devenv.World
	o        Options
	certDir  string
	agentDir string
	replicas int
}

// Prepare writes what every replica of the manager needs (the receiver's
// certificate where --webhook-cert-dir wants it, the webhook Secret, the
// agent binaries' directory); Start starts each replica.
func Prepare(t testing.TB, w *devenv.World, o Options) *Deployment {
	t.Helper()
	ctx := context.Background()
	in := w.OperatorInputs()
	d := &Deployment{w: w, o: o, certDir: filepath.Join(w.Dir(), "webhook-tls"), agentDir: filepath.Join(w.Dir(), "agent-binaries")}
	if err := os.MkdirAll(d.certDir, 0o700); err != nil {
		t.Fatal(err)
	}
	for src, dst := range map[string]string{in.WebhookCertFile: "tls.crt", in.WebhookKeyFile: "tls.key"} {
		b, err := os.ReadFile(src)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(d.certDir, dst), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.API.Client.Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: in.Namespace, Name: "hyperfleet-github-webhook"},
		Data:       in.WebhookSecretData,
	}); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(d.agentDir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(o.AgentBinary, filepath.Join(d.agentDir, agentserver.FilePrefix+"linux-"+runtime.GOARCH)); err != nil {
		t.Fatal(err)
	}
	return d
}

// Start starts one more replica, on ports of its own, and waits until its
// metrics endpoint answers. The first replica logs to manager.log, the
// next ones to manager-2.log and so on. It is interrupted when the test
// ends, if it still runs.
func (d *Deployment) Start(t testing.TB) *Process {
	t.Helper()
	d.replicas++
	in := d.w.OperatorInputs()
	metricsAddr, webhookAddr, pprofAddr, agentAddr, probeAddr := FreeAddr(t), FreeAddr(t), FreeAddr(t), FreeAddr(t), FreeAddr(t)
	logName := "manager.log"
	if d.replicas > 1 {
		logName = fmt.Sprintf("manager-%d.log", d.replicas)
	}
	p := &Process{
		MetricsURL: "http://" + metricsAddr + "/metrics", PprofURL: "http://" + pprofAddr + "/debug/pprof", ReadyzURL: "http://" + probeAddr + "/readyz",
		WebhookURL: "https://" + webhookAddr + "/webhooks/github", WebhookAddr: webhookAddr,
		AgentServerAddr: agentAddr, LogFile: filepath.Join(d.w.Dir(), logName),
		exited: make(chan struct{}),
	}
	logFile, err := os.Create(p.LogFile)
	if err != nil {
		t.Fatal(err)
	}
	agentURL := d.o.AgentServerURL
	if agentURL == "" {
		agentURL = "https://" + agentAddr
	}
	cmd := exec.Command(d.o.Binary, append([]string{"manager",
		"--namespace", in.Namespace,
		fmt.Sprintf("--leader-elect=%t", d.o.LeaderElect),
		"--metrics-bind-address", metricsAddr,
		// Plain HTTP, scraped by the benchmarks (the binary's default is
		// the chart's: HTTPS with authentication).
		"--metrics-secure=false",
		"--health-probe-bind-address", probeAddr,
		"--pprof-bind-address", pprofAddr,
		"--webhook-bind-address", webhookAddr,
		"--webhook-cert-dir", d.certDir,
		"--github-webhook-api-host", in.GitHubAPIHost,
		"--runnerpool-resync-interval", in.ResyncInterval.String(),
		"--orphan-sweep-interval", in.SweepInterval.String(),
		"--claim-max-retry-delay", in.MaxRetryDelay.String(),
		"--agent-server-addr", agentAddr,
		"--agent-server-url", agentURL,
		"--agent-server-cert", in.AgentServerCertFile,
		"--agent-server-key", in.AgentServerKeyFile,
		"--agent-server-ca", in.AgentServerCAFile,
		"--agent-binaries-dir", d.agentDir,
	}, d.o.Args...)...)
	// controller-runtime reads KUBECONFIG; Go's TLS, SSL_CERT_FILE.
	cmd.Env = append(os.Environ(), "KUBECONFIG="+d.w.KubeconfigPath, "SSL_CERT_FILE="+d.o.CAFile)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	// A test killed before its cleanup (a timeout, a SIGTERM) takes its
	// replicas with it instead of leaving them to reconcile on.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p.Cmd = cmd
	go func() { _ = cmd.Wait(); close(p.exited) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(os.Interrupt)
		select {
		case <-p.exited:
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
			<-p.exited
		}
		_ = logFile.Close()
	})
	deadline := time.Now().Add(2 * time.Minute)
	for {
		if _, err := p.Scrape(); err == nil {
			break
		}
		select {
		case <-p.exited:
			b, _ := os.ReadFile(p.LogFile)
			t.Fatalf("the manager exited (%s) before its metrics endpoint answered; its log ends:\n%s", cmd.ProcessState, Tail(b, 4<<10))
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("the manager's metrics endpoint did not answer within 2 minutes; log: %s", p.LogFile)
		}
		time.Sleep(200 * time.Millisecond)
	}
	return p
}

// Kill kills the process (SIGKILL, as a crash or an OOM kill) and waits
// until it has exited.
func (p *Process) Kill() {
	_ = p.Cmd.Process.Kill()
	<-p.exited
}

// Exited reports whether the process has exited.
func (p *Process) Exited() bool {
	select {
	case <-p.exited:
		return true
	default:
		return false
	}
}

// IsLeader reports whether the process holds the leader lease
// (controller-runtime's leader_election_master_status gauge).
func (p *Process) IsLeader() (bool, error) {
	fams, err := p.Scrape()
	if err != nil {
		return false, err
	}
	for _, m := range fams["leader_election_master_status"].GetMetric() {
		if m.GetGauge().GetValue() == 1 {
			return true, nil
		}
	}
	return false, nil
}

// Usage is the process's memory and CPU time now.
func (p *Process) Usage(t testing.TB) bench.Usage {
	t.Helper()
	u, err := bench.ReadUsage(p.Cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	return u
}

// Scrape reads the process's /metrics.
func (p *Process) Scrape() (map[string]*dto.MetricFamily, error) {
	resp, err := http.Get(p.MetricsURL)
	if err != nil {
		return nil, fmt.Errorf("scrape: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("scrape: %s", resp.Status)
	}
	var tp expfmt.TextParser
	fams, err := tp.TextToMetricFamilies(bufio.NewReader(resp.Body))
	if err != nil {
		return nil, fmt.Errorf("scrape: %w", err)
	}
	return fams, nil
}

// Counters sums the counter family name of the process's /metrics by the
// key of each series' labels.
func (p *Process) Counters(name string, key func(map[string]string) string) (map[string]float64, error) {
	fams, err := p.Scrape()
	if err != nil {
		return nil, err
	}
	out := map[string]float64{}
	if f := fams[name]; f != nil {
		for _, m := range f.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			out[key(labels)] += m.GetCounter().GetValue()
		}
	}
	return out, nil
}

// Tail is the last n bytes of b (of a log).
func Tail(b []byte, n int) []byte {
	if len(b) > n {
		return b[len(b)-n:]
	}
	return b
}

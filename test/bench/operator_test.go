//go:build bench

package bench

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/hyperfleet/hyperfleet/internal/agentserver"
	"github.com/hyperfleet/hyperfleet/internal/bench"
	"github.com/hyperfleet/hyperfleet/internal/devenv"
	"github.com/hyperfleet/hyperfleet/test/testenv"
)

// operator is the manager binary running as its own process, as in
// production: what its RSS and CPU are measured on.
type operator struct {
	cmd        *exec.Cmd
	metricsURL string
	webhookURL string
	pprofURL   string
}

// goBuild builds pkg into dir and returns the binary's path.
func goBuild(t *testing.T, dir, pkg string) string {
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

func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// startOperator runs the manager binary against the world with the flags
// a Deployment would give it; caFile is what it trusts for GitHub.
func startOperator(t *testing.T, w *devenv.World, binary, agentBin, caFile string) *operator {
	t.Helper()
	ctx := context.Background()
	in := w.OperatorInputs()
	// The receiver's serving certificate, where --webhook-cert-dir wants
	// it, and the webhook secret, where --github-webhook-secret names it.
	certDir := filepath.Join(w.Dir(), "webhook-tls")
	if err := os.MkdirAll(certDir, 0o700); err != nil {
		t.Fatal(err)
	}
	for src, dst := range map[string]string{in.WebhookCertFile: "tls.crt", in.WebhookKeyFile: "tls.key"} {
		b, err := os.ReadFile(src)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(certDir, dst), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.API.Client.Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: in.Namespace, Name: "hyperfleet-github-webhook"},
		Data:       in.WebhookSecretData,
	}); err != nil {
		t.Fatal(err)
	}
	// The agent server, as the chart runs it with agentServer.enabled:
	// it takes the guests' power-off notices (docs/architecture.md,
	// "Power-off hints").
	agentDir := filepath.Join(w.Dir(), "agent-binaries")
	if err := os.MkdirAll(agentDir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(agentBin, filepath.Join(agentDir, agentserver.FilePrefix+"linux-"+runtime.GOARCH)); err != nil {
		t.Fatal(err)
	}
	metricsAddr, webhookAddr, pprofAddr, agentAddr := freeAddr(t), freeAddr(t), freeAddr(t), freeAddr(t)
	logFile, err := os.Create(filepath.Join(w.Dir(), "manager.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(binary, "manager",
		"--namespace", in.Namespace,
		"--leader-elect=false",
		"--metrics-bind-address", metricsAddr,
		"--health-probe-bind-address", "0",
		"--pprof-bind-address", pprofAddr,
		"--webhook-bind-address", webhookAddr,
		"--webhook-cert-dir", certDir,
		"--runnerpool-resync-interval", in.ResyncInterval.String(),
		"--orphan-sweep-interval", in.SweepInterval.String(),
		"--claim-max-retry-delay", in.MaxRetryDelay.String(),
		"--agent-server-addr", agentAddr,
		"--agent-server-url", "https://"+agentAddr,
		"--agent-server-cert", in.AgentServerCertFile,
		"--agent-server-key", in.AgentServerKeyFile,
		"--agent-server-ca", in.AgentServerCAFile,
		"--agent-binaries-dir", agentDir,
	)
	if os.Getenv("HF_BENCH_LOGS") != "" {
		// Kept for study: the debug lines too (each webhook's record,
		// each hint).
		cmd.Args = append(cmd.Args, "--zap-log-level=debug", "--zap-time-encoding=rfc3339nano")
	}
	// controller-runtime reads KUBECONFIG; Go's TLS, SSL_CERT_FILE.
	cmd.Env = append(os.Environ(), "KUBECONFIG="+w.KubeconfigPath, "SSL_CERT_FILE="+caFile)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(os.Interrupt)
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
		_ = logFile.Close()
	})
	op := &operator{cmd: cmd, metricsURL: "http://" + metricsAddr + "/metrics", webhookURL: "https://" + webhookAddr + "/webhooks/github", pprofURL: "http://" + pprofAddr + "/debug/pprof"}
	deadline := time.Now().Add(2 * time.Minute)
	for {
		if _, err := op.kubeCalls(); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the manager's metrics endpoint did not answer within 2 minutes; log: %s", filepath.Join(w.Dir(), "manager.log"))
		}
		time.Sleep(200 * time.Millisecond)
	}
	return op
}

func (o *operator) usage(t *testing.T) bench.Usage {
	t.Helper()
	u, err := bench.ReadUsage(o.cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	return u
}

// kubeCalls reads the operator's Kubernetes API requests, by verb, from
// client-go's rest_client_requests_total on its /metrics.
func (o *operator) kubeCalls() (map[string]float64, error) {
	return o.counters("rest_client_requests_total", func(labels map[string]string) string {
		return strings.ToUpper(labels["method"])
	})
}

// kubeCallsByResource reads the same requests by verb, resource and
// subresource, from hyperfleet_kube_api_requests_total.
func (o *operator) kubeCallsByResource() (map[string]float64, error) {
	return o.counters("hyperfleet_kube_api_requests_total", func(labels map[string]string) string {
		k := labels["verb"] + " " + labels["resource"]
		if s := labels["subresource"]; s != "" {
			k += "/" + s
		}
		return k
	})
}

// scrape reads the operator's /metrics.
func (o *operator) scrape() (map[string]*dto.MetricFamily, error) {
	resp, err := http.Get(o.metricsURL)
	if err != nil {
		return nil, fmt.Errorf("scrape: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("scrape: %s", resp.Status)
	}
	var p expfmt.TextParser
	fams, err := p.TextToMetricFamilies(bufio.NewReader(resp.Body))
	if err != nil {
		return nil, fmt.Errorf("scrape: %w", err)
	}
	return fams, nil
}

// histogram reads the sum and count of one of the operator's histograms.
func (o *operator) histogram(name string) (float64, uint64, error) {
	fams, err := o.scrape()
	if err != nil {
		return 0, 0, err
	}
	var sum float64
	var n uint64
	if f := fams[name]; f != nil {
		for _, m := range f.GetMetric() {
			sum, n = sum+m.GetHistogram().GetSampleSum(), n+m.GetHistogram().GetSampleCount()
		}
	}
	return sum, n, nil
}

// counters sums the counter family name of the operator's /metrics by the
// key of each series' labels.
func (o *operator) counters(name string, key func(map[string]string) string) (map[string]float64, error) {
	fams, err := o.scrape()
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

// cpuProfile saves a CPU profile of the operator over d into file.
func (o *operator) cpuProfile(file string, d time.Duration) error {
	resp, err := http.Get(fmt.Sprintf("%s/profile?seconds=%d", o.pprofURL, int(d.Seconds())))
	if err != nil {
		return fmt.Errorf("profile: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("profile: %s", resp.Status)
	}
	f, err := os.Create(file)
	if err != nil {
		return fmt.Errorf("profile: %w", err)
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		_ = f.Close()
		return fmt.Errorf("profile: %w", err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("profile: %w", err)
	}
	return nil
}

func sum(m map[string]float64) float64 {
	var s float64
	for _, v := range m {
		s += v
	}
	return s
}

//go:build bench

package bench

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/hyperfleet/hyperfleet/internal/testworld/bench"
	"github.com/hyperfleet/hyperfleet/internal/testworld/devenv"
	"github.com/hyperfleet/hyperfleet/test/managerproc"
)

// operator is the manager binary running as its own process, as in
// production: what its RSS and CPU are measured on.
type operator struct {
	*managerproc.Process
}

// startOperator runs the manager binary against the world with the flags
// a Deployment would give it; caFile is what it trusts for GitHub.
func startOperator(t *testing.T, w *devenv.World, binary, agentBin, caFile string) *operator {
	t.Helper()
	// The templates' credentials Secrets are in the pool's namespace and
	// in the load namespaces: watched, they are read once per version
	// (internal/manager's credentialReads), as a Deployment whose
	// --secret-namespaces lists its tenants' namespaces reads them.
	o := managerproc.Options{Binary: binary, AgentBinary: agentBin, CAFile: caFile, Args: []string{"--secret-namespaces=*"}}
	if os.Getenv("HF_BENCH_LOGS") != "" {
		// Kept for study: the debug lines too (each webhook's record,
		// each hint).
		o.Args = append(o.Args, "--zap-log-level=debug", "--zap-time-encoding=rfc3339nano")
	}
	return &operator{managerproc.Start(t, w, o)}
}

func (o *operator) usage(t *testing.T) bench.Usage { return o.Usage(t) }

// kubeCalls reads the operator's Kubernetes API requests, by verb, from
// client-go's rest_client_requests_total on its /metrics.
func (o *operator) kubeCalls() (map[string]float64, error) {
	return o.Counters("rest_client_requests_total", func(labels map[string]string) string {
		return strings.ToUpper(labels["method"])
	})
}

// kubeCallsByResource reads the same requests by verb, resource and
// subresource, from hyperfleet_kube_api_requests_total.
func (o *operator) kubeCallsByResource() (map[string]float64, error) {
	return o.Counters("hyperfleet_kube_api_requests_total", func(labels map[string]string) string {
		k := labels["verb"] + " " + labels["resource"]
		if s := labels["subresource"]; s != "" {
			k += "/" + s
		}
		return k
	})
}

// histogram reads the sum and count of one of the operator's histograms.
func (o *operator) histogram(name string) (float64, uint64, error) {
	fams, err := o.Scrape()
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

// cpuProfile saves a CPU profile of the operator over d into file.
func (o *operator) cpuProfile(file string, d time.Duration) error {
	resp, err := http.Get(fmt.Sprintf("%s/profile?seconds=%d", o.PprofURL, int(d.Seconds())))
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

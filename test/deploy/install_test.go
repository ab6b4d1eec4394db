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
	"testing"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/hyperfleet/hyperfleet/test/testenv"
)

const (
	// chartDir is the Helm chart, from the repository's root.
	chartDir = "charts/hyperfleet"
	// releaseName gives the release config/'s object names
	// (hyperfleet-manager, ...), as the chart's README installs it.
	releaseName = "hyperfleet"
	// installTimeout bounds helm install --wait: the pod is Ready within
	// seconds of its start, or never (a readiness that waits for
	// something the mode lacks).
	installTimeout = 2 * time.Minute
)

// values are the chart's values (charts/hyperfleet/values.yaml) the test
// sets; the chart's defaults, and the mode's values file, hold for the rest.
type values map[string]any

// cluster is an API server helm installs into, as an administrator: its
// admin kubeconfig in a file.
type cluster struct {
	kubeconfig string
}

func newCluster(t *testing.T, kubeconfig []byte) *cluster {
	t.Helper()
	file := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(file, kubeconfig, 0o600); err != nil {
		t.Fatal(err)
	}
	return &cluster{kubeconfig: file}
}

// helm runs the helm CLI (testenv.HelmPath) against the cluster from the
// repository's root, with a configuration, cache and data directory of its
// own, until ctx ends (the stand-in's failure ends a helm install --wait
// that would otherwise wait for its timeout). It returns helm's output,
// and an error carrying it.
func (c *cluster) helm(ctx context.Context, t *testing.T, args ...string) (string, error) {
	t.Helper()
	bin, err := testenv.HelmPath()
	if err != nil {
		t.Fatalf("no helm CLI: %v", err)
	}
	home := t.TempDir()
	cmd := exec.CommandContext(ctx, bin, append(args, "--kubeconfig", c.kubeconfig)...)
	cmd.Dir = testenv.RepoRoot()
	cmd.Env = append(os.Environ(),
		"HELM_CACHE_HOME="+filepath.Join(home, "cache"),
		"HELM_CONFIG_HOME="+filepath.Join(home, "config"),
		"HELM_DATA_HOME="+filepath.Join(home, "data"),
	)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return out.String(), fmt.Errorf("helm %s: %w\n%s", strings.Join(args, " "), err, out.String())
	}
	return out.String(), nil
}

// install is `helm install --wait` of the chart into namespace, with the
// values files (from the repository's root) and then v: it returns once
// every object is ready, the manager's Deployment included (its pod
// Ready), as helm decides. extra are more flags of helm install.
func (c *cluster) install(ctx context.Context, t *testing.T, namespace string, files []string, v values, extra ...string) (string, error) {
	t.Helper()
	data, err := yaml.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "values.yaml")
	if err := os.WriteFile(file, data, 0o600); err != nil {
		t.Fatal(err)
	}
	args := []string{"install", releaseName, chartDir, "--namespace", namespace, "--wait", "--timeout", installTimeout.String()}
	for _, f := range files {
		args = append(args, "--values", f)
	}
	args = append(append(args, "--values", file), extra...)
	return c.helm(ctx, t, args...)
}

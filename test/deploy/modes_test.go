//go:build deploy

package deploy

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/hyperfleet/hyperfleet/internal/testworld/docblocks"
)

// modesNamespace is where every mode is installed, one after another.
const modesNamespace = "hyperfleet-system"

// mode is one way of installing the chart (docs/install.md, "Pick your
// mode") besides GitHub's webhooks, which TestManifestsRunTheLoop installs.
type mode struct {
	name string
	// values is the mode's values file, which test/chart renders too.
	values string
	// receiver: the mode runs the webhook receiver, which serves (and the
	// pod is Ready) once the Secret hyperfleet-webhook-tls holds its
	// certificate; the test creates that Secret for these modes only.
	receiver bool
	// monitored: the install's metrics are scraped by a real Prometheus
	// through the chart's ServiceMonitor (servicemonitor_test.go).
	monitored bool
	// secret is the receiver's webhook Secret, as docs/install.md has the
	// administrator create it; loaded is the manager's log line once it
	// read it.
	secret *corev1.Secret
	loaded string
	// docs: the mode is installed by docs/install.md's example of it, run
	// as written (its Secrets and helm install --wait), not by the test's
	// own Secrets and install.
	docs bool
}

// webhookTLS is the receiver's certificate Secret, the chart's default
// name for the release.
const webhookTLS = "hyperfleet-webhook-tls"

var modes = []mode{
	{name: "scale-set", values: "test/chart/testdata/mode-scale-set.yaml", monitored: true},
	{name: "GitLab", values: "test/chart/testdata/mode-gitlab.yaml", receiver: true, docs: true,
		secret: &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: modesNamespace, Name: "hyperfleet-gitlab-webhook"},
			Data: map[string][]byte{"owner.acme..platform": []byte("gitlab-hook-token")}},
		loaded: "Loaded the GitLab webhook Secret"},
	{name: "Buildkite", values: "test/chart/testdata/mode-buildkite.yaml", receiver: true,
		secret: &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: modesNamespace, Name: "hyperfleet-buildkite-webhook"},
			Data: map[string][]byte{"owner.acme": []byte("buildkite-notification-token")}},
		loaded: "Loaded the Buildkite webhook Secret"},
}

// TestEveryModeInstalls: helm install --wait of the chart completes, the
// manager's pod Ready, in GitHub's scale-set mode (no receiver, no
// certificate, no webhook Secret), GitLab only and Buildkite only (no
// GitHub webhook Secret): one after another, helm uninstall between, into
// an API server of their own (no world: only the install is in question).
// The manager's log must not report a missing webhook Secret, and each
// receiver must have read its platform's Secret.
func TestEveryModeInstalls(t *testing.T) {
	ctx := context.Background()
	pm := newPodman(t)
	buildImage(t, pm)
	env := bareAPIServer(t)
	admin := env.Client
	// The release's namespace, and the namespace of the templates whose
	// Secrets the manager reads (docs/install.md's secretNamespaces={ci}).
	for _, ns := range []string{modesNamespace, "ci"} {
		if err := admin.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
			t.Fatal(err)
		}
	}
	cert, key := selfSignedTLS(t, "hyperfleet-webhooks."+modesNamespace+".svc")
	tls := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: modesNamespace, Name: webhookTLS}, Type: corev1.SecretTypeTLS,
		Data: map[string][]byte{"tls.crt": cert, "tls.key": key}}
	c := newCluster(t, env.KubeConfig())
	apiURL, err := url.Parse(env.Config.Host)
	if err != nil {
		t.Fatal(err)
	}
	prepareMonitoring(ctx, t, admin, env.Config, modesNamespace)
	start := time.Now()
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			// The mode's Secrets, before the chart (the kubelet mounts them
			// when it starts the pod), and gone with the release.
			var secrets []*corev1.Secret
			if m.receiver {
				secrets = append(secrets, tls.DeepCopy())
			}
			if m.secret != nil {
				secrets = append(secrets, m.secret.DeepCopy())
			}
			for _, s := range secrets {
				if !m.docs {
					if err := admin.Create(ctx, s); err != nil {
						t.Fatal(err)
					}
				}
				t.Cleanup(func() {
					if err := admin.Delete(ctx, s); err != nil {
						t.Error(err)
					}
				})
			}
			k := &kubelet{reader: admin, apiHost: apiURL.Hostname(), apiPort: apiURL.Port(), caPEM: env.Config.CAData, dir: filepath.Join(t.TempDir(), "kubelet")}
			ro, installCtx := startRollout(ctx, t, pm, admin, env.Config, k, client.ObjectKey{Namespace: modesNamespace, Name: deploymentName})
			installed := time.Now()
			var err error
			if m.docs {
				err = installModeAsDocumented(installCtx, t, c, m, tls)
			} else {
				_, err = c.install(installCtx, t, modesNamespace, []string{m.values}, modeValues(t, m))
			}
			// Registered after the rollout's cleanup, so run before it:
			// the release goes, then its pod.
			t.Cleanup(func() {
				if _, err := c.helm(ctx, t, "uninstall", releaseName, "--namespace", modesNamespace); err != nil {
					t.Error(err)
				}
			})
			if err != nil {
				t.Fatalf("%v\nthe rollout: %v", err, ro.failure())
			}
			t.Logf("helm install --wait completed in %s (%s mode)", time.Since(installed).Round(100*time.Millisecond), m.name)
			checkModeLog(t, m, pm.logs(ctx, ro.container()))
			if m.monitored {
				checkServiceMonitorScraped(ctx, t, admin, env.Config, modesNamespace)
			}
		})
	}
	t.Logf("%d modes installed in %s", len(modes), time.Since(start).Round(100*time.Millisecond))
}

// modeValues are the values every install sets (the image) and the
// ports of this machine, loopback only as in TestManifestsRunTheLoop;
// the receiver's only in a mode that has one (its listener flag would
// turn it on).
func modeValues(t *testing.T, m mode) values {
	t.Helper()
	ports := freePorts(t, 3)
	metricsAddr, probeAddr, webhookAddr := ports[0], ports[1], ports[2]
	v := values{
		"image":     values{"repository": imageRepository, "tag": imageTag},
		"metrics":   values{"port": portOf(t, metricsAddr)},
		"probePort": portOf(t, probeAddr),
		"extraArgs": []string{"--metrics-bind-address=" + metricsAddr, "--health-probe-bind-address=" + probeAddr},
	}
	if m.monitored {
		mv := monitoredValues()
		mv["port"] = portOf(t, metricsAddr)
		v["metrics"] = mv
	}
	if m.receiver {
		v["webhook"] = values{"port": portOf(t, webhookAddr)}
		v["extraArgs"] = append(v["extraArgs"].([]string), "--webhook-bind-address="+webhookAddr)
	}
	return v
}

// installModeAsDocumented runs docs/install.md's example of mode m, the
// block marked run-by TestEveryModeInstalls, as written: its Secrets
// (the receiver's certificate from tls, the webhook Secret's token as the
// mode's secret holds it) and its helm install --wait, with the image
// built here in place of the page's and this machine's ports added
// (modeValues, by the helm on PATH).
func installModeAsDocumented(ctx context.Context, t *testing.T, c *cluster, m mode, tls *corev1.Secret) error {
	t.Helper()
	blocks := docblocks.RunBy(readPage(t, "docs/install.md"), "TestEveryModeInstalls")
	var block *docblocks.Block
	for i, b := range blocks {
		if strings.Contains(b.Text, m.values) {
			block = &blocks[i]
		}
	}
	if block == nil {
		return fmt.Errorf("docs/install.md has no block marked run-by TestEveryModeInstalls that installs %s", m.values)
	}
	dir := t.TempDir()
	v := modeValues(t, m)
	delete(v, "image")
	valuesFile := filepath.Join(dir, "ports.yaml")
	certFile, keyFile := filepath.Join(dir, "webhook.crt"), filepath.Join(dir, "webhook.key")
	for file, data := range map[string][]byte{certFile: tls.Data["tls.crt"], keyFile: tls.Data["tls.key"], valuesFile: mustYAML(t, v)} {
		if err := os.WriteFile(file, data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	env := append(os.Environ(), "PATH="+docsTools{helmValues: valuesFile}.path(t, dir)+":"+os.Getenv("PATH"), "KUBECONFIG="+c.kubeconfig)
	for _, value := range m.secret.Data {
		// The one token of the mode's Secret, as the reader exports it.
		env = append(env, "GITLAB_HOOK_TOKEN="+string(value))
	}
	sh := &docsShell{t: t, env: env, replace: strings.NewReplacer(
		"registry.example.com/hyperfleet/hyperfleet", imageRepository, "image.tag=v0.1.0", "image.tag="+imageTag,
		"--cert=webhook.crt --key=webhook.key", "--cert="+certFile+" --key="+keyFile)}
	_, err := sh.try(ctx, *block)
	return err
}

func mustYAML(t *testing.T, v any) []byte {
	t.Helper()
	data, err := yaml.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// checkModeLog checks the manager's log in mode m: started, never refused
// a request, no webhook Secret reported missing (a GitLab or Buildkite
// install must not wait for GitHub's), its receiver's Secret read, and no
// receiver at all in scale-set mode.
func checkModeLog(t *testing.T, m mode, log string) {
	t.Helper()
	if !strings.Contains(log, "Starting manager") {
		t.Fatalf("the manager's log lacks its start message:\n%s", tail(log, 20))
	}
	if lines := forbiddenLines(log); len(lines) > 0 {
		t.Errorf("the manager was refused requests (a missing permission):\n%s", strings.Join(lines, "\n"))
	}
	for _, l := range strings.Split(log, "\n") {
		switch lower := strings.ToLower(l); {
		case strings.Contains(l, "webhook Secret") && strings.Contains(l, "does not exist") || strings.Contains(l, "hyperfleet-github-webhook"):
			t.Errorf("the manager waits for a webhook Secret the %s mode does not have: %s", m.name, l)
		case strings.Contains(l, `"level":"error"`) && (strings.Contains(lower, "webhook") || strings.Contains(lower, "certificate")):
			t.Errorf("the manager's receiver failed in %s mode: %s", m.name, l)
		}
	}
	switch {
	case m.receiver && !strings.Contains(log, m.loaded):
		t.Errorf("the manager's log lacks %q:\n%s", m.loaded, tail(log, 30))
	case !m.receiver && strings.Contains(log, "Webhook receiver"):
		t.Errorf("a webhook receiver runs in %s mode:\n%s", m.name, tail(log, 30))
	}
}

// selfSignedTLS is a self-signed serving certificate for host and its key,
// PEM-encoded, as an administrator (or cert-manager) puts in the
// receiver's Secret.
func selfSignedTLS(t *testing.T, host string) (certPEM, keyPEM []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: host}, DNSNames: []string{host},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER})
}

//go:build deploy

package deploy

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/hyperfleet/hyperfleet/test/monitoring"
	"github.com/hyperfleet/hyperfleet/test/testenv"
)

// The chart's ServiceMonitor, scraped by a real Prometheus through the
// chart's TLS settings: the metrics server's certificate from the Secret
// metrics.tls.secretName, verified with that Secret's ca.crt and the
// metrics Service's name, and Prometheus's own ServiceAccount token, which
// the manager authorizes (TokenReview, SubjectAccessReview) through the
// metrics-reader binding of metrics.readerSubjects. No prometheus-operator
// runs here: scrapeConfig turns the ServiceMonitor the release created into
// the scrape configuration the operator would generate for it.

// Prometheus's ServiceAccount, which metrics.readerSubjects binds.
const (
	promNamespace = "monitoring"
	promAccount   = "prometheus"
	// metricsTLS is the metrics server's certificate Secret.
	metricsTLS = "hyperfleet-metrics-tls"
)

// serviceMonitorCRD is the stand-in CRD test/chart applies too
// (test/chart/testdata/crds/README.md says where it comes from).
const serviceMonitorCRD = "test/chart/testdata/crds/monitoring.coreos.com_servicemonitors.yaml"

// monitoredValues are the values of an install whose metrics Prometheus
// scrapes through the chart's ServiceMonitor.
func monitoredValues() values {
	return values{
		"tls":            values{"secretName": metricsTLS},
		"serviceMonitor": values{"enabled": true, "interval": "1s", "scrapeTimeout": "1s"},
		"readerSubjects": []values{{"kind": "ServiceAccount", "name": promAccount, "namespace": promNamespace}},
	}
}

// prepareMonitoring creates what a monitored install needs before it: the
// ServiceMonitor CRD, Prometheus's namespace and ServiceAccount, and the
// metrics server's certificate Secret for the metrics Service's name,
// self-signed (its own CA, as ca.crt).
func prepareMonitoring(ctx context.Context, t *testing.T, admin client.Client, cfg *rest.Config, namespace string) {
	t.Helper()
	// envtest installs it as kubectl would, and waits until it is served.
	if _, err := envtest.InstallCRDs(cfg, envtest.CRDInstallOptions{
		Paths: []string{filepath.Join(testenv.RepoRoot(), serviceMonitorCRD)}, ErrorIfPathMissing: true,
	}); err != nil {
		t.Fatalf("install %s: %v", serviceMonitorCRD, err)
	}
	for _, o := range []client.Object{
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: promNamespace}},
		&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: promNamespace, Name: promAccount}},
	} {
		if err := admin.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	cert, key := selfSignedTLS(t, releaseName+"-metrics."+namespace+".svc")
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: metricsTLS}, Type: corev1.SecretTypeTLS,
		Data: map[string][]byte{"tls.crt": cert, "tls.key": key, "ca.crt": cert}}
	if err := admin.Create(ctx, secret); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := admin.Delete(ctx, secret); err != nil {
			t.Error(err)
		}
	})
}

// checkServiceMonitorScraped reads the release's ServiceMonitor, runs
// Prometheus with the scrape configuration it stands for, and waits until
// the target is up and its HyperFleet metrics are in Prometheus; a scrape
// that fails (a certificate the CA or the server name does not verify, a
// token the manager refuses) fails the test with Prometheus's error.
func checkServiceMonitorScraped(ctx context.Context, t *testing.T, admin client.Client, cfg *rest.Config, namespace string) {
	t.Helper()
	dir := t.TempDir()
	token, err := serviceAccountToken(ctx, cfg, promNamespace, promAccount)
	if err != nil {
		t.Fatal(err)
	}
	tokenFile := filepath.Join(dir, "token")
	if err := os.WriteFile(tokenFile, []byte(token), 0o600); err != nil {
		t.Fatal(err)
	}
	config := scrapeConfig(ctx, t, admin, namespace, dir, tokenFile)
	t.Logf("the ServiceMonitor as a scrape configuration:\n%s", config)
	prom := monitoring.StartPrometheus(t, config)
	var lastErr string
	waitFor(t, time.Minute, "Prometheus scraping the ServiceMonitor's target", func() (bool, error) {
		var targets struct {
			ActiveTargets []struct {
				Health    string `json:"health"`
				LastError string `json:"lastError"`
			} `json:"activeTargets"`
		}
		if err := prom.Get("/api/v1/targets", nil, &targets); err != nil {
			return false, err
		}
		for _, tg := range targets.ActiveTargets {
			lastErr = tg.LastError
			if tg.Health == "up" {
				return true, nil
			}
		}
		return false, nil
	}, func() string { return "the target's last error: " + lastErr })
	series, err := prom.Query(`count({__name__=~"hyperfleet_.+", job="serviceMonitor/` + namespace + `/` + releaseName + `-manager/0"})`)
	if err != nil || len(series) != 1 {
		t.Fatalf("no HyperFleet metric scraped through the ServiceMonitor: %v %s", err, series)
	}
}

// scrapeConfig is the prometheus.yml that prometheus-operator generates
// for the release's ServiceMonitor, reduced to what it sets: its one
// endpoint's scheme, path, interval and timeout, TLS (the CA from the
// Secret it names, written to a file in dir, and the server name), the
// bearer token file (Prometheus's own token, tokenFile here) and
// honor_labels. The target is what the Service's endpoints would hold:
// the manager pod's address (loopback: the pod shares the host's network)
// and the container port the Service's port of the endpoint's name targets.
func scrapeConfig(ctx context.Context, t *testing.T, admin client.Client, namespace, dir, tokenFile string) string {
	t.Helper()
	sm := &unstructured.Unstructured{}
	sm.SetAPIVersion("monitoring.coreos.com/v1")
	sm.SetKind("ServiceMonitor")
	if err := admin.Get(ctx, client.ObjectKey{Namespace: namespace, Name: releaseName + "-manager"}, sm); err != nil {
		t.Fatalf("the release's ServiceMonitor: %v", err)
	}
	eps, _, _ := unstructured.NestedSlice(sm.Object, "spec", "endpoints")
	if len(eps) != 1 {
		t.Fatalf("the ServiceMonitor has %d endpoints, want 1", len(eps))
	}
	ep := eps[0].(map[string]any)
	str := func(fields ...string) string {
		v, _, _ := unstructured.NestedString(ep, fields...)
		return v
	}
	if str("bearerTokenFile") != "/var/run/secrets/kubernetes.io/serviceaccount/token" {
		t.Fatalf("the ServiceMonitor's endpoint sends %q, want Prometheus's own ServiceAccount token", str("bearerTokenFile"))
	}
	caName, caKey := str("tlsConfig", "ca", "secret", "name"), str("tlsConfig", "ca", "secret", "key")
	caSecret := &corev1.Secret{}
	if err := admin.Get(ctx, client.ObjectKey{Namespace: namespace, Name: caName}, caSecret); err != nil {
		t.Fatalf("the ServiceMonitor's CA Secret %q: %v", caName, err)
	}
	caFile := filepath.Join(dir, "ca.crt")
	if err := os.WriteFile(caFile, caSecret.Data[caKey], 0o600); err != nil {
		t.Fatal(err)
	}
	insecure, _, _ := unstructured.NestedBool(ep, "tlsConfig", "insecureSkipVerify")
	honor, _, _ := unstructured.NestedBool(ep, "honorLabels")
	target := fmt.Sprintf("127.0.0.1:%d", metricsTargetPort(ctx, t, admin, namespace, str("port")))
	job := fmt.Sprintf("serviceMonitor/%s/%s/0", namespace, sm.GetName())
	quote := func(s string) string { b, _ := json.Marshal(s); return string(b) }
	return fmt.Sprintf(`global:
  evaluation_interval: 1s
scrape_configs:
  - job_name: %s
    scheme: %s
    metrics_path: %s
    scrape_interval: %s
    scrape_timeout: %s
    honor_labels: %t
    authorization:
      credentials_file: %s
    tls_config:
      ca_file: %s
      server_name: %s
      insecure_skip_verify: %t
    static_configs:
      - targets: [%s]
`, quote(job), str("scheme"), quote(str("path")), str("interval"), str("scrapeTimeout"), honor,
		quote(tokenFile), quote(caFile), quote(str("tlsConfig", "serverName")), insecure, quote(target))
}

// metricsTargetPort is the container port behind the Service port named
// port of the release's metrics Service, resolved as the endpoints
// controller does: the Service port's targetPort, a number or the name of
// one of the manager container's ports.
func metricsTargetPort(ctx context.Context, t *testing.T, admin client.Client, namespace, port string) int32 {
	t.Helper()
	svc := &corev1.Service{}
	if err := admin.Get(ctx, client.ObjectKey{Namespace: namespace, Name: releaseName + "-metrics"}, svc); err != nil {
		t.Fatalf("the metrics Service: %v", err)
	}
	var target *intstr.IntOrString
	for _, p := range svc.Spec.Ports {
		if p.Name == port {
			target = &p.TargetPort
		}
	}
	if target == nil {
		t.Fatalf("the metrics Service has no port named %q, which the ServiceMonitor scrapes", port)
	}
	if target.Type == intstr.Int {
		return target.IntVal
	}
	dep := &appsv1.Deployment{}
	if err := admin.Get(ctx, client.ObjectKey{Namespace: namespace, Name: deploymentName}, dep); err != nil {
		t.Fatalf("the manager's Deployment: %v", err)
	}
	for _, c := range dep.Spec.Template.Spec.Containers {
		for _, p := range c.Ports {
			if p.Name == target.StrVal {
				return p.ContainerPort
			}
		}
	}
	t.Fatalf("no container of the manager has the port %q the metrics Service targets", target.StrVal)
	return 0
}

// waitFor polls cond every 200 ms until it holds, failing the test with
// what (and the detail's words, when given) at the deadline.
func waitFor(t *testing.T, d time.Duration, what string, cond func() (bool, error), detail ...func() string) {
	t.Helper()
	deadline := time.Now().Add(d)
	var last error
	for {
		ok, err := cond()
		if ok {
			return
		}
		last = err
		if time.Now().After(deadline) {
			msg := []string{"waiting for " + what + " timed out after " + d.String()}
			if last != nil {
				msg = append(msg, last.Error())
			}
			for _, f := range detail {
				msg = append(msg, f())
			}
			t.Fatal(strings.Join(msg, ": "))
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// Package failsafe starts the manager binary (cmd/hyperfleet, as its own
// process: test/managerproc) with the TLS certificates of its webhook
// receiver and its agent server missing, as a Deployment whose cert-manager
// Certificate is not issued yet sees them (the chart mounts both Secrets as
// optional), and checks that only those two servers wait: the controllers
// reconcile, /readyz and hyperfleet_https_server_ready say which server
// waits and why, and once the certificates appear both serve without a
// restart (docs/operations.md, "When a server waits for its certificate").
package failsafe

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/manager"
	"github.com/hyperfleet/hyperfleet/internal/testworld/devenv"
	"github.com/hyperfleet/hyperfleet/internal/testworld/eventdump"
	"github.com/hyperfleet/hyperfleet/test/managerproc"
)

func TestManagerRunsWhileItsServersWaitForCertificates(t *testing.T) {
	dir := t.TempDir()
	bin := managerproc.GoBuild(t, dir, "./cmd/hyperfleet")
	ctx := context.Background()
	w, err := devenv.Start(ctx, devenv.Options{Dir: filepath.Join(dir, "world"), ExternalOperator: true, AgentFromOperator: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = w.Stop() })
	in := w.OperatorInputs()

	// Where the certificates will be, empty for now: an optional Secret
	// volume not yet filled.
	webhookTLS, agentTLS := filepath.Join(dir, "webhook-tls"), filepath.Join(dir, "agent-tls")
	for _, d := range []string{webhookTLS, agentTLS} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	op := managerproc.Start(t, w, managerproc.Options{
		// No guest runs here: any file stands in for the agent binary
		// the agent server hashes.
		Binary: bin, AgentBinary: bin, CAFile: in.GitHubCAFile,
		Args: []string{
			"--webhook-cert-dir", webhookTLS,
			"--agent-server-cert", filepath.Join(agentTLS, "tls.crt"), "--agent-server-key", filepath.Join(agentTLS, "tls.key"),
			"--agent-server-ca", filepath.Join(agentTLS, "ca.crt"),
		},
	})
	t.Cleanup(func() {
		if t.Failed() {
			if b, err := os.ReadFile(op.LogFile); err == nil {
				t.Logf("manager log (last 8 KiB):\n%s", managerproc.Tail(b, 8<<10))
			}
			t.Logf("events:\n%s", eventdump.Format(context.Background(), w.API.Client, nil, devenv.Namespace, "default"))
		}
	})

	// The controllers reconcile meanwhile: the HypervisorCluster gets
	// connected and the pool's GitHub scope is verified (ConnectOperator
	// waits for that); the template, whose VMs download the agent from
	// the agent server, waits for the CA they are to trust.
	if err := w.ConnectOperator(ctx, op.WebhookURL); err != nil {
		t.Fatalf("the controllers did not reconcile while the servers wait for their certificates: %v", err)
	}
	// The cluster connects on its own controller's time: the pool's
	// verification, which ConnectOperator waits for, does not wait for it.
	waitClusterConnected(ctx, t, w)
	tmpl := waitTemplate(ctx, t, w, metav1.ConditionFalse)
	if c := hfv1.FindCondition(tmpl.Status.Conditions, hfv1.HypervisorMachineTemplateValidCondition); c.Reason != string(hfv1.AgentUnavailableReason) || !strings.Contains(c.Message, "waits for the CA file") {
		t.Fatalf("template %s is %s %s %q, want AgentUnavailable saying the agent server waits for its CA", tmpl.Name, c.Status, c.Reason, c.Message)
	}

	// Both servers say they wait, and why, and neither listens.
	status, body := get(t, op.ReadyzURL+"?verbose")
	if status == http.StatusOK {
		t.Fatalf("/readyz is ready while both servers wait for their certificates:\n%s", body)
	}
	for _, says := range []string{"[-]" + manager.ReadyzWebhookServer + " failed", "[-]" + manager.ReadyzAgentServer + " failed"} {
		if !strings.Contains(body, says) {
			t.Errorf("/readyz does not say %q:\n%s", says, body)
		}
	}
	wantReady(t, op, map[string]float64{"webhook": 0, "agent": 0})
	if conn, err := tls.Dial("tcp", op.WebhookAddr, &tls.Config{InsecureSkipVerify: true}); err == nil { //nolint:gosec // only whether it listens
		conn.Close()
		t.Fatal("the webhook receiver accepts TLS connections without a certificate")
	}
	logged, err := os.ReadFile(op.LogFile)
	if err != nil {
		t.Fatal(err)
	}
	for _, says := range []string{"webhook server: waiting for a TLS certificate it can load", "agent server: waiting for a TLS certificate it can load"} {
		if !strings.Contains(string(logged), says) {
			t.Errorf("the manager's log does not say %q", says)
		}
	}

	// The certificates appear (the kubelet fills the volumes): both
	// servers serve, in the same process.
	copyFile(t, in.WebhookCertFile, filepath.Join(webhookTLS, "tls.crt"))
	copyFile(t, in.WebhookKeyFile, filepath.Join(webhookTLS, "tls.key"))
	copyFile(t, in.AgentServerCertFile, filepath.Join(agentTLS, "tls.crt"))
	copyFile(t, in.AgentServerKeyFile, filepath.Join(agentTLS, "tls.key"))
	copyFile(t, in.AgentServerCAFile, filepath.Join(agentTLS, "ca.crt"))
	deadline := time.Now().Add(time.Minute)
	for {
		status, body = get(t, op.ReadyzURL+"?verbose")
		if status == http.StatusOK {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("/readyz not ready a minute after the certificates appeared:\n%s", body)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if err := op.Cmd.Process.Signal(syscall.Signal(0)); err != nil {
		t.Fatalf("the manager process is gone: %v", err)
	}
	wantReady(t, op, map[string]float64{"webhook": 1, "agent": 1})
	// The template is checked again (within a minute) and valid.
	waitTemplate(ctx, t, w, metav1.ConditionTrue)
	for url, caFile := range map[string]string{op.WebhookURL: in.WebhookCertFile, "https://" + op.AgentServerAddr + "/": in.AgentServerCAFile} {
		c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool(t, caFile), MinVersion: tls.VersionTLS12}}}
		resp, err := c.Get(url)
		if err != nil {
			t.Fatalf("%s after its certificate appeared: %v", url, err)
		}
		resp.Body.Close()
	}
}

// waitTemplate waits (up to 2 minutes) until the world's template's Valid
// condition has status want.
func waitTemplate(ctx context.Context, t *testing.T, w *devenv.World, want metav1.ConditionStatus) *hfv1.HypervisorMachineTemplate {
	t.Helper()
	var tmpl hfv1.HypervisorMachineTemplate
	deadline := time.Now().Add(2 * time.Minute)
	for {
		err := w.API.Client.Get(ctx, client.ObjectKey{Namespace: devenv.Namespace, Name: devenv.TemplateName}, &tmpl)
		if c := hfv1.FindCondition(tmpl.Status.Conditions, hfv1.HypervisorMachineTemplateValidCondition); err == nil && c != nil && c.Status == want {
			return &tmpl
		}
		if time.Now().After(deadline) {
			t.Fatalf("template %s/%s not Valid=%s within 2 minutes (%v): %+v", devenv.Namespace, devenv.TemplateName, want, err, tmpl.Status.Conditions)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// waitClusterConnected waits until the world's HypervisorCluster is
// Connected.
func waitClusterConnected(ctx context.Context, t *testing.T, w *devenv.World) {
	t.Helper()
	var cluster hfv1.HypervisorCluster
	deadline := time.Now().Add(2 * time.Minute)
	for {
		err := w.API.Client.Get(ctx, client.ObjectKey{Name: devenv.ClusterName}, &cluster)
		if err == nil && hfv1.IsConditionTrue(cluster.Status.Conditions, hfv1.HypervisorClusterConnectedCondition) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("HypervisorCluster %s not Connected within 2 minutes (%v): %+v", devenv.ClusterName, err, cluster.Status.Conditions)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// wantReady checks hyperfleet_https_server_ready per server.
func wantReady(t *testing.T, op *managerproc.Process, want map[string]float64) {
	t.Helper()
	families, err := op.Scrape()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	if f := families["hyperfleet_https_server_ready"]; f != nil {
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "server" {
					got[l.GetValue()] = m.GetGauge().GetValue()
				}
			}
		}
	}
	for server, v := range want {
		if g, ok := got[server]; !ok || g != v {
			t.Errorf("hyperfleet_https_server_ready{server=%q} = %v (present %v), want %v", server, g, ok, v)
		}
	}
}

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}

func pool(t *testing.T, caFile string) *x509.CertPool {
	t.Helper()
	b, err := os.ReadFile(caFile)
	if err != nil {
		t.Fatal(err)
	}
	p := x509.NewCertPool()
	if !p.AppendCertsFromPEM(b) {
		t.Fatalf("%s holds no PEM certificate", caFile)
	}
	return p
}

// copyFile writes aside and renames, as the kubelet swaps a Secret
// volume's files: never half a file.
func copyFile(t *testing.T, from, to string) {
	t.Helper()
	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to+".tmp", b, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(to+".tmp", to); err != nil {
		t.Fatal(err)
	}
}

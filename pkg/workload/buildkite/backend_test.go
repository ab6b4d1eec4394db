package buildkite_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	bksim "github.com/hyperfleet/hyperfleet/internal/testworld/simulator/buildkite"
	"github.com/hyperfleet/hyperfleet/pkg/workload"
	"github.com/hyperfleet/hyperfleet/pkg/workload/buildkite"
)

func template(cluster, apiURL string) *hfv1.HypervisorMachineTemplate {
	return &hfv1.HypervisorMachineTemplate{
		ObjectMeta: metav1.ObjectMeta{Name: "tpl", Namespace: "ci"},
		Spec: hfv1.HypervisorMachineTemplateSpec{Bootstrap: hfv1.Bootstrap{Buildkite: &hfv1.BuildkiteBootstrap{
			Organization: "acme", Cluster: cluster, APIURL: apiURL,
			Credentials: hfv1.BuildkiteCredentials{APIToken: hfv1.LocalSecretKeySelector{Name: "bk", Key: "token"}},
		}}},
	}
}

func TestBackendReadsTheAPISections(t *testing.T) {
	be, err := buildkite.NewBackend(workload.Dependencies{})
	if err != nil {
		t.Fatal(err)
	}
	tmpl := template("0190a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b", "")
	tt, ok := be.Template(tmpl)
	if !ok || tt.Scope != (workload.Scope{Owner: "acme"}) || tt.RegistrationURL != buildkite.DefaultAgentEndpoint || tt.Endpoint != "" ||
		tt.Runner.InstallPath != "/usr/local/bin" || tt.Runner.RunScript != "buildkite-agent" || tt.Runner.WorkDir != "/var/lib/hyperfleet/builds" ||
		tt.Runner.OS != "linux" || tt.Runner.Arch != "amd64" || tt.Secrets["spec.bootstrap.buildkite.credentials.apiToken"].Name != "bk" {
		t.Fatalf("Template = %+v, %v", tt, ok)
	}
	// Every VM is bound to one job: its method is job-token, and none of
	// it serves more than one job.
	if tt.AgentPlatform != "buildkite" || tt.BootstrapMethod != string(buildkite.MethodJobToken) || tt.CredentialReuse != "" {
		t.Errorf("Template's agent platform %q, method %q and credential reuse %q, want buildkite, job-token and none", tt.AgentPlatform, tt.BootstrapMethod, tt.CredentialReuse)
	}
	dl := template("0190a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b", "")
	dl.Spec.Bootstrap.Buildkite.Agent = &hfv1.BuildkiteAgentSoftware{DownloadURL: "https://example.test/buildkite-agent-{os}-{arch}.tar.gz",
		DownloadSHA256: strings.Repeat("a", 64), Arch: "arm64"}
	if td, _ := be.Template(dl); td.Runner.InstallPath != buildkite.DownloadedAgentDir || td.Runner.RunScript != "buildkite-agent" ||
		td.Runner.DownloadURL != "https://example.test/buildkite-agent-linux-arm64.tar.gz" {
		t.Errorf("a downloaded agent's software = %+v", td.Runner)
	}
	other := template("0190a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5c", "")
	if to, _ := be.Template(other); to.CredentialsKey == tt.CredentialsKey {
		t.Error("another cluster has the same credentials key")
	}
	if _, ok := be.Template(&hfv1.HypervisorMachineTemplate{}); ok {
		t.Error("a template without bootstrap.buildkite is Buildkite's")
	}
	pool := &hfv1.RunnerPool{Spec: hfv1.RunnerPoolSpec{Workload: hfv1.Workload{Type: hfv1.WorkloadBuildkite, Buildkite: &hfv1.BuildkiteWorkload{
		Queue: "linux", DefaultQueue: true, Tags: []string{"os=linux"}, Pipeline: "app",
	}}}}
	pp, ok := be.Pool(pool, tmpl)
	if !ok || pp.Scope != (workload.Scope{Owner: "acme", Repository: "app"}) || !pp.OwnScope ||
		!slices.Equal(pp.Labels, []string{"queue=linux", "os=linux", buildkite.DefaultQueueLabel}) ||
		pp.Claim.Type != hfv1.WorkloadBuildkite || pp.Claim.Buildkite.Queue != "linux" {
		t.Fatalf("Pool = %+v, %v", pp, ok)
	}
	pool.Spec.Workload.Buildkite.Pipeline = ""
	if pp, _ := be.Pool(pool, tmpl); pp.Scope != (workload.Scope{Owner: "acme"}) || pp.OwnScope {
		t.Fatalf("Pool of the whole organization = %+v", pp)
	}
	claim := &hfv1.MachineClaim{Spec: hfv1.MachineClaimSpec{WorkloadConfig: &hfv1.WorkloadConfig{Type: hfv1.WorkloadBuildkite,
		Buildkite: &hfv1.BuildkiteAgentConfig{Queue: "gpu", Tags: []string{"cuda=12"}}}}}
	if c := be.Claim(claim); !slices.Equal(c.Labels, []string{"queue=gpu", "cuda=12"}) {
		t.Fatalf("Claim = %+v", c)
	}
	if f := be.(workload.WebhookReceiver).WebhookFormat(); f.Path != "/webhooks/buildkite" || f.DeliveryHeader != "" || f.EventHeader != "X-Buildkite-Event" {
		t.Fatalf("WebhookFormat = %+v", f)
	}
}

func TestBackendProviderIsKeptWhileItsTokenStays(t *testing.T) {
	w := newWorld(t, bksimConfig())
	be, _ := buildkite.NewBackend(workload.Dependencies{})
	tmpl := template(w.cluster.ID, w.srv.URL)
	token := apiToken
	secrets := func(_ context.Context, field, ns string, ref hfv1.LocalSecretKeySelector) ([]byte, error) {
		if field != "spec.bootstrap.buildkite.credentials.apiToken" || ns != "ci" || ref.Name != "bk" {
			return nil, errors.New("unexpected secret " + field)
		}
		return []byte(token), nil
	}
	ctx := context.Background()
	scope := workload.Scope{Owner: "acme"}
	p1, err := be.Provider(ctx, tmpl, scope, secrets)
	if err != nil {
		t.Fatal(err)
	}
	if err := p1.VerifyScope(ctx); err != nil {
		t.Fatalf("VerifyScope through the back-end: %v", err)
	}
	p2, _ := be.Provider(ctx, tmpl, scope, secrets)
	if p1 != p2 {
		t.Error("the same template and token built a second provider")
	}
	token = "bkua_rotated"
	if p3, _ := be.Provider(ctx, tmpl, scope, secrets); p3 == p1 {
		t.Error("a rotated token kept the old provider")
	}
}

func bksimConfig() bksim.Config { return bksim.Config{} }

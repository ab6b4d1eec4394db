package workloads

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/testworld/credmethods"
	buildkitesim "github.com/hyperfleet/hyperfleet/internal/testworld/simulator/buildkite"
	"github.com/hyperfleet/hyperfleet/internal/testworld/simulator/buildkite/buildkitesimtest"
	"github.com/hyperfleet/hyperfleet/internal/testworld/simulator/github/githubsimtest"
	"github.com/hyperfleet/hyperfleet/pkg/workload"
)

// TestWarmBuildkiteClaimWaitsForItsJob (warm VMs are bound to a job too),
// with the real API server and the Buildkite simulator: a claim of a
// Buildkite pool bound to no job (a warm VM) gets no credential at all, and
// no cluster agent token is made for it (the operator used to give it one,
// which registers agents that take any job of the cluster's queues). Once
// its pool bound it a queued job of the pool, it gets that job's
// acquisition token, naming the job, and keeps the time it stood by since
// (status.bootstrap.registeredAt). A second live claim of the pool bound to
// the same job gets nothing. Once the claim's agent registered, its
// cluster agent token goes (RetireRegistration), once.
func TestWarmBuildkiteClaimWaitsForItsJob(t *testing.T) {
	env := apiServer.Get(t)
	ctx := context.Background()
	const apiToken = "bkua_operator"
	bk := buildkitesimtest.Start(t, buildkitesim.Config{AgentBinary: "/nonexistent", APITokens: []buildkitesim.APIToken{{Token: apiToken, Scopes: buildkitesim.Scopes()}}})
	cl := bk.Sim.CreateCluster("linux")
	if _, err := bk.Sim.CreateQueue(cl.ID, "linux"); err != nil {
		t.Fatal(err)
	}
	if err := bk.Sim.CreatePipeline("app", cl.ID); err != nil {
		t.Fatal(err)
	}
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "bk-warm-"}}
	create := func(obj client.Object) {
		t.Helper()
		if err := env.Client.Create(ctx, obj); err != nil {
			t.Fatalf("create %T %s: %v", obj, obj.GetName(), err)
		}
	}
	create(ns)
	t.Cleanup(func() { _ = env.Client.Delete(context.Background(), ns) })
	create(&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns.Name, Name: "bk"}, Data: map[string][]byte{"token": []byte(apiToken)}})
	cluster := &hfv1.HypervisorCluster{ObjectMeta: metav1.ObjectMeta{GenerateName: "bk-warm-"}}
	cluster.Spec.Provider = "proxmox"
	cluster.Spec.Endpoint = "https://pve.example.com:8006/api2/json"
	cluster.Spec.Credentials.TokenID = &hfv1.SecretKeySelector{Name: "pve", Namespace: ns.Name, Key: "id"}
	cluster.Spec.Credentials.TokenSecret = &hfv1.SecretKeySelector{Name: "pve", Namespace: ns.Name, Key: "secret"}
	create(cluster)
	t.Cleanup(func() { _ = env.Client.Delete(context.Background(), cluster) })
	tmpl := &hfv1.HypervisorMachineTemplate{ObjectMeta: metav1.ObjectMeta{Namespace: ns.Name, Name: "bk"}}
	tmpl.Spec.HypervisorClusterRef.Name = cluster.Name
	tmpl.Spec.Source.Proxmox = hfv1.ProxmoxSource{TemplateID: ptr.To[int32](9001)}
	tmpl.Spec.Resources.CPU, tmpl.Spec.Resources.Memory = 2, resource.MustParse("2Gi")
	tmpl.Spec.Bootstrap.Buildkite = &hfv1.BuildkiteBootstrap{Organization: "acme", Cluster: cl.ID, APIURL: bk.URL, AgentEndpoint: bk.URL + "/v3",
		Credentials: hfv1.BuildkiteCredentials{APIToken: hfv1.LocalSecretKeySelector{Name: "bk", Key: "token"}}}
	create(tmpl)
	pool := &hfv1.RunnerPool{ObjectMeta: metav1.ObjectMeta{Namespace: ns.Name, Name: "bk"},
		Spec: hfv1.RunnerPoolSpec{TemplateRef: hfv1.ObjectName{Name: tmpl.Name}, Scaling: hfv1.Scaling{MaxReplicas: 2},
			Workload: hfv1.Workload{Type: hfv1.WorkloadBuildkite, Buildkite: &hfv1.BuildkiteWorkload{Queue: "linux"}}}}
	create(pool)
	newClaim := func(name string) *hfv1.MachineClaim {
		c := &hfv1.MachineClaim{ObjectMeta: metav1.ObjectMeta{Namespace: ns.Name, Name: name, Labels: map[string]string{hfv1.RunnerPoolLabel: pool.Name}},
			Spec: hfv1.MachineClaimSpec{TemplateRef: hfv1.ObjectName{Name: tmpl.Name}, RunnerPoolRef: &hfv1.ObjectName{Name: pool.Name},
				WorkloadConfig: &hfv1.WorkloadConfig{Type: hfv1.WorkloadBuildkite, Buildkite: &hfv1.BuildkiteAgentConfig{Queue: "linux"}}}}
		create(c)
		return c
	}
	w := &Platforms{Client: env.Client, Backends: githubsimtest.Backends(t, bk.Client().Transport)}
	perVM := func() []buildkitesim.TokenInfo {
		toks, err := bk.Sim.TokensDescribed(cl.ID, "hyperfleet agent ")
		if err != nil {
			t.Fatal(err)
		}
		return toks
	}

	warm := newClaim("bk-1")
	if !w.WaitsForJob(warm, tmpl) {
		t.Fatal("a warm claim of a Buildkite pool does not wait for a job")
	}
	if cred, err := w.RunnerCredential(ctx, warm); !errors.Is(err, errWaitingForJob) || !cred.Secret.IsZero() {
		t.Fatalf("a warm claim's credential: %s, %v; want none (errWaitingForJob)", cred.Method, err)
	}
	if toks := perVM(); len(toks) != 0 {
		t.Fatalf("tokens made for a warm VM: %+v", toks)
	}

	// A job arrives; the pool binds it to the warm claim, which stood by.
	b, err := bk.Sim.CreateBuild("app", "go", []buildkitesim.Step{{Key: "test", Command: "true", Agents: []string{"queue=linux"}}})
	if err != nil {
		t.Fatal(err)
	}
	job := b.JobIDs[0]
	cijob := &hfv1.CIJob{ObjectMeta: metav1.ObjectMeta{Namespace: ns.Name, Name: hfv1.CIJobName(hfv1.WorkloadBuildkite, job)},
		Spec: hfv1.CIJobSpec{Platform: hfv1.WorkloadBuildkite, JobKey: job, Repository: "acme/app", RunnerPoolRef: hfv1.ObjectName{Name: pool.Name}}}
	create(cijob)
	warm.Spec.WorkloadConfig.Buildkite.JobID = job
	if err := env.Client.Update(ctx, warm); err != nil {
		t.Fatalf("bind the warm claim: %v", err)
	}
	// Its status, as the claim controller recorded it while it stood by.
	stoodBy := metav1.NewTime(time.Now().Add(-3 * time.Minute).Truncate(time.Second))
	warm.Status.Bootstrap = &hfv1.BootstrapStatus{RegisteredAt: &stoodBy}
	if w.WaitsForJob(warm, tmpl) {
		t.Fatal("a bound claim still waits for a job")
	}
	cred, err := w.RunnerCredential(ctx, warm)
	if err != nil {
		t.Fatalf("the bound claim's credential: %v", err)
	}
	if cred.Method != credmethods.MethodJobToken || cred.Job != job || !strings.HasPrefix(cred.Secret.Reveal(), "bkjat_") {
		t.Fatalf("the bound claim's credential: %+v", cred)
	}
	if st := warm.Status.Bootstrap; st == nil || st.RegisteredAt == nil || !st.RegisteredAt.Equal(&stoodBy) || st.RunnerName == "" {
		t.Fatalf("status.bootstrap after issuing: %+v; want registeredAt kept (%s)", st, stoodBy)
	}

	// A second live claim of the pool bound to the same job gets nothing.
	twice := newClaim("bk-2")
	twice.Spec.WorkloadConfig.Buildkite.JobID = job
	if err := env.Client.Update(ctx, twice); err != nil {
		t.Fatal(err)
	}
	if _, err := w.RunnerCredential(ctx, twice); !errors.Is(err, workload.ErrJobNotBindable) || !strings.Contains(err.Error(), "bk-1") {
		t.Fatalf("a second claim bound to the job: %v; want ErrJobNotBindable naming bk-1", err)
	}

	// The VM's agent registers with the job token; the claim's cluster
	// token goes, once.
	if len(perVM()) != 1 {
		t.Fatalf("per-VM tokens: %+v", perVM())
	}
	body, _ := json.Marshal(map[string]any{"name": cred.RunnerName, "meta_data": []string{"queue=linux"}})
	req, _ := http.NewRequest(http.MethodPost, bk.URL+"/v3/register", bytes.NewReader(body))
	req.Header.Set("Authorization", "Token "+cred.Secret.Reveal())
	req.Header.Set("Content-Type", "application/json")
	resp, err := bk.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("register with the job token: %d", resp.StatusCode)
	}
	if done, err := w.RetireRegistration(ctx, warm, tmpl); err != nil || !done {
		t.Fatalf("RetireRegistration: %v, %v", done, err)
	}
	for _, tok := range perVM() {
		if !tok.Deleted {
			t.Errorf("the registered claim's cluster token stayed: %+v", tok)
		}
	}
	if done, err := w.RetireRegistration(ctx, warm, tmpl); err != nil || done {
		t.Fatalf("RetireRegistration again: %v, %v; want nothing to do", done, err)
	}
}

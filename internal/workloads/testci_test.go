package workloads

import (
	"context"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/agentconfig"
	"github.com/hyperfleet/hyperfleet/internal/cloudinit"
	"github.com/hyperfleet/hyperfleet/internal/testworld/testci"
	"github.com/hyperfleet/hyperfleet/internal/testworld/testobjects"
	"github.com/hyperfleet/hyperfleet/internal/vmspec"
	"github.com/hyperfleet/hyperfleet/pkg/workload"
)

// TestATestOnlyPlatformNeedsNoSharedCode: a CI platform that exists only
// in the tests (internal/testworld/testci), registered through the public
// mechanisms as a shipped one is (workload.Register,
// agentconfig.RegisterPlatform), runs a claim of its pool through the
// shared code with no edit there: the pool's claim, the VM's runner
// variables (vmspec, BootstrapVars), the runner credential its provider
// issues (RunnerCredential), the VM's cloud-init and agent config (shaped
// and checked by the platform's own spec), and the credential as the
// secrets store keeps it. The cheapest world that decides it: a fake API
// server and the platform's in-memory accounts.
func TestATestOnlyPlatformNeedsNoSharedCode(t *testing.T) {
	testci.Register()
	factories := workload.Registered()
	backends, err := workload.NewBackends(map[hfv1.WorkloadType]workload.Factory{testci.Type: factories[testci.Type]}, workload.Dependencies{})
	if err != nil {
		t.Fatal(err)
	}
	const ns, owner = "ci", "acme-tci"
	tmpl := &hfv1.HypervisorMachineTemplate{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "tci",
		Annotations: map[string]string{testci.OwnerAnnotation: owner}}}
	tmpl.Spec.HypervisorClusterRef.Name = "pve"
	pool := &hfv1.RunnerPool{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "gpu", UID: "pool-uid",
		Annotations: map[string]string{testci.LabelsAnnotation: "testci:gpu,large"}}}
	pool.Spec.TemplateRef.Name = tmpl.Name
	pool.Spec.Workload.Type = testci.Type
	cluster := &hfv1.HypervisorCluster{ObjectMeta: metav1.ObjectMeta{Name: "pve"}}

	// The claim as the pool makes it (runnerpool_scaling.go, newClaim).
	be, ps, ok := backends.Pool(pool, tmpl)
	if !ok || be.Name() != "TestCI" || ps.Scope.Owner != owner {
		t.Fatalf("the pool's back-end %v reads scope %q (%v), want TestCI's %s", be, ps.Scope, ok, owner)
	}
	claim := &hfv1.MachineClaim{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "gpu-x7k2p", UID: "0a1b2c3d-0000-4000-8000-000000000001"}}
	claim.Spec.TemplateRef.Name = tmpl.Name
	claim.Spec.RunnerPoolRef = &hfv1.ObjectName{Name: pool.Name}
	claim.Spec.WorkloadConfig = ps.Claim

	scheme := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{hfv1.AddToScheme, corev1.AddToScheme} {
		if err := add(scheme); err != nil {
			t.Fatal(err)
		}
	}
	kube := fake.NewClientBuilder().WithScheme(scheme).WithObjects(tmpl, pool, claim, cluster).WithStatusSubresource(&hfv1.MachineClaim{}).Build()
	platforms := &Platforms{Client: kube, Backends: backends, Signer: testobjects.Signer(t)}
	ctx := context.Background()

	// The VM's runner variables.
	vars := vmspec.ClaimVars(backends, claim, tmpl, cluster, nil)
	if err := platforms.BootstrapVars(ctx, claim, tmpl, &vars); err != nil {
		t.Fatal(err)
	}
	if vars.Platform != string(testci.Platform) || vars.BootstrapMethod != string(testci.MethodToken) || vars.RegistrationURL != testci.RegistrationURL {
		t.Fatalf("the VM's platform %q, method %q and URL %q, want TestCI's", vars.Platform, vars.BootstrapMethod, vars.RegistrationURL)
	}
	wantLabels := []string{workload.LabelSelfHosted, workload.LabelHyperFleet, "testci:gpu", "large"}
	if !slices.Equal(vars.Labels, wantLabels) {
		t.Errorf("the VM's runner labels %q, want %q", vars.Labels, wantLabels)
	}

	// The runner credential, issued by the platform's provider.
	cred, err := platforms.RunnerCredential(ctx, claim)
	if err != nil {
		t.Fatal(err)
	}
	if cred.Method != workload.Method(testci.MethodToken) || cred.RunnerName != vars.RunnerName || cred.Secret.IsZero() {
		t.Fatalf("credential %+v, want a %s for runner %s", cred, testci.MethodToken, vars.RunnerName)
	}
	r, err := testci.Accounts.Of(owner).GetRunner(ctx, cred.RunnerName)
	if err != nil || !slices.Equal(r.Labels, wantLabels) {
		t.Fatalf("TestCI runner %+v (%v), want labels %q", r, err, wantLabels)
	}
	// Recorded in the claim's status (the caller persists it).
	if st := claim.Status.Bootstrap; st == nil || st.RunnerName != cred.RunnerName {
		t.Errorf("the claim's bootstrap status %+v does not record runner %s", st, cred.RunnerName)
	}

	// The VM's cloud-init and agent config, shaped and checked by TestCI's
	// spec: only its tags reach its runner.
	vars.SecretsDeadline = cloudinit.Time{Time: time.Now().Add(10 * time.Minute)}
	if _, err := cloudinit.Render(vmspec.Input(tmpl, vars)); err != nil {
		t.Fatalf("rendering the VM's cloud-init: %v", err)
	}
	js, err := cloudinit.AgentConfigFile(&vars)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := agentconfig.Parse(js)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Platform != testci.Platform || cfg.BootstrapMethod != testci.MethodToken || !slices.Equal(cfg.Runner.Labels, []string{"testci:gpu"}) ||
		cfg.Runner.Software.RunScript != testci.RunScript {
		t.Errorf("agent config: platform %q, method %q, labels %q, runner %q; want TestCI's, its tag testci:gpu only",
			cfg.Platform, cfg.BootstrapMethod, cfg.Runner.Labels, cfg.Runner.Software.RunScript)
	}
	cfg.RegistrationURL = "https://elsewhere.example"
	if err := cfg.Validate(); err == nil {
		t.Error("an agent config TestCI's spec refuses (another registration URL) validated")
	}

	// The credential as the secrets store keeps it, and what it serves.
	stored := agentconfig.StoredCredential{Method: agentconfig.BootstrapMethod(cred.Method), RegistrationToken: cred.Secret.Reveal()}
	if err := stored.Validate(); err != nil {
		t.Errorf("the stored TestCI credential: %v", err)
	}
	if !stored.Method.SingleJob() {
		t.Error("TestCI's token, single-job by its spec, counts as reusable")
	}
	if waitsForJob(be, claim, tmpl) {
		t.Error("a TestCI claim waits for a job, which its platform never binds")
	}
}

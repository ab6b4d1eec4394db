package chart_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/test/testenv"
)

// The release the lifecycle tests install, upgrade and uninstall.
const (
	lifecycleRelease   = "hyperfleet"
	lifecycleNamespace = "hyperfleet-system"
	claimCRD           = "machineclaims.hyperfleet.io"
)

// cluster is a kube-apiserver without CRDs, for helm to install the chart
// into as it would into a cluster: the CRDs a release owns are cluster
// objects, so each test that installs one gets its own API server.
type cluster struct {
	env        *testenv.Environment
	kubeconfig string
}

func newCluster(t *testing.T) *cluster {
	t.Helper()
	env, err := testenv.StartWithoutCRDs()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := env.Stop(); err != nil {
			t.Error(err)
		}
	})
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(kubeconfig, env.KubeConfig(), 0o600); err != nil {
		t.Fatal(err)
	}
	return &cluster{env: env, kubeconfig: kubeconfig}
}

// helm runs the helm CLI against the cluster.
func (c *cluster) helm(t *testing.T, args ...string) (string, error) {
	t.Helper()
	return testenv.Helm(t, append(args, "--kubeconfig", c.kubeconfig)...)
}

// mustHelm is helm that fails the test on an error.
func (c *cluster) mustHelm(t *testing.T, args ...string) string {
	t.Helper()
	out, err := c.helm(t, args...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// crd returns the CRD name as the API server has it; nil when it is gone.
func (c *cluster) crd(t *testing.T, name string) *unstructured.Unstructured {
	t.Helper()
	crd := &unstructured.Unstructured{}
	crd.SetGroupVersionKind(apiextensionsv1.SchemeGroupVersion.WithKind("CustomResourceDefinition"))
	err := c.env.Client.Get(context.Background(), client.ObjectKey{Name: name}, crd)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	return crd
}

// addedField is the CRD field the previous chart lacks and this one adds:
// a MachineClaim's spec.workloadConfig, under the first version's schema
// (no validation rule outside it names it, so the CRD stays valid without).
var addedField = []string{"schema", "openAPIV3Schema", "properties", "spec", "properties", "workloadConfig"}

func hasAddedField(crd *unstructured.Unstructured) bool {
	versions, _, _ := unstructured.NestedSlice(crd.Object, "spec", "versions")
	if len(versions) == 0 {
		return false
	}
	_, found, _ := unstructured.NestedMap(versions[0].(map[string]any), addedField...)
	return found
}

// previousChart writes a copy of the chart as the previous version was: its
// MachineClaim CRD without spec.workloadConfig, the CRDs in crdDir of the copy
// ("crds": Helm's directory, installed once and never upgraded, as before
// this version; "templates/crds": as now).
func previousChart(t *testing.T, crdDir string) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "hyperfleet")
	if err := os.CopyFS(dir, os.DirFS(filepath.Join(testenv.RepoRoot(), chartDir))); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{"crds", filepath.Join("templates", "crds")} {
		if err := os.RemoveAll(filepath.Join(dir, d)); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.MkdirAll(filepath.Join(dir, crdDir), 0o755); err != nil {
		t.Fatal(err)
	}
	files, _ := filepath.Glob(filepath.Join(testenv.RepoRoot(), "config", "crd", "bases", "*.yaml"))
	removed := false
	for _, f := range files {
		var crd unstructured.Unstructured
		readYAML(t, f, &crd.Object)
		if crd.GetName() == claimCRD {
			versions, _, _ := unstructured.NestedSlice(crd.Object, "spec", "versions")
			if len(versions) > 0 {
				v := versions[0].(map[string]any)
				_, removed, _ = unstructured.NestedMap(v, addedField...)
				unstructured.RemoveNestedField(v, addedField...)
				if err := unstructured.SetNestedSlice(crd.Object, versions, "spec", "versions"); err != nil {
					t.Fatal(err)
				}
			}
		}
		raw, err := yaml.Marshal(crd.Object)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, crdDir, filepath.Base(f)), raw, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if !removed {
		t.Fatalf("config/crd/bases: %s has no %s to take out for the previous chart", claimCRD, strings.Join(addedField, "."))
	}
	return dir
}

// newClaim is a MachineClaim in namespace ci, with spec.workloadConfig
// when withWorkload.
func newClaim(name string, withWorkload bool) *hfv1.MachineClaim {
	claim := &hfv1.MachineClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ci"},
		Spec:       hfv1.MachineClaimSpec{TemplateRef: hfv1.ObjectName{Name: "github-runner"}},
	}
	if withWorkload {
		claim.Spec.WorkloadConfig = &hfv1.WorkloadConfig{Type: hfv1.WorkloadGitHubActions,
			GitHub: &hfv1.GitHubRunnerConfig{Labels: []string{"linux", "x64"}}}
	}
	return claim
}

// createClaim creates claim with strict field validation (a field the CRD
// does not know is a refusal).
func (c *cluster) createClaim(t *testing.T, claim *hfv1.MachineClaim) error {
	t.Helper()
	ctx := context.Background()
	waitEstablished(t, c.env.Client, claimCRD)
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: claim.Namespace}}
	if err := c.env.Client.Create(ctx, ns); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	return c.env.Client.Create(ctx, claim, client.FieldValidation("Strict"))
}

// createHeldClaim creates a claim that holds the operator's finalizer, as
// every claim with a VM does: the operator's ServiceAccount adds it (the
// admission policy refuses it from anyone else).
func (c *cluster) createHeldClaim(t *testing.T, name string) *hfv1.MachineClaim {
	t.Helper()
	claim := newClaim(name, false)
	if err := c.createClaim(t, claim); err != nil {
		t.Fatal(err)
	}
	cfg := rest.CopyConfig(c.env.Config)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: "system:serviceaccount:" + lifecycleNamespace + ":hyperfleet-manager"}
	operator, err := client.New(cfg, client.Options{Scheme: c.env.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	patch := client.MergeFrom(claim.DeepCopy())
	claim.Finalizers = []string{hfv1.MachineClaimFinalizer}
	if err := operator.Patch(context.Background(), claim, patch); err != nil {
		t.Fatalf("adding %s as the operator: %v", hfv1.MachineClaimFinalizer, err)
	}
	return claim
}

// claim returns the claim as the API server has it; nil when it is gone.
func (c *cluster) claim(t *testing.T, claim *hfv1.MachineClaim) *hfv1.MachineClaim {
	t.Helper()
	got := &hfv1.MachineClaim{}
	err := c.env.Client.Get(context.Background(), client.ObjectKeyFromObject(claim), got)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	return got
}

// TestUpgradeUpdatesTheCRDs: helm upgrade from the previous chart to this
// one updates the CRDs in the API server: a field this chart's MachineClaim
// CRD has and the previous one's lacks is served after the upgrade, and a
// claim created before it is still there. From a chart whose CRDs were in
// Helm's crds/ directory (installed once, owned by no release) the upgrade
// must take ownership of them (--take-ownership, docs/operations.md,
// "Upgrading"): without it Helm refuses, naming the CRD.
func TestUpgradeUpdatesTheCRDs(t *testing.T) {
	cases := []struct {
		name, crdDir string
		// adopt: the previous chart's CRDs belong to no release.
		adopt bool
	}{
		{name: "from CRDs as templates", crdDir: filepath.Join("templates", "crds")},
		{name: "from CRDs in crds/", crdDir: "crds", adopt: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := newCluster(t)
			previous := previousChart(t, tc.crdDir)
			c.mustHelm(t, "install", lifecycleRelease, previous, "--namespace", lifecycleNamespace, "--create-namespace")
			if crd := c.crd(t, claimCRD); crd == nil || hasAddedField(crd) {
				t.Fatalf("the previous chart installed %s with %s, want it without", claimCRD, strings.Join(addedField, "."))
			}
			if err := c.createClaim(t, newClaim("early", true)); err == nil || !strings.Contains(err.Error(), "workloadConfig") {
				t.Fatalf("a claim with spec.workloadConfig under the previous CRD: %v, want a refusal naming the unknown field", err)
			}
			claim := c.createHeldClaim(t, "job-1")

			upgrade := []string{"upgrade", lifecycleRelease, chartDir, "--namespace", lifecycleNamespace}
			if tc.adopt {
				_, err := c.helm(t, upgrade...)
				if err == nil || !strings.Contains(err.Error(), `CustomResourceDefinition "cijobs.hyperfleet.io"`) ||
					!strings.Contains(err.Error(), "invalid ownership metadata") {
					t.Fatalf("helm upgrade over CRDs no release owns: %v, want Helm's refusal to adopt them", err)
				}
				upgrade = append(upgrade, "--take-ownership")
			}
			c.mustHelm(t, upgrade...)

			crd := c.crd(t, claimCRD)
			if crd == nil || !hasAddedField(crd) {
				t.Fatalf("after helm upgrade %s has no %s: the upgrade did not update the CRD", claimCRD, strings.Join(addedField, "."))
			}
			if got := crd.GetAnnotations()["helm.sh/resource-policy"]; got != "keep" {
				t.Errorf("after helm upgrade %s has helm.sh/resource-policy %q, want keep", claimCRD, got)
			}
			if got := crd.GetAnnotations()["meta.helm.sh/release-name"]; got != lifecycleRelease {
				t.Errorf("after helm upgrade %s belongs to release %q, want %q", claimCRD, got, lifecycleRelease)
			}
			if c.claim(t, claim) == nil {
				t.Errorf("the claim %s created before the upgrade is gone", claim.Name)
			}
			if err := c.createClaim(t, newClaim("late", true)); err != nil {
				t.Errorf("a claim with spec.workloadConfig after the upgrade: %v", err)
			}
		})
	}
}

// TestUninstallKeepsCRDsAndClaims: with crds.keep (the default) helm
// uninstall removes the manager but leaves every CRD, and with them every
// claim, untouched, and says so; the install's notes say what to do before
// uninstalling. With crds.keep off the uninstall deletes the CRDs, and so
// asks every claim to go; with no manager left to destroy its VM, the
// operator's finalizer holds the claim, and with it the CRD, in place
// (docs/operations.md, "Decommission"): nothing disappears silently.
func TestUninstallKeepsCRDsAndClaims(t *testing.T) {
	c := newCluster(t)
	ctx := context.Background()
	install := []string{"install", lifecycleRelease, chartDir, "--namespace", lifecycleNamespace, "--create-namespace"}
	notes := c.mustHelm(t, install...)
	for _, want := range []string{"Before helm uninstall", "delete every RunnerPool", "wait until no MachineClaim is left", `"Decommission"`} {
		if !strings.Contains(notes, want) {
			t.Errorf("the install's notes do not say %q:\n%s", want, notes)
		}
	}
	claim := c.createHeldClaim(t, "job-1")
	crdNames := []string{"cijobs.hyperfleet.io", "hypervisorclusters.hyperfleet.io", "hypervisormachinetemplates.hyperfleet.io",
		"ippools.hyperfleet.io", claimCRD, "runnerpools.hyperfleet.io"}

	out := c.mustHelm(t, "uninstall", lifecycleRelease, "--namespace", lifecycleNamespace)
	if !strings.Contains(out, "kept due to the resource policy") {
		t.Errorf("helm uninstall does not say it kept the CRDs:\n%s", out)
	}
	deploy := &unstructured.Unstructured{}
	deploy.SetAPIVersion("apps/v1")
	deploy.SetKind("Deployment")
	err := c.env.Client.Get(ctx, client.ObjectKey{Namespace: lifecycleNamespace, Name: "hyperfleet-manager"}, deploy)
	if !apierrors.IsNotFound(err) {
		t.Fatalf("after helm uninstall the manager's Deployment: %v, want it gone", err)
	}
	for _, name := range crdNames {
		if !strings.Contains(out, name) {
			t.Errorf("helm uninstall does not name %s among the kept resources:\n%s", name, out)
		}
		if crd := c.crd(t, name); crd == nil || crd.GetDeletionTimestamp() != nil {
			t.Errorf("after helm uninstall with crds.keep the CRD %s is gone or going", name)
		}
	}
	if got := c.claim(t, claim); got == nil || got.DeletionTimestamp != nil {
		t.Fatalf("after helm uninstall with crds.keep the claim %s is gone or going: %v", claim.Name, got)
	}

	// The same release again, now with crds.keep off: it takes the CRDs
	// back (they still name it), and its uninstall deletes them.
	c.mustHelm(t, append(install, "--set", "crds.keep=false")...)
	c.mustHelm(t, "uninstall", lifecycleRelease, "--namespace", lifecycleNamespace)
	deadline := time.Now().Add(time.Minute)
	for {
		got := c.claim(t, claim)
		if got == nil {
			t.Fatalf("the claim %s vanished with its CRD although it holds %s", claim.Name, hfv1.MachineClaimFinalizer)
		}
		if got.DeletionTimestamp != nil {
			if len(got.Finalizers) != 1 || got.Finalizers[0] != hfv1.MachineClaimFinalizer {
				t.Errorf("the deleted claim holds %v, want %s", got.Finalizers, hfv1.MachineClaimFinalizer)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a minute after helm uninstall with crds.keep off the claim %s is not being deleted", claim.Name)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if crd := c.crd(t, claimCRD); crd == nil || crd.GetDeletionTimestamp() == nil {
		t.Errorf("after helm uninstall with crds.keep off the CRD %s is %v, want it held, terminating, by its claim", claimCRD, crd)
	}
}

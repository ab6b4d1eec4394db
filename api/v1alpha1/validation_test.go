package v1alpha1_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/test/testenv"
)

var env *testenv.Environment

func TestMain(m *testing.M) {
	os.Exit(testenv.Run(m, &env))
}

// newNamespace creates a namespace for one test and removes it afterwards.
func newNamespace(t *testing.T) string {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "api-"}}
	if err := env.Client.Create(context.Background(), ns); err != nil {
		t.Fatalf("creating a test namespace: %v", err)
	}
	t.Cleanup(func() { _ = env.Client.Delete(context.Background(), ns) })
	return ns.Name
}

// readSamples returns every object in config/samples, keyed by file name.
func readSamples(t *testing.T) map[string]*unstructured.Unstructured {
	t.Helper()
	dir := filepath.Join(testenv.RepoRoot(), "config", "samples")
	files, err := filepath.Glob(filepath.Join(dir, "hyperfleet_*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no samples found in %s: %v", dir, err)
	}
	out := map[string]*unstructured.Unstructured{}
	for _, f := range files {
		raw, err := os.ReadFile(f)
		if err != nil {
			t.Fatalf("reading %s: %v", f, err)
		}
		u := &unstructured.Unstructured{}
		if err := utilyaml.Unmarshal(raw, &u.Object); err != nil {
			t.Fatalf("parsing %s: %v", f, err)
		}
		out[filepath.Base(f)] = u
	}
	return out
}

func isNamespaced(kind string) bool {
	return kind != "HypervisorCluster" && kind != "IPPool"
}

// TestSamplesAreAccepted creates every sample with strict field validation,
// so that a sample with a misspelt or unknown field fails too.
func TestSamplesAreAccepted(t *testing.T) {
	ctx := context.Background()
	ns := newNamespace(t)
	samples := readSamples(t)
	kinds := map[string]bool{}
	for file, obj := range samples {
		t.Run(file, func(t *testing.T) {
			kinds[obj.GetKind()] = true
			if isNamespaced(obj.GetKind()) {
				obj.SetNamespace(ns)
			}
			if err := env.Client.Create(ctx, obj, client.FieldValidation("Strict")); err != nil {
				t.Fatalf("the API server rejected sample %s: %v", file, err)
			}
			t.Cleanup(func() { _ = env.Client.Delete(ctx, obj) })
			// Decoding the stored object into the Go types strictly proves the
			// CRD schema and the Go types agree.
			typed, err := env.Scheme.New(obj.GroupVersionKind())
			if err != nil {
				t.Fatalf("the scheme does not know %s: %v", obj.GroupVersionKind(), err)
			}
			if err := runtime.DefaultUnstructuredConverter.FromUnstructuredWithValidation(obj.Object, typed, true); err != nil {
				t.Fatalf("stored %s does not decode into the Go types: %v", file, err)
			}
		})
	}
	for _, kind := range []string{"HypervisorCluster", "HypervisorMachineTemplate", "RunnerPool", "MachineClaim", "IPPool"} {
		if !kinds[kind] {
			t.Errorf("config/samples has no %s", kind)
		}
	}
}

// TestDefaultsAreApplied checks the defaults a user relies on without
// writing them.
func TestDefaultsAreApplied(t *testing.T) {
	ctx := context.Background()
	ns := newNamespace(t)
	tpl := validTemplate()
	tpl.SetNamespace(ns)
	// An empty cloudInit: its fields are defaulted, not the section itself.
	_ = unstructured.SetNestedMap(tpl.Object, map[string]any{}, "spec", "cloudInit")
	if err := env.Client.Create(ctx, tpl); err != nil {
		t.Fatalf("creating a minimal template: %v", err)
	}
	pool := validPool()
	pool.SetNamespace(ns)
	unstructured.RemoveNestedField(pool.Object, "spec", "scaling")
	if err := env.Client.Create(ctx, pool); err != nil {
		t.Fatalf("creating a minimal pool: %v", err)
	}
	cluster := validStoreCluster()
	cluster.SetName("defaults-store")
	_ = unstructured.SetNestedMap(cluster.Object, map[string]any{"name": "pve-client", "namespace": "hf"}, "spec", "credentials", "clientCert")
	_ = unstructured.SetNestedMap(cluster.Object, map[string]any{}, "spec", "dns", "validation")
	_ = unstructured.SetNestedMap(cluster.Object, map[string]any{}, "spec", "network", "validation")
	if err := env.Client.Create(ctx, cluster, client.FieldValidation("Strict")); err != nil {
		t.Fatalf("creating a cluster with a minimal secret store: %v", err)
	}
	t.Cleanup(func() { _ = env.Client.Delete(ctx, cluster) })
	store := []string{"spec", "spire", "secretStore"}
	want := []struct {
		obj   *unstructured.Unstructured
		path  []string
		value any
	}{
		{tpl, []string{"spec", "network", "mode"}, "dhcp"},
		{tpl, []string{"spec", "attestation", "method"}, "none"},
		{tpl, []string{"spec", "bootstrap", "method"}, "jit-config"},
		{tpl, []string{"spec", "bootstrap", "httpTimeout"}, "30s"},
		{tpl, []string{"spec", "bootstrap", "agentSource"}, "Image"},
		{tpl, []string{"spec", "bootstrap", "github", "apiBaseURL"}, "https://api.github.com"},
		{tpl, []string{"spec", "source", "proxmox", "cloneMode"}, "linked"},
		{tpl, []string{"spec", "cloudInit", "delivery"}, "iso"},
		{pool, []string{"spec", "scaling", "minReplicas"}, int64(0)},
		{pool, []string{"spec", "scaling", "maxReplicas"}, int64(10)},
		{pool, []string{"spec", "scaling", "scaleDownDelay"}, "5m"},
		{pool, []string{"spec", "lifecycle", "bootstrapTimeout"}, "10m"},
		{pool, []string{"spec", "lifecycle", "jobTimeout"}, "3h"},
		{cluster, []string{"spec", "probeTimeout"}, "10s"},
		{cluster, append(store, "kvMount"), "secret"},
		{cluster, append(store, "pathPrefix"), "hyperfleet"},
		{cluster, append(store, "authMount"), "jwt"},
		{cluster, append(store, "audience"), "hyperfleet-secret-store"},
		{cluster, append(store, "vmPolicy"), "hyperfleet-vm"},
		{cluster, []string{"spec", "credentials", "clientCert", "certificateKey"}, hfv1.DefaultClientCertificateKey},
		{cluster, []string{"spec", "credentials", "clientCert", "privateKeyKey"}, hfv1.DefaultClientPrivateKeyKey},
		// The validation settings' defaults are the operator's own for a
		// field left out (hfv1.Default*; planValidation).
		{cluster, []string{"spec", "dns", "validation", "enabled"}, true},
		{cluster, []string{"spec", "dns", "validation", "validateOnReady"}, true},
		{cluster, []string{"spec", "dns", "validation", "validateInterval"}, "5m"},
		{cluster, []string{"spec", "dns", "validation", "timeoutSeconds"}, int64(hfv1.DefaultDNSValidationTimeoutSeconds)},
		{cluster, []string{"spec", "dns", "validation", "onFailure"}, string(hfv1.ValidationReport)},
		{cluster, []string{"spec", "network", "validation", "enabled"}, true},
		{cluster, []string{"spec", "network", "validation", "pingTest"}, true},
		{cluster, []string{"spec", "network", "validation", "sshPort"}, int64(hfv1.DefaultSSHPort)},
		{cluster, []string{"spec", "network", "validation", "timeoutSeconds"}, int64(hfv1.DefaultNetworkValidationTimeoutSeconds)},
		{cluster, []string{"spec", "network", "validation", "onFailure"}, string(hfv1.ValidationReport)},
	}
	for _, w := range want {
		got, found, err := unstructured.NestedFieldNoCopy(w.obj.Object, w.path...)
		if err != nil || !found || got != w.value {
			t.Errorf("%s %s: got %v (found %v, err %v), want default %v", w.obj.GetKind(), strings.Join(w.path, "."), got, found, err, w.value)
		}
	}
}

// TestGitLabObjectsAreAccepted: a GitLab template (each scope), pool and
// claim are accepted, with the defaults the GitLab back-end relies on.
func TestGitLabObjectsAreAccepted(t *testing.T) {
	ctx := context.Background()
	ns := newNamespace(t)
	create := func(obj *unstructured.Unstructured) {
		t.Helper()
		obj.SetNamespace(ns)
		if err := env.Client.Create(ctx, obj, client.FieldValidation("Strict")); err != nil {
			t.Fatalf("creating %s %s: %v", obj.GetKind(), obj.GetName(), err)
		}
	}
	tpl := validGitLabTemplate()
	_ = unstructured.SetNestedMap(tpl.Object, map[string]any{}, "spec", "bootstrap", "gitlab", "runner")
	create(tpl)
	for name, scope := range map[string][2]any{"project": {"project", "acme/platform/app"}, "instance": {"instance", true}, "top-group": {"group", "acme"}} {
		other := validGitLabTemplate()
		other.SetName("tpl-" + name)
		unstructured.RemoveNestedField(other.Object, "spec", "bootstrap", "gitlab", "group")
		_ = unstructured.SetNestedField(other.Object, scope[1], "spec", "bootstrap", "gitlab", scope[0].(string))
		create(other)
	}
	pool := validGitLabPool()
	_ = unstructured.SetNestedField(pool.Object, "acme/platform/app", "spec", "workload", "gitlab", "project")
	_ = unstructured.SetNestedField(pool.Object, true, "spec", "workload", "gitlab", "runUntagged")
	create(pool)
	claim := validClaim()
	_ = unstructured.SetNestedMap(claim.Object, map[string]any{"type": "gitlab-ci", "gitlab": map[string]any{"tags": []any{"linux"}, "runUntagged": false}}, "spec", "workloadConfig")
	create(claim)
	gl := []string{"spec", "bootstrap", "gitlab"}
	for _, w := range []struct {
		path  []string
		value any
	}{
		{append(gl, "url"), "https://gitlab.com"},
		{append(gl, "accessLevel"), "not_protected"},
		{append(gl, "runner", "path"), "/usr/local/bin/gitlab-runner"},
		{append(gl, "runner", "buildsDir"), "/var/lib/hyperfleet/builds"},
		{append(gl, "runner", "os"), "linux"},
		{append(gl, "runner", "arch"), "amd64"},
	} {
		got, found, err := unstructured.NestedFieldNoCopy(tpl.Object, w.path...)
		if err != nil || !found || got != w.value {
			t.Errorf("%s: got %v (found %v, err %v), want default %v", strings.Join(w.path, "."), got, found, err, w.value)
		}
	}
	typed := &hfv1.HypervisorMachineTemplate{}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructuredWithValidation(tpl.Object, typed, true); err != nil {
		t.Fatalf("the stored template does not decode into the Go types: %v", err)
	}
	if g := typed.Spec.Bootstrap.GitLab; g == nil || g.Group != "acme/platform" || g.Credentials.Token.Key != "token" {
		t.Fatalf("decoded bootstrap.gitlab = %+v", g)
	}
}

// TestCloneLimitDefaults: a clone limit left out of spec.limits is
// defaulted by the API server to the value the operator uses when limits
// is unset (DefaultClonesPerNode, DefaultClonesPerStorage), so that
// leaving a field out and leaving limits out mean the same.
func TestCloneLimitDefaults(t *testing.T) {
	ctx := context.Background()
	cases := map[string]struct {
		limits            map[string]any
		perNode, perStore int64
	}{
		"empty limits":          {map[string]any{}, hfv1.DefaultClonesPerNode, hfv1.DefaultClonesPerStorage},
		"only clonesPerNode":    {map[string]any{"clonesPerNode": int64(1)}, 1, hfv1.DefaultClonesPerStorage},
		"only clonesPerStorage": {map[string]any{"clonesPerStorage": int64(9)}, hfv1.DefaultClonesPerNode, 9},
	}
	i := 0
	for name, tc := range cases {
		i++
		t.Run(name, func(t *testing.T) {
			c := validCluster()
			c.SetName(fmt.Sprintf("limits-%d", i))
			set(tc.limits, "spec", "limits")(c)
			if err := env.Client.Create(ctx, c); err != nil {
				t.Fatalf("creating the cluster: %v", err)
			}
			t.Cleanup(func() { _ = env.Client.Delete(ctx, c) })
			perNode, _, _ := unstructured.NestedInt64(c.Object, "spec", "limits", "clonesPerNode")
			perStore, _, _ := unstructured.NestedInt64(c.Object, "spec", "limits", "clonesPerStorage")
			if perNode != tc.perNode || perStore != tc.perStore {
				t.Errorf("stored limits: clonesPerNode %d, clonesPerStorage %d; want %d and %d", perNode, perStore, tc.perNode, tc.perStore)
			}
		})
	}
}

// TestScaleSubresource checks that `kubectl scale` on a RunnerPool sets
// spec.scaling.minReplicas.
func TestScaleSubresource(t *testing.T) {
	ctx := context.Background()
	ns := newNamespace(t)
	pool := validPool()
	pool.SetNamespace(ns)
	if err := env.Client.Create(ctx, pool); err != nil {
		t.Fatalf("creating the pool: %v", err)
	}
	scale := &unstructured.Unstructured{}
	scale.SetAPIVersion("autoscaling/v1")
	scale.SetKind("Scale")
	if err := env.Client.SubResource("scale").Get(ctx, pool, scale); err != nil {
		t.Fatalf("reading the scale subresource: %v", err)
	}
	if err := unstructured.SetNestedField(scale.Object, int64(3), "spec", "replicas"); err != nil {
		t.Fatal(err)
	}
	if err := env.Client.SubResource("scale").Update(ctx, pool, client.WithSubResourceBody(scale)); err != nil {
		t.Fatalf("scaling the pool: %v", err)
	}
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(pool), pool); err != nil {
		t.Fatal(err)
	}
	if got, _, _ := unstructured.NestedInt64(pool.Object, "spec", "scaling", "minReplicas"); got != 3 {
		t.Fatalf("after scaling to 3, spec.scaling.minReplicas is %d", got)
	}
}

// mutation changes a valid object into the object under test.
type mutation func(u *unstructured.Unstructured)

func set(value any, path ...string) mutation {
	return func(u *unstructured.Unstructured) {
		if err := unstructured.SetNestedField(u.Object, deepCopyValue(value), path...); err != nil {
			panic(fmt.Sprintf("setting %v: %v", path, err))
		}
	}
}

func del(path ...string) mutation {
	return func(u *unstructured.Unstructured) { unstructured.RemoveNestedField(u.Object, path...) }
}

func all(ms ...mutation) mutation {
	return func(u *unstructured.Unstructured) {
		for _, m := range ms {
			m(u)
		}
	}
}

func deepCopyValue(v any) any {
	switch v := v.(type) {
	case []string:
		out := make([]any, len(v))
		for i, s := range v {
			out[i] = s
		}
		return out
	case int:
		return int64(v)
	case map[string]any:
		return runtime.DeepCopyJSONValue(v)
	default:
		return v
	}
}

func secretRef(name, key string) map[string]any {
	return map[string]any{"name": name, "namespace": "hyperfleet-system", "key": key}
}

func object(kind, name string, spec map[string]any) *unstructured.Unstructured {
	u := &unstructured.Unstructured{Object: map[string]any{"spec": spec}}
	u.SetAPIVersion("hyperfleet.io/v1alpha1")
	u.SetKind(kind)
	u.SetName(name)
	return u
}

func validCluster() *unstructured.Unstructured {
	return object("HypervisorCluster", "", map[string]any{
		"provider": "proxmox",
		"endpoint": "https://pve.example.com:8006/api2/json",
		"credentials": map[string]any{
			"tokenID":     secretRef("pve", "tokenId"),
			"tokenSecret": secretRef("pve", "tokenSecret"),
		},
	})
}

// validStoreCluster is validCluster with SPIRE and a secrets store.
func validStoreCluster() *unstructured.Unstructured {
	u := validCluster()
	set(map[string]any{
		"trustDomain":   "ci.example.org",
		"serverAddress": "spire.ci.example.org:8081",
		"serverAPI":     map[string]any{"adminSocket": "/run/spire/server/api.sock"},
		"secretStore": map[string]any{
			"address":  "https://vault.example.com:8200",
			"tokenRef": secretRef("vault", "token"),
		},
	}, "spec", "spire")(u)
	return u
}

func validTemplate() *unstructured.Unstructured {
	return object("HypervisorMachineTemplate", "tpl", map[string]any{
		"hypervisorClusterRef": map[string]any{"name": "pve"},
		"source":               map[string]any{"proxmox": map[string]any{"templateID": int64(9000)}},
		"resources":            map[string]any{"cpu": int64(2), "memory": "4Gi"},
		"bootstrap": map[string]any{"github": map[string]any{
			"credentials": map[string]any{"pat": map[string]any{"name": "gh", "key": "token"}},
			"owner":       "example",
			"repository":  "app",
		}},
	})
}

// enterpriseTemplate turns validTemplate into one of enterprise runners.
var enterpriseTemplate = all(del("spec", "bootstrap", "github", "repository"), del("spec", "bootstrap", "github", "owner"),
	set("acme-corp", "spec", "bootstrap", "github", "enterprise"), set("linux", "spec", "bootstrap", "github", "runnerGroup"))

// validWindowsTemplate is a GitHub template of Windows VMs (docs/windows.md).
func validWindowsTemplate() *unstructured.Unstructured {
	u := validTemplate()
	set("windows", "spec", "guest", "os")(u)
	set("win", "spec", "bootstrap", "github", "runner", "os")(u)
	return u
}

func validGenericTemplate() *unstructured.Unstructured {
	return object("HypervisorMachineTemplate", "tpl", map[string]any{
		"hypervisorClusterRef": map[string]any{"name": "pve"},
		"source":               map[string]any{"proxmox": map[string]any{"templateID": int64(9000)}},
		"resources":            map[string]any{"cpu": int64(2), "memory": "4Gi"},
		"bootstrap":            map[string]any{"generic": map[string]any{"script": "echo hello"}},
	})
}

func validGenericPool() *unstructured.Unstructured {
	return object("RunnerPool", "pool", map[string]any{
		"templateRef": map[string]any{"name": "tpl"},
		"workload":    map[string]any{"type": "generic"},
		"scaling":     map[string]any{"minReplicas": int64(2), "maxReplicas": int64(5)},
	})
}

// validGitLabTemplate is a template of GitLab group runners.
func validGitLabTemplate() *unstructured.Unstructured {
	return object("HypervisorMachineTemplate", "tpl", map[string]any{
		"hypervisorClusterRef": map[string]any{"name": "pve"},
		"source":               map[string]any{"proxmox": map[string]any{"templateID": int64(9000)}},
		"resources":            map[string]any{"cpu": int64(2), "memory": "4Gi"},
		"bootstrap": map[string]any{"gitlab": map[string]any{
			"credentials": map[string]any{"token": map[string]any{"name": "gl", "key": "token"}},
			"group":       "acme/platform",
		}},
	})
}

// validGitLabPool is a gitlab-ci pool of tagged jobs.
func validGitLabPool() *unstructured.Unstructured {
	return object("RunnerPool", "pool", map[string]any{
		"templateRef": map[string]any{"name": "tpl"},
		"workload": map[string]any{
			"type":   "gitlab-ci",
			"gitlab": map[string]any{"tags": []any{"linux", "docker"}},
		},
	})
}

func validPool() *unstructured.Unstructured {
	return object("RunnerPool", "pool", map[string]any{
		"templateRef": map[string]any{"name": "tpl"},
		"workload": map[string]any{
			"type":   "github-actions",
			"github": map[string]any{"labels": []any{"linux"}},
		},
		"scaling": map[string]any{"minReplicas": int64(0), "maxReplicas": int64(5)},
	})
}

func validClaim() *unstructured.Unstructured {
	return object("MachineClaim", "claim", map[string]any{
		"templateRef":   map[string]any{"name": "tpl"},
		"runnerPoolRef": map[string]any{"name": "pool"},
	})
}

// validCIJob is a CIJob of a GitHub job, recorded with an integer jobID as
// every CIJob was before jobKey existed.
func validCIJob() *unstructured.Unstructured {
	return object("CIJob", "github-actions-4242", map[string]any{
		"platform":      "github-actions",
		"jobID":         int64(4242),
		"repository":    "octo-org/app",
		"runnerPoolRef": map[string]any{"name": "pool"},
	})
}

func validIPPool() *unstructured.Unstructured {
	return object("IPPool", "", map[string]any{
		"addresses": []any{"10.0.0.0/24"},
		"prefix":    int64(24),
	})
}

type invalidCase struct {
	name   string
	base   func() *unstructured.Unstructured
	mutate mutation
	// update, when set, is applied to the created object; the update must be
	// rejected (immutability and transition rules). mutate must then leave
	// the object valid.
	update mutation
	// status sends the update through the status subresource.
	status bool
	want   string
}

func invalidCases() []invalidCase {
	return []invalidCase{
		// HypervisorCluster
		{name: "cluster unknown provider", base: validCluster, mutate: set("vsphere", "spec", "provider"), want: `spec.provider: Unsupported value: "vsphere"`},
		{name: "cluster http endpoint", base: validCluster, mutate: set("http://pve.example.com:8006/api2/json", "spec", "endpoint"), want: "endpoint must be an https:// URL"},
		{name: "cluster endpoint not a URL", base: validCluster, mutate: set("pve.example.com:8006", "spec", "endpoint"), want: "endpoint must be an https:// URL"},
		{name: "cluster spire socket and address", base: validCluster, mutate: set(map[string]any{"trustDomain": "example.org", "serverAddress": "spire:8081",
			"serverAPI": map[string]any{"adminSocket": "/run/spire/api.sock", "address": "spire:8081", "workloadAPISocket": "/run/spire/agent.sock"}}, "spec", "spire"),
			want: "set exactly one of spire.serverAPI.adminSocket"},
		{name: "cluster spire no server API", base: validCluster, mutate: set(map[string]any{"trustDomain": "example.org", "serverAddress": "spire:8081",
			"serverAPI": map[string]any{}}, "spec", "spire"), want: "set exactly one of spire.serverAPI.adminSocket"},
		{name: "cluster spire mTLS without own SVID", base: validCluster, mutate: set(map[string]any{"trustDomain": "example.org", "serverAddress": "spire:8081",
			"serverAPI": map[string]any{"address": "spire:8081"}}, "spec", "spire"), want: "spire.serverAPI.address needs spire.serverAPI.workloadAPISocket"},
		{name: "cluster spire serverID with socket", base: validCluster, mutate: set(map[string]any{"trustDomain": "example.org", "serverAddress": "spire:8081",
			"serverAPI": map[string]any{"adminSocket": "/run/spire/api.sock", "serverID": "spiffe://example.org/spire/server"}}, "spec", "spire"),
			want: "workloadAPISocket and serverID apply only with spire.serverAPI.address"},
		{name: "cluster spire token bounds reversed", base: validCluster, mutate: set(map[string]any{"trustDomain": "example.org", "serverAddress": "spire:8081",
			"serverAPI": map[string]any{"adminSocket": "/run/spire/api.sock"}, "joinTokenTTL": map[string]any{"min": "1h", "max": "10m"}}, "spec", "spire"),
			want: "spire.joinTokenTTL.min must not be longer than spire.joinTokenTTL.max"},
		{name: "cluster spire deadline too short", base: validCluster, mutate: set(map[string]any{"trustDomain": "example.org", "serverAddress": "spire:8081",
			"serverAPI": map[string]any{"adminSocket": "/run/spire/api.sock"}, "attestationDeadline": "1s"}, "spec", "spire"),
			want: "spire.attestationDeadline must be between 10s and 2h"},
		{name: "cluster spire bad trust domain", base: validCluster, mutate: set(map[string]any{"trustDomain": "Example.ORG", "serverAddress": "spire:8081",
			"serverAPI": map[string]any{"adminSocket": "/run/spire/api.sock"}}, "spec", "spire"), want: "spec.spire.trustDomain"},
		{name: "cluster spire address without port", base: validCluster, mutate: set(map[string]any{"trustDomain": "example.org", "serverAddress": "spire",
			"serverAPI": map[string]any{"adminSocket": "/run/spire/api.sock"}}, "spec", "spire"), want: "spec.spire.serverAddress"},
		{name: "cluster no credentials", base: validCluster, mutate: set(map[string]any{}, "spec", "credentials"), want: "set exactly one credential pair"},
		{name: "cluster token and password", base: validCluster, mutate: all(set(secretRef("pve", "user"), "spec", "credentials", "username"), set(secretRef("pve", "pw"), "spec", "credentials", "password")), want: "set exactly one credential pair"},
		{name: "cluster token without secret", base: validCluster, mutate: del("spec", "credentials", "tokenSecret"), want: "set exactly one credential pair"},
		{name: "cluster secret ref without namespace", base: validCluster, mutate: del("spec", "credentials", "tokenID", "namespace"), want: "spec.credentials.tokenID.namespace: Required value"},
		{name: "cluster clientCert with one key for both", base: validCluster, mutate: set(map[string]any{"name": "pve-client", "namespace": "hf", "certificateKey": "client.pem", "privateKeyKey": "client.pem"}, "spec", "credentials", "clientCert"),
			want: "credentials.clientCert: certificateKey and privateKeyKey must name two different keys of the Secret"},
		{name: "cluster clientCert without namespace", base: validCluster, mutate: set(map[string]any{"name": "pve-client"}, "spec", "credentials", "clientCert"), want: "spec.credentials.clientCert.namespace: Required value"},
		{name: "cluster clientCert alone", base: validCluster, mutate: all(del("spec", "credentials", "tokenID"), del("spec", "credentials", "tokenSecret"), set(map[string]any{"name": "pve-client", "namespace": "hf"}, "spec", "credentials", "clientCert")),
			want: "set exactly one credential pair"},
		{name: "cluster two TLS trust modes", base: validCluster, mutate: set(map[string]any{"insecureSkipVerify": true, "fingerprintSHA256": strings.Repeat("AB:", 31) + "AB"}, "spec", "tls"), want: "set at most one of tls.caBundleRef, tls.fingerprintSHA256 and tls.insecureSkipVerify=true"},
		{name: "cluster malformed fingerprint", base: validCluster, mutate: set("AB:CD", "spec", "tls", "fingerprintSHA256"), want: "spec.tls.fingerprintSHA256: Invalid value"},
		{name: "cluster vmid range reversed", base: validCluster, mutate: set(map[string]any{"start": int64(2000), "end": int64(1000)}, "spec", "vmidRange"), want: "vmidRange.start must not be greater than vmidRange.end"},
		{name: "cluster vmid below 100", base: validCluster, mutate: set(map[string]any{"start": int64(99), "end": int64(1000)}, "spec", "vmidRange"), want: "spec.vmidRange.start: Invalid value: 99: spec.vmidRange.start in body should be greater than or equal to 100"},
		{name: "cluster vmidRange in both places", base: validCluster,
			mutate: all(set(map[string]any{"start": int64(1000), "end": int64(1999)}, "spec", "vmidRange"), set(map[string]any{"start": int64(1000), "end": int64(1999)}, "spec", "proxmox", "vmidRange")),
			want:   "spec.vmidRange: Invalid value: \"object\": vmidRange is set twice: remove the deprecated spec.vmidRange and keep spec.proxmox.vmidRange"},
		{name: "cluster isoStorage in both places", base: validCluster,
			mutate: all(set("local", "spec", "isoStorage"), set("cephfs", "spec", "proxmox", "isoStorage")),
			want:   "spec.isoStorage: Invalid value: \"object\": isoStorage is set twice: remove the deprecated spec.isoStorage and keep spec.proxmox.isoStorage"},
		{name: "cluster proxmox vmid range reversed", base: validCluster, mutate: set(map[string]any{"start": int64(2000), "end": int64(1000)}, "spec", "proxmox", "vmidRange"), want: "vmidRange.start must not be greater than vmidRange.end"},
		{name: "cluster proxmox iso storage malformed", base: validCluster, mutate: set("not/a/storage", "spec", "proxmox", "isoStorage"), want: "spec.proxmox.isoStorage: Invalid value"},
		{name: "cluster adds the proxmox vmidRange without removing the deprecated one", base: validCluster,
			mutate: set(map[string]any{"start": int64(1000), "end": int64(1999)}, "spec", "vmidRange"),
			update: set(map[string]any{"start": int64(1000), "end": int64(1999)}, "spec", "proxmox", "vmidRange"),
			want:   "remove the deprecated spec.vmidRange"},
		{name: "cluster illegal proxmox tag", base: validCluster, mutate: set([]string{"hyperfleet.io/managed-by=x"}, "spec", "tags"), want: "spec.tags[0]: Invalid value"},
		{name: "cluster clone limit too high", base: validCluster, mutate: set(int64(100), "spec", "limits", "clonesPerNode"), want: "spec.limits.clonesPerNode: Invalid value: 100"},
		{name: "cluster poll interval too short", base: validCluster, mutate: set("100ms", "spec", "pollInterval"), want: "pollInterval must be between 1s and 5m"},
		{name: "cluster probe timeout too short", base: validCluster, mutate: set("500ms", "spec", "probeTimeout"), want: "probeTimeout must be between 1s and 30s"},
		{name: "cluster probe timeout longer than a request", base: validCluster, mutate: set("1m", "spec", "probeTimeout"), want: "probeTimeout must be between 1s and 30s"},
		{name: "cluster probe timeout not a duration", base: validCluster, mutate: set("ten seconds", "spec", "probeTimeout"), want: "spec.probeTimeout"},
		{name: "cluster poll interval not a duration", base: validCluster, mutate: set("often", "spec", "pollInterval"), want: "spec.pollInterval: Invalid value"},
		{name: "cluster dns server not an IP", base: validCluster, mutate: set([]string{"dns.example.com"}, "spec", "dns", "servers"), want: "each DNS server must be an IPv4 or IPv6 address"},
		{name: "cluster network validation checking nothing", base: validCluster, mutate: set(map[string]any{"pingTest": false}, "spec", "network", "validation"),
			want: "network.validation checks nothing with pingTest and sshTest both false: set one of them to true, or enabled: false"},
		{name: "cluster dns validation interval too short", base: validCluster, mutate: set(map[string]any{"validateInterval": "30s"}, "spec", "dns", "validation"),
			want: "dns.validation.validateInterval must be 0s (validate once) or between 1m and 24h"},
		{name: "cluster dns validation that never runs", base: validCluster, mutate: set(map[string]any{"validateOnReady": false, "validateInterval": "0s"}, "spec", "dns", "validation"),
			want: "dns.validation never validates with validateOnReady false and validateInterval 0s"},
		{name: "cluster dns validation timeout too long", base: validCluster, mutate: set(map[string]any{"timeoutSeconds": int64(61)}, "spec", "dns", "validation"),
			want: "spec.dns.validation.timeoutSeconds: Invalid value: 61"},
		{name: "cluster network validation unknown onFailure", base: validCluster, mutate: set(map[string]any{"onFailure": "Delete"}, "spec", "network", "validation"),
			want: "spec.network.validation.onFailure: Unsupported value: \"Delete\""},
		{name: "cluster ssh port out of range", base: validCluster, mutate: set(map[string]any{"sshTest": true, "sshPort": int64(70000)}, "spec", "network", "validation"),
			want: "spec.network.validation.sshPort: Invalid value: 70000"},
		{name: "cluster registerVMs without provider", base: validCluster, mutate: set(map[string]any{"domain": "ci.example.com", "registerVMs": true}, "spec", "dns"), want: "dns.registerVMs needs dns.dnsProvider"},
		{name: "cluster dns provider without zone", base: validCluster,
			mutate: set(map[string]any{"dnsProvider": rfc2136Provider()}, "spec", "dns"), want: "dns.dnsProvider needs a zone"},
		{name: "cluster rfc2136 without server", base: validCluster,
			mutate: set(map[string]any{"domain": "ci.example.com", "dnsProvider": without(rfc2136Provider(), "rfc2136")}, "spec", "dns"), want: "needs dns.dnsProvider.rfc2136 with the server's address"},
		{name: "cluster rfc2136 without tsig key", base: validCluster,
			mutate: set(map[string]any{"domain": "ci.example.com", "dnsProvider": without(rfc2136Provider(), "credentials")}, "spec", "dns"), want: "needs a credential named tsigKey"},
		{name: "cluster rfc2136 settings on external-dns", base: validCluster,
			mutate: set(map[string]any{"domain": "ci.example.com", "dnsProvider": with(rfc2136Provider(), "type", "external-dns")}, "spec", "dns"), want: "dns.dnsProvider.rfc2136 is only for type rfc2136"},
		{name: "cluster dns type route53", base: validCluster,
			mutate: set(map[string]any{"domain": "ci.example.com", "dnsProvider": map[string]any{"type": "route53"}}, "spec", "dns"), want: "set type: external-dns and externalDNS.labelValue to the same word"},
		{name: "cluster dns type cloudflare", base: validCluster,
			mutate: set(map[string]any{"domain": "ci.example.com", "dnsProvider": map[string]any{"type": "cloudflare"}}, "spec", "dns"), want: "HyperFleet never talks to those services"},
		{name: "cluster external-dns label not a label value", base: validCluster,
			mutate: set(map[string]any{"domain": "ci.example.com", "dnsProvider": map[string]any{"type": "external-dns", "externalDNS": map[string]any{"labelValue": "Route 53"}}}, "spec", "dns"), want: "spec.dns.dnsProvider.externalDNS.labelValue: Invalid value"},
		{name: "cluster externalDNS settings on rfc2136", base: validCluster,
			mutate: set(map[string]any{"domain": "ci.example.com", "dnsProvider": with(rfc2136Provider(), "externalDNS", map[string]any{"namespace": "external-dns"})}, "spec", "dns"), want: "dns.dnsProvider.externalDNS is for type external-dns"},
		{name: "cluster credentials on external-dns", base: validCluster,
			mutate: set(map[string]any{"domain": "ci.example.com", "dnsProvider": without(with(rfc2136Provider(), "type", "external-dns"), "rfc2136")}, "spec", "dns"), want: "dns.dnsProvider.credentials are for type rfc2136 only"},
		{name: "cluster credentials on external-dns", base: validCluster,
			mutate: set(map[string]any{"domain": "ci.example.com", "dnsProvider": without(with(rfc2136Provider(), "type", "external-dns"), "rfc2136")}, "spec", "dns"), want: "external-dns holds the DNS service's credentials"},
		{name: "cluster externalDNS namespace malformed", base: validCluster,
			mutate: set(map[string]any{"domain": "ci.example.com", "dnsProvider": map[string]any{"type": "external-dns", "externalDNS": map[string]any{"namespace": "Not_A_Namespace"}}}, "spec", "dns"), want: "spec.dns.dnsProvider.externalDNS.namespace: Invalid value"},
		{name: "cluster dns provider type unknown", base: validCluster,
			mutate: set(map[string]any{"domain": "ci.example.com", "dnsProvider": map[string]any{"type": "externaldns"}}, "spec", "dns"), want: "spec.dns.dnsProvider.type: Unsupported value"},
		{name: "cluster rfc2136 server without port", base: validCluster,
			mutate: set(map[string]any{"domain": "ci.example.com", "dnsProvider": with(rfc2136Provider(), "rfc2136", map[string]any{"server": "ns1.example.com"})}, "spec", "dns"), want: "spec.dns.dnsProvider.rfc2136.server: Invalid value"},
		{name: "cluster reverse zone outside arpa", base: validCluster,
			mutate: set(map[string]any{"domain": "ci.example.com", "dnsProvider": with(rfc2136Provider(), "reverseZones", []any{"example.com"})}, "spec", "dns"), want: "must be a zone below in-addr.arpa or ip6.arpa"},
		{name: "cluster dns ttl too short", base: validCluster,
			mutate: set(map[string]any{"domain": "ci.example.com", "dnsProvider": with(rfc2136Provider(), "ttlSeconds", int64(1))}, "spec", "dns"), want: "spec.dns.dnsProvider.ttlSeconds: Invalid value: 1"},
		{name: "cluster secret store over http", base: validStoreCluster, mutate: set("http://vault.example.com:8200", "spec", "spire", "secretStore", "address"), want: "spire.secretStore.address must be an https:// URL"},
		{name: "cluster secret store address with a path", base: validStoreCluster, mutate: set("https://vault.example.com:8200/v1", "spec", "spire", "secretStore", "address"), want: "spire.secretStore.address must be an https:// URL without a path"},
		{name: "cluster secret store address not a URL", base: validStoreCluster, mutate: set("vault.example.com:8200", "spec", "spire", "secretStore", "address"), want: "spire.secretStore.address must be an https:// URL"},
		{name: "cluster secret store without token", base: validStoreCluster, mutate: del("spec", "spire", "secretStore", "tokenRef"), want: "spec.spire.secretStore.tokenRef: Required value"},
		{name: "cluster secret store prefix with dot-dot", base: validStoreCluster, mutate: set("hyperfleet/../sys", "spec", "spire", "secretStore", "pathPrefix"), want: "spec.spire.secretStore.pathPrefix: Invalid value"},
		{name: "cluster secret store absolute kv mount", base: validStoreCluster, mutate: set("/secret", "spec", "spire", "secretStore", "kvMount"), want: "spec.spire.secretStore.kvMount: Invalid value"},
		{name: "cluster secret store audience with space", base: validStoreCluster, mutate: set("hyperfleet store", "spec", "spire", "secretStore", "audience"), want: "spec.spire.secretStore.audience: Invalid value"},
		{name: "cluster secret store policy with slash", base: validStoreCluster, mutate: set("vm/all", "spec", "spire", "secretStore", "vmPolicy"), want: "spec.spire.secretStore.vmPolicy: Invalid value"},
		{name: "cluster duplicate nodes", base: validCluster, mutate: set([]string{"pve1", "pve1"}, "spec", "nodes"), want: "nodes must not list a node twice"},

		// HypervisorMachineTemplate
		// A Windows guest (docs/windows.md): what its agent and user data do not build is refused.
		{name: "windows guest gitlab", base: validGitLabTemplate, mutate: set("windows", "spec", "guest", "os"), want: "guest.os windows runs GitHub Actions runners only"},
		{name: "windows guest generic", base: validGenericTemplate, mutate: set("windows", "spec", "guest", "os"), want: "guest.os windows runs GitHub Actions runners only"},
		{name: "windows guest linux runner", base: validTemplate, mutate: set("windows", "spec", "guest", "os"), want: "guest.os windows needs bootstrap.github.runner.os: win"},
		{name: "win runner on linux guest", base: validTemplate, mutate: set("win", "spec", "bootstrap", "github", "runner", "os"), want: "bootstrap.github.runner.os win needs a Windows template: set guest.os: windows"},
		{name: "win runner on explicit linux guest", base: validTemplate, mutate: all(set("linux", "spec", "guest", "os"), set("win", "spec", "bootstrap", "github", "runner", "os")), want: "bootstrap.github.runner.os win needs a Windows template"},
		{name: "windows guest attests", base: validWindowsTemplate, mutate: set("join-token", "spec", "attestation", "method"), want: "guest.os windows cannot attest"},
		{name: "windows guest proxmox delivery", base: validWindowsTemplate, mutate: set(map[string]any{"delivery": "proxmox"}, "spec", "cloudInit"), want: "guest.os windows takes its user data from the NoCloud ISO"},
		{name: "windows guest user data", base: validWindowsTemplate, mutate: set(map[string]any{"userData": "#cloud-config\n"}, "spec", "cloudInit"), want: "not merged into a Windows VM's cloudbase-init data"},
		{name: "windows guest static network", base: validWindowsTemplate, mutate: set(map[string]any{"mode": "static", "ipPoolRef": map[string]any{"name": "pool"}}, "spec", "network"), want: "guest.os windows takes its address from Windows' own DHCP client"},
		{name: "windows guest dhcp hostname identifier", base: validWindowsTemplate, mutate: set(map[string]any{"mode": "dhcp", "dhcp": map[string]any{"clientIdentifier": "hostname"}}, "spec", "network"), want: "guest.os windows takes its address from Windows' own DHCP client"},
		{name: "windows guest dhcp lease time", base: validWindowsTemplate, mutate: set(map[string]any{"mode": "dhcp", "dhcp": map[string]any{"leaseTime": "30m", "client": "isc-dhcp-client"}}, "spec", "network"), want: "guest.os windows takes its address from Windows' own DHCP client"},
		{name: "windows guest agent from operator", base: validWindowsTemplate, mutate: set("Operator", "spec", "bootstrap", "agentSource"), want: "guest.os windows needs the agent in the image"},
		{name: "guest os unknown", base: validTemplate, mutate: set("freebsd", "spec", "guest", "os"), want: `spec.guest.os: Unsupported value: "freebsd"`},
		{name: "template id and name", base: validTemplate, mutate: set("debian", "spec", "source", "proxmox", "templateName"), want: "set exactly one of source.proxmox.templateID, templateName and templateSelector"},
		{name: "template neither id nor name", base: validTemplate, mutate: del("spec", "source", "proxmox", "templateID"), want: "set exactly one of source.proxmox.templateID, templateName and templateSelector"},
		{name: "template storage on linked clone", base: validTemplate, mutate: set("local-lvm", "spec", "source", "proxmox", "storage"), want: "storage and format apply only to full clones"},
		{name: "template unknown clone mode", base: validTemplate, mutate: set("instant", "spec", "source", "proxmox", "cloneMode"), want: `spec.source.proxmox.cloneMode: Unsupported value: "instant"`},
		{name: "template zero cpu", base: validTemplate, mutate: set(int64(0), "spec", "resources", "cpu"), want: "spec.resources.cpu: Invalid value: 0"},
		{name: "template too little memory", base: validTemplate, mutate: set("64Mi", "spec", "resources", "memory"), want: "resources.memory must be between 256Mi and 4Ti"},
		{name: "template tiny disk", base: validTemplate, mutate: set("100Mi", "spec", "resources", "disk"), want: "resources.disk must be between 1Gi and 64Ti"},
		{name: "template vlan out of range", base: validTemplate, mutate: set(int64(4095), "spec", "network", "vlan"), want: "spec.network.vlan: Invalid value: 4095"},
		{name: "template static without pool", base: validTemplate, mutate: set("static", "spec", "network", "mode"), want: "network.mode static needs network.ipPoolRef"},
		{name: "template proxy naming no proxy", base: validTemplate, mutate: set(map[string]any{"noProxy": []any{".example.com"}}, "spec", "network", "proxy"),
			want: "network.proxy names no proxy: set httpProxy, httpsProxy or both"},
		{name: "template proxy with credentials", base: validTemplate, mutate: set("http://ci:s3cret@proxy.example.com:3128", "spec", "network", "proxy", "httpsProxy"),
			want: "network.proxy.httpsProxy holds credentials"},
		{name: "template proxy of another scheme", base: validTemplate, mutate: set("socks5://proxy.example.com:1080", "spec", "network", "proxy", "httpProxy"),
			want: "network.proxy.httpProxy must be http://host:port or https://host:port"},
		{name: "template proxy with a path", base: validTemplate, mutate: set("http://proxy.example.com:3128/pac", "spec", "network", "proxy", "httpsProxy"),
			want: "network.proxy.httpsProxy must be http://host:port or https://host:port"},
		{name: "template no-proxy entry with a space", base: validTemplate, mutate: set(map[string]any{"httpsProxy": "http://proxy.example.com:3128", "noProxy": []any{"a b"}}, "spec", "network", "proxy"),
			want: "each network.proxy.noProxy entry must be a host name, IP address or CIDR network"},
		{name: "template pool ref with dhcp", base: validTemplate, mutate: set(map[string]any{"name": "v4"}, "spec", "network", "ipPoolRef"), want: "network.ipPoolRef applies only to network.mode static"},
		{name: "template pool refs with dhcp", base: validTemplate, mutate: set([]any{map[string]any{"name": "v4"}}, "spec", "network", "ipPoolRefs"), want: "network.ipPoolRefs applies only to network.mode static"},
		{name: "template pool ref and pool refs", base: validTemplate, mutate: all(set("static", "spec", "network", "mode"), set(map[string]any{"name": "v4"}, "spec", "network", "ipPoolRef"), set([]any{map[string]any{"name": "v4"}, map[string]any{"name": "v6"}}, "spec", "network", "ipPoolRefs")), want: "network.ipPoolRef and network.ipPoolRefs are exclusive"},
		{name: "template one pool twice", base: validTemplate, mutate: all(set("static", "spec", "network", "mode"), set([]any{map[string]any{"name": "v4"}, map[string]any{"name": "v4"}}, "spec", "network", "ipPoolRefs")), want: "network.ipPoolRefs names one IPPool twice"},
		{name: "template three pools", base: validTemplate, mutate: all(set("static", "spec", "network", "mode"), set([]any{map[string]any{"name": "a"}, map[string]any{"name": "b"}, map[string]any{"name": "c"}}, "spec", "network", "ipPoolRefs")), want: "spec.network.ipPoolRefs: Too many: 3: must have at most 2 items"},
		{name: "template dhcp options with static", base: validTemplate, mutate: all(set("static", "spec", "network", "mode"), set(map[string]any{"name": "v4"}, "spec", "network", "ipPoolRef"), set(map[string]any{"clientIdentifier": "mac"}, "spec", "network", "dhcp")), want: "network.dhcp applies only to network.mode dhcp"},
		{name: "template unknown client identifier", base: validTemplate, mutate: set(map[string]any{"clientIdentifier": "duid"}, "spec", "network", "dhcp"), want: `spec.network.dhcp.clientIdentifier: Unsupported value: "duid"`},
		{name: "template cloud-init mode without networkData", base: validTemplate, mutate: set("cloud-init", "spec", "network", "mode"), want: "network.mode cloud-init takes the network configuration from cloudInit.networkData"},
		{name: "template proxmox section with iso delivery", base: validTemplate, mutate: set(map[string]any{"proxmox": map[string]any{"user": "ci"}}, "spec", "cloudInit"), want: "cloudInit.proxmox applies only to cloudInit.delivery proxmox"},
		{name: "template userData under proxmox delivery", base: validTemplate, mutate: set(map[string]any{"delivery": "proxmox", "userData": "#cloud-config\n"}, "spec", "cloudInit"), want: "put your cloud-config in a snippet named by cloudInit.proxmox.userSnippet"},
		{name: "template metaData under proxmox delivery", base: validTemplate, mutate: set(map[string]any{"delivery": "proxmox", "metaData": "zone: a\n"}, "spec", "cloudInit"), want: "cloudInit.userData, networkData and metaData cannot reach a VM under cloudInit.delivery proxmox"},
		{name: "template cloud-init network under proxmox delivery", base: validTemplate, mutate: all(set("cloud-init", "spec", "network", "mode"), set(map[string]any{"delivery": "proxmox"}, "spec", "cloudInit")), want: "network.mode cloud-init takes the network from cloudInit.networkData, which cloudInit.delivery proxmox cannot carry"},
		{name: "template hostname client id under proxmox delivery", base: validTemplate, mutate: all(set(map[string]any{"clientIdentifier": "hostname"}, "spec", "network", "dhcp"), set(map[string]any{"delivery": "proxmox"}, "spec", "cloudInit")), want: "network.dhcp.clientIdentifier hostname needs a bootcmd in the VM's user-data, which cloudInit.delivery proxmox cannot carry"},
		{name: "template agent download under proxmox delivery", base: validTemplate, mutate: all(set("Operator", "spec", "bootstrap", "agentSource"), set(map[string]any{"delivery": "proxmox"}, "spec", "cloudInit")), want: "bootstrap.agentSource Operator downloads the agent from per-template user-data"},
		{name: "template user snippet with ciuser", base: validTemplate, mutate: set(map[string]any{"delivery": "proxmox", "proxmox": map[string]any{"user": "ci", "userSnippet": "local:snippets/user.yaml"}}, "spec", "cloudInit"), want: "cloudInit.proxmox.userSnippet replaces Proxmox's generated user-data whole"},
		{name: "template snippet outside snippets", base: validTemplate, mutate: set(map[string]any{"delivery": "proxmox", "proxmox": map[string]any{"vendorSnippet": "local:iso/kit.yaml"}}, "spec", "cloudInit"), want: "spec.cloudInit.proxmox.vendorSnippet: Invalid value"},
		{name: "template snippet path escape", base: validTemplate, mutate: set(map[string]any{"delivery": "proxmox", "proxmox": map[string]any{"vendorSnippet": "local:snippets/../x"}}, "spec", "cloudInit"), want: "spec.cloudInit.proxmox.vendorSnippet: Invalid value"},
		{name: "template private key as ssh key", base: validTemplate, mutate: set(map[string]any{"delivery": "proxmox", "proxmox": map[string]any{"sshAuthorizedKeys": []any{"-----BEGIN OPENSSH PRIVATE KEY-----"}}}, "spec", "cloudInit"), want: "spec.cloudInit.proxmox.sshAuthorizedKeys[0]: Invalid value"},
		{name: "template ssh key with newline", base: validTemplate, mutate: set(map[string]any{"delivery": "proxmox", "proxmox": map[string]any{"sshAuthorizedKeys": []any{"ssh-ed25519 AAAA x\nssh-rsa AAAA y"}}}, "spec", "cloudInit"), want: "spec.cloudInit.proxmox.sshAuthorizedKeys[0]: Invalid value"},
		{name: "template ciuser upper case", base: validTemplate, mutate: set(map[string]any{"delivery": "proxmox", "proxmox": map[string]any{"user": "Admin"}}, "spec", "cloudInit"), want: "spec.cloudInit.proxmox.user: Invalid value"},
		{name: "template unknown attestation", base: validTemplate, mutate: set(map[string]any{"method": "psk"}, "spec", "attestation"), want: `spec.attestation.method: Unsupported value: "psk"`},
		{name: "template tpm options with join-token", base: validTemplate, mutate: set(map[string]any{"method": "join-token", "tpm": map[string]any{"devicePath": "/dev/tpm0"}}, "spec", "attestation"), want: "attestation.tpm applies only to attestation.method tpm"},
		{name: "template join token ttl too long", base: validTemplate, mutate: set(map[string]any{"method": "join-token", "joinToken": map[string]any{"ttl": "48h"}}, "spec", "attestation"), want: "attestation.joinToken.ttl must be between 1m and 24h"},
		{name: "template unknown bootstrap method", base: validTemplate, mutate: set("external-secrets", "spec", "bootstrap", "method"), want: `spec.bootstrap.method: Unsupported value: "external-secrets"`},
		// A lower-case value is the likely mistake; the message lists the right spellings.
		{name: "template unknown agent source", base: validTemplate, mutate: set("operator", "spec", "bootstrap", "agentSource"), want: `spec.bootstrap.agentSource: Unsupported value: "operator": supported values: "Image", "Operator"`},
		{name: "template app and pat", base: validTemplate, mutate: set(map[string]any{"appID": map[string]any{"name": "a", "key": "id"}, "privateKey": map[string]any{"name": "a", "key": "pem"}, "installationID": map[string]any{"name": "a", "key": "inst"}}, "spec", "bootstrap", "github", "credentials", "app"), want: "set exactly one of bootstrap.github.credentials.app (GitHub App, recommended) and bootstrap.github.credentials.pat"},
		{name: "template without a CI platform", base: validTemplate, mutate: del("spec", "bootstrap", "github"), want: "spec.bootstrap needs exactly one CI platform section: bootstrap.github (GitHub Actions),"},
		{name: "template github and generic", base: validTemplate, mutate: set(map[string]any{"script": "echo hi"}, "spec", "bootstrap", "generic"), want: "spec.bootstrap needs exactly one CI platform section: bootstrap.github (GitHub Actions),"},
		{name: "template generic without script", base: validGenericTemplate, mutate: del("spec", "bootstrap", "generic", "script"), want: "spec.bootstrap.generic.script: Required value"},
		{name: "template generic empty script", base: validGenericTemplate, mutate: set("", "spec", "bootstrap", "generic", "script"), want: "spec.bootstrap.generic.script: Invalid value"},
		{name: "template generic script too long", base: validGenericTemplate, mutate: set(strings.Repeat("x", 65537), "spec", "bootstrap", "generic", "script"), want: "spec.bootstrap.generic.script: Too long"},
		{name: "template generic ttl too short", base: validGenericTemplate, mutate: set("30s", "spec", "bootstrap", "generic", "ttl"), want: "bootstrap.generic.ttl must be between 1m and 168h"},
		{name: "template generic ttl too long", base: validGenericTemplate, mutate: set("169h", "spec", "bootstrap", "generic", "ttl"), want: "bootstrap.generic.ttl must be between 1m and 168h"},
		{name: "template generic work dir in /etc", base: validGenericTemplate, mutate: set("/etc/work", "spec", "bootstrap", "generic", "workDir"), want: "bootstrap.generic.workDir must not be, contain or"},
		{name: "template generic work dir with dot-dot", base: validGenericTemplate, mutate: set("/opt/x/../work", "spec", "bootstrap", "generic", "workDir"), want: "bootstrap.generic.workDir must be written plainly"},
		{name: "template no github credentials", base: validTemplate, mutate: set(map[string]any{}, "spec", "bootstrap", "github", "credentials"), want: "set exactly one of bootstrap.github.credentials.app"},
		{name: "template pat secret in another namespace", base: validTemplate, mutate: set(map[string]any{"name": "gh", "key": "token", "namespace": "kube-system"}, "spec", "bootstrap", "github", "credentials", "pat"), want: `unknown field "spec.bootstrap.github.credentials.pat.namespace"`},
		{name: "template repository and organization", base: validTemplate, mutate: set("example", "spec", "bootstrap", "github", "organization"), want: "set exactly one of bootstrap.github.repository (repository runners), bootstrap.github.organization (organization runners) and bootstrap.github.enterprise"},
		{name: "template http api base url", base: validTemplate, mutate: set("http://ghe.example.com/api/v3", "spec", "bootstrap", "github", "apiBaseURL"), want: "bootstrap.github.apiBaseURL must be an https:// URL"},
		{name: "template registration url without placeholder", base: validTemplate, mutate: set(map[string]any{"repository": "https://api.github.com/repos/x/y/actions/runners/registration-token"}, "spec", "bootstrap", "github", "registrationURLs"), want: "a repository URL template must start with https:// and contain {owner} and {repo}"},
		{name: "template unknown runner arch", base: validTemplate, mutate: set(map[string]any{"arch": "riscv64"}, "spec", "bootstrap", "github", "runner"), want: `spec.bootstrap.github.runner.arch: Unsupported value: "riscv64"`},
		{name: "template bad checksum", base: validTemplate, mutate: set(map[string]any{"downloadURL": "https://example.com/runner.tgz", "downloadSHA256": "abc"}, "spec", "bootstrap", "github", "runner"), want: "spec.bootstrap.github.runner.downloadSHA256: Invalid value"},
		{name: "template enterprise and repository", base: validTemplate, mutate: set("acme-corp", "spec", "bootstrap", "github", "enterprise"), want: "set exactly one of bootstrap.github.repository (repository runners), bootstrap.github.organization (organization runners) and bootstrap.github.enterprise"},
		{name: "template enterprise with an app", base: validTemplate, mutate: all(enterpriseTemplate, del("spec", "bootstrap", "github", "credentials", "pat"), set(map[string]any{"appID": map[string]any{"name": "a", "key": "id"}, "privateKey": map[string]any{"name": "a", "key": "pem"}, "installationID": map[string]any{"name": "a", "key": "inst"}}, "spec", "bootstrap", "github", "credentials", "app")), want: "bootstrap.github.enterprise needs bootstrap.github.credentials.pat, a personal access token (classic) with the manage_runners:enterprise scope"},
		{name: "template enterprise with runner URLs", base: validTemplate, mutate: all(enterpriseTemplate, set(map[string]any{"organization": "https://github.example.com/{owner}"}, "spec", "bootstrap", "github", "runnerURLs")), want: "bootstrap.github.registrationURLs and runnerURLs have no enterprise form"},
		{name: "template enterprise slug with a slash", base: validTemplate, mutate: all(enterpriseTemplate, set("acme/corp", "spec", "bootstrap", "github", "enterprise")), want: "spec.bootstrap.github.enterprise: Invalid value"},
		{name: "template organization without owner", base: validTemplate, mutate: all(del("spec", "bootstrap", "github", "repository"), del("spec", "bootstrap", "github", "owner"), set("acme", "spec", "bootstrap", "github", "organization")), want: "bootstrap.github.owner is required for repository and organization runners"},
		{name: "template runner group on repository runners", base: validTemplate, mutate: set("ci", "spec", "bootstrap", "github", "runnerGroup"), want: "bootstrap.github.runnerGroup applies only to organization and enterprise runners"},
		{name: "template github and gitlab", base: validTemplate, mutate: set(map[string]any{"credentials": map[string]any{"token": map[string]any{"name": "gl", "key": "token"}}, "group": "acme"}, "spec", "bootstrap", "gitlab"), want: "spec.bootstrap needs exactly one CI platform section: bootstrap.github (GitHub Actions),"},
		{name: "template gitlab without scope", base: validGitLabTemplate, mutate: del("spec", "bootstrap", "gitlab", "group"), want: "set exactly one of bootstrap.gitlab.project (project runners), bootstrap.gitlab.group (group runners) and bootstrap.gitlab.instance: true"},
		{name: "template gitlab instance false is no scope", base: validGitLabTemplate, mutate: all(del("spec", "bootstrap", "gitlab", "group"), set(false, "spec", "bootstrap", "gitlab", "instance")), want: "set exactly one of bootstrap.gitlab.project"},
		{name: "template gitlab project and group", base: validGitLabTemplate, mutate: set("acme/platform/app", "spec", "bootstrap", "gitlab", "project"), want: "set exactly one of bootstrap.gitlab.project"},
		{name: "template gitlab group and instance", base: validGitLabTemplate, mutate: set(true, "spec", "bootstrap", "gitlab", "instance"), want: "set exactly one of bootstrap.gitlab.project"},
		{name: "template gitlab project without group", base: validGitLabTemplate, mutate: all(del("spec", "bootstrap", "gitlab", "group"), set("app", "spec", "bootstrap", "gitlab", "project")), want: "spec.bootstrap.gitlab.project: Invalid value"},
		{name: "template gitlab group with trailing slash", base: validGitLabTemplate, mutate: set("acme/", "spec", "bootstrap", "gitlab", "group"), want: "spec.bootstrap.gitlab.group: Invalid value"},
		{name: "template gitlab group path too long", base: validGitLabTemplate, mutate: set(strings.Repeat("a/", 128)+"b", "spec", "bootstrap", "gitlab", "group"), want: "spec.bootstrap.gitlab.group: Too long"},
		{name: "template gitlab http url", base: validGitLabTemplate, mutate: set("http://gitlab.example.com", "spec", "bootstrap", "gitlab", "url"), want: "bootstrap.gitlab.url must be an https:// URL"},
		{name: "template gitlab runner-token method", base: validGitLabTemplate, mutate: set("runner-token", "spec", "bootstrap", "method"), want: "bootstrap.method runner-token applies to GitHub only"},
		{name: "template gitlab unknown access level", base: validGitLabTemplate, mutate: set("protected", "spec", "bootstrap", "gitlab", "accessLevel"), want: `spec.bootstrap.gitlab.accessLevel: Unsupported value: "protected"`},
		{name: "template gitlab download without checksum", base: validGitLabTemplate, mutate: set(map[string]any{"downloadURL": "https://example.com/gitlab-runner-{os}-{arch}"}, "spec", "bootstrap", "gitlab", "runner"), want: "bootstrap.gitlab.runner.downloadURL needs bootstrap.gitlab.runner.downloadSHA256"},
		{name: "template gitlab checksum without download", base: validGitLabTemplate, mutate: set(map[string]any{"downloadSHA256": strings.Repeat("ab", 32)}, "spec", "bootstrap", "gitlab", "runner"), want: "bootstrap.gitlab.runner.downloadSHA256 applies only with bootstrap.gitlab.runner.downloadURL"},
		{name: "template gitlab builds dir in a system directory", base: validGitLabTemplate, mutate: set(map[string]any{"buildsDir": "/etc/builds"}, "spec", "bootstrap", "gitlab", "runner"), want: "bootstrap.gitlab.runner.buildsDir must not be, contain or"},
		{name: "template gitlab builds dir not plain", base: validGitLabTemplate, mutate: set(map[string]any{"buildsDir": "/srv/ci/../builds"}, "spec", "bootstrap", "gitlab", "runner"), want: "bootstrap.gitlab.runner.buildsDir must be written plainly"},
		{name: "template gitlab runner path not plain", base: validGitLabTemplate, mutate: set(map[string]any{"path": "/opt//gitlab-runner"}, "spec", "bootstrap", "gitlab", "runner"), want: "bootstrap.gitlab.runner.path must be written plainly"},
		{name: "template gitlab runner arch in GitHub's naming", base: validGitLabTemplate, mutate: set(map[string]any{"arch": "x64"}, "spec", "bootstrap", "gitlab", "runner"), want: `spec.bootstrap.gitlab.runner.arch: Unsupported value: "x64"`},
		{name: "template download without checksum", base: validTemplate, mutate: set(map[string]any{"downloadURL": "https://example.com/actions-runner-{os}-{arch}.tar.gz"}, "spec", "bootstrap", "github", "runner"), want: "runner.downloadURL needs runner.downloadSHA256"},
		{name: "template checksum without download", base: validTemplate, mutate: set(map[string]any{"downloadSHA256": strings.Repeat("ab", 32)}, "spec", "bootstrap", "github", "runner"), want: "runner.downloadSHA256 applies only with runner.downloadURL"},
		{name: "template http timeout too long", base: validTemplate, mutate: set("10m", "spec", "bootstrap", "httpTimeout"), want: "bootstrap.httpTimeout must be between 1s and 5m"},
		{name: "template unknown cloud-init delivery", base: validTemplate, mutate: set(map[string]any{"delivery": "snippets"}, "spec", "cloudInit"), want: `spec.cloudInit.delivery: Unsupported value: "snippets"`},
		{name: "template user data too large", base: validTemplate, mutate: set(map[string]any{"userData": "#cloud-config\n" + strings.Repeat("#", 70000)}, "spec", "cloudInit"), want: "spec.cloudInit.userData: Too long"},

		// RunnerPool
		{name: "pool placement names templateRef", base: validPool, mutate: set(map[string]any{"templates": []any{map[string]any{"name": "other"}, map[string]any{"name": "tpl"}}}, "spec", "placement"), want: "spec.placement.templates must not name spec.templateRef's template"},
		{name: "pool placement template twice", base: validPool, mutate: set(map[string]any{"templates": []any{map[string]any{"name": "other"}, map[string]any{"name": "other"}}}, "spec", "placement"), want: "placement.templates must not name a template twice"},
		{name: "pool placement strategy", base: validPool, mutate: set(map[string]any{"strategy": "random", "templates": []any{map[string]any{"name": "other"}}}, "spec", "placement"), want: "spec.placement.strategy: Unsupported value"},
		{name: "pool min above max", base: validPool, mutate: set(map[string]any{"minReplicas": int64(6), "maxReplicas": int64(5)}, "spec", "scaling"), want: "scaling.minReplicas must not be greater than scaling.maxReplicas"},
		{name: "pool generic with minIdle", base: validGenericPool, mutate: set(int64(1), "spec", "scaling", "minIdle"), want: "scaling.minIdle does not apply to workload.type generic"},
		{name: "pool generic with a github section", base: validGenericPool, mutate: set(map[string]any{"labels": []any{"linux"}}, "spec", "workload", "github"), want: "workload.github applies only to workload.type github-actions"},
		{name: "pool minIdle above max", base: validPool, mutate: set(int64(9), "spec", "scaling", "minIdle"), want: "scaling.minIdle must not be greater than scaling.maxReplicas"},
		{name: "pool schedule minReplicas above max", base: validPool, mutate: schedules(withSched("minReplicas", int64(6))), want: "scaling.schedules[].minReplicas must not be greater than scaling.maxReplicas"},
		{name: "pool schedule minIdle above max", base: validPool, mutate: schedules(withSched("minIdle", int64(6))), want: "scaling.schedules[].minIdle must not be greater than scaling.maxReplicas"},
		{name: "pool schedule raising nothing", base: validPool, mutate: schedules(withSched("minReplicas", nil)), want: "scaling.schedules[]: set minReplicas, minIdle, standby or more of them"},
		{name: "pool schedule cron with four fields", base: validPool, mutate: schedules(withSched("cron", "0 8 * *")), want: "scaling.schedules[].cron must have five fields"},
		{name: "pool schedule cron descriptor", base: validPool, mutate: schedules(withSched("cron", "@daily")), want: "scaling.schedules[].cron must have five fields"},
		{name: "pool schedule cron with its own zone", base: validPool, mutate: schedules(withSched("cron", "CRON_TZ=UTC 0 8 * * 1-5")), want: "scaling.schedules[].cron must have five fields"},
		{name: "pool schedule too long", base: validPool, mutate: schedules(withSched("duration", "169h")), want: "scaling.schedules[].duration must be between 1m and 168h"},
		{name: "pool schedule too short", base: validPool, mutate: schedules(withSched("duration", "30s")), want: "scaling.schedules[].duration must be between 1m and 168h"},
		{name: "pool schedule name not a DNS label", base: validPool, mutate: schedules(withSched("name", "Office Hours")), want: "spec.scaling.schedules[0].name: Invalid value"},
		{name: "pool schedule zone not a zone name", base: validPool, mutate: schedules(withSched("timeZone", "../../etc/passwd")), want: "spec.scaling.schedules[0].timeZone: Invalid value"},
		{name: "pool schedules with one name twice", base: validPool, mutate: schedules(withSched(), withSched("cron", "0 12 * * *")), want: "Duplicate value"},
		{name: "pool too many schedules", base: validPool, mutate: manySchedules(17), want: "spec.scaling.schedules: Too many"},
		{name: "pool generic schedule with minIdle", base: validGenericPool, mutate: schedules(withSched("minIdle", int64(1))), want: "scaling.schedules[].minIdle does not apply to workload.type generic"},
		{name: "pool max above 1000", base: validPool, mutate: set(int64(5000), "spec", "scaling", "maxReplicas"), want: "spec.scaling.maxReplicas: Invalid value: 5000"},
		{name: "pool negative min", base: validPool, mutate: set(int64(-1), "spec", "scaling", "minReplicas"), want: "spec.scaling.minReplicas: Invalid value: -1"},
		{name: "pool unknown workload", base: validPool, mutate: set("jenkins", "spec", "workload", "type"), want: `spec.workload.type: Unsupported value: "jenkins"`},
		{name: "pool github without block", base: validPool, mutate: del("spec", "workload", "github"), want: "workload.type github-actions needs workload.github"},
		{name: "pool github block on buildkite", base: validPool, mutate: all(set("buildkite", "spec", "workload", "type"), set(map[string]any{"queue": "default"}, "spec", "workload", "buildkite")), want: "workload.github applies only to workload.type github-actions"},
		{name: "pool repository and organization", base: validPool, mutate: all(set("example/app", "spec", "workload", "github", "repository"), set("example", "spec", "workload", "github", "organization")), want: "set at most one of workload.github.repository and workload.github.organization"},
		{name: "pool runner group on a repository", base: validPool, mutate: all(set("example/app", "spec", "workload", "github", "repository"), set("ci", "spec", "workload", "github", "runnerGroup")), want: "workload.github.runnerGroup applies only to organization runners"},
		{name: "pool repository without owner", base: validPool, mutate: set("app", "spec", "workload", "github", "repository"), want: "spec.workload.github.repository: Invalid value"},
		{name: "pool no labels", base: validPool, mutate: set([]string{}, "spec", "workload", "github", "labels"), want: "spec.workload.github.labels: Invalid value: 0: spec.workload.github.labels in body should have at least 1 items"},
		{name: "pool label with comma", base: validPool, mutate: set([]string{"linux,x64"}, "spec", "workload", "github", "labels"), want: "spec.workload.github.labels[0]: Invalid value"},
		{name: "pool gitlab without block", base: validGitLabPool, mutate: del("spec", "workload", "gitlab"), want: "workload.type gitlab-ci needs workload.gitlab"},
		{name: "pool gitlab block on github", base: validPool, mutate: set(map[string]any{"tags": []any{"linux"}}, "spec", "workload", "gitlab"), want: "workload.gitlab applies only to workload.type gitlab-ci"},
		{name: "pool gitlab project and group", base: validGitLabPool, mutate: all(set("acme/platform/app", "spec", "workload", "gitlab", "project"), set("acme", "spec", "workload", "gitlab", "group")), want: "set at most one of workload.gitlab.project and workload.gitlab.group"},
		{name: "pool gitlab url is the template's", base: validGitLabPool, mutate: set("https://gitlab.com", "spec", "workload", "gitlab", "url"), want: `unknown field "spec.workload.gitlab.url"`},
		{name: "pool gitlab tag with comma", base: validGitLabPool, mutate: set([]any{"linux,docker"}, "spec", "workload", "gitlab", "tags"), want: "spec.workload.gitlab.tags[0]: Invalid value"},
		{name: "pool gitlab project without group", base: validGitLabPool, mutate: set("app", "spec", "workload", "gitlab", "project"), want: "spec.workload.gitlab.project: Invalid value"},
		{name: "pool job timeout beyond lifetime", base: validPool, mutate: set(map[string]any{"maxLifetime": "1h", "jobTimeout": "2h"}, "spec", "lifecycle"), want: "lifecycle.jobTimeout (default 3h) must not be longer than lifecycle.maxLifetime"},
		{name: "pool default job timeout beyond lifetime", base: validPool, mutate: set(map[string]any{"maxLifetime": "1h"}, "spec", "lifecycle"), want: "lifecycle.jobTimeout (default 3h) must not be longer than lifecycle.maxLifetime"},
		{name: "pool bootstrap timeout too short", base: validPool, mutate: set(map[string]any{"bootstrapTimeout": "5s"}, "spec", "lifecycle"), want: "lifecycle.bootstrapTimeout must be between 30s and 2h"},
		{name: "pool scale down delay too long", base: validPool, mutate: set("2h", "spec", "scaling", "scaleDownDelay"), want: "scaling.scaleDownDelay must be at most 1h"},
		{name: "pool history limit too high", base: validPool, mutate: set(map[string]any{"history": map[string]any{"limit": int64(5000)}}, "spec", "lifecycle"), want: "spec.lifecycle.history.limit: Invalid value: 5000"},

		// MachineClaim
		{name: "claim without template", base: validClaim, mutate: del("spec", "templateRef"), want: "spec.templateRef: Required value"},
		{name: "claim unknown phase", base: validClaim, mutate: func(*unstructured.Unstructured) {}, update: set(map[string]any{"phase": "Running"}, "status"), status: true, want: `status.phase: Unsupported value: "Running"`},
		{name: "claim vmRef naming no VM", base: validClaim, mutate: func(*unstructured.Unstructured) {}, update: set(map[string]any{"vmRef": map[string]any{"hypervisorCluster": "pve", "node": "pve1"}}, "status"), status: true, want: "status.vmRef needs providerID"},
		{name: "claim providerID without scheme", base: validClaim, mutate: func(*unstructured.Unstructured) {}, update: set(map[string]any{"vmRef": map[string]any{"hypervisorCluster": "pve", "providerID": "1234"}}, "status"), status: true, want: "status.vmRef.providerID: Invalid value"},
		{name: "claim vmID below range", base: validClaim, mutate: func(*unstructured.Unstructured) {}, update: set(map[string]any{"vmRef": map[string]any{"hypervisorCluster": "pve", "vmID": int64(7)}}, "status"), status: true, want: "status.vmRef.vmID: Invalid value: 7"},
		{name: "claim github without runner block", base: validClaim, mutate: set(map[string]any{"type": "github-actions"}, "spec", "workloadConfig"), want: "workloadConfig.type github-actions needs workloadConfig.github"},
		{name: "claim github runner on generic", base: validClaim, mutate: set(map[string]any{"type": "generic", "github": map[string]any{"runnerName": "x"}}, "spec", "workloadConfig"), want: "workloadConfig.github applies only to workloadConfig.type github-actions"},
		{name: "claim gitlab runner on github", base: validClaim, mutate: set(map[string]any{"type": "github-actions", "github": map[string]any{}, "gitlab": map[string]any{"tags": []any{"linux"}}}, "spec", "workloadConfig"), want: "workloadConfig.gitlab applies only to workloadConfig.type gitlab-ci"},
		{name: "claim gitlab tag with space", base: validClaim, mutate: set(map[string]any{"type": "gitlab-ci", "gitlab": map[string]any{"tags": []any{"my tag"}}}, "spec", "workloadConfig"), want: "spec.workloadConfig.gitlab.tags[0]: Invalid value"},
		{name: "claim runner name with space", base: validClaim, mutate: set(map[string]any{"type": "github-actions", "github": map[string]any{"runnerName": "my runner"}}, "spec", "workloadConfig"), want: "spec.workloadConfig.github.runnerName: Invalid value"},
		{name: "claim template ref immutable", base: validClaim, mutate: func(*unstructured.Unstructured) {}, update: set("other", "spec", "templateRef", "name"), want: "spec.templateRef is immutable"},
		{name: "claim pool ref immutable", base: validClaim, mutate: func(*unstructured.Unstructured) {}, update: set("other", "spec", "runnerPoolRef", "name"), want: "spec.runnerPoolRef is immutable"},
		{name: "claim end reason unknown", base: validClaim, mutate: set(map[string]any{"reason": "bored", "requestedAt": "2026-01-01T00:00:00Z"}, "spec", "end"), want: `spec.end.reason: Unsupported value: "bored"`},
		{name: "claim end reason the claim records itself", base: validClaim, mutate: set(map[string]any{"reason": "powered_off", "requestedAt": "2026-01-01T00:00:00Z"}, "spec", "end"), want: `spec.end.reason: Unsupported value: "powered_off"`},
		{name: "claim end without time", base: validClaim, mutate: set(map[string]any{"reason": "scaled_down"}, "spec", "end"), want: "spec.end.requestedAt: Required value"},
		{name: "claim end message too long", base: validClaim, mutate: set(map[string]any{"reason": "scaled_down", "requestedAt": "2026-01-01T00:00:00Z", "message": strings.Repeat("x", 1025)}, "spec", "end"), want: "spec.end.message: Too long"},
		{name: "claim end cannot be removed", base: validClaim, mutate: set(map[string]any{"reason": "scaled_down", "requestedAt": "2026-01-01T00:00:00Z"}, "spec", "end"), update: del("spec", "end"), want: "spec.end cannot be removed once set"},
		{name: "claim job id not a uuid", base: validClaim, mutate: set(map[string]any{"type": "buildkite", "buildkite": map[string]any{"jobID": "42"}}, "spec", "workloadConfig"), want: "spec.workloadConfig.buildkite.jobID: Invalid value"},
		{name: "claim job id immutable", base: validClaim, mutate: set(map[string]any{"type": "buildkite", "buildkite": map[string]any{"jobID": "0190a3b2-6c1e-4a8f-9d2b-3e4f5a6b7c8d"}}, "spec", "workloadConfig"),
			update: set("0190a3b2-6c1e-4a8f-9d2b-3e4f5a6b7c8e", "spec", "workloadConfig", "buildkite", "jobID"), want: "workloadConfig.buildkite.jobID is immutable: a claim is bound to one job for its life"},
		{name: "claim job id cannot be removed", base: validClaim, mutate: set(map[string]any{"type": "buildkite", "buildkite": map[string]any{"queue": "linux", "jobID": "0190a3b2-6c1e-4a8f-9d2b-3e4f5a6b7c8d"}}, "spec", "workloadConfig"),
			update: del("spec", "workloadConfig", "buildkite", "jobID"), want: "workloadConfig.buildkite.jobID cannot be removed: a claim bound to a job stays bound to it for its life"},
		{name: "claim pool ref cannot be removed", base: validClaim, mutate: func(*unstructured.Unstructured) {}, update: del("spec", "runnerPoolRef"), want: "spec.runnerPoolRef is immutable: it cannot be added or removed after creation"},

		// CIJob: exactly one of jobID and jobKey, and a jobKey that makes a
		// valid object name (api/v1alpha1/jobid.go).
		{name: "cijob with jobID and jobKey", base: validCIJob, mutate: set("0190a1b2-7c4d-7e8f-9a0b-1c2d3e4f5a6b", "spec", "jobKey"),
			want: "set exactly one of jobID (a platform's numeric job id) and jobKey"},
		{name: "cijob with neither jobID nor jobKey", base: validCIJob, mutate: del("spec", "jobID"),
			want: "set exactly one of jobID (a platform's numeric job id) and jobKey"},
		{name: "cijob jobKey ending in a hyphen", base: validCIJob, mutate: all(del("spec", "jobID"), set("abc-", "spec", "jobKey")), want: "spec.jobKey: Invalid value"},
		{name: "cijob jobKey with an underscore", base: validCIJob, mutate: all(del("spec", "jobID"), set("a_b", "spec", "jobKey")), want: "spec.jobKey: Invalid value"},
		{name: "cijob jobKey too long", base: validCIJob, mutate: all(del("spec", "jobID"), set(strings.Repeat("a", 65), "spec", "jobKey")), want: "spec.jobKey: Too long"},
		{name: "claim bootstrap with jobID and jobKey", base: validClaim, mutate: func(*unstructured.Unstructured) {},
			update: set(map[string]any{"jobID": int64(7), "jobKey": "0190a1b2-7c4d-7e8f-9a0b-1c2d3e4f5a6b"}, "status", "bootstrap"), status: true,
			want: "set at most one of jobID (a platform's numeric job id) and jobKey"},
		{name: "claim bootstrap jobKey not a key", base: validClaim, mutate: func(*unstructured.Unstructured) {},
			update: set(map[string]any{"jobKey": "-x"}, "status", "bootstrap"), status: true, want: "status.bootstrap.jobKey: Invalid value"},
		// IPPool
		{name: "ippool bare address", base: validIPPool, mutate: set([]string{"10.0.0.5"}, "spec", "addresses"), want: "each address must be a CIDR (10.0.0.0/24), a range of two addresses of one family"},
		{name: "ippool range of mixed families", base: validIPPool, mutate: set([]string{"10.0.0.1-2001:db8::1"}, "spec", "addresses"), want: "each address must be a CIDR"},
		{name: "ippool range with three parts", base: validIPPool, mutate: set([]string{"10.0.0.1-10.0.0.2-10.0.0.3"}, "spec", "addresses"), want: "each address must be a CIDR"},
		{name: "ippool bad cidr", base: validIPPool, mutate: set([]string{"10.0.0.0/33"}, "spec", "addresses"), want: "each address must be a CIDR"},
		{name: "ippool no addresses", base: validIPPool, mutate: set([]string{}, "spec", "addresses"), want: "spec.addresses: Invalid value: 0: spec.addresses in body should have at least 1 items"},
		{name: "ippool mixed families", base: validIPPool, mutate: set([]string{"10.0.0.0/24", "2001:db8::/120"}, "spec", "addresses"), want: "all addresses of an IPPool must be of one IP family"},
		{name: "ippool ipv4 prefix above 32", base: validIPPool, mutate: set(int64(64), "spec", "prefix"), want: "prefix must be at most 32 for an IPv4 pool"},
		{name: "ippool bad exclusion", base: validIPPool, mutate: set([]string{"10.0.0.1"}, "spec", "excludedAddresses"), want: "each excluded address must be a CIDR"},
		{name: "ippool gateway not an IP", base: validIPPool, mutate: set([]string{"gw.example.com"}, "spec", "gateways"), want: "each gateway must be an IPv4 or IPv6 address"},
		{name: "ippool gateway of other family", base: validIPPool, mutate: set([]string{"2001:db8::1"}, "spec", "gateways"), want: "gateways must be of the same IP family as the pool's addresses"},
		{name: "ippool nameserver not an IP", base: validIPPool, mutate: set([]string{"8.8.8"}, "spec", "nameservers"), want: "each nameserver must be an IPv4 or IPv6 address"},
	}
}

// TestInvalidObjectsAreRejected feeds the API server objects that break one
// rule each and checks that the rejection names the problem.
// rfc2136Provider is a valid dns.dnsProvider of type rfc2136.
func rfc2136Provider() map[string]any {
	return map[string]any{
		"type":         "rfc2136",
		"reverseZones": []any{"2.0.192.in-addr.arpa"},
		"rfc2136":      map[string]any{"server": "ns1.example.com:53"},
		"credentials": []any{map[string]any{"name": "tsigKey",
			"secretKeyRef": map[string]any{"name": "dns-key", "namespace": "hf", "key": "tsig.key"}}},
	}
}

func with(m map[string]any, k string, v any) map[string]any { m[k] = v; return m }

func without(m map[string]any, k string) map[string]any { delete(m, k); return m }

func TestInvalidObjectsAreRejected(t *testing.T) {
	ctx := context.Background()
	ns := newNamespace(t)
	cases := append(invalidCases(), libvirtInvalidCases()...)
	if len(cases) < 40 {
		t.Fatalf("the invalid-object table has %d cases; keep at least 40", len(cases))
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			obj := tc.base()
			obj.SetName(fmt.Sprintf("case-%d", i))
			if isNamespaced(obj.GetKind()) {
				obj.SetNamespace(ns)
			}
			tc.mutate(obj)
			if tc.update == nil {
				err := env.Client.Create(ctx, obj, client.FieldValidation("Strict"))
				if err == nil {
					_ = env.Client.Delete(ctx, obj)
				}
				assertRejected(t, err, tc.want)
				return
			}
			if err := env.Client.Create(ctx, obj); err != nil {
				t.Fatalf("the valid starting object was rejected: %v", err)
			}
			t.Cleanup(func() { _ = env.Client.Delete(ctx, obj) })
			tc.update(obj)
			if tc.status {
				assertRejected(t, env.Client.Status().Update(ctx, obj), tc.want)
				return
			}
			assertRejected(t, env.Client.Update(ctx, obj), tc.want)
		})
	}
}

// TestClaimJobIDIsSetOnce: a warm Buildkite claim, made with no job, is
// bound to one later (its RunnerPool sets spec.workloadConfig.buildkite.jobID
// when a job arrives): the API server takes the job once, and refuses any
// other job or its removal afterwards.
func TestClaimJobIDIsSetOnce(t *testing.T) {
	ctx := context.Background()
	obj := validClaim()
	obj.SetName("warm")
	obj.SetNamespace(newNamespace(t))
	set(map[string]any{"type": "buildkite", "buildkite": map[string]any{"queue": "linux"}}, "spec", "workloadConfig")(obj)
	if err := env.Client.Create(ctx, obj, client.FieldValidation("Strict")); err != nil {
		t.Fatalf("a warm claim was rejected: %v", err)
	}
	t.Cleanup(func() { _ = env.Client.Delete(ctx, obj) })
	set("0190a3b2-6c1e-4a8f-9d2b-3e4f5a6b7c8e", "spec", "workloadConfig", "buildkite", "jobID")(obj)
	if err := env.Client.Update(ctx, obj); err != nil {
		t.Fatalf("binding the warm claim to a job was rejected: %v", err)
	}
	rebound := obj.DeepCopy()
	set("0190a3b2-6c1e-4a8f-9d2b-3e4f5a6b7c8f", "spec", "workloadConfig", "buildkite", "jobID")(rebound)
	assertRejected(t, env.Client.Update(ctx, rebound), "workloadConfig.buildkite.jobID is immutable: a claim is bound to one job for its life")
	unbound := obj.DeepCopy()
	del("spec", "workloadConfig", "buildkite", "jobID")(unbound)
	assertRejected(t, env.Client.Update(ctx, unbound), "workloadConfig.buildkite.jobID cannot be removed")
}

// createRejected creates each case's object (named prefix-<i>, in ns when
// its kind is namespaced) and checks that the API server refuses it with
// the case's message.
func createRejected(t *testing.T, ns, prefix string, cases []invalidCase) {
	t.Helper()
	ctx := context.Background()
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			obj := tc.base()
			obj.SetName(fmt.Sprintf("%s-%d", prefix, i))
			if isNamespaced(obj.GetKind()) {
				obj.SetNamespace(ns)
			}
			tc.mutate(obj)
			err := env.Client.Create(ctx, obj, client.FieldValidation("Strict"))
			if err == nil {
				_ = env.Client.Delete(ctx, obj)
			}
			assertRejected(t, err, tc.want)
		})
	}
}

func assertRejected(t *testing.T, err error, want string) {
	t.Helper()
	if err == nil {
		t.Fatalf("the API server accepted the object; want a rejection containing %q", want)
	}
	if !apierrors.IsInvalid(err) && !apierrors.IsBadRequest(err) {
		t.Fatalf("want an Invalid or BadRequest error, got %T: %v", err, err)
	}
	if !strings.Contains(err.Error(), want) {
		t.Fatalf("rejection does not say %q:\n%v", want, err)
	}
}

// TestWindowsTemplateIsAccepted: the Windows guest mode's own shape
// (docs/windows.md) passes every CEL rule, and decodes into the Go types.
func TestWindowsTemplateIsAccepted(t *testing.T) {
	ctx := context.Background()
	tpl := validWindowsTemplate()
	tpl.SetNamespace(newNamespace(t))
	set(map[string]any{"mode": "dhcp", "dhcp": map[string]any{"clientIdentifier": "mac", "sendHostname": true}}, "spec", "network")(tpl)
	set(map[string]any{"delivery": "iso"}, "spec", "cloudInit")(tpl)
	if err := env.Client.Create(ctx, tpl, client.FieldValidation("Strict")); err != nil {
		t.Fatalf("the API server rejected a Windows template: %v", err)
	}
	typed := &hfv1.HypervisorMachineTemplate{}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructuredWithValidation(tpl.Object, typed, true); err != nil {
		t.Fatalf("the stored template does not decode into the Go types: %v", err)
	}
	if g := typed.Spec.Guest; g == nil || g.OS != hfv1.GuestWindows || typed.Spec.Bootstrap.GitHub.Runner.OS != "win" {
		t.Fatalf("decoded guest %+v, runner %+v", g, typed.Spec.Bootstrap.GitHub.Runner)
	}
}

// withSched is a valid schedule (working hours in Berlin) with key set to
// value (nil deletes it).
func withSched(kv ...any) map[string]any {
	m := map[string]any{"name": "office", "cron": "0 8 * * 1-5", "timeZone": "Europe/Berlin", "duration": "10h", "minReplicas": int64(2)}
	for i := 0; i+1 < len(kv); i += 2 {
		if kv[i+1] == nil {
			delete(m, kv[i].(string))
			continue
		}
		m[kv[i].(string)] = kv[i+1]
	}
	return m
}

// schedules sets spec.scaling.schedules.
func schedules(ss ...map[string]any) mutation {
	list := make([]any, 0, len(ss))
	for _, s := range ss {
		list = append(list, s)
	}
	return set(list, "spec", "scaling", "schedules")
}

// manySchedules sets n valid schedules of distinct names.
func manySchedules(n int) mutation {
	ss := make([]map[string]any, 0, n)
	for i := range n {
		ss = append(ss, withSched("name", fmt.Sprintf("s%d", i)))
	}
	return schedules(ss...)
}

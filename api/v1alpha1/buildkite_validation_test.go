package v1alpha1_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
)

// Buildkite's sections of the API (buildkite_types.go): accepted with the
// defaults pkg/workload/buildkite relies on, and refused with messages that
// name the field and the fix.

const bkCluster = "0190a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b"

// validBuildkiteTemplate is a template of Buildkite cluster agents.
func validBuildkiteTemplate() *unstructured.Unstructured {
	return object("HypervisorMachineTemplate", "tpl", map[string]any{
		"hypervisorClusterRef": map[string]any{"name": "pve"},
		"source":               map[string]any{"proxmox": map[string]any{"templateID": int64(9000)}},
		"resources":            map[string]any{"cpu": int64(2), "memory": "4Gi"},
		"bootstrap": map[string]any{"buildkite": map[string]any{
			"organization": "acme",
			"cluster":      bkCluster,
			"credentials":  map[string]any{"apiToken": map[string]any{"name": "bk", "key": "token"}},
		}},
	})
}

// validBuildkitePool is a buildkite pool of one queue.
func validBuildkitePool() *unstructured.Unstructured {
	return object("RunnerPool", "pool", map[string]any{
		"templateRef": map[string]any{"name": "tpl"},
		"workload": map[string]any{
			"type":      "buildkite",
			"buildkite": map[string]any{"queue": "linux", "defaultQueue": true, "tags": []any{"os=linux", "size=large"}},
		},
	})
}

// TestBuildkiteObjectsAreAccepted: a Buildkite template, pool and claim are
// accepted, with the defaults the Buildkite back-end relies on.
func TestBuildkiteObjectsAreAccepted(t *testing.T) {
	ctx := context.Background()
	ns := newNamespace(t)
	create := func(obj *unstructured.Unstructured) {
		t.Helper()
		obj.SetNamespace(ns)
		if err := env.Client.Create(ctx, obj, client.FieldValidation("Strict")); err != nil {
			t.Fatalf("creating %s %s: %v", obj.GetKind(), obj.GetName(), err)
		}
	}
	tpl := validBuildkiteTemplate()
	_ = unstructured.SetNestedMap(tpl.Object, map[string]any{}, "spec", "bootstrap", "buildkite", "agent")
	create(tpl)
	pool := validBuildkitePool()
	_ = unstructured.SetNestedField(pool.Object, "docs-site", "spec", "workload", "buildkite", "pipeline")
	create(pool)
	claim := validClaim()
	_ = unstructured.SetNestedMap(claim.Object, map[string]any{"type": "buildkite", "buildkite": map[string]any{"queue": "linux", "tags": []any{"os=linux"}}}, "spec", "workloadConfig")
	create(claim)
	bk := []string{"spec", "bootstrap", "buildkite"}
	for _, w := range []struct {
		path  []string
		value any
	}{
		{append(bk, "apiURL"), "https://api.buildkite.com"},
		{append(bk, "agentEndpoint"), "https://agent.buildkite.com/v3"},
		{append(bk, "agent", "path"), "/usr/local/bin/buildkite-agent"},
		{append(bk, "agent", "buildPath"), "/var/lib/hyperfleet/builds"},
		{append(bk, "agent", "os"), "linux"},
		{append(bk, "agent", "arch"), "amd64"},
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
	if b := typed.Spec.Bootstrap.Buildkite; b == nil || b.Cluster != bkCluster || b.Credentials.APIToken.Key != "token" || b.Agent == nil || b.Agent.BuildPath == "" {
		t.Fatalf("decoded bootstrap.buildkite = %+v", b)
	}
}

// buildkiteInvalidCases are refused Buildkite objects and what the refusal
// must say.
func buildkiteInvalidCases() []invalidCase {
	bk := []string{"spec", "bootstrap", "buildkite"}
	at := func(p ...string) []string { return append(append([]string(nil), bk...), p...) }
	return []invalidCase{
		{name: "github and buildkite", base: validTemplate, mutate: set(map[string]any{"organization": "acme", "cluster": bkCluster, "credentials": map[string]any{"apiToken": map[string]any{"name": "bk", "key": "token"}}}, bk...), want: "spec.bootstrap needs exactly one CI platform section: bootstrap.github (GitHub Actions), bootstrap.gitlab (GitLab CI), bootstrap.buildkite (Buildkite)"},
		{name: "no cluster", base: validBuildkiteTemplate, mutate: del(at("cluster")...), want: "spec.bootstrap.buildkite.cluster: Required value"},
		{name: "cluster not a UUID", base: validBuildkiteTemplate, mutate: set("default", at("cluster")...), want: "spec.bootstrap.buildkite.cluster: Invalid value"},
		{name: "organization with capitals", base: validBuildkiteTemplate, mutate: set("Acme", at("organization")...), want: "spec.bootstrap.buildkite.organization: Invalid value"},
		{name: "http api", base: validBuildkiteTemplate, mutate: set("http://api.buildkite.com", at("apiURL")...), want: "bootstrap.buildkite.apiURL must be an https:// URL"},
		{name: "agent endpoint trailing slash", base: validBuildkiteTemplate, mutate: set("https://agent.buildkite.com/v3/", at("agentEndpoint")...), want: "bootstrap.buildkite.agentEndpoint must be an https:// URL without a trailing /"},
		{name: "runner-token method", base: validBuildkiteTemplate, mutate: set("runner-token", "spec", "bootstrap", "method"), want: "bootstrap.method runner-token applies to GitHub only"},
		{name: "download without checksum", base: validBuildkiteTemplate, mutate: set(map[string]any{"downloadURL": "https://example.com/buildkite-agent-{os}-{arch}.tar.gz"}, at("agent")...), want: "bootstrap.buildkite.agent.downloadURL needs bootstrap.buildkite.agent.downloadSHA256"},
		{name: "checksum without download", base: validBuildkiteTemplate, mutate: set(map[string]any{"downloadSHA256": strings.Repeat("ab", 32)}, at("agent")...), want: "bootstrap.buildkite.agent.downloadSHA256 applies only with bootstrap.buildkite.agent.downloadURL"},
		{name: "http download", base: validBuildkiteTemplate, mutate: set(map[string]any{"downloadURL": "http://example.com/a.tar.gz", "downloadSHA256": strings.Repeat("ab", 32)}, at("agent")...), want: "bootstrap.buildkite.agent.downloadURL must be an https:// URL"},
		{name: "build path in a system directory", base: validBuildkiteTemplate, mutate: set(map[string]any{"buildPath": "/usr/builds"}, at("agent")...), want: "bootstrap.buildkite.agent.buildPath must not be, contain or"},
		{name: "build path not plain", base: validBuildkiteTemplate, mutate: set(map[string]any{"buildPath": "/srv/ci/../builds"}, at("agent")...), want: "bootstrap.buildkite.agent.buildPath must be written plainly"},
		{name: "agent path not plain", base: validBuildkiteTemplate, mutate: set(map[string]any{"path": "/opt/./buildkite-agent"}, at("agent")...), want: "bootstrap.buildkite.agent.path must be written plainly"},
		{name: "agent arch in GitHub's naming", base: validBuildkiteTemplate, mutate: set(map[string]any{"arch": "x64"}, at("agent")...), want: `spec.bootstrap.buildkite.agent.arch: Unsupported value: "x64"`},
		{name: "pool without section", base: validBuildkitePool, mutate: del("spec", "workload", "buildkite"), want: "workload.type buildkite needs workload.buildkite (at least its queue)"},
		{name: "pool without queue", base: validBuildkitePool, mutate: del("spec", "workload", "buildkite", "queue"), want: "spec.workload.buildkite.queue: Required value"},
		{name: "pool old organization field", base: validBuildkitePool, mutate: set("acme", "spec", "workload", "buildkite", "organization"), want: `unknown field "spec.workload.buildkite.organization"`},
		{name: "pool tag without value", base: validBuildkitePool, mutate: set([]string{"linux"}, "spec", "workload", "buildkite", "tags"), want: "spec.workload.buildkite.tags[0]: Invalid value"},
		{name: "pool queue as a tag", base: validBuildkitePool, mutate: set([]string{"queue=other"}, "spec", "workload", "buildkite", "tags"), want: "workload.buildkite.tags must not set queue: use workload.buildkite.queue"},
		{name: "pool pipeline not a slug", base: validBuildkitePool, mutate: set("My App", "spec", "workload", "buildkite", "pipeline"), want: "spec.workload.buildkite.pipeline: Invalid value"},
		{name: "pool buildkite on github", base: validPool, mutate: set(map[string]any{"queue": "linux"}, "spec", "workload", "buildkite"), want: "workload.buildkite applies only to workload.type buildkite"},
		{name: "claim buildkite on github", base: validClaim, mutate: set(map[string]any{"type": "github-actions", "github": map[string]any{}, "buildkite": map[string]any{"queue": "linux"}}, "spec", "workloadConfig"), want: "workloadConfig.buildkite applies only to workloadConfig.type buildkite"},
		{name: "claim queue as a tag", base: validClaim, mutate: set(map[string]any{"type": "buildkite", "buildkite": map[string]any{"tags": []any{"queue=x"}}}, "spec", "workloadConfig"), want: "workloadConfig.buildkite.tags must not set queue"},
	}
}

func TestInvalidBuildkiteObjectsAreRejected(t *testing.T) {
	ctx := context.Background()
	ns := newNamespace(t)
	for i, tc := range buildkiteInvalidCases() {
		t.Run(tc.name, func(t *testing.T) {
			obj := tc.base()
			obj.SetName(fmt.Sprintf("bk-case-%d", i))
			obj.SetNamespace(ns)
			tc.mutate(obj)
			err := env.Client.Create(ctx, obj, client.FieldValidation("Strict"))
			if err == nil {
				_ = env.Client.Delete(ctx, obj)
			}
			assertRejected(t, err, tc.want)
		})
	}
}

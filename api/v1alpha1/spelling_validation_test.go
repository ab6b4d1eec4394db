package v1alpha1_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
)

// withApp makes a template's GitHub credentials an App with the given key
// names for the App id and the installation id.
func withApp(appKey, instKey string) mutation {
	return all(del("spec", "bootstrap", "github", "credentials", "pat"), set(map[string]any{
		appKey:       map[string]any{"name": "gh", "key": "id"},
		instKey:      map[string]any{"name": "gh", "key": "inst"},
		"privateKey": map[string]any{"name": "gh", "key": "pem"},
	}, "spec", "bootstrap", "github", "credentials", "app"))
}

// oldTokenCluster is validCluster with its token id under the old key.
func oldTokenCluster() *unstructured.Unstructured {
	u := validCluster()
	del("spec", "credentials", "tokenID")(u)
	set(secretRef("pve", "tokenId"), "spec", "credentials", "tokenId")(u)
	return u
}

// oldTemplate is validTemplate with templateId, appId and installationId.
func oldTemplate() *unstructured.Unstructured {
	u := validTemplate()
	del("spec", "source", "proxmox", "templateID")(u)
	set(int64(9000), "spec", "source", "proxmox", "templateId")(u)
	withApp("appId", "installationId")(u)
	return u
}

// TestOldSpecSpellingsRefused: a spec a user writes with an id field under
// its old spelling is refused on create, the message naming the field and
// its new spelling.
func TestOldSpecSpellingsRefused(t *testing.T) {
	ctx := context.Background()
	ns := newNamespace(t)
	for name, tc := range map[string]struct {
		obj  func() *unstructured.Unstructured
		want []string
	}{
		"cluster tokenId": {oldTokenCluster, []string{"spec.credentials.tokenId is now tokenID: rename the field"}},
		"template templateId, appId and installationId": {oldTemplate, []string{
			"spec.source.proxmox.templateId is now templateID: rename the field",
			"spec.bootstrap.github.credentials.app.appId is now appID: rename the field",
			"spec.bootstrap.github.credentials.app.installationId is now installationID: rename the field",
		}},
	} {
		t.Run(name, func(t *testing.T) {
			obj := tc.obj()
			obj.SetGenerateName("old-")
			if isNamespaced(obj.GetKind()) {
				obj.SetNamespace(ns)
			}
			err := env.Client.Create(ctx, obj)
			if err == nil {
				_ = env.Client.Delete(ctx, obj)
			}
			for _, want := range tc.want {
				assertRejected(t, err, want)
			}
		})
	}
	// The new spelling of the same objects is accepted: the refusal is the
	// spelling's, not the values'.
	template := validTemplate()
	withApp("appID", "installationID")(template)
	for _, obj := range []*unstructured.Unstructured{validCluster(), template} {
		obj.SetName("")
		obj.SetGenerateName("new-")
		if isNamespaced(obj.GetKind()) {
			obj.SetNamespace(ns)
		}
		if err := env.Client.Create(ctx, obj, client.FieldValidation("Strict")); err != nil {
			t.Fatalf("%s with the new spellings refused: %v", obj.GetKind(), err)
		}
		t.Cleanup(func() { _ = env.Client.Delete(ctx, obj) })
	}
}

// TestStoredOldSpecSpellingsKeepWorking: a cluster and a template stored
// with the old spellings (by an earlier version, here through their CRDs
// without the refusal rules) read into the Go fields, and stay updatable
// after the rules are in place: validation ratcheting lets a write that
// leaves the old key's object as stored pass, and a write that changes it
// must rename the key.
func TestStoredOldSpecSpellingsKeepWorking(t *testing.T) {
	ctx := context.Background()
	ns := newNamespace(t)
	cluster, template := oldTokenCluster(), oldTemplate()
	cluster.SetName("stored-old-token")
	template.SetName("stored-old-template")
	template.SetNamespace(ns)
	withoutRenameRules(t, []string{"hypervisorclusters.hyperfleet.io", "hypervisormachinetemplates.hyperfleet.io"}, func() {
		for _, obj := range []*unstructured.Unstructured{cluster, template} {
			if err := env.Client.Create(ctx, obj); err != nil {
				t.Fatalf("storing %s with the old spellings: %v", obj.GetKind(), err)
			}
			t.Cleanup(func() { _ = env.Client.Delete(ctx, obj) })
		}
	})

	var hc hfv1.HypervisorCluster
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(cluster), &hc); err != nil {
		t.Fatal(err)
	}
	if r := hc.Spec.Credentials.TokenID; r == nil || r.Name != "pve" || r.Key != "tokenId" {
		t.Errorf("the stored tokenId reads as TokenID %+v", r)
	}
	var tm hfv1.HypervisorMachineTemplate
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(template), &tm); err != nil {
		t.Fatal(err)
	}
	app := tm.Spec.Bootstrap.GitHub.Credentials.App
	if id := tm.Spec.Source.Proxmox.TemplateID; id == nil || *id != 9000 || app == nil || app.AppID.Key != "id" || app.InstallationID.Key != "inst" {
		t.Errorf("the stored template reads as templateID %v, app %+v", id, app)
	}

	// kubectl apply of the same manifest with another field changed.
	relabel := func(obj *unstructured.Unstructured, mutate mutation) error {
		cur := &unstructured.Unstructured{}
		cur.SetGroupVersionKind(obj.GroupVersionKind())
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(obj), cur); err != nil {
			return err
		}
		mutate(cur)
		return env.Client.Update(ctx, cur)
	}
	if err := relabel(cluster, set("5m", "spec", "pollInterval")); err != nil {
		t.Errorf("a stored cluster with tokenId, its pollInterval changed: %v", err)
	}
	if err := relabel(template, set(int64(4), "spec", "resources", "cpu")); err != nil {
		t.Errorf("a stored template with the old spellings, its cpu changed: %v", err)
	}
	// A change to the object that holds the old key must rename it.
	assertRejected(t, relabel(cluster, set(secretRef("pve", "other"), "spec", "credentials", "tokenSecret")),
		"spec.credentials.tokenId is now tokenID: rename the field")
	assertRejected(t, relabel(template, set("full", "spec", "source", "proxmox", "cloneMode")),
		"spec.source.proxmox.templateId is now templateID: rename the field")
	rename := func(path []string, oldKey, newKey string) mutation {
		return func(u *unstructured.Unstructured) {
			v, _, _ := unstructured.NestedFieldCopy(u.Object, append(path, oldKey)...)
			del(append(path, oldKey)...)(u)
			set(v, append(path, newKey)...)(u)
		}
	}
	if err := relabel(cluster, rename([]string{"spec", "credentials"}, "tokenId", "tokenID")); err != nil {
		t.Errorf("renaming tokenId: %v", err)
	}
	app2 := []string{"spec", "bootstrap", "github", "credentials", "app"}
	if err := relabel(template, all(rename([]string{"spec", "source", "proxmox"}, "templateId", "templateID"),
		rename(app2, "appId", "appID"), rename(app2, "installationId", "installationID"))); err != nil {
		t.Errorf("renaming the template's fields: %v", err)
	}
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(cluster), &hc); err != nil {
		t.Fatal(err)
	}
	if r := hc.Spec.Credentials.TokenID; r == nil || r.Key != "tokenId" || hc.Spec.Credentials.DeprecatedTokenID != nil { //nolint:staticcheck // the deprecated field under test
		t.Errorf("after the rename: TokenID %+v, deprecated %+v", r, hc.Spec.Credentials.DeprecatedTokenID) //nolint:staticcheck // the deprecated field under test
	}
}

// TestStoredCIJobMovesToNewSpelling: a CIJob an earlier operator recorded
// (jobId, runId, runnerId, lastDeliveryId) reads into the Go fields, and
// the next write of the job (an Update, as internal/demand records a state
// change) stores the new spelling only: its spec is still the same job
// for the immutability rule, which refuses a change of the id itself.
func TestStoredCIJobMovesToNewSpelling(t *testing.T) {
	ctx := context.Background()
	obj := validCIJob()
	obj.SetNamespace(newNamespace(t))
	del("spec", "jobID")(obj)
	set(int64(4242), "spec", "jobId")(obj)
	set(int64(777), "spec", "runId")(obj)
	set(map[string]any{"state": "queued", "runnerId": int64(23), "lastDeliveryId": "d-1"}, "status")(obj)
	if err := env.Client.Create(ctx, obj, client.FieldValidation("Strict")); err != nil {
		t.Fatalf("a CIJob as an earlier operator wrote it: %v", err)
	}
	t.Cleanup(func() { _ = env.Client.Delete(ctx, obj) })

	var job hfv1.CIJob
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(obj), &job); err != nil {
		t.Fatal(err)
	}
	if job.Spec.JobID != 4242 || job.Spec.RunID != 777 || job.Status.RunnerID != 23 || job.Status.LastDeliveryID != "d-1" {
		t.Fatalf("the stored CIJob reads as spec %+v, status %+v", job.Spec, job.Status)
	}
	changed := job.DeepCopy()
	changed.Spec.JobID = 4243
	assertRejected(t, env.Client.Update(ctx, changed), "a CIJob's spec is immutable")

	job.Status.State = hfv1.CIJobInProgress
	if err := env.Client.Update(ctx, &job); err != nil {
		t.Fatalf("recording a state change of the stored CIJob: %v", err)
	}
	stored := &unstructured.Unstructured{}
	stored.SetGroupVersionKind(obj.GroupVersionKind())
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(obj), stored); err != nil {
		t.Fatal(err)
	}
	spec, status := stored.Object["spec"].(map[string]any), stored.Object["status"].(map[string]any)
	for _, k := range []string{"jobId", "runId"} {
		if _, ok := spec[k]; ok {
			t.Errorf("spec still holds %s: %v", k, spec)
		}
	}
	for _, k := range []string{"runnerId", "lastDeliveryId"} {
		if _, ok := status[k]; ok {
			t.Errorf("status still holds %s: %v", k, status)
		}
	}
	if fmt.Sprintf("%v %v %v %v", spec["jobID"], spec["runID"], status["runnerID"], status["lastDeliveryID"]) != "4242 777 23 d-1" {
		t.Errorf("moved to spec %v, status %v", spec, status)
	}
}

// withoutRenameRules runs fn while the named CRDs lack the rules that
// refuse the old spellings (as CRDs of an earlier version did), and puts
// them back, waiting each time until the API server serves the change.
func withoutRenameRules(t *testing.T, crds []string, fn func()) {
	t.Helper()
	ctx := context.Background()
	saved := map[string]*unstructured.Unstructured{}
	for _, name := range crds {
		crd := &unstructured.Unstructured{}
		crd.SetAPIVersion("apiextensions.k8s.io/v1")
		crd.SetKind("CustomResourceDefinition")
		if err := env.Client.Get(ctx, client.ObjectKey{Name: name}, crd); err != nil {
			t.Fatal(err)
		}
		saved[name] = crd.DeepCopy()
		if n := dropRenameRules(crd.Object); n == 0 {
			t.Fatalf("CRD %s has no rule refusing an old spelling", name)
		}
		if err := env.Client.Update(ctx, crd); err != nil {
			t.Fatalf("dropping the rename rules of %s: %v", name, err)
		}
	}
	restore := func() {
		for name, crd := range saved {
			err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
				cur := crd.DeepCopy()
				fresh := &unstructured.Unstructured{}
				fresh.SetGroupVersionKind(crd.GroupVersionKind())
				if err := env.Client.Get(ctx, client.ObjectKey{Name: name}, fresh); err != nil {
					return false, err
				}
				cur.SetResourceVersion(fresh.GetResourceVersion())
				err := env.Client.Update(ctx, cur)
				return err == nil, client.IgnoreNotFound(ignoreConflict(err))
			})
			if err != nil {
				t.Fatalf("restoring CRD %s: %v", name, err)
			}
		}
		waitServed(t, true)
	}
	defer restore()
	waitServed(t, false)
	fn()
}

// waitServed waits until a cluster with tokenId and a template with
// templateId are refused (refused) or accepted (dry run) by the API
// server, which serves a changed CRD shortly after it is stored.
func waitServed(t *testing.T, refused bool) {
	t.Helper()
	ctx := context.Background()
	ns := newNamespace(t)
	err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		for _, obj := range []*unstructured.Unstructured{oldTokenCluster(), oldTemplate()} {
			obj.SetName("probe")
			if isNamespaced(obj.GetKind()) {
				obj.SetNamespace(ns)
			}
			err := env.Client.Create(ctx, obj, client.DryRunAll)
			if refused != (err != nil && strings.Contains(err.Error(), "rename the field")) {
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		t.Fatalf("waiting for the API server to serve the CRDs with the rename rules %s: %v", map[bool]string{true: "in place", false: "dropped"}[refused], err)
	}
}

// dropRenameRules removes, anywhere in a CRD document, the CEL rules whose
// message asks to rename a field; it returns how many it removed.
func dropRenameRules(v any) int {
	n := 0
	switch v := v.(type) {
	case map[string]any:
		if rules, ok := v["x-kubernetes-validations"].([]any); ok {
			kept := rules[:0:0]
			for _, r := range rules {
				if m, _ := r.(map[string]any); m != nil && strings.Contains(fmt.Sprint(m["message"]), "rename the field") {
					n++
					continue
				}
				kept = append(kept, r)
			}
			v["x-kubernetes-validations"] = kept
		}
		for _, x := range v {
			n += dropRenameRules(x)
		}
	case []any:
		for _, x := range v {
			n += dropRenameRules(x)
		}
	}
	return n
}

func ignoreConflict(err error) error {
	if apierrors.IsConflict(err) {
		return nil
	}
	return err
}

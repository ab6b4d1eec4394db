// Package admission_test applies the admission policies shipped in
// config/admission to the real kube-apiserver and checks what they refuse
// and what they let through.
package admission_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/test/testenv"
)

// operatorUser is the username of the ServiceAccount config/rbac creates.
const operatorUser = "system:serviceaccount:hyperfleet-system:hyperfleet-manager"

var env *testenv.Environment

func TestMain(m *testing.M) { os.Exit(testenv.Run(m, &env)) }

// applyPolicies creates every object in config/admission and waits until
// the policy is enforced (the API server loads policies asynchronously).
func applyPolicies(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	raw, err := os.ReadFile(filepath.Join(testenv.RepoRoot(), "config", "admission", "protected_metadata_policy.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	dec := utilyaml.NewYAMLOrJSONDecoder(strings.NewReader(string(raw)), 4096)
	for {
		u := &unstructured.Unstructured{}
		if err := dec.Decode(&u.Object); err != nil {
			break
		}
		if len(u.Object) == 0 {
			continue
		}
		if err := env.Client.Create(ctx, u); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatalf("create %s %s: %v", u.GetKind(), u.GetName(), err)
		}
	}
	// Both users may do anything RBAC can grant: what is refused below is
	// refused by the policy alone.
	for _, user := range []string{"alice", operatorUser} {
		crb := &rbacv1.ClusterRoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: "admission-test-" + strings.ReplaceAll(user, ":", "-")},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "cluster-admin"},
			Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: user}},
		}
		if err := env.Client.Create(ctx, crb); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
	}
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "policy-probe"}}
	if err := env.Client.Create(ctx, ns); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	probe := claim("policy-probe", "probe", map[string]string{hfv1.RunnerPoolLabel: "x"}, nil)
	deadline := time.Now().Add(time.Minute)
	for {
		err := as(t, "alice").Create(ctx, probe.DeepCopy())
		if err != nil && strings.Contains(err.Error(), "hyperfleet-operator-owned-fields") {
			return
		}
		if err == nil {
			_ = env.Client.Delete(ctx, probe.DeepCopy())
		}
		if time.Now().After(deadline) {
			t.Fatalf("the policy is not enforced after a minute (last create: %v)", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// as returns a client that acts as user (impersonated by the test's
// administrator).
func as(t *testing.T, user string) client.Client {
	t.Helper()
	cfg := rest.CopyConfig(env.Config)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: user, Groups: []string{"system:authenticated"}}
	c, err := client.New(cfg, client.Options{Scheme: env.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func claim(ns, name string, labels, annotations map[string]string) *hfv1.MachineClaim {
	return &hfv1.MachineClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: labels, Annotations: annotations},
		Spec:       hfv1.MachineClaimSpec{TemplateRef: hfv1.ObjectName{Name: "debian"}},
	}
}

func newNamespace(t *testing.T) string {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "tenant-"}}
	if err := env.Client.Create(context.Background(), ns); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Client.Delete(context.Background(), ns) })
	return ns.Name
}

// wantRefused fails unless err is the policy's refusal naming field.
func wantRefused(t *testing.T, what string, err error, field string) {
	t.Helper()
	if err == nil {
		t.Fatalf("%s: accepted, want refused by the admission policy", what)
	}
	if !apierrors.IsInvalid(err) && !apierrors.IsForbidden(err) {
		t.Fatalf("%s: %v, want the policy's refusal", what, err)
	}
	for _, s := range []string{"hyperfleet-operator-owned-fields", field, "HyperFleet operator only"} {
		if !strings.Contains(err.Error(), s) {
			t.Fatalf("%s: message %q does not mention %q", what, err.Error(), s)
		}
	}
}

// TestTenantCannotWriteOperatorMetadata: a tenant can neither create a
// claim carrying hyperfleet.io/* labels or annotations (the forged VM
// reservation among them), nor add, change or remove them later, nor
// write status; the operator can; ordinary edits of the tenant's own
// labels still work.
func TestTenantCannotWriteOperatorMetadata(t *testing.T) {
	applyPolicies(t)
	ctx := context.Background()
	ns := newNamespace(t)
	tenant, operator := as(t, "alice"), as(t, operatorUser)

	wantRefused(t, "create with a forged reservation", tenant.Create(ctx, claim(ns, "forged", nil,
		map[string]string{hfv1.VMReservationAnnotation: "pve/pve1/4242"})), "metadata.annotations: "+hfv1.VMReservationAnnotation)
	wantRefused(t, "create with a pool label", tenant.Create(ctx, claim(ns, "labelled", map[string]string{hfv1.RunnerPoolLabel: "other-pool"}, nil)),
		"metadata.labels: "+hfv1.RunnerPoolLabel)

	// A plain claim, then the operator stamps its metadata.
	c := claim(ns, "plain", map[string]string{"team": "a"}, map[string]string{"note": "mine"})
	if err := tenant.Create(ctx, c); err != nil {
		t.Fatalf("a claim without hyperfleet.io metadata was refused: %v", err)
	}
	stamped := c.DeepCopy()
	stamped.Labels[hfv1.ManagedByLabel] = hfv1.ManagedByValue
	stamped.Annotations[hfv1.VMReservationAnnotation] = "pve/pve1/1000/v1.sig"
	if err := operator.Update(ctx, stamped); err != nil {
		t.Fatalf("the operator could not write its metadata: %v", err)
	}

	edit := func(mutate func(*hfv1.MachineClaim)) error {
		cur := &hfv1.MachineClaim{}
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(c), cur); err != nil {
			t.Fatal(err)
		}
		mutate(cur)
		return tenant.Update(ctx, cur)
	}
	wantRefused(t, "change the reservation", edit(func(m *hfv1.MachineClaim) {
		m.Annotations[hfv1.VMReservationAnnotation] = "pve/pve1/4242/v1.sig"
	}), hfv1.VMReservationAnnotation)
	wantRefused(t, "remove the managed-by label", edit(func(m *hfv1.MachineClaim) {
		delete(m.Labels, hfv1.ManagedByLabel)
	}), hfv1.ManagedByLabel)
	wantRefused(t, "add a made-up hyperfleet.io annotation", edit(func(m *hfv1.MachineClaim) {
		m.Annotations["hyperfleet.io/anything"] = "x"
	}), "hyperfleet.io/anything")
	wantRefused(t, "ask the claim to end as its pool would", edit(func(m *hfv1.MachineClaim) {
		m.Spec.End = &hfv1.MachineClaimEndRequest{Reason: hfv1.EndMaxLifetime, Message: "skip the drain", RequestedAt: metav1.Now()}
	}), "spec.end")
	ended := &hfv1.MachineClaim{}
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(c), ended); err != nil {
		t.Fatal(err)
	}
	ended.Spec.End = &hfv1.MachineClaimEndRequest{Reason: hfv1.EndIdleTimeout, Message: "idle", RequestedAt: metav1.Now()}
	if err := operator.Update(ctx, ended); err != nil {
		t.Fatalf("the operator could not ask the claim to end: %v", err)
	}
	wantRefused(t, "change the pool's end request", edit(func(m *hfv1.MachineClaim) {
		m.Spec.End.Reason = hfv1.EndJobTimeout
	}), "spec.end")
	if err := edit(func(m *hfv1.MachineClaim) { m.Labels["team"] = "b"; m.Annotations["note"] = "still mine" }); err != nil {
		t.Fatalf("an edit that leaves hyperfleet.io metadata alone was refused: %v", err)
	}

	cur := &hfv1.MachineClaim{}
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(c), cur); err != nil {
		t.Fatal(err)
	}
	cur.Status.Phase = hfv1.MachineClaimReady
	cur.Status.VMRef = &hfv1.VMReference{HypervisorCluster: "pve", Node: "pve1", VMID: 4242}
	wantRefused(t, "write status", tenant.Status().Update(ctx, cur.DeepCopy()), "status of machineclaims")
	if err := operator.Status().Update(ctx, cur.DeepCopy()); err != nil {
		t.Fatalf("the operator could not write status: %v", err)
	}
}

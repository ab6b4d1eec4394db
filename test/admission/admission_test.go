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

// policyFiles are the admission policies of config/admission.
var policyFiles = []string{"protected_metadata_policy.yaml", "isolation_tenancy_policy.yaml"}

// applyPolicies creates every object in config/admission and waits until
// each policy is enforced (the API server loads policies asynchronously).
func applyPolicies(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	for _, f := range policyFiles {
		applyFile(t, "config", "admission", f)
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
	// The isolation policy judges a template only against the cluster it
	// names: a cluster that allows no policy but its default to anyone.
	probeCluster := isolatingCluster("policy-probe", &hfv1.NetworkIsolation{OperatorCIDRs: []string{"192.0.2.5"}},
		tenancyRule(metav1.LabelSelector{}))
	if err := env.Client.Create(ctx, probeCluster); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	probes := map[string]client.Object{
		"hyperfleet-operator-owned-fields": claim("policy-probe", "probe", map[string]string{hfv1.RunnerPoolLabel: "x"}, nil),
		isolationPolicyName:                template("policy-probe", "probe", probeCluster.Name, "not-allowed"),
	}
	for policy, probe := range probes {
		waitEnforced(t, policy, probe)
	}
}

// waitEnforced waits until a dry-run create of probe by a tenant is
// refused by policy.
func waitEnforced(t *testing.T, policy string, probe client.Object) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		err := as(t, "alice").Create(context.Background(), probe.DeepCopyObject().(client.Object), client.DryRunAll)
		if err != nil && strings.Contains(err.Error(), policy) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the policy %s is not enforced after a minute (last create of %s: %v)", policy, probe.GetName(), err)
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
	bound := claim(ns, "bound", nil, nil)
	bound.Spec.WorkloadConfig = &hfv1.WorkloadConfig{Type: hfv1.WorkloadBuildkite, Buildkite: &hfv1.BuildkiteAgentConfig{JobID: "0190a3b2-6c1e-4a8f-9d2b-3e4f5a6b7c8d"}}
	wantRefused(t, "create bound to a Buildkite job", tenant.Create(ctx, bound.DeepCopy()), "spec.workloadConfig.buildkite.jobID")
	if err := operator.Create(ctx, bound); err != nil {
		t.Fatalf("the operator could not make a claim for a job: %v", err)
	}
	// A warm claim, made with no job, is bound to one later by its pool
	// (the operator), once: a tenant can neither bind it nor rebind it.
	warm := claim(ns, "warm", nil, nil)
	warm.Spec.WorkloadConfig = &hfv1.WorkloadConfig{Type: hfv1.WorkloadBuildkite, Buildkite: &hfv1.BuildkiteAgentConfig{Queue: "linux"}}
	if err := operator.Create(ctx, warm); err != nil {
		t.Fatalf("the operator could not make a warm claim: %v", err)
	}
	bindTo := func(c client.Client, job string) error {
		cur := &hfv1.MachineClaim{}
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(warm), cur); err != nil {
			t.Fatal(err)
		}
		cur.Spec.WorkloadConfig.Buildkite.JobID = job
		return c.Update(ctx, cur)
	}
	wantRefused(t, "a tenant binds a warm claim to a job", bindTo(tenant, "0190a3b2-6c1e-4a8f-9d2b-3e4f5a6b7c8e"), "spec.workloadConfig.buildkite.jobID")
	if err := bindTo(operator, "0190a3b2-6c1e-4a8f-9d2b-3e4f5a6b7c8e"); err != nil {
		t.Fatalf("the operator could not bind its warm claim to a job: %v", err)
	}
	for who, c := range map[string]client.Client{"a tenant": tenant, "the operator": operator} {
		if err := bindTo(c, "0190a3b2-6c1e-4a8f-9d2b-3e4f5a6b7c8f"); !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "a claim is bound to one job for its life") {
			t.Fatalf("%s rebinding a bound claim: %v, want the API's refusal (the job is set once)", who, err)
		}
	}

	// A standby claim is its pool's: made in the tier and taken out of it
	// (for a job) by the operator only, and never put back.
	standby := claim(ns, "standby", nil, nil)
	standby.Spec.RunnerPoolRef, standby.Spec.Standby = &hfv1.ObjectName{Name: "pool"}, true
	wantRefused(t, "create in a pool's standby tier", tenant.Create(ctx, standby.DeepCopy()), "spec.standby")
	if err := operator.Create(ctx, standby); err != nil {
		t.Fatalf("the operator could not make a standby claim: %v", err)
	}
	setStandby := func(c client.Client, on bool) error {
		cur := &hfv1.MachineClaim{}
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(standby), cur); err != nil {
			t.Fatal(err)
		}
		cur.Spec.Standby = on
		return c.Update(ctx, cur)
	}
	wantRefused(t, "a tenant takes a standby VM out of the tier", setStandby(tenant, false), "spec.standby")
	if err := setStandby(operator, false); err != nil {
		t.Fatalf("the operator could not take its standby claim for a job: %v", err)
	}
	for who, c := range map[string]client.Client{"a tenant": tenant, "the operator": operator} {
		if err := setStandby(c, true); err == nil || !strings.Contains(err.Error(), "spec.standby") {
			t.Fatalf("%s putting a resumed claim back in the tier: %v, want refused", who, err)
		}
	}

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

// TestTenantCannotRemoveFinalizersOrEditCIJobs: a tenant (with
// cluster-admin RBAC) can neither remove nor add HyperFleet's finalizers on
// a claim (before or after deleting it), a template or an IPPool, and each
// refusal says how to get what the tenant wants; nor create a CIJob or
// change its state or labels. The operator can do each; the tenant's own
// finalizers and the deletion itself stay the tenant's.
func TestTenantCannotRemoveFinalizersOrEditCIJobs(t *testing.T) {
	applyPolicies(t)
	ctx := context.Background()
	ns := newNamespace(t)
	tenant, operator := as(t, "alice"), as(t, operatorUser)

	withFinalizer := func(obj client.Object, finalizer string) {
		t.Helper()
		obj.SetFinalizers([]string{finalizer})
		if err := operator.Update(ctx, obj); err != nil {
			t.Fatalf("the operator could not add finalizer %s to %s: %v", finalizer, obj.GetName(), err)
		}
	}
	// edit applies mutate to the current obj as user.
	edit := func(user client.Client, obj client.Object, mutate func(client.Object)) error {
		t.Helper()
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(obj), obj); err != nil {
			t.Fatal(err)
		}
		mutate(obj)
		return user.Update(ctx, obj)
	}
	drop := func(o client.Object) { o.SetFinalizers(nil) }

	// A claim: its finalizer holds it until its VM is gone.
	c := claim(ns, "held", nil, nil)
	if err := tenant.Create(ctx, c); err != nil {
		t.Fatal(err)
	}
	withFinalizer(c, hfv1.MachineClaimFinalizer)
	wantRefused(t, "remove the claim's finalizer", edit(tenant, c, drop), "metadata.finalizers: "+hfv1.MachineClaimFinalizer)
	err := edit(tenant, c, drop)
	if err == nil || !strings.Contains(err.Error(), "to end a MachineClaim, delete it: the operator removes its finalizer when its VM is gone") {
		t.Fatalf("the refusal does not say how to end a claim: %v", err)
	}
	if err := edit(tenant, c, func(o client.Object) { o.SetFinalizers(append(o.GetFinalizers(), "example.com/mine")) }); err != nil {
		t.Fatalf("the tenant could not add a finalizer of its own: %v", err)
	}
	if err := tenant.Delete(ctx, c); err != nil {
		t.Fatalf("the tenant could not delete its claim: %v", err)
	}
	wantRefused(t, "remove the finalizer of a deleted claim", edit(tenant, c, drop), hfv1.MachineClaimFinalizer)
	if err := edit(tenant, c, func(o client.Object) { o.SetFinalizers([]string{hfv1.MachineClaimFinalizer}) }); err != nil {
		t.Fatalf("the tenant could not remove a finalizer of its own: %v", err)
	}
	wantRefused(t, "create a claim with the operator's finalizer", tenant.Create(ctx, &hfv1.MachineClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "pre-held", Finalizers: []string{hfv1.MachineClaimFinalizer}},
		Spec:       hfv1.MachineClaimSpec{TemplateRef: hfv1.ObjectName{Name: "debian"}},
	}), hfv1.MachineClaimFinalizer)
	if err := edit(operator, c, drop); err != nil {
		t.Fatalf("the operator could not remove its finalizer: %v", err)
	}

	// A template and an IPPool: their finalizers hold them while claims use them.
	tmpl := template(ns, "debian", "pve", "")
	pool := &hfv1.IPPool{
		ObjectMeta: metav1.ObjectMeta{Name: ns + "-pool"},
		Spec:       hfv1.IPPoolSpec{Addresses: []string{"10.9.0.10-10.9.0.20"}, Prefix: 24},
	}
	for _, tc := range []struct {
		obj       client.Object
		finalizer string
	}{{tmpl, hfv1.HypervisorMachineTemplateFinalizer}, {pool, hfv1.IPPoolFinalizer}} {
		if err := tenant.Create(ctx, tc.obj); err != nil {
			t.Fatal(err)
		}
		withFinalizer(tc.obj, tc.finalizer)
		if err := tenant.Delete(ctx, tc.obj); err != nil {
			t.Fatalf("delete %s: %v", tc.obj.GetName(), err)
		}
		err := edit(tenant, tc.obj, drop)
		wantRefused(t, "remove the finalizer of "+tc.obj.GetName(), err, "metadata.finalizers: "+tc.finalizer)
		if !strings.Contains(err.Error(), "the operator removes its finalizer once no MachineClaim uses it") {
			t.Fatalf("the refusal does not say what to do: %v", err)
		}
		if err := edit(operator, tc.obj, drop); err != nil {
			t.Fatalf("the operator could not remove its finalizer from %s: %v", tc.obj.GetName(), err)
		}
	}

	// CIJobs: the demand record is the operator's.
	job := &hfv1.CIJob{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "github-actions-4242"},
		Spec: hfv1.CIJobSpec{Platform: hfv1.WorkloadGitHubActions, JobID: 4242, Repository: "octo-org/app",
			Labels: []string{"self-hosted"}, RunnerPoolRef: hfv1.ObjectName{Name: "linux"}},
		Status: hfv1.CIJobStatus{State: hfv1.CIJobQueued},
	}
	wantRefused(t, "create a CIJob", tenant.Create(ctx, job.DeepCopy()), "cijobs")
	if err := operator.Create(ctx, job); err != nil {
		t.Fatalf("the operator could not record a job: %v", err)
	}
	wantRefused(t, "complete a queued job", edit(tenant, job, func(o client.Object) {
		o.(*hfv1.CIJob).Status.State = hfv1.CIJobCompleted
	}), "status.state")
	wantRefused(t, "name another runner", edit(tenant, job, func(o client.Object) {
		j := o.(*hfv1.CIJob)
		j.Status.State, j.Status.RunnerName = hfv1.CIJobInProgress, "someone-elses-runner"
	}), "cijobs")
	wantRefused(t, "label a job", edit(tenant, job, func(o client.Object) { o.SetLabels(map[string]string{"team": "a"}) }), "cijobs")
	if err := edit(operator, job, func(o client.Object) { o.(*hfv1.CIJob).Status.State = hfv1.CIJobInProgress }); err != nil {
		t.Fatalf("the operator could not move the job forward: %v", err)
	}
}

// applyFile creates every object of a YAML file of the repository.
func applyFile(t *testing.T, path ...string) {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(append([]string{testenv.RepoRoot()}, path...)...))
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
		if err := env.Client.Create(context.Background(), u); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatalf("create %s %s: %v", u.GetKind(), u.GetName(), err)
		}
	}
}

// bind binds user to the ClusterRole role: in ns with a RoleBinding, or
// cluster-wide when ns is empty.
func bind(t *testing.T, user, role, ns string) {
	t.Helper()
	subjects := []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: user}}
	ref := rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role}
	var obj client.Object = &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "admission-test-" + user + "-" + role}, RoleRef: ref, Subjects: subjects}
	if ns != "" {
		obj = &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: user + "-" + role}, RoleRef: ref, Subjects: subjects}
	}
	if err := env.Client.Create(context.Background(), obj); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
}

// TestOnlyPlatformAdminsForceDeleteOrDisown: the annotations
// hyperfleet.io/force-delete and hyperfleet.io/disown of a MachineClaim
// may be written only by a caller the authorizer grants the verb of the
// same name (the ClusterRole hyperfleet-claim-admin of config/rbac). A
// namespace admin with every ordinary verb on claims is refused, on create
// and on update, with a message that names the annotation, says it is for
// platform admins and names the role; a user bound to the role may add,
// change and remove both, but only with a reason of 1 to 256 characters,
// and still no other hyperfleet.io/* key; the admin annotations stay
// forbidden on every other kind. A role with the verb '*' on claims
// includes the two verbs (why tenants must get explicit verbs).
func TestOnlyPlatformAdminsForceDeleteOrDisown(t *testing.T) {
	applyPolicies(t)
	applyFile(t, "config", "rbac", "claim_admin_role.yaml")
	ctx := context.Background()
	ns := newNamespace(t)
	// A namespace admin as tenants are set up: the built-in admin role and
	// every ordinary verb on HyperFleet's kinds in the namespace.
	tenantRole := &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: "admission-test-hyperfleet-tenant"},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{hfv1.GroupVersion.Group}, Resources: []string{"machineclaims", "hypervisormachinetemplates", "runnerpools"},
			Verbs: []string{"get", "list", "watch", "create", "update", "patch", "delete", "deletecollection"}}},
	}
	wildcard := &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: "admission-test-claims-wildcard"},
		Rules:      []rbacv1.PolicyRule{{APIGroups: []string{hfv1.GroupVersion.Group}, Resources: []string{"machineclaims"}, Verbs: []string{"*"}}},
	}
	for _, r := range []*rbacv1.ClusterRole{tenantRole, wildcard} {
		if err := env.Client.Create(ctx, r); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
	}
	bind(t, "nadia", "admin", ns)
	bind(t, "nadia", tenantRole.Name, ns)
	bind(t, "pat", "hyperfleet-claim-admin", "")
	bind(t, "wes", wildcard.Name, ns)
	tenant, admin, wildcardUser := as(t, "nadia"), as(t, "pat"), as(t, "wes")

	// wantAdminOnly fails unless err is the policy's refusal of key.
	wantAdminOnly := func(what string, err error, key, verb string) {
		t.Helper()
		if err == nil {
			t.Fatalf("%s: accepted, want refused by the admission policy", what)
		}
		for _, s := range []string{"hyperfleet-operator-owned-fields", "metadata.annotations: " + key, "is for platform admins", "nadia may not",
			"the verb " + verb + " on machineclaims", "ClusterRole hyperfleet-claim-admin"} {
			if !strings.Contains(err.Error(), s) {
				t.Fatalf("%s: message %q does not say %q", what, err.Error(), s)
			}
		}
	}
	c := claim(ns, "held", nil, nil)
	if err := tenant.Create(ctx, c); err != nil {
		t.Fatalf("the namespace admin cannot create a claim (the test's RBAC is wrong): %v", err)
	}
	// patchAs applies mutate to the current claim as user, with a merge
	// patch (what kubectl annotate sends).
	patchAs := func(user client.Client, mutate func(*hfv1.MachineClaim)) error {
		t.Helper()
		cur := &hfv1.MachineClaim{}
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(c), cur); err != nil {
			t.Fatal(err)
		}
		before := cur.DeepCopy()
		if cur.Annotations == nil {
			cur.Annotations = map[string]string{}
		}
		mutate(cur)
		return user.Patch(ctx, cur, client.MergeFrom(before))
	}
	set := func(key, value string) func(*hfv1.MachineClaim) {
		return func(m *hfv1.MachineClaim) { m.Annotations[key] = value }
	}
	unset := func(key string) func(*hfv1.MachineClaim) {
		return func(m *hfv1.MachineClaim) { delete(m.Annotations, key) }
	}

	for _, a := range []struct{ key, verb string }{{hfv1.ForceDeleteAnnotation, hfv1.ForceDeleteVerb}, {hfv1.DisownAnnotation, hfv1.DisownVerb}} {
		wantAdminOnly("namespace admin adds "+a.key, patchAs(tenant, set(a.key, "my VM is stuck")), a.key, a.verb)
		wantAdminOnly("namespace admin creates a claim with "+a.key, tenant.Create(ctx, claim(ns, "pre-"+a.verb, nil, map[string]string{a.key: "x"})), a.key, a.verb)
		if err := patchAs(admin, set(a.key, "pve-b lost its disks; ticket OPS-42")); err != nil {
			t.Fatalf("the platform admin could not set %s: %v", a.key, err)
		}
		if err := patchAs(admin, set(a.key, "ticket OPS-43")); err != nil {
			t.Fatalf("the platform admin could not change %s: %v", a.key, err)
		}
		wantAdminOnly("namespace admin removes "+a.key, patchAs(tenant, unset(a.key)), a.key, a.verb)
		if err := patchAs(admin, unset(a.key)); err != nil {
			t.Fatalf("the platform admin could not remove %s: %v", a.key, err)
		}
		for name, value := range map[string]string{"empty": "", "blank": "   ", "over 256 characters": strings.Repeat("r", 257)} {
			err := patchAs(admin, set(a.key, value))
			if err == nil || !strings.Contains(err.Error(), "metadata.annotations: "+a.key+": the value is the reason, for the record: 1 to 256 characters") {
				t.Errorf("the platform admin set %s to a reason that is %s: %v, want the policy's refusal", a.key, name, err)
			}
		}
		if err := patchAs(admin, set(a.key, strings.Repeat("é", 256))); err != nil {
			t.Errorf("a reason of 256 characters (512 bytes) in %s was refused: %v", a.key, err)
		}
		if err := patchAs(admin, unset(a.key)); err != nil {
			t.Fatal(err)
		}
		if err := patchAs(wildcardUser, set(a.key, "granted by '*'")); err != nil {
			t.Errorf("a role with the verb '*' on machineclaims does not include %s: %v", a.verb, err)
		}
		if err := patchAs(admin, unset(a.key)); err != nil {
			t.Fatal(err)
		}
	}
	// The role's verbs open the two annotations, nothing else.
	wantRefused(t, "platform admin writes the reservation", patchAs(admin, set(hfv1.VMReservationAnnotation, "pve/pve1/sig/proxmox://4242")),
		"metadata.annotations: "+hfv1.VMReservationAnnotation)
	wantRefused(t, "platform admin writes a made-up key", patchAs(admin, set("hyperfleet.io/force", "x")), "metadata.annotations: hyperfleet.io/force")
	wantRefused(t, "platform admin labels the claim", patchAs(admin, func(m *hfv1.MachineClaim) {
		m.Labels = map[string]string{hfv1.RunnerPoolLabel: "other"}
	}), "metadata.labels: "+hfv1.RunnerPoolLabel)
	// On any other kind the two keys are the operator's like any other.
	pool := &hfv1.IPPool{ObjectMeta: metav1.ObjectMeta{Name: ns + "-pool", Annotations: map[string]string{hfv1.DisownAnnotation: "x"}},
		Spec: hfv1.IPPoolSpec{Addresses: []string{"10.9.0.10-10.9.0.20"}, Prefix: 24}}
	wantRefused(t, "cluster admin annotates an IPPool with "+hfv1.DisownAnnotation, as(t, "alice").Create(ctx, pool), "metadata.annotations: "+hfv1.DisownAnnotation)
}

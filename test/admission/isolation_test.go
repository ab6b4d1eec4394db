package admission_test

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
)

// isolationPolicyName is the policy of config/admission/isolation_tenancy_policy.yaml.
const isolationPolicyName = "hyperfleet-isolation-tenancy"

// template is a valid Proxmox template in ns on cluster, naming the
// isolation policy policy ("" for none).
func template(ns, name, cluster, policy string) *hfv1.HypervisorMachineTemplate {
	return &hfv1.HypervisorMachineTemplate{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: hfv1.HypervisorMachineTemplateSpec{
			HypervisorClusterRef: hfv1.ObjectName{Name: cluster},
			Source:               hfv1.MachineSource{Proxmox: hfv1.ProxmoxSource{TemplateName: "debian-12"}},
			Resources:            hfv1.MachineResources{CPU: 1, Memory: resource.MustParse("1Gi")},
			Network:              hfv1.MachineNetwork{IsolationPolicy: policy},
			Bootstrap: hfv1.Bootstrap{GitHub: &hfv1.GitHubBootstrap{Owner: "octo-org", Organization: "octo-org",
				Credentials: hfv1.GitHubCredentials{PAT: &hfv1.LocalSecretKeySelector{Name: "github", Key: "token"}}}},
		},
	}
}

// isolatingCluster is a valid Proxmox cluster with isolation iso (nil:
// none) and the tenancy rules.
func isolatingCluster(name string, iso *hfv1.NetworkIsolation, rules ...hfv1.TenancyRule) *hfv1.HypervisorCluster {
	c := &hfv1.HypervisorCluster{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: hfv1.HypervisorClusterSpec{Provider: hfv1.ProviderProxmox, Endpoint: "https://pve.example.com:8006/api2/json",
			Credentials: hfv1.HypervisorCredentials{
				TokenID:     &hfv1.SecretKeySelector{Namespace: "hyperfleet-system", Name: "pve", Key: "tokenID"},
				TokenSecret: &hfv1.SecretKeySelector{Namespace: "hyperfleet-system", Name: "pve", Key: "tokenSecret"},
			},
			Tenancy: rules,
		},
	}
	if iso != nil {
		c.Spec.Network = &hfv1.ClusterNetworkSettings{VMSubnets: []string{"192.0.2.0/24"}, Isolation: iso}
	}
	return c
}

// tenancyRule is a rule for the namespaces sel selects, allowing the
// isolation policies (none: the cluster's default only).
func tenancyRule(sel metav1.LabelSelector, policies ...string) hfv1.TenancyRule {
	return hfv1.TenancyRule{NamespaceSelector: sel, Templates: []hfv1.AllowedTemplate{{Name: "debian-12"}}, IsolationPolicies: policies}
}

// isolation defines the policies web and build, and defaultPolicy def ("":
// the built-in default).
func isolation(def string) *hfv1.NetworkIsolation {
	return &hfv1.NetworkIsolation{OperatorCIDRs: []string{"192.0.2.5"}, DefaultPolicy: def, Policies: []hfv1.IsolationPolicy{
		{Name: "web", Egress: []hfv1.EgressRule{{CIDRs: []string{"0.0.0.0/0"}, Ports: []string{"443"}}}},
		{Name: "build"},
	}}
}

func labels(kv ...string) metav1.LabelSelector {
	sel := metav1.LabelSelector{MatchLabels: map[string]string{}}
	for i := 0; i+1 < len(kv); i += 2 {
		sel.MatchLabels[kv[i]] = kv[i+1]
	}
	return sel
}

func expr(key string, op metav1.LabelSelectorOperator, values ...string) metav1.LabelSelector {
	return metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: key, Operator: op, Values: values}}}
}

// labelledNamespace creates a namespace with labels.
func labelledNamespace(t *testing.T, labels map[string]string) string {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "isolation-", Labels: labels}}
	if err := env.Client.Create(context.Background(), ns); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Client.Delete(context.Background(), ns) })
	return ns.Name
}

// createCluster creates cluster and waits until the policy sees it.
func createCluster(t *testing.T, cluster *hfv1.HypervisorCluster) {
	t.Helper()
	ctx := context.Background()
	if err := env.Client.Create(ctx, cluster); err != nil {
		t.Fatalf("create HypervisorCluster %s: %v", cluster.Name, err)
	}
	t.Cleanup(func() { _ = env.Client.Delete(ctx, cluster) })
	waitClustersSeen(t)
}

var barriers atomic.Int32

// waitClustersSeen waits until the policy judges templates by every
// HypervisorCluster as it is now: the API server reads params from a
// cache, a moment behind, and one watch fills it in order. So the test
// lets the probe cluster of applyPolicies allow one more policy, and waits
// until a template naming it passes.
func waitClustersSeen(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	probe := &hfv1.HypervisorCluster{}
	if err := env.Client.Get(ctx, client.ObjectKey{Name: "policy-probe"}, probe); err != nil {
		t.Fatal(err)
	}
	barrier := fmt.Sprintf("barrier-%d", barriers.Add(1))
	probe.Spec.Tenancy[0].IsolationPolicies = []string{barrier}
	if err := env.Client.Update(ctx, probe); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(time.Minute)
	for {
		err := as(t, "alice").Create(ctx, template("policy-probe", "barrier", probe.Name, barrier), client.DryRunAll)
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the policy has not seen the clusters' last change after a minute: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// wantIsolationRefused fails unless err is the isolation policy's refusal
// saying each of want.
func wantIsolationRefused(t *testing.T, what string, err error, want ...string) {
	t.Helper()
	if err == nil {
		t.Fatalf("%s: accepted, want refused by %s", what, isolationPolicyName)
	}
	for _, s := range append([]string{isolationPolicyName, "spec.network.isolationPolicy"}, want...) {
		if !strings.Contains(err.Error(), s) {
			t.Fatalf("%s: message %q does not say %q", what, err.Error(), s)
		}
	}
}

// TestIsolationPolicyAllowedByTenancy: a tenant's template may name (or,
// naming none, get) only an isolation policy that a spec.tenancy rule of
// its cluster selecting its namespace allows: listed in the rule's
// isolationPolicies or, the rule listing none, the cluster's default. The
// namespaceSelector is Kubernetes' label selector. A cluster without
// isolation or without tenancy rules is not judged here (a policy named on
// a cluster without isolation is the reconciler's to refuse).
func TestIsolationPolicyAllowedByTenancy(t *testing.T) {
	applyPolicies(t)
	cases := []struct {
		name      string
		isolation *hfv1.NetworkIsolation
		rules     []hfv1.TenancyRule
		nsLabels  map[string]string
		policy    string
		// refused lists what the refusal says; empty: allowed.
		refused []string
	}{
		{name: "cluster without isolation", rules: []hfv1.TenancyRule{tenancyRule(labels())}, policy: "web"},
		{name: "isolation without tenancy", isolation: isolation(""), policy: "build"},
		{name: "matchLabels selects, rule lists the policy", isolation: isolation(""),
			rules: []hfv1.TenancyRule{tenancyRule(labels("team", "a"), "web")}, nsLabels: map[string]string{"team": "a"}, policy: "web"},
		{name: "matchLabels does not select", isolation: isolation(""),
			rules: []hfv1.TenancyRule{tenancyRule(labels("team", "a"), "web")}, nsLabels: map[string]string{"team": "b"}, policy: "web",
			refused: []string{"web is not allowed", "no spec.tenancy entry of the cluster selects this namespace"}},
		{name: "matchLabels and matchExpressions both must select", isolation: isolation(""),
			rules: []hfv1.TenancyRule{tenancyRule(metav1.LabelSelector{MatchLabels: map[string]string{"team": "a"},
				MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "tier", Operator: metav1.LabelSelectorOpIn, Values: []string{"gold"}}}}, "web")},
			nsLabels: map[string]string{"team": "a"}, policy: "web", refused: []string{"selects this namespace"}},
		{name: "In selects", isolation: isolation(""), rules: []hfv1.TenancyRule{tenancyRule(expr("tier", metav1.LabelSelectorOpIn, "gold", "silver"), "web")},
			nsLabels: map[string]string{"tier": "silver"}, policy: "web"},
		{name: "In, another value", isolation: isolation(""), rules: []hfv1.TenancyRule{tenancyRule(expr("tier", metav1.LabelSelectorOpIn, "gold", "silver"), "web")},
			nsLabels: map[string]string{"tier": "bronze"}, policy: "web", refused: []string{"selects this namespace"}},
		{name: "In, no label", isolation: isolation(""), rules: []hfv1.TenancyRule{tenancyRule(expr("tier", metav1.LabelSelectorOpIn, "gold"), "web")},
			policy: "web", refused: []string{"selects this namespace"}},
		{name: "In without values selects nothing", isolation: isolation(""), rules: []hfv1.TenancyRule{tenancyRule(expr("tier", metav1.LabelSelectorOpIn), "web")},
			nsLabels: map[string]string{"tier": ""}, policy: "web", refused: []string{"selects this namespace"}},
		{name: "an unknown operator selects nothing", isolation: isolation(""), rules: []hfv1.TenancyRule{tenancyRule(expr("tier", "Matches", "gold"), "web")},
			nsLabels: map[string]string{"tier": "gold"}, policy: "web", refused: []string{"selects this namespace"}},
		{name: "NotIn selects another value", isolation: isolation(""), rules: []hfv1.TenancyRule{tenancyRule(expr("tier", metav1.LabelSelectorOpNotIn, "bronze"), "web")},
			nsLabels: map[string]string{"tier": "gold"}, policy: "web"},
		{name: "NotIn selects a namespace without the label", isolation: isolation(""),
			rules: []hfv1.TenancyRule{tenancyRule(expr("tier", metav1.LabelSelectorOpNotIn, "bronze"), "web")}, policy: "web"},
		{name: "NotIn, a listed value", isolation: isolation(""), rules: []hfv1.TenancyRule{tenancyRule(expr("tier", metav1.LabelSelectorOpNotIn, "bronze"), "web")},
			nsLabels: map[string]string{"tier": "bronze"}, policy: "web", refused: []string{"selects this namespace"}},
		{name: "Exists, empty value", isolation: isolation(""), rules: []hfv1.TenancyRule{tenancyRule(expr("ci", metav1.LabelSelectorOpExists), "web")},
			nsLabels: map[string]string{"ci": ""}, policy: "web"},
		{name: "Exists, no label", isolation: isolation(""), rules: []hfv1.TenancyRule{tenancyRule(expr("ci", metav1.LabelSelectorOpExists), "web")},
			nsLabels: map[string]string{"cd": "yes"}, policy: "web", refused: []string{"selects this namespace"}},
		{name: "DoesNotExist, no label", isolation: isolation(""), rules: []hfv1.TenancyRule{tenancyRule(expr("quarantine", metav1.LabelSelectorOpDoesNotExist), "web")},
			policy: "web"},
		{name: "DoesNotExist, labelled", isolation: isolation(""), rules: []hfv1.TenancyRule{tenancyRule(expr("quarantine", metav1.LabelSelectorOpDoesNotExist), "web")},
			nsLabels: map[string]string{"quarantine": "yes"}, policy: "web", refused: []string{"selects this namespace"}},
		{name: "policy not listed", isolation: isolation(""), rules: []hfv1.TenancyRule{tenancyRule(labels(), "web", "default")}, policy: "build",
			refused: []string{"spec.network.isolationPolicy: build is not allowed in namespace ", "allowed isolation policies here: web, default. ",
				"(or leave it unset for the default, default)", "ask the cluster's owner to list build in spec.tenancy[].isolationPolicies"}},
		{name: "another rule selecting the namespace lists it", isolation: isolation(""),
			rules: []hfv1.TenancyRule{tenancyRule(labels(), "web"), tenancyRule(labels("team", "a"), "build")}, nsLabels: map[string]string{"team": "a"}, policy: "build"},
		{name: "no policy named, the rule lists others", isolation: isolation(""), rules: []hfv1.TenancyRule{tenancyRule(labels(), "web")},
			refused: []string{"spec.network.isolationPolicy is unset, so the template gets the default isolation policy default of its cluster",
				"allowed isolation policies here: web. Name one of them in spec.network.isolationPolicy, or ask"}},
		{name: "rule lists none, the built-in default named", isolation: isolation(""), rules: []hfv1.TenancyRule{tenancyRule(labels())}, policy: "default"},
		{name: "rule lists none, no policy named", isolation: isolation(""), rules: []hfv1.TenancyRule{tenancyRule(labels())}},
		{name: "rule lists none, the cluster's default named", isolation: isolation("build"), rules: []hfv1.TenancyRule{tenancyRule(labels())}, policy: "build"},
		{name: "rule lists none, the cluster's default implied", isolation: isolation("build"), rules: []hfv1.TenancyRule{tenancyRule(labels())}},
		{name: "rule lists none, another policy named", isolation: isolation("build"), rules: []hfv1.TenancyRule{tenancyRule(labels())}, policy: "web",
			refused: []string{"web is not allowed", "allowed isolation policies here: build. ", "(or leave it unset for the default, build)"}},
		{name: "rule lists none, the built-in default when the cluster's is another", isolation: isolation("build"), rules: []hfv1.TenancyRule{tenancyRule(labels())},
			policy: "default", refused: []string{"default is not allowed", "allowed isolation policies here: build. "}},
	}
	ctx := context.Background()
	tenant := as(t, "alice")
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cluster := isolatingCluster(fmt.Sprintf("isolation-%d", i), tc.isolation, tc.rules...)
			createCluster(t, cluster)
			ns := labelledNamespace(t, tc.nsLabels)
			err := tenant.Create(ctx, template(ns, "runner", cluster.Name, tc.policy))
			if len(tc.refused) == 0 {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			wantIsolationRefused(t, tc.name, err, append([]string{"namespace " + ns, "on HypervisorCluster " + cluster.Name}, tc.refused...)...)
		})
	}
}

// TestIsolationPolicyJudgedByItsClusterOnly: a template is judged by the
// rules of the cluster it names, not by another cluster's; an UPDATE that
// names another policy or cluster is judged like a create, one that leaves
// both alone is not (a cluster edited since is the reconciler's to catch,
// and the operator's finalizer must come off).
func TestIsolationPolicyJudgedByItsClusterOnly(t *testing.T) {
	applyPolicies(t)
	ctx := context.Background()
	tenant := as(t, "alice")
	strict := isolatingCluster("isolation-strict", isolation(""), tenancyRule(labels()))
	open := isolatingCluster("isolation-open", isolation(""), tenancyRule(labels(), "web", "build"))
	createCluster(t, strict)
	createCluster(t, open)
	ns := labelledNamespace(t, nil)

	if err := tenant.Create(ctx, template(ns, "open", open.Name, "web")); err != nil {
		t.Fatalf("a template allowed by its own cluster was refused for another's rules: %v", err)
	}
	wantIsolationRefused(t, "the same template on the strict cluster", tenant.Create(ctx, template(ns, "strict", strict.Name, "web")),
		"web is not allowed", "on HypervisorCluster "+strict.Name)

	update := func(mutate func(*hfv1.HypervisorMachineTemplate)) error {
		cur := &hfv1.HypervisorMachineTemplate{}
		if err := env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "open"}, cur); err != nil {
			t.Fatal(err)
		}
		mutate(cur)
		return tenant.Update(ctx, cur)
	}
	if err := update(func(m *hfv1.HypervisorMachineTemplate) { m.Spec.Network.IsolationPolicy = "build" }); err != nil {
		t.Fatalf("changing to another allowed policy was refused: %v", err)
	}
	wantIsolationRefused(t, "update to a policy the cluster does not allow", update(func(m *hfv1.HypervisorMachineTemplate) {
		m.Spec.Network.IsolationPolicy = "secret"
	}), "secret is not allowed", "allowed isolation policies here: web, build. ")
	wantIsolationRefused(t, "update to the strict cluster", update(func(m *hfv1.HypervisorMachineTemplate) {
		m.Spec.HypervisorClusterRef.Name = strict.Name
	}), "build is not allowed", "on HypervisorCluster "+strict.Name)

	// The cluster's owner takes build back: the template keeps it until
	// the reconciler refuses it, and edits that choose nothing still pass.
	cur := &hfv1.HypervisorCluster{}
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(open), cur); err != nil {
		t.Fatal(err)
	}
	cur.Spec.Tenancy[0].IsolationPolicies = []string{"web"}
	if err := env.Client.Update(ctx, cur); err != nil {
		t.Fatalf("the cluster's owner could not take a policy back from tenants: %v", err)
	}
	waitClustersSeen(t)
	if err := update(func(m *hfv1.HypervisorMachineTemplate) { m.Labels = map[string]string{"team": "a"} }); err != nil {
		t.Fatalf("an edit that chooses no policy or cluster was refused for the template's earlier choice: %v", err)
	}
	wantIsolationRefused(t, "naming the policy taken back again, by its default", update(func(m *hfv1.HypervisorMachineTemplate) {
		m.Spec.Network.IsolationPolicy = ""
	}), "spec.network.isolationPolicy is unset", "allowed isolation policies here: web. ")
}

// Package chart_test checks the Helm chart charts/hyperfleet with the helm
// CLI built from its Go module (hack/helm/build.sh): helm lint; helm
// template with the default values and with every optional part on
// (testdata/everything-on.yaml), each rendered object server-side applied
// to the real kube-apiserver with strict field validation; values the chart
// must refuse, and values.schema.json against values.yaml (schema_test.go);
// the Secret-reading bindings and flag, and the trusted CAs
// (manager_test.go); (compare_test.go) that the chart and config/
// (kustomize) install the same objects but for the differences listed
// there; and (lifecycle_test.go) helm install, upgrade and uninstall
// against the real kube-apiserver: an upgrade updates the CRDs, an
// uninstall keeps them and every claim.
package chart_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/discovery"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/hyperfleet/hyperfleet/test/testenv"
)

// The API server starts only for the tests that apply objects.
var lazy testenv.Lazy

func TestMain(m *testing.M) { os.Exit(lazy.Main(m)) }

// chartDir is the chart, from the repository's root.
const chartDir = "charts/hyperfleet"

// release is one way of installing the chart.
type release struct {
	name, namespace string
	// values are values files, from this package's directory.
	values []string
}

var (
	// defaults is the install the chart's README shows; its names are
	// config/'s.
	defaults = release{name: "hyperfleet", namespace: "hyperfleet-system"}
	// everythingOn turns on every optional part, under other names.
	everythingOn = release{name: "ci", namespace: "ci-infra", values: []string{"testdata/everything-on.yaml"}}
	// everythingOff turns off every part that is on by default.
	everythingOff = release{name: "bare", namespace: "bare", values: []string{"testdata/everything-off.yaml"}}
	// podMonitored scrapes the metrics through a PodMonitor, which
	// everythingOn cannot (it has the ServiceMonitor, and the chart
	// refuses both).
	podMonitored = release{name: "pm", namespace: "pm-infra", values: []string{"testdata/podmonitor-on.yaml"}}
	// The modes of docs/install.md, "Pick your mode", besides the
	// defaults' (GitHub's webhooks): GitHub's scale-set mode, GitLab only,
	// Buildkite only. test/deploy installs each with helm install --wait.
	scaleSetMode  = release{name: "scaleset", namespace: "scaleset", values: []string{"testdata/mode-scale-set.yaml"}}
	gitLabMode    = release{name: "gitlab", namespace: "gitlab", values: []string{"testdata/mode-gitlab.yaml"}}
	buildkiteMode = release{name: "buildkite", namespace: "buildkite", values: []string{"testdata/mode-buildkite.yaml"}}
	// releases are all of them.
	releases = []release{defaults, everythingOn, everythingOff, podMonitored, scaleSetMode, gitLabMode, buildkiteMode}
)

// fullname is the prefix of the release's object names (the chart's
// hyperfleet.fullname without overrides).
func (r release) fullname() string {
	if strings.Contains(r.name, "hyperfleet") {
		return r.name
	}
	return r.name + "-hyperfleet"
}

// templateArgs are the arguments of `helm template` for r (the CRDs are
// templates, so rendered with the rest).
func templateArgs(r release, extra ...string) []string {
	args := []string{"template", r.name, chartDir, "--namespace", r.namespace}
	for _, f := range r.values {
		args = append(args, "--values", filepath.Join("test", "chart", f))
	}
	return append(args, extra...)
}

// render returns the objects `helm template` renders for r, in order.
func render(t *testing.T, r release, extra ...string) []*unstructured.Unstructured {
	t.Helper()
	out, err := testenv.Helm(t, templateArgs(r, extra...)...)
	if err != nil {
		t.Fatal(err)
	}
	objs, err := testenv.DecodeObjects([]byte(out))
	if err != nil {
		t.Fatalf("helm template %s: %v", r.name, err)
	}
	return objs
}

// key names an object: kind namespace/name.
func key(u *unstructured.Unstructured) string {
	return fmt.Sprintf("%s %s/%s", u.GetKind(), u.GetNamespace(), u.GetName())
}

func keys(objs []*unstructured.Unstructured) []string {
	out := make([]string, 0, len(objs))
	for _, o := range objs {
		out = append(out, key(o))
	}
	sort.Strings(out)
	return out
}

func find(t *testing.T, objs []*unstructured.Unstructured, kind, name string) *unstructured.Unstructured {
	t.Helper()
	for _, o := range objs {
		if o.GetKind() == kind && o.GetName() == name {
			return o
		}
	}
	t.Fatalf("no %s %s among %v", kind, name, keys(objs))
	return nil
}

// TestLint: helm lint --strict passes with the default values, with
// every optional part on and with every default part off.
func TestLint(t *testing.T) {
	for _, r := range releases {
		args := []string{"lint", "--strict", chartDir, "--namespace", r.namespace}
		for _, f := range r.values {
			args = append(args, "--values", filepath.Join("test", "chart", f))
		}
		if _, err := testenv.Helm(t, args...); err != nil {
			t.Errorf("%s: %v", r.name, err)
		}
	}
}

// optionalObjects are what only the optional parts add.
var optionalObjects = []string{
	"Certificate ci-infra/ci-hyperfleet-agent",
	"Certificate ci-infra/ci-hyperfleet-metrics",
	"Certificate ci-infra/ci-hyperfleet-webhook",
	"ClusterRoleBinding /ci-hyperfleet-claim-admin",
	"ClusterRoleBinding /ci-hyperfleet-metrics-reader",
	"ConfigMap ci-infra/ci-hyperfleet-dashboards",
	"NetworkPolicy ci-infra/ci-hyperfleet-manager",
	"PrometheusRule ci-infra/ci-hyperfleet",
	"RoleBinding team-a/ci-hyperfleet-secret-reader",
	"RoleBinding team-b/ci-hyperfleet-secret-reader",
	"ServiceMonitor ci-infra/ci-hyperfleet-manager",
}

// TestTemplate: the default values render config/'s objects (names
// included) and none of the optional ones; everything-on.yaml renders
// every optional object, under its release's names; everything-off.yaml
// only what the manager cannot do without.
func TestTemplate(t *testing.T) {
	want := []string{
		"ClusterRole /hyperfleet-claim-admin", "ClusterRole /hyperfleet-manager", "ClusterRole /hyperfleet-metrics-auth", "ClusterRole /hyperfleet-metrics-reader",
		"ClusterRole /hyperfleet-secret-reader", "ClusterRoleBinding /hyperfleet-manager", "ClusterRoleBinding /hyperfleet-metrics-auth",
		"ConfigMap hyperfleet-system/hyperfleet-config",
		"CustomResourceDefinition /cijobs.hyperfleet.io", "CustomResourceDefinition /hypervisorclusters.hyperfleet.io",
		"CustomResourceDefinition /hypervisormachinetemplates.hyperfleet.io", "CustomResourceDefinition /ippools.hyperfleet.io",
		"CustomResourceDefinition /machineclaims.hyperfleet.io", "CustomResourceDefinition /runnerpools.hyperfleet.io",
		"Deployment hyperfleet-system/hyperfleet-manager",
		"PodDisruptionBudget hyperfleet-system/hyperfleet-manager",
		"Role hyperfleet-system/hyperfleet-leader-election", "RoleBinding hyperfleet-system/hyperfleet-leader-election",
		"RoleBinding hyperfleet-system/hyperfleet-secret-reader", "Service hyperfleet-system/hyperfleet-agent",
		"Service hyperfleet-system/hyperfleet-metrics", "Service hyperfleet-system/hyperfleet-webhooks",
		"ServiceAccount hyperfleet-system/hyperfleet-manager",
		"ValidatingAdmissionPolicy /hyperfleet-isolation-tenancy", "ValidatingAdmissionPolicy /hyperfleet-operator-owned-fields",
		"ValidatingAdmissionPolicyBinding /hyperfleet-isolation-tenancy", "ValidatingAdmissionPolicyBinding /hyperfleet-operator-owned-fields",
	}
	if got := keys(render(t, defaults)); !reflect.DeepEqual(got, want) {
		t.Errorf("default values render\n  %s\nwant\n  %s", strings.Join(got, "\n  "), strings.Join(want, "\n  "))
	}

	all := keys(render(t, everythingOn))
	for _, o := range optionalObjects {
		if !contains(all, o) {
			t.Errorf("everything-on.yaml does not render %s (rendered: %v)", o, all)
		}
	}

	var bare []string
	for _, k := range keys(render(t, everythingOff)) {
		if !strings.HasPrefix(k, "CustomResourceDefinition ") {
			bare = append(bare, k)
		}
	}
	wantBare := []string{
		"ClusterRole /bare-hyperfleet-manager", "ClusterRole /bare-hyperfleet-secret-reader", "ClusterRoleBinding /bare-hyperfleet-manager",
		"ConfigMap bare/bare-hyperfleet-config", "Deployment bare/bare-hyperfleet-manager", "Role bare/bare-hyperfleet-leader-election",
		"RoleBinding bare/bare-hyperfleet-leader-election", "RoleBinding bare/bare-hyperfleet-secret-reader",
		"Service bare/bare-hyperfleet-metrics", "ServiceAccount bare/bare-hyperfleet-manager",
	}
	if !reflect.DeepEqual(bare, wantBare) {
		t.Errorf("everything-off.yaml renders\n  %s\nwant\n  %s", strings.Join(bare, "\n  "), strings.Join(wantBare, "\n  "))
	}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// TestClaimAdminRoleOfTheRelease: the release installs the ClusterRole
// <fullname>-claim-admin with the verbs the admission policy asks for
// (force-delete, disown), with no aggregation to the namespace roles, and
// the policy's messages name that role; everything-on.yaml binds it to
// admissionPolicy.claimAdmins.
func TestClaimAdminRoleOfTheRelease(t *testing.T) {
	for _, r := range []release{defaults, everythingOn} {
		objs := render(t, r)
		role := r.fullname() + "-claim-admin"
		cr := find(t, objs, "ClusterRole", role)
		rules, _, _ := unstructured.NestedSlice(cr.Object, "rules")
		raw := fmt.Sprint(rules)
		for _, want := range []string{"force-delete", "disown", "machineclaims", "hyperfleet.io"} {
			if !strings.Contains(raw, want) {
				t.Errorf("%s: ClusterRole %s does not grant %s: %v", r.name, role, want, rules)
			}
		}
		for k := range cr.GetLabels() {
			if strings.HasPrefix(k, "rbac.authorization.k8s.io/aggregate-to-") {
				t.Errorf("%s: ClusterRole %s is aggregated (%s): namespace admins would get its verbs", r.name, role, k)
			}
		}
		policy := find(t, objs, "ValidatingAdmissionPolicy", r.fullname()+"-operator-owned-fields")
		validations, _, _ := unstructured.NestedSlice(policy.Object, "spec", "validations")
		named := 0
		for _, v := range validations {
			if m, _ := v.(map[string]any)["messageExpression"].(string); strings.Contains(m, "ClusterRole "+role+" grants") {
				named++
			}
		}
		if named != 2 {
			t.Errorf("%s: %d policy messages name the ClusterRole %s, want 2 (force-delete and disown)", r.name, named, role)
		}
	}
	binding := find(t, render(t, everythingOn), "ClusterRoleBinding", everythingOn.fullname()+"-claim-admin")
	if subjects, _, _ := unstructured.NestedSlice(binding.Object, "subjects"); len(subjects) != 1 || !strings.Contains(fmt.Sprint(subjects), "platform-admins") {
		t.Errorf("the claim-admin binding's subjects are %v, want the group platform-admins", subjects)
	}
}

// TestAdmissionPolicyExemptsTheReleaseServiceAccount: the policy's
// matchCondition names the ServiceAccount of the release, in its namespace.
func TestAdmissionPolicyExemptsTheReleaseServiceAccount(t *testing.T) {
	for _, r := range []release{defaults, everythingOn} {
		policy := find(t, render(t, r), "ValidatingAdmissionPolicy", r.fullname()+"-operator-owned-fields")
		conds, _, _ := unstructured.NestedSlice(policy.Object, "spec", "matchConditions")
		want := fmt.Sprintf("request.userInfo.username != 'system:serviceaccount:%s:%s-manager'", r.namespace, r.fullname())
		if len(conds) != 1 || conds[0].(map[string]any)["expression"] != want {
			t.Errorf("%s: matchConditions %v, want the one expression %q", r.name, conds, want)
		}
	}
}

// TestIsolationTenancyPolicyOfTheRelease: the policy that holds templates
// to the isolation policies their cluster's tenancy allows is installed
// under the release's name, its binding names it, keeps config/'s paramRef
// (every HypervisorCluster, none found: allowed) and carries the release's
// labels.
func TestIsolationTenancyPolicyOfTheRelease(t *testing.T) {
	for _, r := range []release{defaults, everythingOn} {
		objs := render(t, r)
		name := r.fullname() + "-isolation-tenancy"
		policy := find(t, objs, "ValidatingAdmissionPolicy", name)
		if kind, _, _ := unstructured.NestedString(policy.Object, "spec", "paramKind", "kind"); kind != "HypervisorCluster" {
			t.Errorf("%s: policy %s has paramKind %q, want HypervisorCluster", r.name, name, kind)
		}
		binding := find(t, objs, "ValidatingAdmissionPolicyBinding", name)
		if got, _, _ := unstructured.NestedString(binding.Object, "spec", "policyName"); got != name {
			t.Errorf("%s: binding %s binds policy %q, want %q", r.name, name, got, name)
		}
		ref, _, _ := unstructured.NestedMap(binding.Object, "spec", "paramRef")
		if want := map[string]any{"selector": map[string]any{}, "parameterNotFoundAction": "Allow"}; !reflect.DeepEqual(ref, want) {
			t.Errorf("%s: binding %s has paramRef %v, want %v", r.name, name, ref, want)
		}
		for _, o := range []*unstructured.Unstructured{policy, binding} {
			if got := o.GetLabels()[instanceLabel]; got != r.name {
				t.Errorf("%s: %s has label %s=%q, want the release's", r.name, key(o), instanceLabel, got)
			}
		}
	}
}

// TestExistingServiceAccount: with serviceAccount.create false the chart
// creates no ServiceAccount and runs, binds and exempts the one named; the
// log level reaches the manager's flags.
func TestExistingServiceAccount(t *testing.T) {
	objs := render(t, defaults, "--set", "serviceAccount.create=false", "--set", "serviceAccount.name=platform-ci", "--set", "logLevel=debug")
	for _, o := range objs {
		if o.GetKind() == "ServiceAccount" {
			t.Errorf("the chart created ServiceAccount %s with serviceAccount.create=false", o.GetName())
		}
	}
	deploy := find(t, objs, "Deployment", defaults.fullname()+"-manager")
	if sa, _, _ := unstructured.NestedString(deploy.Object, "spec", "template", "spec", "serviceAccountName"); sa != "platform-ci" {
		t.Errorf("the Deployment runs as %q, want platform-ci", sa)
	}
	containers, _, _ := unstructured.NestedSlice(deploy.Object, "spec", "template", "spec", "containers")
	args, _, _ := unstructured.NestedStringSlice(containers[0].(map[string]any), "args")
	if !slices.Contains(args, "--zap-log-level=debug") {
		t.Errorf("manager args %v lack --zap-log-level=debug", args)
	}
	bound := 0
	for _, o := range objs {
		if k := o.GetKind(); k != "RoleBinding" && k != "ClusterRoleBinding" {
			continue
		}
		subjects, _, _ := unstructured.NestedSlice(o.Object, "subjects")
		for _, s := range subjects {
			if m := s.(map[string]any); m["kind"] == "ServiceAccount" {
				if m["name"] != "platform-ci" {
					t.Errorf("%s binds ServiceAccount %v, want platform-ci", key(o), m["name"])
				}
				bound++
			}
		}
	}
	if bound == 0 {
		t.Error("no binding names the ServiceAccount")
	}
	policy := find(t, objs, "ValidatingAdmissionPolicy", defaults.fullname()+"-operator-owned-fields")
	conds, _, _ := unstructured.NestedSlice(policy.Object, "spec", "matchConditions")
	if want := fmt.Sprintf("request.userInfo.username != 'system:serviceaccount:%s:platform-ci'", defaults.namespace); len(conds) != 1 || conds[0].(map[string]any)["expression"] != want {
		t.Errorf("matchConditions %v, want %q", conds, want)
	}
}

// TestServiceMonitorVerifiesTheMetricsCertificate: with
// metrics.certificate the manager serves the certificate cert-manager
// issues for the metrics Service (--metrics-cert-dir, the Secret mounted)
// and the ServiceMonitor verifies the scrape with that Secret's ca.crt and
// the Service's name, instead of a self-signed certificate a scrape can
// only skip verifying; a CA the values name wins.
func TestServiceMonitorVerifiesTheMetricsCertificate(t *testing.T) {
	set := []string{"--set", "metrics.certificate.enabled=true", "--set", "certManager.issuerRef.name=ca", "--set", "metrics.serviceMonitor.enabled=true"}
	objs := render(t, defaults, set...)
	secret := defaults.fullname() + "-metrics-tls"
	cert := find(t, objs, "Certificate", defaults.fullname()+"-metrics")
	if name, _, _ := unstructured.NestedString(cert.Object, "spec", "secretName"); name != secret {
		t.Errorf("the metrics Certificate writes Secret %q, want %q", name, secret)
	}
	if names, _, _ := unstructured.NestedStringSlice(cert.Object, "spec", "dnsNames"); !slices.Contains(names, defaults.fullname()+"-metrics."+defaults.namespace+".svc") {
		t.Errorf("the metrics Certificate's names %v lack the Service's", names)
	}
	deploy := find(t, objs, "Deployment", defaults.fullname()+"-manager")
	containers, _, _ := unstructured.NestedSlice(deploy.Object, "spec", "template", "spec", "containers")
	args, _, _ := unstructured.NestedStringSlice(containers[0].(map[string]any), "args")
	if !slices.Contains(args, "--metrics-cert-dir=/etc/hyperfleet/metrics-tls") {
		t.Errorf("manager args %v lack --metrics-cert-dir", args)
	}
	volumes, _, _ := unstructured.NestedSlice(deploy.Object, "spec", "template", "spec", "volumes")
	mounted := false
	for _, v := range volumes {
		if name, _, _ := unstructured.NestedString(v.(map[string]any), "secret", "secretName"); name == secret {
			mounted = true
		}
	}
	if !mounted {
		t.Errorf("no volume mounts Secret %s", secret)
	}
	sm := find(t, objs, "ServiceMonitor", defaults.fullname()+"-manager")
	endpoints, _, _ := unstructured.NestedSlice(sm.Object, "spec", "endpoints")
	tls, _, _ := unstructured.NestedMap(endpoints[0].(map[string]any), "tlsConfig")
	if ca, _, _ := unstructured.NestedString(tls, "ca", "secret", "name"); ca != secret || tls["serverName"] != defaults.fullname()+"-metrics."+defaults.namespace+".svc" {
		t.Errorf("the ServiceMonitor's tlsConfig %v: want the CA of Secret %s and the Service's name", tls, secret)
	}
	// A CA the values name is kept.
	sm = find(t, render(t, defaults, append(set, "--set", "metrics.serviceMonitor.tlsConfig.ca.configMap.name=corp-ca", "--set", "metrics.serviceMonitor.tlsConfig.ca.configMap.key=ca.crt")...), "ServiceMonitor", defaults.fullname()+"-manager")
	endpoints, _, _ = unstructured.NestedSlice(sm.Object, "spec", "endpoints")
	ca, _, _ := unstructured.NestedMap(endpoints[0].(map[string]any), "tlsConfig", "ca")
	if name, _, _ := unstructured.NestedString(ca, "configMap", "name"); name != "corp-ca" || len(ca) != 1 {
		t.Errorf("the ServiceMonitor's CA is %v, want only the values' ConfigMap corp-ca", ca)
	}
}

// TestPodMonitorScrapesThePods: metrics.podMonitor renders a PodMonitor
// that selects the manager's pods (the Deployment's own pod labels), scrapes
// their container port named metrics over TLS, verifying the certificate
// cert-manager issues for the metrics Service by that name and its
// Secret's ca.crt, and sends the token of the Secret the values name.
func TestPodMonitorScrapesThePods(t *testing.T) {
	objs := render(t, podMonitored)
	full := podMonitored.fullname()
	pm := find(t, objs, "PodMonitor", full+"-manager")
	deploy := find(t, objs, "Deployment", full+"-manager")
	podLabels, _, _ := unstructured.NestedStringMap(deploy.Object, "spec", "template", "metadata", "labels")
	selector, _, _ := unstructured.NestedStringMap(pm.Object, "spec", "selector", "matchLabels")
	if len(selector) == 0 {
		t.Fatal("the PodMonitor selects every pod")
	}
	for k, v := range selector {
		if podLabels[k] != v {
			t.Errorf("the PodMonitor selects %s=%s, which the manager's pods (%v) do not carry", k, v, podLabels)
		}
	}
	if ns, _, _ := unstructured.NestedStringSlice(pm.Object, "spec", "namespaceSelector", "matchNames"); !reflect.DeepEqual(ns, []string{podMonitored.namespace}) {
		t.Errorf("the PodMonitor looks in namespaces %v, want the release's", ns)
	}
	endpoints, _, _ := unstructured.NestedSlice(pm.Object, "spec", "podMetricsEndpoints")
	if len(endpoints) != 1 {
		t.Fatalf("%d endpoints", len(endpoints))
	}
	ep := endpoints[0].(map[string]any)
	containers, _, _ := unstructured.NestedSlice(deploy.Object, "spec", "template", "spec", "containers")
	ports, _, _ := unstructured.NestedSlice(containers[0].(map[string]any), "ports")
	named := false
	for _, p := range ports {
		named = named || p.(map[string]any)["name"] == ep["port"]
	}
	if !named || ep["scheme"] != "https" {
		t.Errorf("the PodMonitor scrapes port %v (%v), want the manager container's port metrics over https", ep["port"], ep["scheme"])
	}
	secret := full + "-metrics-tls"
	if ca, _, _ := unstructured.NestedString(ep, "tlsConfig", "ca", "secret", "name"); ca != secret {
		t.Errorf("the scrape verifies with the CA of %q, want Secret %s", ca, secret)
	}
	if name, _, _ := unstructured.NestedString(ep, "tlsConfig", "serverName"); name != full+"-metrics."+podMonitored.namespace+".svc" {
		t.Errorf("the scrape verifies the name %q, want the metrics Service's, which the certificate is for", name)
	}
	if cred, _, _ := unstructured.NestedStringMap(ep, "authorization", "credentials"); cred["name"] != "prometheus-token" || cred["key"] != "token" {
		t.Errorf("the scrape sends the token of %v, want Secret prometheus-token's key token", cred)
	}
	if keys := keys(objs); contains(keys, "ServiceMonitor "+podMonitored.namespace+"/"+full+"-manager") {
		t.Error("a ServiceMonitor beside the PodMonitor")
	}
}

// TestReadOnlyRootHasWritableTmp: the manager's root filesystem is
// read-only, and it stages every VM's cloud-init ISO under /tmp, so each
// install mounts an emptyDir there.
func TestReadOnlyRootHasWritableTmp(t *testing.T) {
	installs := map[string][]*unstructured.Unstructured{"config/default": kustomize(t)}
	for _, r := range releases {
		installs["chart release "+r.name] = render(t, r)
	}
	for name, objs := range installs {
		for _, o := range objs {
			if o.GetKind() != "Deployment" {
				continue
			}
			if err := checkWritableTmp(o); err != nil {
				t.Errorf("%s: %s: %v", name, key(o), err)
			}
		}
	}
}

func checkWritableTmp(deploy *unstructured.Unstructured) error {
	volumes, _, _ := unstructured.NestedSlice(deploy.Object, "spec", "template", "spec", "volumes")
	emptyDirs := map[string]bool{}
	for _, v := range volumes {
		v := v.(map[string]any)
		if _, ok := v["emptyDir"]; ok {
			emptyDirs[v["name"].(string)] = true
		}
	}
	containers, _, _ := unstructured.NestedSlice(deploy.Object, "spec", "template", "spec", "containers")
	for _, c := range containers {
		c := c.(map[string]any)
		if ro, _, _ := unstructured.NestedBool(c, "securityContext", "readOnlyRootFilesystem"); !ro {
			return fmt.Errorf("container %s: the root filesystem is not read-only", c["name"])
		}
		mounts, _, _ := unstructured.NestedSlice(c, "volumeMounts")
		found := false
		for _, m := range mounts {
			m := m.(map[string]any)
			found = found || (m["mountPath"] == "/tmp" && emptyDirs[m["name"].(string)] && m["readOnly"] != true)
		}
		if !found {
			return fmt.Errorf("container %s: a read-only root filesystem and no writable emptyDir at /tmp", c["name"])
		}
	}
	return nil
}

// TestRulesAndDashboardsComeFromTheirFiles: the PrometheusRule holds the
// groups of every rule file in files/rules, and the dashboards ConfigMap
// every dashboard in files/dashboards, unchanged.
func TestRulesAndDashboardsComeFromTheirFiles(t *testing.T) {
	objs := render(t, everythingOn)
	dir := filepath.Join(testenv.RepoRoot(), chartDir, "files")

	var wantGroups []any
	ruleFiles, _ := filepath.Glob(filepath.Join(dir, "rules", "*.yaml"))
	for _, f := range ruleFiles {
		var file struct {
			Groups []any `json:"groups"`
		}
		readYAML(t, f, &file)
		if len(file.Groups) == 0 {
			t.Errorf("%s has no rule groups", f)
		}
		wantGroups = append(wantGroups, file.Groups...)
	}
	groups, _, _ := unstructured.NestedSlice(find(t, objs, "PrometheusRule", "ci-hyperfleet").Object, "spec", "groups")
	if !reflect.DeepEqual(jsonRoundTrip(t, groups), jsonRoundTrip(t, wantGroups)) {
		t.Errorf("PrometheusRule groups\n%v\nwant those of %v\n%v", groups, ruleFiles, wantGroups)
	}

	data, _, _ := unstructured.NestedStringMap(find(t, objs, "ConfigMap", "ci-hyperfleet-dashboards").Object, "data")
	dashboards, _ := filepath.Glob(filepath.Join(dir, "dashboards", "*.json"))
	if len(data) != len(dashboards) || len(dashboards) == 0 {
		t.Errorf("dashboards ConfigMap has keys %v, want one per file of %v", mapKeys(data), dashboards)
	}
	for _, f := range dashboards {
		raw, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		got := data[filepath.Base(f)]
		if !json.Valid([]byte(got)) || strings.TrimSpace(got) != strings.TrimSpace(string(raw)) {
			t.Errorf("dashboards ConfigMap key %s is not %s as it is", filepath.Base(f), f)
		}
	}
}

func readYAML(t *testing.T, path string, into any) {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(raw, into); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}

// jsonRoundTrip gives YAML-decoded and JSON-decoded values one form.
func jsonRoundTrip(t *testing.T, v any) any {
	t.Helper()
	raw, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	var out any
	if err := json.Unmarshal(raw, &out); err != nil {
		t.Fatal(err)
	}
	return out
}

func mapKeys(m map[string]string) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// TestBadValuesAreRefused: values that would install a manager that cannot
// work fail helm template, saying what to set. The templates check them
// themselves, beyond values.schema.json (schema_test.go): these run with
// --skip-schema-validation, as a user may.
func TestBadValuesAreRefused(t *testing.T) {
	cases := []struct {
		name string
		set  []string
		want string
	}{
		{"agent server without a URL", []string{"agentServer.enabled=true"}, "agentServer.url is required"},
		{"webhook certificate without an issuer", []string{"webhook.certificate.enabled=true"}, "certManager.issuerRef.name is required"},
		{"agent certificate without an issuer", []string{"agentServer.enabled=true", "agentServer.url=https://agents.example.com:9443", "agentServer.certificate.enabled=true"},
			"certManager.issuerRef.name is required"},
		{"two replicas without leader election", []string{"replicaCount=2", "leaderElection.enabled=false"}, "every replica would reconcile"},
		{"unknown anti-affinity", []string{"podAntiAffinity=sometimes"}, `podAntiAffinity is "sometimes"`},
		{"every namespace and a list", []string{"secretNamespaces={team-a,*}"}, `"*" means every namespace, so list nothing else with it`},
		{"no ServiceAccount created and none named", []string{"serviceAccount.create=false"}, "serviceAccount.name: set the name of an existing ServiceAccount"},
		{"a PodMonitor and a ServiceMonitor", []string{"metrics.podMonitor.enabled=true", "metrics.podMonitor.authorization.credentials.name=t", "metrics.serviceMonitor.enabled=true"},
			"enable one, both scrape the same pods"},
		{"a receiver of no platform", []string{"webhook.github.enabled=false"}, "the receiver would receive nothing"},
		{"a PodMonitor of secure metrics without a token", []string{"metrics.podMonitor.enabled=true"}, "metrics.podMonitor.authorization.credentials is required with metrics.secure"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			extra := []string{"--skip-schema-validation"}
			for _, s := range tc.set {
				extra = append(extra, "--set", s)
			}
			_, err := testenv.Helm(t, templateArgs(defaults, extra...)...)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("helm template with %v: %v, want a refusal saying %q", tc.set, err, tc.want)
			}
		})
	}
}

// fieldManager is the field manager of the test's server-side applies.
const fieldManager = "hyperfleet-chart-test"

// apply server-side applies obj with strict field validation: a field the
// API server does not know is a refusal, not a warning.
func apply(ctx context.Context, c client.Client, obj *unstructured.Unstructured) error {
	return c.Patch(ctx, obj.DeepCopy(), client.Apply, client.FieldOwner(fieldManager), client.FieldValidation("Strict"))
}

// installStandInCRDs installs testdata/crds (the optional objects' CRDs,
// trimmed) and waits until the API server serves them.
func installStandInCRDs(t *testing.T, c client.Client) {
	t.Helper()
	ctx := context.Background()
	files, _ := filepath.Glob(filepath.Join("testdata", "crds", "*.yaml"))
	if len(files) == 0 {
		t.Fatal("no CRDs in testdata/crds")
	}
	for _, f := range files {
		raw, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		objs, err := testenv.DecodeObjects(raw)
		if err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		for _, o := range objs {
			if err := apply(ctx, c, o); err != nil {
				t.Fatalf("%s: %v", f, err)
			}
			waitEstablished(t, c, o.GetName())
		}
	}
}

func waitEstablished(t *testing.T, c client.Client, name string) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		crd := &unstructured.Unstructured{}
		crd.SetGroupVersionKind(apiextensionsv1.SchemeGroupVersion.WithKind("CustomResourceDefinition"))
		if err := c.Get(context.Background(), client.ObjectKey{Name: name}, crd); err != nil {
			t.Fatal(err)
		}
		conds, _, _ := unstructured.NestedSlice(crd.Object, "status", "conditions")
		for _, cond := range asMaps(conds) {
			if cond["type"] == string(apiextensionsv1.Established) && cond["status"] == string(apiextensionsv1.ConditionTrue) {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("CRD %s is not established after a minute: %v", name, conds)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestAPIServerAcceptsEveryObject: every object the chart renders, with
// the default values, with every default part off and with every optional
// part on (the
// prometheus-operator and cert-manager kinds against their stand-in CRDs),
// is accepted by the real kube-apiserver through server-side apply with
// strict field validation, rendered for that server's Kubernetes version.
func TestAPIServerAcceptsEveryObject(t *testing.T) {
	env := lazy.Get(t)
	ctx := context.Background()
	dc, err := discovery.NewDiscoveryClientForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	version, err := dc.ServerVersion()
	if err != nil {
		t.Fatal(err)
	}
	installStandInCRDs(t, env.Client)

	for _, r := range releases {
		t.Run(r.name, func(t *testing.T) {
			objs := render(t, r, "--kube-version", version.GitVersion)
			// The release's namespace, and those secretNamespaces names:
			// they exist before the release.
			namespaces := map[string]bool{r.namespace: true}
			for _, o := range objs {
				if o.GetNamespace() != "" {
					namespaces[o.GetNamespace()] = true
				}
			}
			for name := range namespaces {
				ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}
				if err := env.Client.Create(ctx, ns); err != nil && !apierrors.IsAlreadyExists(err) {
					t.Fatal(err)
				}
			}
			for _, o := range objs {
				if err := apply(ctx, env.Client, o); err != nil {
					t.Errorf("%s refused: %v", key(o), err)
				}
			}
			t.Logf("%s: %d objects applied", r.name, len(objs))
		})
	}
}

// TestApplyRefusesUnknownFields: the apply above is strict, so that its
// passing means every field rendered is one the API server knows.
func TestApplyRefusesUnknownFields(t *testing.T) {
	env := lazy.Get(t)
	svc := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "v1", "kind": "Service",
		"metadata": map[string]any{"name": "typo", "namespace": "default"},
		"spec":     map[string]any{"ports": []any{map[string]any{"port": int64(80)}}, "selectr": map[string]any{"a": "b"}},
	}}
	err := apply(context.Background(), env.Client, svc)
	if err == nil || !strings.Contains(err.Error(), "selectr") {
		t.Fatalf("applying a Service with the unknown field spec.selectr: %v, want a refusal naming it", err)
	}
}

package chart_test

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"pgregory.net/rapid"

	"github.com/hyperfleet/hyperfleet/internal/testworld/proptest"
	"github.com/hyperfleet/hyperfleet/test/testenv"
)

// chartValues draws the values of one install: every documented value
// the templates branch on, in the combinations the chart accepts (more
// than one replica needs leader election; "*" stands alone in
// secretNamespaces), and security contexts that change the user, group,
// seccomp profile or add fields while staying as strict as the defaults.
// The result is merged over values.yaml by helm.
func chartValues(t *rapid.T) map[string]any {
	b := func(label string) bool { return rapid.Bool().Draw(t, label) }
	nsName := rapid.StringMatching(`[a-z][a-z0-9-]{0,10}[a-z0-9]`)
	v := map[string]any{}
	replicas := rapid.IntRange(1, 3).Draw(t, "replicaCount")
	v["replicaCount"] = replicas
	v["leaderElection"] = map[string]any{"enabled": replicas > 1 || b("leader election")}
	v["crds"] = map[string]any{"enabled": b("crds"), "keep": b("crds keep")}
	if b("fullnameOverride") {
		v["fullnameOverride"] = nsName.Draw(t, "fullname")
	}
	if b("serviceAccount name") {
		v["serviceAccount"] = map[string]any{"name": nsName.Draw(t, "service account")}
	}
	switch rapid.IntRange(0, 2).Draw(t, "secretNamespaces") {
	case 1:
		v["secretNamespaces"] = rapid.SliceOfNDistinct(nsName, 1, 3, rapid.ID[string]).Draw(t, "secret namespaces")
	case 2:
		v["secretNamespaces"] = []string{"*"}
	}
	v["trustedCA"] = map[string]any{"enabled": b("trustedCA")}
	metrics := map[string]any{
		"secure":         b("metrics secure"),
		"serviceMonitor": map[string]any{"enabled": b("serviceMonitor")},
		"prometheusRule": map[string]any{"enabled": b("prometheusRule")},
		"dashboard":      map[string]any{"enabled": b("dashboard")},
	}
	if b("metrics readers") {
		metrics["readerSubjects"] = []any{map[string]any{"kind": "ServiceAccount", "name": "prometheus", "namespace": "monitoring"}}
	}
	v["metrics"] = metrics
	certs := b("cert-manager")
	if certs {
		v["certManager"] = map[string]any{"issuerRef": map[string]any{"name": "ci-ca"}}
	}
	v["webhook"] = map[string]any{
		"enabled":             b("webhook"),
		"allowFallbackSecret": b("fallback secret"),
		"certificate":         map[string]any{"enabled": certs && b("webhook certificate"), "dnsNames": []string{"hooks.ci.example.com"}},
		"service":             map[string]any{"type": rapid.SampledFrom([]string{"ClusterIP", "LoadBalancer", "NodePort"}).Draw(t, "webhook service")},
	}
	if b("agent server") {
		v["agentServer"] = map[string]any{
			"enabled":     true,
			"url":         "https://agents.ci.example.com:9443",
			"tls":         map[string]any{"withCA": b("agent CA")},
			"certificate": map[string]any{"enabled": certs && b("agent certificate"), "dnsNames": []string{"agents.ci.example.com"}},
			"service":     map[string]any{"enabled": b("agent service")},
		}
	}
	admission := map[string]any{"enabled": b("admission policy")}
	if b("claim admins") {
		admission["claimAdmins"] = []any{map[string]any{"kind": "Group", "name": "platform-admins", "apiGroup": "rbac.authorization.k8s.io"}}
	}
	v["admissionPolicy"] = admission
	v["networkPolicy"] = map[string]any{"enabled": b("network policy")}
	v["podDisruptionBudget"] = map[string]any{"enabled": b("pdb")}
	v["podAntiAffinity"] = rapid.SampledFrom([]string{"soft", "hard", ""}).Draw(t, "anti-affinity")
	// Security contexts as strict as the defaults, written differently.
	pod, ctr := map[string]any{}, map[string]any{}
	if b("own user") {
		uid := rapid.IntRange(1, 1<<20).Draw(t, "uid")
		pod["runAsUser"], ctr["runAsUser"] = uid, uid
		pod["runAsGroup"], ctr["runAsGroup"], pod["fsGroup"] = uid, uid, uid
	}
	if b("localhost seccomp") {
		prof := map[string]any{"type": "Localhost", "localhostProfile": "profiles/hyperfleet.json"}
		pod["seccompProfile"], ctr["seccompProfile"] = prof, prof
	}
	if b("selinux") {
		ctr["seLinuxOptions"] = map[string]any{"level": "s0:c123,c456"}
	}
	if b("drop more") {
		ctr["capabilities"] = map[string]any{"drop": []string{"ALL", "NET_RAW"}}
	}
	v["podSecurityContext"], v["securityContext"] = pod, ctr
	return v
}

// weakening is a value that would make the manager less confined, and the
// path helm's refusal must name (values.schema.json's).
type weakening struct {
	set, path string
	// reason is in the message too when the path alone is not enough
	// (a removed setting is missing from its parent).
	reason string
}

var weakenings = []weakening{
	{"securityContext.privileged=true", "/securityContext/privileged", ""},
	{"securityContext.allowPrivilegeEscalation=true", "/securityContext/allowPrivilegeEscalation", ""},
	{"securityContext.allowPrivilegeEscalation=null", "/securityContext", "missing property 'allowPrivilegeEscalation'"},
	{"securityContext.readOnlyRootFilesystem=false", "/securityContext/readOnlyRootFilesystem", ""},
	{"securityContext.readOnlyRootFilesystem=null", "/securityContext", "missing property 'readOnlyRootFilesystem'"},
	{"securityContext.runAsNonRoot=false", "/securityContext/runAsNonRoot", ""},
	{"securityContext.runAsNonRoot=null", "/securityContext", "missing property 'runAsNonRoot'"},
	{"securityContext.runAsUser=0", "/securityContext/runAsUser", ""},
	{"securityContext.runAsGroup=0", "/securityContext/runAsGroup", ""},
	{"securityContext.procMount=Unmasked", "/securityContext/procMount", ""},
	{"securityContext.capabilities.add={NET_ADMIN}", "/securityContext/capabilities/add", ""},
	{"securityContext.capabilities.add={SYS_ADMIN,NET_RAW}", "/securityContext/capabilities/add", ""},
	{"securityContext.capabilities.drop={NET_RAW}", "/securityContext/capabilities/drop", ""},
	{"securityContext.capabilities.drop=null", "/securityContext/capabilities", "missing property 'drop'"},
	{"securityContext.capabilities=null", "/securityContext", "missing property 'capabilities'"},
	{"securityContext.seccompProfile.type=Unconfined", "/securityContext/seccompProfile/type", ""},
	{"securityContext.seccompProfile=null", "/securityContext", "missing property 'seccompProfile'"},
	{"podSecurityContext.runAsNonRoot=false", "/podSecurityContext/runAsNonRoot", ""},
	{"podSecurityContext.runAsNonRoot=null", "/podSecurityContext", "missing property 'runAsNonRoot'"},
	{"podSecurityContext.runAsUser=0", "/podSecurityContext/runAsUser", ""},
	{"podSecurityContext.runAsGroup=0", "/podSecurityContext/runAsGroup", ""},
	{"podSecurityContext.seccompProfile.type=Unconfined", "/podSecurityContext/seccompProfile/type", ""},
	{"podSecurityContext.seccompProfile=null", "/podSecurityContext", "missing property 'seccompProfile'"},
}

// writeVerbs change an object.
var writeVerbs = []string{"create", "update", "patch", "delete", "deletecollection", "*"}

// rbacGrant is one rule as it reaches a subject: cluster-wide (a
// ClusterRoleBinding) or in one namespace (a RoleBinding).
type rbacGrant struct {
	role, namespace string // namespace "" is cluster-wide
	rule            map[string]any
}

// checkRBAC checks every Role and ClusterRole the render holds, and what
// the manager's ServiceAccount is granted through the bindings: no
// wildcard, no verb that grants more permissions, Secrets written nowhere
// but the release's namespace, and read cluster-wide only when
// secretNamespaces asks for every namespace, else exactly in the
// namespaces it lists and the release's.
func checkRBAC(objs []*unstructured.Unstructured, namespace, serviceAccount string, secretNamespaces []string) error {
	roles := map[string][]any{} // "Kind name" -> rules
	for _, o := range objs {
		if o.GetKind() != "Role" && o.GetKind() != "ClusterRole" {
			continue
		}
		rules, _, _ := unstructured.NestedSlice(o.Object, "rules")
		for _, r := range rules {
			rule, _ := r.(map[string]any)
			for _, field := range []string{"apiGroups", "resources", "verbs", "nonResourceURLs", "resourceNames"} {
				vals, _, _ := unstructured.NestedStringSlice(rule, field)
				for _, val := range vals {
					if val == "*" || strings.HasSuffix(val, "/*") {
						return fmt.Errorf("%s: a wildcard in %s: %v", key(o), field, rule)
					}
					if field == "verbs" && slices.Contains([]string{"escalate", "bind", "impersonate"}, val) {
						return fmt.Errorf("%s: verb %s grants more than this rule: %v", key(o), val, rule)
					}
				}
			}
		}
		roles[o.GetKind()+" "+o.GetName()] = rules
	}
	var grants []rbacGrant
	for _, o := range objs {
		if o.GetKind() != "RoleBinding" && o.GetKind() != "ClusterRoleBinding" {
			continue
		}
		subjects, _, _ := unstructured.NestedSlice(o.Object, "subjects")
		manager := false
		for _, s := range subjects {
			sm, _ := s.(map[string]any)
			if sm["kind"] == "ServiceAccount" && sm["name"] == serviceAccount && sm["namespace"] == namespace {
				manager = true
			}
		}
		if !manager {
			continue
		}
		kind, _, _ := unstructured.NestedString(o.Object, "roleRef", "kind")
		name, _, _ := unstructured.NestedString(o.Object, "roleRef", "name")
		rules, ok := roles[kind+" "+name]
		if !ok {
			return fmt.Errorf("%s binds %s %s, which the chart does not install", key(o), kind, name)
		}
		ns := ""
		if o.GetKind() == "RoleBinding" {
			ns = o.GetNamespace()
		}
		for _, r := range rules {
			rule, _ := r.(map[string]any)
			grants = append(grants, rbacGrant{role: kind + " " + name, namespace: ns, rule: rule})
		}
	}
	readsIn := map[string]bool{}
	for _, g := range grants {
		resources, _, _ := unstructured.NestedStringSlice(g.rule, "resources")
		groups, _, _ := unstructured.NestedStringSlice(g.rule, "apiGroups")
		if !slices.Contains(resources, "secrets") || !slices.Contains(groups, "") {
			continue
		}
		verbs, _, _ := unstructured.NestedStringSlice(g.rule, "verbs")
		for _, verb := range verbs {
			switch {
			case slices.Contains(writeVerbs, verb) && g.namespace != namespace:
				return fmt.Errorf("the manager may %s Secrets in %q (\"\" is every namespace) through %s; only its own namespace %s is allowed", verb, g.namespace, g.role, namespace)
			case verb == "get" || verb == "list" || verb == "watch":
				readsIn[g.namespace] = true
			}
		}
	}
	want := map[string]bool{}
	if slices.Equal(secretNamespaces, []string{"*"}) {
		want[""] = true
	} else {
		want[namespace] = true
		for _, ns := range secretNamespaces {
			want[ns] = true
		}
	}
	if fmt.Sprint(readsIn) != fmt.Sprint(want) {
		return fmt.Errorf("the manager reads Secrets in %v (\"\" is every namespace), want %v (secretNamespaces %v)", readsIn, want, secretNamespaces)
	}
	return nil
}

// checkSecurityContexts checks every pod the render holds: non-root, no
// privilege and no escalation, a read-only root filesystem, every
// capability dropped and none added, a seccomp profile (the runtime's or
// one on the node), and nothing of the host's.
func checkSecurityContexts(objs []*unstructured.Unstructured) (int, error) {
	pods := 0
	for _, o := range objs {
		podSpec, ok, _ := unstructured.NestedMap(o.Object, "spec", "template", "spec")
		if !ok {
			continue
		}
		pods++
		for _, host := range []string{"hostNetwork", "hostPID", "hostIPC"} {
			if podSpec[host] == true {
				return pods, fmt.Errorf("%s: %s", key(o), host)
			}
		}
		if vols, _, _ := unstructured.NestedSlice(podSpec, "volumes"); slices.ContainsFunc(vols, func(v any) bool { _, ok := v.(map[string]any)["hostPath"]; return ok }) {
			return pods, fmt.Errorf("%s mounts a hostPath volume", key(o))
		}
		psc, _, _ := unstructured.NestedMap(podSpec, "securityContext")
		var containers []any
		for _, field := range []string{"initContainers", "containers"} {
			cs, _, _ := unstructured.NestedSlice(podSpec, field)
			containers = append(containers, cs...)
		}
		if len(containers) == 0 {
			return pods, fmt.Errorf("%s has no containers", key(o))
		}
		for _, c := range containers {
			cm, _ := c.(map[string]any)
			sc, _, _ := unstructured.NestedMap(cm, "securityContext")
			where := fmt.Sprintf("%s container %v", key(o), cm["name"])
			// A container's own setting wins over the pod's.
			eff := func(k string) any {
				if v, ok := sc[k]; ok {
					return v
				}
				return psc[k]
			}
			if eff("runAsNonRoot") != true {
				return pods, fmt.Errorf("%s: runAsNonRoot is %v", where, eff("runAsNonRoot"))
			}
			if uid, ok := eff("runAsUser").(int64); ok && uid == 0 {
				return pods, fmt.Errorf("%s runs as uid 0", where)
			}
			if sc["allowPrivilegeEscalation"] != false {
				return pods, fmt.Errorf("%s: allowPrivilegeEscalation is %v", where, sc["allowPrivilegeEscalation"])
			}
			if sc["privileged"] == true {
				return pods, fmt.Errorf("%s is privileged", where)
			}
			if sc["readOnlyRootFilesystem"] != true {
				return pods, fmt.Errorf("%s: readOnlyRootFilesystem is %v", where, sc["readOnlyRootFilesystem"])
			}
			if pm, ok := sc["procMount"]; ok && pm != "Default" {
				return pods, fmt.Errorf("%s: procMount %v", where, pm)
			}
			drop, _, _ := unstructured.NestedStringSlice(sc, "capabilities", "drop")
			add, _, _ := unstructured.NestedStringSlice(sc, "capabilities", "add")
			if !slices.Contains(drop, "ALL") || len(add) > 0 {
				return pods, fmt.Errorf("%s: capabilities drop %v, add %v", where, drop, add)
			}
			prof, _ := eff("seccompProfile").(map[string]any)
			if typ := prof["type"]; typ != "RuntimeDefault" && typ != "Localhost" {
				return pods, fmt.Errorf("%s: seccomp profile %v", where, prof)
			}
		}
	}
	return pods, nil
}

// Feature: hyperfleet-operator, Property 17: RBAC and Security Context
//
// TestLeastPrivilegeProperty: over generated chart values (every
// documented value the templates branch on, in valid combinations, and
// security contexts as strict as the defaults written differently), every
// render of the chart gives the manager least privilege: no wildcard in any
// Role or ClusterRole and no escalate, bind or impersonate verb; Secrets
// written in the release's namespace only and read exactly where
// secretNamespaces says (cluster-wide only for "*"); and every pod runs
// non-root, unprivileged, without privilege escalation, on a read-only root
// filesystem, with every capability dropped and none added, under a
// seccomp profile, with nothing of the host's. The same values with one
// generated weakening of a security context (privileged, escalation, a
// writable root filesystem, root, an added capability, ALL not dropped,
// Unconfined seccomp, or a required setting removed) are refused by
// values.schema.json, in helm template and helm lint --strict, with a
// message naming the value.
func TestLeastPrivilegeProperty(t *testing.T) {
	dir := t.TempDir()
	cases := 0
	proptest.Check(t, proptest.Minimum, func(rt *rapid.T) {
		cases++
		values := chartValues(rt)
		raw, err := json.Marshal(values)
		if err != nil {
			rt.Fatal(err)
		}
		file := filepath.Join(dir, fmt.Sprintf("values-%d.yaml", cases))
		if err := os.WriteFile(file, raw, 0o600); err != nil {
			rt.Fatal(err)
		}
		name := rapid.SampledFrom([]string{"hyperfleet", "ci", "fleet"}).Draw(rt, "release")
		namespace := rapid.SampledFrom([]string{"hyperfleet-system", "ci-infra"}).Draw(rt, "namespace")
		rel := release{name: name, namespace: namespace}
		args := append(templateArgs(rel), "--values", file)
		out, err := testenv.Helm(t, args...)
		if err != nil {
			rt.Fatalf("values %s: %v", raw, err)
		}
		objs, err := testenv.DecodeObjects([]byte(out))
		if err != nil {
			rt.Fatal(err)
		}
		sa := rel.fullname() + "-manager"
		if v, ok := values["fullnameOverride"].(string); ok {
			sa = v + "-manager"
		}
		if m, ok := values["serviceAccount"].(map[string]any); ok {
			sa = m["name"].(string)
		}
		secretNamespaces, _ := values["secretNamespaces"].([]string)
		if err := checkRBAC(objs, namespace, sa, secretNamespaces); err != nil {
			rt.Fatalf("values %s: %v", raw, err)
		}
		pods, err := checkSecurityContexts(objs)
		if err != nil {
			rt.Fatalf("values %s: %v", raw, err)
		}
		if pods == 0 {
			rt.Fatalf("values %s: the render holds no pod", raw)
		}

		// One weakening on top of the same values.
		w := rapid.SampledFrom(weakenings).Draw(rt, "weakening")
		weak := append(slices.Clone(args), "--set", w.set)
		lint := []string{"lint", "--strict", chartDir, "--namespace", namespace, "--values", file, "--set", w.set}
		for what, a := range map[string][]string{"helm template": weak, "helm lint --strict": lint} {
			_, err := testenv.Helm(t, a...)
			if err == nil {
				rt.Fatalf("%s with values %s and --set %s passed, want a refusal", what, raw, w.set)
			}
			if !strings.Contains(err.Error(), "at '"+w.path) || !strings.Contains(err.Error(), w.reason) {
				rt.Fatalf("%s refused --set %s without naming %s %s: %v", what, w.set, w.path, w.reason, err)
			}
		}
	})
}

// TestNamespacesNamedLikeYAMLBooleans: namespace names YAML 1.1 reads as
// booleans ("on", "yes", "no", "off", valid DNS labels all) stay names in
// every rendered object. Found by TestLeastPrivilegeProperty (secretNamespaces
// [on]): the unquoted `namespace: on` was read as the boolean true, not a
// name, so the Secret reader's RoleBinding lost the namespace it was for.
func TestNamespacesNamedLikeYAMLBooleans(t *testing.T) {
	rel := release{name: "hyperfleet", namespace: "yes"}
	objs := render(t, rel, "--set", "secretNamespaces={on,off}")
	for _, o := range objs {
		if o.GetKind() == "CustomResourceDefinition" || o.GetKind() == "ClusterRole" || o.GetKind() == "ClusterRoleBinding" ||
			o.GetKind() == "ValidatingAdmissionPolicy" || o.GetKind() == "ValidatingAdmissionPolicyBinding" || o.GetKind() == "ValidatingWebhookConfiguration" {
			continue
		}
		if ns := o.GetNamespace(); ns != "yes" && ns != "on" && ns != "off" {
			t.Errorf("%s %s: namespace %q", o.GetKind(), o.GetName(), ns)
		}
	}
	if err := checkRBAC(objs, rel.namespace, rel.fullname()+"-manager", []string{"on", "off"}); err != nil {
		t.Error(err)
	}
}

package chart_test

import (
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
)

// TestSecretNamespacesAreBound: the manager's --secret-namespaces and the
// bindings of the ClusterRole <fullname>-secret-reader cover the same
// namespaces: the release's alone by default (no flag, as in config/),
// the release's and secretNamespaces' with a list, every namespace (a
// ClusterRoleBinding) with ["*"].
func TestSecretNamespacesAreBound(t *testing.T) {
	cases := []struct {
		name  string
		r     release
		set   string
		flag  string   // the flag's value; empty: not passed
		bound []string // the RoleBindings' namespaces; nil: a ClusterRoleBinding
	}{
		{name: "defaults", r: defaults, bound: []string{"hyperfleet-system"}},
		{name: "a list", r: everythingOn, flag: "ci-infra,team-a,team-b", bound: []string{"ci-infra", "team-a", "team-b"}},
		{name: "the release's namespace listed", r: defaults, set: "secretNamespaces={team-a,hyperfleet-system}",
			flag: "hyperfleet-system,team-a", bound: []string{"hyperfleet-system", "team-a"}},
		{name: "every namespace", r: defaults, set: "secretNamespaces={*}", flag: "*"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var extra []string
			if c.set != "" {
				extra = []string{"--set", c.set}
			}
			objs := render(t, c.r, extra...)
			role := c.r.fullname() + "-secret-reader"
			sa := rbacv1.Subject{Kind: "ServiceAccount", Name: c.r.fullname() + "-manager", Namespace: c.r.namespace}
			find(t, objs, "ClusterRole", role)

			var bound []string
			cluster := false
			for _, o := range objs {
				if o.GetName() != role || (o.GetKind() != "RoleBinding" && o.GetKind() != "ClusterRoleBinding") {
					continue
				}
				var b rbacv1.RoleBinding // a ClusterRoleBinding has the same fields
				convert(t, o, &b)
				if b.RoleRef.Kind != "ClusterRole" || b.RoleRef.Name != role || !slices.Equal(b.Subjects, []rbacv1.Subject{sa}) {
					t.Errorf("%s binds %v to %v, want the ClusterRole %s to %v", key(o), b.RoleRef, b.Subjects, role, sa)
				}
				if o.GetKind() == "ClusterRoleBinding" {
					cluster = true
				} else {
					bound = append(bound, o.GetNamespace())
				}
			}
			slices.Sort(bound)
			if cluster != (c.bound == nil) || !slices.Equal(bound, c.bound) {
				t.Errorf("bindings of %s: in namespaces %v, cluster-wide %v; want %v", role, bound, cluster, c.bound)
			}

			flag, passed := "", false
			_, ctr := managerPod(t, objs, c.r)
			for _, a := range ctr.Args {
				if v, ok := strings.CutPrefix(a, "--secret-namespaces="); ok {
					flag, passed = v, true
				}
			}
			if flag != c.flag || passed != (c.flag != "") {
				t.Errorf("--secret-namespaces=%q (passed: %v), want %q", flag, passed, c.flag)
			}
		})
	}
}

// TestTrustedCA: trustedCA mounts its ConfigMap, optional, where
// SSL_CERT_DIR points; trustedCA.enabled off leaves out both.
func TestTrustedCA(t *testing.T) {
	const dir = "/etc/hyperfleet/trusted-ca"
	for _, c := range []struct {
		r         release
		configMap string // empty: off
	}{
		{defaults, "hyperfleet-trusted-ca"},
		{everythingOn, "corporate-ca"},
		{everythingOff, ""},
	} {
		pod, ctr := managerPod(t, render(t, c.r), c.r)
		env := slices.ContainsFunc(ctr.Env, func(e corev1.EnvVar) bool { return e.Name == "SSL_CERT_DIR" && e.Value == dir })
		mount := slices.ContainsFunc(ctr.VolumeMounts, func(m corev1.VolumeMount) bool {
			return m.Name == "trusted-ca" && m.MountPath == dir && m.ReadOnly
		})
		volume := slices.ContainsFunc(pod.Volumes, func(v corev1.Volume) bool {
			cm := v.ConfigMap
			return v.Name == "trusted-ca" && cm != nil && cm.Name == c.configMap && cm.Optional != nil && *cm.Optional
		})
		on := c.configMap != ""
		if env != on || mount != on || volume != on {
			t.Errorf("%s: SSL_CERT_DIR=%s %v, mounted there %v, from the optional ConfigMap %q %v; want all %v",
				c.r.name, dir, env, mount, c.configMap, volume, on)
		}
		if !on && (slices.ContainsFunc(pod.Volumes, func(v corev1.Volume) bool { return v.Name == "trusted-ca" }) ||
			slices.ContainsFunc(ctr.Env, func(e corev1.EnvVar) bool { return e.Name == "SSL_CERT_DIR" })) {
			t.Errorf("%s: trustedCA is off, yet the pod has a trusted-ca volume or SSL_CERT_DIR", c.r.name)
		}
	}
}

// managerPod is the pod of the release's Deployment and its container
// manager.
func managerPod(t *testing.T, objs []*unstructured.Unstructured, r release) (corev1.PodSpec, corev1.Container) {
	t.Helper()
	var d appsv1.Deployment
	convert(t, find(t, objs, "Deployment", r.fullname()+"-manager"), &d)
	pod := d.Spec.Template.Spec
	for _, c := range pod.Containers {
		if c.Name == "manager" {
			return pod, c
		}
	}
	t.Fatalf("%s: the Deployment has no container manager", r.name)
	return pod, corev1.Container{}
}

// convert fills a typed object from a rendered one, failing on a field
// the type does not have.
func convert(t *testing.T, o *unstructured.Unstructured, into any) {
	t.Helper()
	if err := runtime.DefaultUnstructuredConverter.FromUnstructuredWithValidation(o.Object, into, true); err != nil {
		t.Fatalf("%s: %v", key(o), err)
	}
}

// TestWebhookFallbackSecretIsOptIn: the manager accepts the webhook
// Secret's shared fallback key only when webhook.allowFallbackSecret says
// so (--github-webhook-allow-fallback-secret; docs/security.md, "Webhook
// intake").
func TestWebhookFallbackSecretIsOptIn(t *testing.T) {
	const flag = "--github-webhook-allow-fallback-secret"
	for _, c := range []struct {
		set  string
		want bool
	}{{"", false}, {"webhook.allowFallbackSecret=true", true}, {"webhook.allowFallbackSecret=true,webhook.enabled=false", false}} {
		var extra []string
		if c.set != "" {
			extra = []string{"--set", c.set}
		}
		_, ctr := managerPod(t, render(t, defaults, extra...), defaults)
		if got := slices.Contains(ctr.Args, flag); got != c.want {
			t.Errorf("--set %q: %s passed %v, want %v (args %v)", c.set, flag, got, c.want, ctr.Args)
		}
	}
}

// TestModes: each mode of docs/install.md, "Pick your mode", gives the
// manager the receivers the page says and no other: GitHub's webhooks by
// default; in scale-set mode no receiver at all (no listener, Service,
// certificate volume or port); GitLab or Buildkite only, that platform's
// receiver with its Secret and no GitHub one (an empty
// --github-webhook-secret), so that no GitHub Secret is needed.
func TestModes(t *testing.T) {
	const github = "--github-webhook-secret="
	for _, c := range []struct {
		r        release
		receiver bool
		want     []string
		unwanted []string
	}{
		{defaults, true, nil, []string{github, "--gitlab-webhook-secret", "--buildkite-webhook-secret"}},
		{scaleSetMode, false, []string{"--webhook-bind-address=0"}, []string{github, "--gitlab-webhook-secret", "--buildkite-webhook-secret", "--webhook-cert-dir"}},
		{gitLabMode, true, []string{github, "--gitlab-webhook-secret=hyperfleet-gitlab-webhook"}, []string{"--buildkite-webhook-secret"}},
		{buildkiteMode, true, []string{github, "--buildkite-webhook-secret=hyperfleet-buildkite-webhook"}, []string{"--gitlab-webhook-secret"}},
	} {
		objs := render(t, c.r)
		pod, ctr := managerPod(t, objs, c.r)
		for _, f := range c.want {
			if !slices.Contains(ctr.Args, f) {
				t.Errorf("%s: %s not passed (args %v)", c.r.name, f, ctr.Args)
			}
		}
		for _, f := range c.unwanted {
			if slices.ContainsFunc(ctr.Args, func(a string) bool { return strings.HasPrefix(a, f) }) {
				t.Errorf("%s: %s passed (args %v)", c.r.name, f, ctr.Args)
			}
		}
		got := map[string]bool{
			"a listener":            slices.ContainsFunc(ctr.Args, func(a string) bool { return strings.HasPrefix(a, "--webhook-bind-address=:") }),
			"the Service":           contains(keys(objs), "Service "+c.r.namespace+"/"+c.r.fullname()+"-webhooks"),
			"the port":              slices.ContainsFunc(ctr.Ports, func(p corev1.ContainerPort) bool { return p.Name == "webhooks" }),
			"the certificate":       slices.ContainsFunc(pod.Volumes, func(v corev1.Volume) bool { return v.Name == "webhook-tls" }),
			"the certificate mount": slices.ContainsFunc(ctr.VolumeMounts, func(m corev1.VolumeMount) bool { return m.Name == "webhook-tls" }),
		}
		for what, has := range got {
			if has != c.receiver {
				t.Errorf("%s: the receiver's %s rendered %v, want %v", c.r.name, what, has, c.receiver)
			}
		}
	}
}

// TestBuildkiteWebhookSecret: the manager receives Buildkite's webhooks
// only when webhook.buildkite.secretName names their Secret
// (--buildkite-webhook-secret), and accepts its fallback key only when
// webhook.buildkite.allowFallbackSecret says so too.
func TestBuildkiteWebhookSecret(t *testing.T) { checkPlatformWebhookSecret(t, "buildkite") }

// TestGitLabWebhookSecret: the same for GitLab's Job Hooks
// (webhook.gitlab, --gitlab-webhook-secret).
func TestGitLabWebhookSecret(t *testing.T) { checkPlatformWebhookSecret(t, "gitlab") }

// checkPlatformWebhookSecret checks values webhook.<platform>.secretName
// and allowFallbackSecret against flags --<platform>-webhook-secret and
// --<platform>-webhook-allow-fallback-secret.
func checkPlatformWebhookSecret(t *testing.T, platform string) {
	t.Helper()
	v, secret, fallback := "webhook."+platform+".", "--"+platform+"-webhook-secret", "--"+platform+"-webhook-allow-fallback-secret"
	for _, c := range []struct {
		set      string
		want     []string
		unwanted []string
	}{
		{"", nil, []string{secret, fallback}},
		{v + "secretName=hooks", []string{secret + "=hooks"}, []string{fallback}},
		{v + "secretName=hooks," + v + "allowFallbackSecret=true", []string{secret + "=hooks", fallback}, nil},
		{v + "secretName=hooks,webhook.enabled=false", nil, []string{secret + "=hooks"}},
	} {
		var extra []string
		if c.set != "" {
			extra = []string{"--set", c.set}
		}
		_, ctr := managerPod(t, render(t, defaults, extra...), defaults)
		for _, f := range c.want {
			if !slices.Contains(ctr.Args, f) {
				t.Errorf("--set %q: %s not passed (args %v)", c.set, f, ctr.Args)
			}
		}
		for _, f := range c.unwanted {
			if slices.ContainsFunc(ctr.Args, func(a string) bool { return strings.HasPrefix(a, f) }) {
				t.Errorf("--set %q: %s passed (args %v)", c.set, f, ctr.Args)
			}
		}
	}
}

// TestProxyEnvironment checks the proxy values: off by default (no proxy
// variable at all), and when on, HTTP_PROXY, HTTPS_PROXY and a NO_PROXY
// that keeps the API server (by the address the kubelet gives the pod)
// and in-cluster services direct besides the listed hosts.
func TestProxyEnvironment(t *testing.T) {
	for _, r := range []release{defaults, everythingOff} {
		_, ctr := managerPod(t, render(t, r), r)
		if slices.ContainsFunc(ctr.Env, func(e corev1.EnvVar) bool { return strings.HasSuffix(e.Name, "_PROXY") }) {
			t.Errorf("%s: proxy variables without proxy values: %v", r.name, ctr.Env)
		}
	}
	_, ctr := managerPod(t, render(t, everythingOn), everythingOn)
	got := map[string]string{}
	for _, e := range ctr.Env {
		got[e.Name] = e.Value
	}
	want := map[string]string{
		"HTTP_PROXY":  "http://proxy.example.com:3128",
		"HTTPS_PROXY": "http://proxy.example.com:3128",
		"NO_PROXY":    "10.96.0.0/12,pve.example.com,$(KUBERNETES_SERVICE_HOST),.svc,.cluster.local,localhost,127.0.0.1",
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %q, want %q", k, got[k], v)
		}
	}
}

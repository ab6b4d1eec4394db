//go:build deploy

// Package deploy runs the Helm chart as a cluster would: the image built
// here with podman, the chart installed by `helm install --wait` into the
// real kube-apiserver (RBAC enforced), and the Deployment's pod run by
// podman kube play with the chart's own security context, read-only root
// and volumes, its manager authenticating as its ServiceAccount; a
// stand-in for the Deployment controller and the kubelet (rollout_test.go)
// reports the pod's readiness, from its own readiness probe, as the
// status helm waits for. The end-to-end loop (internal/testworld/devenv:
// both simulators, guests that download the agent from the operator) must
// then pass with no forbidden request, in GitHub's webhook mode; the other
// modes of docs/install.md (modes_test.go) must install to a Ready pod.
// Run with `make test-deploy`.
package deploy

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/testworld/devenv"
)

const (
	// image is what the test builds and runs: imageRepository:imageTag.
	imageRepository = "localhost/hyperfleet"
	imageTag        = "deploy-test"
	image           = imageRepository + ":" + imageTag
	// serviceAccount is the manager's in the release (releaseName).
	serviceAccount = "hyperfleet-manager"
	// deploymentName is the manager's Deployment.
	deploymentName = "hyperfleet-manager"
	jobs           = 5
	jobDuration    = 2 * time.Second
	// elsewhere is a namespace whose Secret HyperFleet references nowhere.
	elsewhere = "unrelated-team"
)

// TestManifestsRunTheLoop is the deployment test (see the package doc).
func TestManifestsRunTheLoop(t *testing.T) {
	ctx := context.Background()
	pm := newPodman(t)
	// docs/install.md, step 1: the image.
	buildImage(t, pm)

	dir := t.TempDir()
	// The world stands in for steps 2, 3 and 5 (Proxmox, GitHub, the first
	// pool): the simulators and the objects devenv applies.
	w, err := devenv.Start(ctx, devenv.Options{
		Dir: dir, MaxReplicas: jobs, Progress: testWriter{t},
		ExternalOperator: true, AgentFromOperator: true,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := w.Stop(); err != nil {
			t.Errorf("stop world: %v", err)
		}
	})
	in := w.OperatorInputs()
	admin := w.API.Client

	ports := freePorts(t, 4)
	metricsAddr, probeAddr, webhookAddr, agentAddr := ports[0], ports[1], ports[2], ports[3]
	// docs/install.md, step 4: the Secrets the operator reads, before the
	// chart: the kubelet mounts them when it starts the pod.
	createInstallSecrets(ctx, t, admin, in)
	// docs/install.md, step 4: the chart, with the values every install
	// sets (image, secretNamespaces) and this world's own, installed with
	// helm install --wait, which returns once the manager's pod is Ready.
	v := values{
		"image": values{"repository": imageRepository, "tag": imageTag},
		// Ports of their own (the pod shares the host's network with
		// whatever else runs here), bound to loopback only: the chart
		// binds every interface, and a flag in extraArgs overrides its.
		"metrics":   values{"port": portOf(t, metricsAddr)},
		"probePort": portOf(t, probeAddr),
		// The GitHub simulator is the API host of the world's templates,
		// and so of its webhooks.
		"webhook": values{"port": portOf(t, webhookAddr), "apiHost": in.GitHubAPIHost},
		"extraArgs": []string{
			"--metrics-bind-address=" + metricsAddr,
			"--health-probe-bind-address=" + probeAddr,
			"--webhook-bind-address=" + webhookAddr,
			"--agent-server-addr=" + agentAddr,
		},
		// The agent server, from the image's binaries and the agent-tls
		// Secret's certificate and CA.
		"agentServer": values{"enabled": true, "port": portOf(t, agentAddr), "url": "https://" + agentAddr, "tls": values{"withCA": true}},
		// The namespaces whose Secrets the world's objects reference
		// besides the manager's (the cluster's token): the tenant's (the
		// PAT).
		"secretNamespaces": []string{devenv.Namespace},
		// The world's quick intervals, through the settings ConfigMap.
		"config": values{
			"runnerpool-resync-interval": in.ResyncInterval.String(),
			"orphan-sweep-interval":      in.SweepInterval.String(),
			"claim-max-retry-delay":      in.MaxRetryDelay.String(),
		},
	}
	apiURL, err := url.Parse(w.API.Config.Host)
	if err != nil {
		t.Fatal(err)
	}
	k := &kubelet{reader: admin, apiHost: apiURL.Hostname(), apiPort: apiURL.Port(), caPEM: w.API.Config.CAData, dir: filepath.Join(dir, "kubelet")}
	ro, installCtx := startRollout(ctx, t, pm, admin, w.API.Config, k, client.ObjectKey{Namespace: in.Namespace, Name: deploymentName})
	// The world created the CRDs before the chart, as envtest does: the
	// release takes them over (--take-ownership, docs/install.md, "Upgrades").
	installed := time.Now()
	if _, err := newCluster(t, w.API.KubeConfig()).install(installCtx, t, in.Namespace, nil, v, "--take-ownership"); err != nil {
		t.Fatalf("%v\nthe rollout: %v", err, ro.failure())
	}
	t.Logf("helm install --wait completed in %s (webhook mode)", time.Since(installed).Round(100*time.Millisecond))
	p := ro.started()
	unexpected, err := checkOnlyKubeletChanges(p.deployment, p.pod, p.changes)
	if err != nil {
		t.Fatal(err)
	}
	if len(unexpected) > 0 {
		t.Fatalf("the pod given to podman differs from the installed Deployment beyond the kubelet's additions: %v", unexpected)
	}
	ctr := ro.container()
	checkContainer(ctx, t, pm, ctr)

	if err := w.ConnectOperator(ctx, "https://"+webhookAddr+"/webhooks/github"); err != nil {
		t.Fatalf("%v\nmanager log:\n%s", err, tail(pm.logs(ctx, ctr), 60))
	}
	start := time.Now()
	if _, err := w.EnqueueJobs(jobs, jobDuration); err != nil {
		t.Fatal(err)
	}
	waitDone(ctx, t, w, pm, ctr, 5*time.Minute)
	t.Logf("%d jobs ran on fresh VMs and everything was cleaned up in %s", jobs, time.Since(start).Round(time.Second))
	checkJobs(ctx, t, w)

	checkLeastPrivilege(ctx, t, w.API.Config, admin, p.token)
	log := pm.logs(ctx, ctr)
	if !strings.Contains(log, "Starting manager") {
		t.Fatalf("the manager's log lacks its start message; what podman logs returned:\n%s", tail(log, 20))
	}
	checkSettings(t, log, map[string]string{
		"runnerpool-resync-interval": in.ResyncInterval.String() + " (file)",
		"orphan-sweep-interval":      in.SweepInterval.String() + " (file)",
		"claim-max-retry-delay":      in.MaxRetryDelay.String() + " (file)",
		"secret-namespaces":          in.Namespace + "," + devenv.Namespace + " (flag)",
		"agent-server-addr":          agentAddr + " (flag)",
	})
	if lines := forbiddenLines(log); len(lines) > 0 {
		t.Errorf("the manager was refused requests (a missing permission):\n%s", strings.Join(lines, "\n"))
	}
}

// portOf is the port of a host:port address.
func portOf(t *testing.T, addr string) int {
	t.Helper()
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatal(err)
	}
	n, err := strconv.Atoi(port)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// freePorts returns n loopback addresses whose ports nothing listens on.
func freePorts(t *testing.T, n int) []string {
	t.Helper()
	var out []string
	var lns []net.Listener
	for range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		lns = append(lns, ln)
		out = append(out, ln.Addr().String())
	}
	for _, ln := range lns {
		_ = ln.Close()
	}
	return out
}

// createInstallSecrets creates what an administrator adds to an install
// (docs/operations.md): the webhook receiver's certificate and the
// webhooks' secret, the agent server's certificate, and the CA bundle the
// manager trusts beyond the image's (the GitHub simulator's); and a
// namespace with a Secret nothing references.
func createInstallSecrets(ctx context.Context, t *testing.T, c client.Client, in devenv.OperatorInputs) {
	t.Helper()
	read := func(f string) []byte {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	objs := []client.Object{
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: in.Namespace, Name: "hyperfleet-webhook-tls"}, Type: corev1.SecretTypeTLS,
			Data: map[string][]byte{"tls.crt": read(in.WebhookCertFile), "tls.key": read(in.WebhookKeyFile)}},
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: in.Namespace, Name: "hyperfleet-github-webhook"},
			Data: in.WebhookSecretData},
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: in.Namespace, Name: "hyperfleet-agent-tls"}, Type: corev1.SecretTypeTLS,
			Data: map[string][]byte{"tls.crt": read(in.AgentServerCertFile), "tls.key": read(in.AgentServerKeyFile), "ca.crt": read(in.AgentServerCAFile)}},
		&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: in.Namespace, Name: "hyperfleet-trusted-ca"},
			Data: map[string]string{"github-ca.crt": string(read(in.GitHubCAFile))}},
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: elsewhere}},
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: elsewhere, Name: "not-for-hyperfleet"},
			Data: map[string][]byte{"password": []byte("nobody referenced me")}},
	}
	for _, o := range objs {
		if err := c.Create(ctx, o); err != nil {
			t.Fatalf("create %T %s: %v", o, o.GetName(), err)
		}
	}
}

// checkContainer asserts what podman made of the security context.
func checkContainer(ctx context.Context, t *testing.T, pm *podman, ctr string) {
	t.Helper()
	out, err := pm.run(ctx, "container", "inspect", "--format", "{{.Config.User}} {{.HostConfig.ReadonlyRootfs}} {{.HostConfig.NetworkMode}}", ctr)
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.TrimSpace(out); !strings.HasPrefix(got, "65532") || !strings.HasSuffix(got, "true host") {
		t.Fatalf("container runs as %q (user, read-only root, network); want uid 65532, a read-only root, the host's network", got)
	}
}

// waitDone waits until every job completed and nothing is left.
func waitDone(ctx context.Context, t *testing.T, w *devenv.World, pm *podman, ctr string, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		snap, err := w.Snapshot(ctx)
		if err == nil && snap.Done(0) {
			return
		}
		state, _ := pm.run(ctx, "container", "inspect", "--format", "{{.State.Status}}", ctr)
		if s := strings.TrimSpace(state); s != "running" {
			t.Fatalf("the manager container is %s while jobs run", s)
		}
		if time.Now().After(deadline) {
			t.Fatalf("jobs not done within %s: %s (err %v)", timeout, summary(snap), err)
		}
		time.Sleep(time.Second)
	}
}

// checkJobs asserts that every job ran once, to success, on a runner of
// its own (a fresh VM each: runners are single-use and named after their
// claim).
func checkJobs(ctx context.Context, t *testing.T, w *devenv.World) {
	t.Helper()
	snap, err := w.Snapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(snap.Jobs) != jobs {
		t.Fatalf("%d jobs recorded, want %d", len(snap.Jobs), jobs)
	}
	runners := map[string]int64{}
	for _, j := range snap.Jobs {
		if j.Status != "completed" || j.Conclusion != "success" || j.RunAttempt != 1 {
			t.Errorf("job %d: %s/%s in attempt %d, want completed/success in attempt 1", j.ID, j.Status, j.Conclusion, j.RunAttempt)
		}
		if other, dup := runners[j.RunnerName]; dup || j.RunnerName == "" {
			t.Errorf("job %d ran on runner %q, which also ran job %d", j.ID, j.RunnerName, other)
		}
		runners[j.RunnerName] = j.ID
	}
}

// checkLeastPrivilege makes requests as the manager's ServiceAccount
// (its own token) that it must not be allowed, and asks the API server
// (SubjectAccessReview) about the same.
func checkLeastPrivilege(ctx context.Context, t *testing.T, adminCfg *rest.Config, admin client.Client, token string) {
	t.Helper()
	cfg := rest.AnonymousClientConfig(adminCfg)
	cfg.BearerToken = token
	sa, err := client.New(cfg, client.Options{Scheme: admin.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	mustForbid := func(what string, err error) {
		t.Helper()
		if !apierrors.IsForbidden(err) {
			t.Errorf("as the manager's ServiceAccount, %s: got %v, want forbidden", what, err)
		}
	}
	var s corev1.Secret
	mustForbid("get a Secret in a namespace HyperFleet does not reference",
		sa.Get(ctx, client.ObjectKey{Namespace: elsewhere, Name: "not-for-hyperfleet"}, &s))
	mustForbid("list Secrets in a namespace HyperFleet does not reference", sa.List(ctx, &corev1.SecretList{}, client.InNamespace(elsewhere)))
	mustForbid("list Secrets in every namespace", sa.List(ctx, &corev1.SecretList{}))
	mustForbid("create a HypervisorCluster", sa.Create(ctx, &hfv1.HypervisorCluster{
		ObjectMeta: metav1.ObjectMeta{Name: "smuggled"},
		Spec: hfv1.HypervisorClusterSpec{Provider: hfv1.ProviderProxmox, Endpoint: "https://127.0.0.1:1/api2/json",
			Credentials: hfv1.HypervisorCredentials{
				TokenID:     &hfv1.SecretKeySelector{Namespace: elsewhere, Name: "not-for-hyperfleet", Key: "password"},
				TokenSecret: &hfv1.SecretKeySelector{Namespace: elsewhere, Name: "not-for-hyperfleet", Key: "password"},
			}},
	}))
	mustForbid("create a RoleBinding", sa.Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Namespace: elsewhere, Name: "escalate"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "cluster-admin"},
		Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Namespace: devenv.SystemNamespace, Name: serviceAccount}},
	}))
	// The same questions to the authorizer, and one it must allow so that
	// a broken review cannot pass for a refusal.
	user := "system:serviceaccount:" + devenv.SystemNamespace + ":" + serviceAccount
	for _, c := range []struct {
		attrs authzAttrs
		allow bool
	}{
		{authzAttrs{verb: "get", resource: "secrets", namespace: elsewhere, name: "not-for-hyperfleet"}, false},
		{authzAttrs{verb: "watch", resource: "secrets"}, false},
		{authzAttrs{verb: "create", group: hfv1.GroupVersion.Group, resource: "hypervisorclusters"}, false},
		{authzAttrs{verb: "delete", group: hfv1.GroupVersion.Group, resource: "hypervisorclusters", name: devenv.ClusterName}, false},
		{authzAttrs{verb: "get", resource: "secrets", namespace: devenv.Namespace, name: "github"}, true},
	} {
		allowed, err := subjectAccessReview(ctx, adminCfg, user, c.attrs)
		if err != nil {
			t.Fatal(err)
		}
		if allowed != c.allow {
			t.Errorf("SubjectAccessReview for %s: %+v allowed=%v, want %v", user, c.attrs, allowed, c.allow)
		}
	}
}

// authzAttrs are a request's attributes for a SubjectAccessReview.
type authzAttrs struct {
	verb, group, resource, namespace, name string
}

func subjectAccessReview(ctx context.Context, cfg *rest.Config, user string, a authzAttrs) (bool, error) {
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return false, err
	}
	sar, err := cs.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authorizationv1.SubjectAccessReview{
		Spec: authorizationv1.SubjectAccessReviewSpec{
			User:   user,
			Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + devenv.SystemNamespace, "system:authenticated"},
			ResourceAttributes: &authorizationv1.ResourceAttributes{
				Verb: a.verb, Group: a.group, Resource: a.resource, Namespace: a.namespace, Name: a.name,
			},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		return false, fmt.Errorf("SubjectAccessReview: %w", err)
	}
	return sar.Status.Allowed, nil
}

// checkSettings checks the manager's log line of the settings that are
// not their default (JSON) for want, each setting's value and source: the
// chart's settings ConfigMap is the file, its args and extraArgs the flags.
func checkSettings(t *testing.T, log string, want map[string]string) {
	t.Helper()
	for _, l := range strings.Split(log, "\n") {
		var line map[string]any
		if json.Unmarshal([]byte(l), &line) != nil || line["msg"] != "Settings that are not their default" {
			continue
		}
		for k, v := range want {
			if line[k] != v {
				t.Errorf("the manager's setting %s is %v, want %q (its log line: %s)", k, line[k], v, l)
			}
		}
		return
	}
	t.Errorf("the manager logged no settings line; its log:\n%s", tail(log, 20))
}

// forbiddenLines are the log lines that report a refused request.
func forbiddenLines(log string) []string {
	var out []string
	for _, l := range strings.Split(log, "\n") {
		if strings.Contains(strings.ToLower(l), "forbidden") {
			out = append(out, l)
		}
	}
	return out
}

func summary(s devenv.Snapshot) string {
	status := map[string]int{}
	for _, j := range s.Jobs {
		status[j.Status]++
	}
	var claims []string
	for _, c := range s.Claims {
		claims = append(claims, c.Name+"/"+string(c.Status.Phase))
	}
	return fmt.Sprintf("jobs %v; %d VMs, %d ISOs, %d runners; claims %v", status, len(s.VMs), len(s.ISOs), len(s.Runners), claims)
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(lines[max(len(lines)-n, 0):], "\n")
}

// testWriter sends the world's progress messages to the test log.
type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

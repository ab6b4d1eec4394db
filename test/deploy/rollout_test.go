//go:build deploy

package deploy

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"
)

// probeEvery is how often the stand-in probes the pod's readiness. A
// kubelet waits the probe's initialDelaySeconds and then probes every
// periodSeconds (5 s and 10 s in the chart); probing more often changes
// when Ready is seen, never whether: the test waits on the pod's answer,
// not on the chart's timings.
const probeEvery = 500 * time.Millisecond

// rollout stands in for what kube-controller-manager and the kubelet do
// with one Deployment, which this world has neither of: the Deployment
// controller's ReplicaSet (owned by the Deployment, its pod-template-hash
// label and selector), the pod started by podman kube play as the kubelet
// would run it (kubelet), its readiness from the readiness probe the
// Deployment names, asked of the running pod as the kubelet asks it, and
// the ReplicaSet's and Deployment's status that the two controllers derive
// from it. That status is what helm install --wait reads (helm's
// pkg/kube/ready.go: the Deployment's newest ReplicaSet's readyReplicas,
// both observedGenerations), so a pod that never answers its probe keeps
// the install waiting.
type rollout struct {
	pm    *podman
	admin client.Client
	cfg   *rest.Config
	// kubelet runs the pod; its token is the Deployment's ServiceAccount's,
	// asked for once the Deployment exists.
	kubelet *kubelet
	key     client.ObjectKey

	cancel context.CancelFunc
	done   chan struct{}
	mu     sync.Mutex
	err    error
	// Set once the pod is played: what was played (startedPod), the pod.
	played startedPod
	pod    playedPod
	ready  bool
}

// startedPod is the Deployment as the API server has it (podSource), the
// same as podman runs it and what the kubelet changed, and the
// ServiceAccount's token the manager runs with.
type startedPod struct {
	deployment, pod *appsv1.Deployment
	changes         podChanges
	token           string
}

// started returns what was played; empty before.
func (r *rollout) started() startedPod {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.played
}

// startRollout waits (in the background) for the Deployment key, then
// plays its pod and reports its readiness until stop; it stops and
// removes the pod when the test ends. It returns a context that a failure
// of the rollout ends, for helm install --wait to run in: the install
// then fails at once, with the rollout's error, instead of at its timeout.
func startRollout(ctx context.Context, t *testing.T, pm *podman, admin client.Client, cfg *rest.Config, k *kubelet, key client.ObjectKey) (*rollout, context.Context) {
	t.Helper()
	ctx, cancel := context.WithCancel(ctx)
	r := &rollout{pm: pm, admin: admin, cfg: cfg, kubelet: k, key: key, cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(r.done)
		if err := r.run(ctx); err != nil && ctx.Err() == nil {
			r.mu.Lock()
			r.err = err
			r.mu.Unlock()
			cancel()
		}
	}()
	t.Cleanup(func() {
		if ctr := r.container(); t.Failed() && ctr != "" {
			t.Logf("manager log (podman logs %s) without its failed readiness checks, last lines:\n%s", ctr, tail(withoutFailedProbes(pm.logs(context.WithoutCancel(ctx), ctr)), 80))
		}
		if err := r.stop(context.WithoutCancel(ctx)); err != nil {
			t.Error(err)
		}
	})
	return r, ctx
}

// failure is the error that stopped the rollout, if any.
func (r *rollout) failure() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.err
}

// container is the manager's container, once played.
func (r *rollout) container() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.pod.container
}

// stop ends the reporting and, as the kubelet does with a pod whose
// ReplicaSet is gone, removes the pod (and its emptyDir volumes, which
// podman keeps by name) and the ReplicaSet, as the garbage collector
// would after helm uninstall. It can be called more than once.
func (r *rollout) stop(ctx context.Context) error {
	r.cancel()
	<-r.done
	r.mu.Lock()
	pod, d := r.pod, r.played.pod
	r.pod = playedPod{}
	r.mu.Unlock()
	var errs []error
	if pod.pod != "" {
		if _, err := r.pm.run(ctx, "pod", "rm", "-f", pod.pod); err != nil {
			errs = append(errs, fmt.Errorf("remove the pod: %w", err))
		}
		removeEmptyDirs(ctx, r.pm, d)
	}
	var sets appsv1.ReplicaSetList
	if err := r.admin.List(ctx, &sets, client.InNamespace(r.key.Namespace)); err != nil {
		errs = append(errs, err)
	}
	for i := range sets.Items {
		if err := r.admin.Delete(ctx, &sets.Items[i]); err != nil && !apierrors.IsNotFound(err) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// run is the rollout's life: the Deployment, its ReplicaSet, the pod,
// then its readiness until ctx ends.
func (r *rollout) run(ctx context.Context) error {
	dep, err := r.waitDeployment(ctx)
	if err != nil {
		return err
	}
	token, err := serviceAccountToken(ctx, r.cfg, dep.Namespace, dep.Spec.Template.Spec.ServiceAccountName)
	if err != nil {
		return err
	}
	r.kubelet.token = token
	rs, err := r.createReplicaSet(ctx, dep)
	if err != nil {
		return err
	}
	src := podSource(dep)
	p, changes, err := r.kubelet.pod(ctx, src)
	if err != nil {
		return err
	}
	pod, err := playPod(ctx, r.pm, p, r.kubelet.dir)
	if err != nil {
		return err
	}
	r.mu.Lock()
	r.played, r.pod = startedPod{deployment: src, pod: p, changes: changes, token: token}, pod
	r.mu.Unlock()
	readiness, err := readinessURL(dep)
	if err != nil {
		return err
	}
	return r.report(ctx, dep, rs, readiness)
}

// waitDeployment waits until helm created the Deployment and returns it
// as the API server has it (defaults included).
func (r *rollout) waitDeployment(ctx context.Context) (*appsv1.Deployment, error) {
	for {
		var d appsv1.Deployment
		err := r.admin.Get(ctx, r.key, &d)
		switch {
		case err == nil:
			return &d, nil
		case !apierrors.IsNotFound(err):
			return nil, fmt.Errorf("read the Deployment %s: %w", r.key, err)
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("no Deployment %s: %w", r.key, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// podSource is the Deployment the kubelet's pod comes from: its name,
// labels, annotations and spec as the API server has them (defaults
// included), without the server's metadata and status.
func podSource(d *appsv1.Deployment) *appsv1.Deployment {
	return &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: d.Name, Namespace: d.Namespace, Labels: d.Labels, Annotations: d.Annotations},
		Spec:       *d.Spec.DeepCopy(),
	}
}

// createReplicaSet creates the Deployment's ReplicaSet as the Deployment
// controller does: named and labelled with the template's hash, the hash
// in its selector, controlled by the Deployment.
func (r *rollout) createReplicaSet(ctx context.Context, dep *appsv1.Deployment) (*appsv1.ReplicaSet, error) {
	hash, err := templateHash(&dep.Spec.Template)
	if err != nil {
		return nil, err
	}
	withHash := func(labels map[string]string) map[string]string {
		out := map[string]string{appsv1.DefaultDeploymentUniqueLabelKey: hash}
		for k, v := range labels {
			out[k] = v
		}
		return out
	}
	tmpl := *dep.Spec.Template.DeepCopy()
	tmpl.Labels = withHash(tmpl.Labels)
	selector := dep.Spec.Selector.DeepCopy()
	selector.MatchLabels = withHash(selector.MatchLabels)
	rs := &appsv1.ReplicaSet{
		ObjectMeta: metav1.ObjectMeta{
			Name: dep.Name + "-" + hash, Namespace: dep.Namespace, Labels: withHash(dep.Spec.Template.Labels),
			OwnerReferences: []metav1.OwnerReference{*metav1.NewControllerRef(dep, appsv1.SchemeGroupVersion.WithKind("Deployment"))},
		},
		Spec: appsv1.ReplicaSetSpec{Replicas: dep.Spec.Replicas, Selector: selector, Template: tmpl},
	}
	if err := r.admin.Create(ctx, rs); err != nil {
		return nil, fmt.Errorf("create the ReplicaSet of %s: %w", r.key, err)
	}
	return rs, nil
}

// templateHash is a hash of the pod template, as the Deployment
// controller labels its ReplicaSets with (its own hash function differs;
// helm compares templates ignoring the label).
func templateHash(tmpl *corev1.PodTemplateSpec) (string, error) {
	data, err := json.Marshal(tmpl)
	if err != nil {
		return "", err
	}
	h := fnv.New32a()
	_, _ = h.Write(data)
	return rand.SafeEncodeString(strconv.FormatUint(uint64(h.Sum32()), 10)), nil
}

// readinessURL is where the kubelet sends the manager container's
// readiness probe: its httpGet path and port (a named port is the
// container's port of that name) on the pod's address, the host's
// loopback on the host's network.
func readinessURL(dep *appsv1.Deployment) (string, error) {
	ctr := dep.Spec.Template.Spec.Containers[0]
	if ctr.ReadinessProbe == nil || ctr.ReadinessProbe.HTTPGet == nil {
		return "", fmt.Errorf("the Deployment %s/%s's container %s has no HTTP readiness probe", dep.Namespace, dep.Name, ctr.Name)
	}
	get := ctr.ReadinessProbe.HTTPGet
	port := get.Port.String()
	if get.Port.StrVal != "" {
		port = ""
		for _, p := range ctr.Ports {
			if p.Name == get.Port.StrVal {
				port = strconv.Itoa(int(p.ContainerPort))
			}
		}
		if port == "" {
			return "", fmt.Errorf("the readiness probe's port %s is no port of container %s", get.Port.StrVal, ctr.Name)
		}
	}
	host := get.Host
	if host == "" {
		host = "127.0.0.1"
	}
	return strings.ToLower(string(get.Scheme)) + "://" + net.JoinHostPort(host, port) + get.Path, nil
}

// report probes the pod's readiness and writes the ReplicaSet's and the
// Deployment's status whenever it changes, until ctx ends. A container
// that is no longer running is a failure (a kubelet would restart it;
// the test wants to see why it stopped).
func (r *rollout) report(ctx context.Context, dep *appsv1.Deployment, rs *appsv1.ReplicaSet, url string) error {
	probe := dep.Spec.Template.Spec.Containers[0].ReadinessProbe
	hc := &http.Client{Timeout: time.Duration(max(probe.TimeoutSeconds, 1)) * time.Second}
	first := true
	for {
		ready := probeOnce(ctx, hc, url)
		if !ready {
			state, err := r.pm.run(ctx, "container", "inspect", "--format", "{{.State.Status}}", r.container())
			if s := strings.TrimSpace(state); err == nil && s != "running" && s != "created" {
				return fmt.Errorf("the manager container is %s before it was ready:\n%s", s, tail(r.pm.logs(ctx, r.container()), 40))
			}
		}
		if first || ready != r.isReady() {
			if err := r.writeStatus(ctx, dep, rs, ready); err != nil {
				return err
			}
			r.mu.Lock()
			r.ready = ready
			r.mu.Unlock()
			first = false
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(probeEvery):
		}
	}
}

func (r *rollout) isReady() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.ready
}

// probeOnce is one readiness probe: ready on a 2xx or 3xx answer, as the
// kubelet's HTTP probe decides.
func probeOnce(ctx context.Context, hc *http.Client, url string) bool {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return false
	}
	resp, err := hc.Do(req)
	if err != nil {
		return false
	}
	_ = resp.Body.Close()
	return resp.StatusCode >= 200 && resp.StatusCode < 400
}

// writeStatus writes what the ReplicaSet controller (from the pod's Ready
// condition) and then the Deployment controller (from its ReplicaSet)
// report for one pod, ready or not.
func (r *rollout) writeStatus(ctx context.Context, dep *appsv1.Deployment, rs *appsv1.ReplicaSet, ready bool) error {
	n := int32(0)
	if ready {
		n = 1
	}
	replicas := ptr.Deref(dep.Spec.Replicas, 1)
	rsPatch := client.MergeFrom(rs.DeepCopy())
	rs.Status = appsv1.ReplicaSetStatus{Replicas: replicas, FullyLabeledReplicas: replicas, ReadyReplicas: n, AvailableReplicas: n, ObservedGeneration: rs.Generation}
	if err := r.admin.Status().Patch(ctx, rs, rsPatch); err != nil {
		return fmt.Errorf("write the ReplicaSet %s's status: %w", rs.Name, err)
	}
	depPatch := client.MergeFrom(dep.DeepCopy())
	dep.Status = appsv1.DeploymentStatus{ObservedGeneration: dep.Generation, Replicas: replicas, UpdatedReplicas: replicas,
		ReadyReplicas: n, AvailableReplicas: n, UnavailableReplicas: replicas - n}
	if err := r.admin.Status().Patch(ctx, dep, depPatch); err != nil {
		return fmt.Errorf("write the Deployment %s's status: %w", r.key, err)
	}
	return nil
}

// withoutFailedProbes is a manager log without the line each failed
// readiness probe adds, which would leave no room for the line that says
// why it fails.
func withoutFailedProbes(log string) string {
	var out []string
	for _, l := range strings.Split(log, "\n") {
		if !strings.Contains(l, `"msg":"healthz check failed"`) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// serviceAccountToken asks the TokenRequest API for a token of the
// ServiceAccount, as the kubelet does for a projected volume.
func serviceAccountToken(ctx context.Context, cfg *rest.Config, ns, name string) (string, error) {
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return "", err
	}
	tr, err := cs.CoreV1().ServiceAccounts(ns).CreateToken(ctx, name,
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](3600)}}, metav1.CreateOptions{})
	if err != nil {
		return "", fmt.Errorf("TokenRequest for %s/%s: %w", ns, name, err)
	}
	return tr.Status.Token, nil
}

// playPod hands the pod to podman kube play, removing first what a
// previous run killed before its cleanup left behind (the pod, its
// emptyDir volumes, which podman keeps by name).
func playPod(ctx context.Context, pm *podman, d *appsv1.Deployment, dir string) (playedPod, error) {
	d = d.DeepCopy()
	d.APIVersion, d.Kind = "apps/v1", "Deployment"
	data, err := yaml.Marshal(d)
	if err != nil {
		return playedPod{}, err
	}
	file := filepath.Join(dir, "pod.yaml")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return playedPod{}, err
	}
	if err := os.WriteFile(file, data, 0o600); err != nil {
		return playedPod{}, err
	}
	_, _ = pm.run(ctx, "kube", "down", file)
	removeEmptyDirs(ctx, pm, d)
	return pm.play(ctx, file)
}

// removeEmptyDirs removes the podman volumes of d's emptyDir volumes.
func removeEmptyDirs(ctx context.Context, pm *podman, d *appsv1.Deployment) {
	if d == nil {
		return
	}
	for _, v := range d.Spec.Template.Spec.Volumes {
		if v.EmptyDir != nil {
			_, _ = pm.run(ctx, "volume", "rm", "-f", v.Name)
		}
	}
}

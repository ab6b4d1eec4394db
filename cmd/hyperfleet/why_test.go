package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/webhook"
	"github.com/hyperfleet/hyperfleet/test/testenv"
)

// lazyEnv starts the API server on first use, so the package's other
// tests run without it.
var lazyEnv testenv.Lazy

func TestMain(m *testing.M) { os.Exit(lazyEnv.Main(m)) }

// whyWorld is one namespace and cluster on the real API server, written
// as the controllers write them: a connected cluster, a valid template,
// and a verified pool of max 2 whose two runners are busy.
type whyWorld struct {
	t          *testing.T
	ctx        context.Context
	c          client.Client
	kubeconfig string
	ns         string
	cluster    string
}

func newWhyWorld(t *testing.T) *whyWorld {
	env := lazyEnv.Get(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(kubeconfig, env.KubeConfig(), 0o600); err != nil {
		t.Fatal(err)
	}
	w := &whyWorld{t: t, ctx: ctx, c: env.Client, kubeconfig: kubeconfig}
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "why-"}}
	w.create(ns)
	w.ns, w.cluster = ns.Name, "pve-"+ns.Name

	cluster := &hfv1.HypervisorCluster{ObjectMeta: metav1.ObjectMeta{Name: w.cluster}, Spec: hfv1.HypervisorClusterSpec{
		Provider: hfv1.ProviderProxmox, Endpoint: "https://pve.example.com:8006/api2/json",
		Credentials: hfv1.HypervisorCredentials{
			TokenID:     &hfv1.SecretKeySelector{Namespace: w.ns, Name: "pve", Key: "id"},
			TokenSecret: &hfv1.SecretKeySelector{Namespace: w.ns, Name: "pve", Key: "secret"},
		},
	}}
	w.create(cluster)
	cluster.Status.ConnectedNodes = 2
	cluster.Status.Nodes = []hfv1.NodeStatus{{Name: "pve1", State: "online"}, {Name: "pve2", State: "online"}}
	w.conds(&cluster.Status.Conditions, hfv1.ReadyCondition, metav1.ConditionTrue, hfv1.ReadyReason, "Connected to 2 nodes")
	w.conds(&cluster.Status.Conditions, hfv1.HypervisorClusterConnectedCondition, metav1.ConditionTrue, hfv1.ReadyReason, "Connected")
	w.status(cluster)

	tmpl := &hfv1.HypervisorMachineTemplate{ObjectMeta: metav1.ObjectMeta{Namespace: w.ns, Name: "ubuntu"}, Spec: hfv1.HypervisorMachineTemplateSpec{
		HypervisorClusterRef: hfv1.ObjectName{Name: w.cluster},
		Source:               hfv1.MachineSource{Proxmox: hfv1.ProxmoxSource{TemplateID: ptr.To[int32](9000)}},
		Resources:            hfv1.MachineResources{CPU: 2, Memory: resource.MustParse("2Gi")},
		Bootstrap: hfv1.Bootstrap{GitHub: &hfv1.GitHubBootstrap{Owner: "octo", Repository: "app",
			Credentials: hfv1.GitHubCredentials{PAT: &hfv1.LocalSecretKeySelector{Name: "github", Key: "token"}}}},
	}}
	w.create(tmpl)
	w.conds(&tmpl.Status.Conditions, hfv1.ReadyCondition, metav1.ConditionTrue, hfv1.ReadyReason, "valid")
	w.conds(&tmpl.Status.Conditions, hfv1.HypervisorMachineTemplateValidCondition, metav1.ConditionTrue, hfv1.ReadyReason, "valid")
	w.status(tmpl)

	pool := &hfv1.RunnerPool{ObjectMeta: metav1.ObjectMeta{Namespace: w.ns, Name: "linux"}, Spec: hfv1.RunnerPoolSpec{
		TemplateRef: hfv1.ObjectName{Name: tmpl.Name},
		Workload:    hfv1.Workload{Type: hfv1.WorkloadGitHubActions, GitHub: &hfv1.GitHubWorkload{Labels: []string{"big"}}},
		Scaling:     hfv1.Scaling{MaxReplicas: 2},
	}}
	w.create(pool)
	pool.Status.Replicas, pool.Status.ReadyReplicas, pool.Status.BusyReplicas, pool.Status.DesiredReplicas, pool.Status.PendingJobs = 2, 2, 2, 2, 1
	w.conds(&pool.Status.Conditions, hfv1.ReadyCondition, metav1.ConditionTrue, hfv1.ReadyReason, "ready")
	w.conds(&pool.Status.Conditions, hfv1.RunnerPoolScopeVerifiedCondition, metav1.ConditionTrue, hfv1.ScopeVerifiedReason, "verified")
	w.conds(&pool.Status.Conditions, hfv1.RunnerPoolCapacityCondition, metav1.ConditionFalse, hfv1.AtMaxReplicasReason,
		"Demand needs more than spec.scaling.maxReplicas (2) allows: 1 pending jobs, 2 busy, 0 failed VMs retained; raise maxReplicas or wait")
	w.status(pool)

	job := &hfv1.CIJob{ObjectMeta: metav1.ObjectMeta{Namespace: w.ns, Name: hfv1.CIJobName(hfv1.WorkloadGitHubActions, "4242")},
		Spec: hfv1.CIJobSpec{Platform: hfv1.WorkloadGitHubActions, JobID: 4242, Repository: "octo/app", Labels: []string{"self-hosted", "big"},
			RunnerPoolRef: hfv1.ObjectName{Name: pool.Name}},
		Status: hfv1.CIJobStatus{State: hfv1.CIJobQueued, QueuedAt: &metav1.Time{Time: time.Now().Add(-time.Minute)}}}
	w.create(job)
	return w
}

func (w *whyWorld) create(obj client.Object) {
	w.t.Helper()
	if err := w.c.Create(w.ctx, obj); err != nil {
		w.t.Fatalf("creating %T %s: %v", obj, obj.GetName(), err)
	}
}

func (w *whyWorld) status(obj client.Object) {
	w.t.Helper()
	if err := w.c.Status().Update(w.ctx, obj); err != nil {
		w.t.Fatalf("writing the status of %T %s: %v", obj, obj.GetName(), err)
	}
}

func (w *whyWorld) conds(conds *[]metav1.Condition, t hfv1.ConditionType, s metav1.ConditionStatus, r hfv1.ConditionReason, msg string) {
	meta.SetStatusCondition(conds, metav1.Condition{Type: string(t), Status: s, Reason: string(r), Message: msg})
}

// run runs the command as a user would, with --kubeconfig.
func (w *whyWorld) run(cmd func(context.Context, []string, *bytes.Buffer, *bytes.Buffer) error, args ...string) string {
	w.t.Helper()
	var out, errOut bytes.Buffer
	if err := cmd(w.ctx, append(args, "--kubeconfig", w.kubeconfig), &out, &errOut); err != nil {
		w.t.Fatalf("%v: %v\n%s", args, err, errOut.String())
	}
	return out.String()
}

func whyCmd(ctx context.Context, args []string, out, errOut *bytes.Buffer) error {
	return runWhy(ctx, args, out, errOut)
}

func statusCmd(ctx context.Context, args []string, out, errOut *bytes.Buffer) error {
	return runStatus(ctx, args, out, errOut)
}

// TestWhyScenarios runs `hyperfleet why` and `hyperfleet status` against
// the real API server, reading the kubeconfig as kubectl does: a job
// blocked by its pool at maxReplicas (found by id in every namespace, and
// by its URL), a job no pool's labels cover (known only from the events
// the webhook receiver writes, read with the API server's field selector
// on reason), and a claim held by its cluster's quota.
//
// Mutation: why.Load listing the events of another reason than
// NoMatchingRunnerPool fails "no pool matches the job's labels" (the job
// is then reported JobNotRecorded).
func TestWhyScenarios(t *testing.T) {
	w := newWhyWorld(t)

	t.Run("pool at maxReplicas", func(t *testing.T) {
		out := w.run(whyCmd, "4242")
		lines := strings.Split(strings.TrimSpace(out), "\n")
		if !strings.HasPrefix(lines[0], "CIJob "+w.ns+"/github-actions-4242") ||
			!strings.Contains(out, "\nBLOCKED AtMaxReplicas: RunnerPool "+w.ns+"/linux, spec.scaling.maxReplicas") ||
			!strings.Contains(out, "status.replicas 2 of spec.scaling.maxReplicas 2") || !strings.Contains(out, "see: docs/troubleshooting.md#atmaxreplicas") {
			t.Fatalf("why 4242:\n%s", out)
		}
		if byURL := w.run(whyCmd, "https://github.com/octo/app/actions/runs/7/job/4242", "-n", w.ns); byURL != out {
			t.Fatalf("by URL:\n%s\nby id:\n%s", byURL, out)
		}
	})

	t.Run("no pool matches the job's labels", func(t *testing.T) {
		w.create(&corev1.Event{ObjectMeta: metav1.ObjectMeta{Namespace: w.ns, GenerateName: "linux."},
			InvolvedObject: corev1.ObjectReference{APIVersion: hfv1.GroupVersion.String(), Kind: "RunnerPool", Namespace: w.ns, Name: "linux"},
			Reason:         webhook.ReasonNoMatchingRunnerPool, Type: corev1.EventTypeWarning, LastTimestamp: metav1.Now(),
			Message: "queued job 5151 of octo/app (runs-on: self-hosted, gpu) matches no RunnerPool; this pool's runners lack: gpu"})
		out := w.run(whyCmd, "https://github.com/octo/app/actions/runs/7/job/5151", "-n", w.ns, "-o", "json")
		var r struct {
			Chain   []struct{ Kind, Name, State string }
			Blocked struct{ Reason, Object, Message, Fix string }
		}
		if err := json.Unmarshal([]byte(out), &r); err != nil {
			t.Fatalf("%v:\n%s", err, out)
		}
		if r.Blocked.Reason != webhook.ReasonNoMatchingRunnerPool || !strings.Contains(r.Blocked.Message, "RunnerPool "+w.ns+"/linux lacks gpu") ||
			len(r.Chain) != 1 || r.Chain[0].Name != w.ns+"/linux" {
			t.Fatalf("why job 5151:\n%s", out)
		}
	})

	t.Run("claim held by the cluster's quota", func(t *testing.T) {
		c := &hfv1.MachineClaim{ObjectMeta: metav1.ObjectMeta{Namespace: w.ns, Name: "linux-abc"},
			Spec: hfv1.MachineClaimSpec{TemplateRef: hfv1.ObjectName{Name: "ubuntu"}, RunnerPoolRef: &hfv1.ObjectName{Name: "linux"}}}
		w.create(c)
		c.Status.Phase = hfv1.MachineClaimPending
		w.conds(&c.Status.Conditions, hfv1.MachineClaimProvisionedCondition, metav1.ConditionFalse, hfv1.MaxMachinesReachedReason,
			"resource error: HypervisorCluster holds spec.limits.maxMachines (10) VMs")
		w.status(c)
		out := w.run(whyCmd, "claim/linux-abc")
		if !strings.Contains(out, "\nBLOCKED MaxMachinesReached: MachineClaim "+w.ns+"/linux-abc, status.conditions[type=Provisioned]") ||
			!strings.Contains(out, "HypervisorCluster "+w.cluster) {
			t.Fatalf("why claim/linux-abc:\n%s", out)
		}
	})

	t.Run("status", func(t *testing.T) {
		out := w.run(statusCmd, "-n", w.ns, "-o", "json")
		var s struct {
			Pools    []map[string]any
			Clusters []map[string]any
		}
		if err := json.Unmarshal([]byte(out), &s); err != nil {
			t.Fatalf("%v:\n%s", err, out)
		}
		if len(s.Pools) != 1 || s.Pools[0]["name"] != "linux" || s.Pools[0]["max"] != 2.0 || s.Pools[0]["busy"] != 2.0 || s.Pools[0]["reason"] != "Ready/AtMaxReplicas" {
			t.Fatalf("pools: %s", out)
		}
		found := false
		for _, c := range s.Clusters {
			found = found || (c["name"] == w.cluster && c["connected"] == "True" && c["nodes"] == 2.0)
		}
		if !found {
			t.Fatalf("cluster %s not in: %s", w.cluster, out)
		}
		if text := w.run(statusCmd); !strings.Contains(text, "RUNNERPOOL") || !strings.Contains(text, w.cluster) {
			t.Fatalf("status:\n%s", text)
		}
	})
}

// TestKubectlPluginName: installed as kubectl-hyperfleet the binary runs
// the commands kubectl hyperfleet offers, and no others.
func TestKubectlPluginName(t *testing.T) {
	for argv0, want := range map[string]bool{
		"/usr/local/bin/kubectl-hyperfleet": true, "kubectl-hyperfleet.exe": true, "kubectl-hyperfleet": true,
		"/usr/bin/hyperfleet": false, "kubectl": false, "kubectl-hyperfleet-dev": false,
	} {
		if got := isKubectlPlugin(argv0); got != want {
			t.Errorf("isKubectlPlugin(%q) = %v, want %v", argv0, got, want)
		}
	}
	if !pluginCommands["why"] || !pluginCommands["status"] || pluginCommands["manager"] {
		t.Errorf("plugin commands: %v", pluginCommands)
	}
}

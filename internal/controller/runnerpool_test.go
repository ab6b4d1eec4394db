package controller_test

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	crmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/manager"
	"github.com/hyperfleet/hyperfleet/internal/metrics"
	"github.com/hyperfleet/hyperfleet/internal/scaling"
	"github.com/hyperfleet/hyperfleet/internal/selfsigned"
	githubsim "github.com/hyperfleet/hyperfleet/internal/testworld/simulator/github"
	"github.com/hyperfleet/hyperfleet/internal/testworld/simulator/github/githubsimtest"
	proxmoxsim "github.com/hyperfleet/hyperfleet/internal/testworld/simulator/proxmox"
)

// guestAgentScript stands in for the in-VM agent: it makes the directory
// the operator places the VM's secrets in (as cloud-init's bootcmd does),
// waits for the JIT runner configuration to arrive there through the guest
// agent, runs the simulator's runner package with it for one job and
// powers the VM off. VMs whose name starts with "noboot-" never start
// their runner (bootstrap timeouts); those whose name starts with "crash-"
// power off at once, before their runner comes online (a broken image).
const guestAgentScript = `
case "$HF_SIM_NAME" in noboot-*) exec sleep 3600;; esac
case "$HF_SIM_NAME" in crash-*) curl -s -X POST "$HF_SIM_POWEROFF_URL"; exec sleep 3600;; esac
mkdir -p -m 0700 "$HF_SIM_VM_DIR/root/run/hyperfleet"
secrets="$HF_SIM_VM_DIR/root/run/hyperfleet/secrets.json"
i=0
while :; do
  jit=$(sed -n 's/.*"jitConfig":"\([^"]*\)".*/\1/p' "$secrets" 2>/dev/null)
  [ -n "$jit" ] && break
  i=$((i+1))
  if [ $i -gt 3000 ]; then echo "guest: no JIT configuration placed in the VM"; exec sleep 3600; fi
  sleep 0.05
done
rm -f "$secrets"
cp -r "$HF_TEST_RUNNER_DIR" runner && cd runner || exit 1
sh run.sh --jitconfig "$jit"
echo "guest: run.sh exited $?"
curl -s -X POST "$HF_SIM_POWEROFF_URL"
exec sleep 3600
`

// poolWorld is an operator with both simulators: the Proxmox simulator's
// guests run a runner for their VM's JIT configuration, and the GitHub
// simulator delivers webhooks to the operator's receiver.
type poolWorld struct {
	t   *testing.T
	sim *simulator
	gs  *githubsimtest.Server
	op  *operator
	f   *fixture
	// hookClient trusts the operator's webhook receiver.
	hookClient *http.Client
	// maxVMs is the most operator VMs seen at once.
	maxVMs atomic.Int64
}

type poolWorldOptions struct {
	// noGuest boots VMs without running anything in them.
	noGuest bool
	// github, when set, changes the GitHub simulator's configuration.
	github func(*githubsim.Config)
	// backoff replaces the pools' replacement backoff.
	backoff *scaling.Backoff
	// sharedSecret verifies the webhooks with the shared fallback secret
	// (accepted: AllowSharedSecret) instead of octo-org's own key.
	sharedSecret bool
	// clock replaces the operator's clock.
	clock clock.Clock
	// resyncInterval replaces the pools' resync interval (1 s); from a
	// minute up, the world starts after the first resync, so that none
	// runs during the test.
	resyncInterval time.Duration
}

const poolWebhookSecret = "pool-test-webhook-secret"

func startPoolWorld(t *testing.T, o poolWorldOptions) *poolWorld {
	t.Helper()
	certFile, keyFile, hookClient := webhookCertificate(t)
	ghCfg := githubsim.Config{
		Organizations: []githubsim.OrgConfig{{Login: "octo-org"}},
		Repositories:  []githubsim.RepoConfig{{Name: "octo-org/app"}},
		PATs:          []githubsim.PATConfig{{Token: testGitHubPAT, Login: "octocat"}},
		// Generous: on a loaded 2-core machine a runner's poll can stall
		// for seconds, which GitHub would not count as a lost runner.
		HeartbeatTimeout: githubsim.Duration(30 * time.Second),
	}
	if o.github != nil {
		o.github(&ghCfg)
	}
	gs := githubsimtest.Start(t, ghCfg, githubsim.WithWebhookClient(hookClient))
	runnerDir := gs.InstallRunner(t)
	sim := startSim(t, func(c *proxmoxsim.Config) {
		c.Nodes[0].Memory, c.Nodes[0].CPUs = 1<<40, 1024
		if !o.noGuest {
			if dir := os.Getenv("HF_TEST_GUEST_DIR"); dir != "" {
				// Keeps the guests' console logs for investigation.
				c.Guest.WorkDir = filepath.Join(dir, t.Name())
			}
			c.Guest.Command = []string{"sh", "-c", guestAgentScript}
			c.Guest.Env = map[string]string{"HF_TEST_RUNNER_DIR": runnerDir, "HF_SIM_POLL_WAIT": "1"}
		}
	})
	// The pools' template names the simulator as its GitHub API
	// (useGitHub): its deliveries are that host's.
	hooks := &manager.WebhookOptions{Addr: "127.0.0.1:0", CertFile: certFile, KeyFile: keyFile, Platforms: []manager.WebhookPlatform{{Platform: hfv1.WorkloadGitHubActions,
		APIHost: strings.TrimPrefix(gs.URL, "https://"), OwnerSecrets: map[string][]byte{"octo-org": []byte(poolWebhookSecret)}}}}
	if o.sharedSecret {
		hooks.Platforms[0].OwnerSecrets, hooks.Platforms[0].Secret, hooks.Platforms[0].AllowSharedSecret = nil, []byte(poolWebhookSecret), true
	}
	op := startOperator(t, operatorOptions{
		github:         gs.Transport,
		webhook:        hooks,
		resyncInterval: cmp.Or(o.resyncInterval, time.Second),
		backoff:        o.backoff,
		clock:          o.clock,
	})
	select {
	case <-op.components.Webhook.Ready():
	case <-time.After(30 * time.Second):
		t.Fatal("webhook server did not start")
	}
	if _, err := gs.Sim.AddWebhook(githubsim.Webhook{URL: "https://" + op.components.Webhook.Addr().String() + "/webhooks/github", Secret: poolWebhookSecret}); err != nil {
		t.Fatal(err)
	}
	f := newFixture(t, sim, nil)
	f.useGitHub(gs, nil)
	w := &poolWorld{t: t, sim: sim, gs: gs, op: op, f: f, hookClient: hookClient}
	// Registered after the fixture, so it runs before the fixture's
	// cleanup changes anything.
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		for _, d := range gs.Sim.Deliveries() {
			if d.StatusCode != http.StatusAccepted && !d.Dropped {
				t.Logf("delivery %s %s job %d: status %d err %q", d.Event, d.Action, d.JobID, d.StatusCode, d.Error)
			}
		}
		// The operator's cleanup writes it before the log
		// (writeLogOnFailure).
		var state strings.Builder
		var list hfv1.MachineClaimList
		_ = env.Client.List(context.Background(), &list, client.InNamespace(f.namespace))
		for _, c := range list.Items {
			fmt.Fprintf(&state, "claim %s phase %s deleting %v finalizers %v reason %q conditions %+v bootstrap %+v\n",
				c.Name, c.Status.Phase, !c.DeletionTimestamp.IsZero(), c.Finalizers, c.Status.TerminationReason, c.Status.Conditions, c.Status.Bootstrap)
		}
		for _, vm := range operatorVMs(sim) {
			fmt.Fprintf(&state, "vm %d %s %s\n", vm.VMID, vm.Name, vm.Status)
		}
		for _, r := range gs.Sim.Runners() {
			fmt.Fprintf(&state, "runner %+v\n", r)
		}
		op.failureState = state.String()
	})
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for ctx.Err() == nil {
			if n := int64(len(operatorVMs(sim))); n > w.maxVMs.Load() {
				w.maxVMs.Store(n)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}()
	t.Cleanup(func() { cancel(); wg.Wait() })
	if o.resyncInterval >= time.Minute {
		// A world whose resync waits long is one where the source under
		// test is the only one, but the resync also runs once a second
		// after the start; it is let run before the test has pools and
		// jobs, or a job queued then is recorded by it (source resync).
		eventually(t, 30*time.Second, "the operator's first resync", func() error {
			if n := op.components.Resync.Passes(); n == 0 {
				return errors.New("not run yet")
			}
			return nil
		})
	}
	return w
}

// webhookCertificate writes a serving certificate for the operator's
// webhook receiver and returns a client that trusts it.
func webhookCertificate(t testing.TB) (string, string, *http.Client) {
	t.Helper()
	c, err := selfsigned.New("127.0.0.1", "localhost")
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile, _, err := c.WriteDir(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return certFile, keyFile, &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: c.Pool(), MinVersion: tls.VersionTLS12}}}
}

// newPool creates a RunnerPool named name whose runners carry the label
// name, in the world's namespace, and waits until its scope is verified.
func (w *poolWorld) newPool(name string, mutate func(*hfv1.RunnerPool)) *hfv1.RunnerPool {
	w.t.Helper()
	p := &hfv1.RunnerPool{
		ObjectMeta: metav1.ObjectMeta{Namespace: w.f.namespace, Name: name},
		Spec: hfv1.RunnerPoolSpec{
			TemplateRef: hfv1.ObjectName{Name: w.f.template.Name},
			Workload:    hfv1.Workload{Type: hfv1.WorkloadGitHubActions, GitHub: &hfv1.GitHubWorkload{Labels: []string{name}}},
			Scaling:     hfv1.Scaling{MinReplicas: 0, MaxReplicas: 4, ScaleDownDelay: &metav1.Duration{}},
		},
	}
	if mutate != nil {
		mutate(p)
	}
	w.f.create(p)
	// Jobs are routed only to verified pools (docs/security.md): a job
	// queued before the check would find no pool.
	w.waitPool(p, "the pool's scope verified", 30*time.Second, func(p *hfv1.RunnerPool) error {
		if !hfv1.IsConditionTrue(p.Status.Conditions, hfv1.RunnerPoolScopeVerifiedCondition) {
			return fmt.Errorf("ScopeVerified %+v", hfv1.FindCondition(p.Status.Conditions, hfv1.RunnerPoolScopeVerifiedCondition))
		}
		return nil
	})
	return p
}

// enqueue queues n jobs for the pool's label on octo-org/app.
func (w *poolWorld) enqueue(label string, n int, d time.Duration) []int64 {
	w.t.Helper()
	ids := make([]int64, 0, n)
	for range n {
		j, err := w.gs.Sim.EnqueueJob(githubsim.JobRequest{Repository: "octo-org/app", Labels: []string{"self-hosted", label}, Duration: d})
		if err != nil {
			w.t.Fatal(err)
		}
		ids = append(ids, j.ID)
	}
	return ids
}

// waitJobs waits until every job completed and returns them.
func (w *poolWorld) waitJobs(ids []int64, timeout time.Duration) []githubsim.Job {
	w.t.Helper()
	var out []githubsim.Job
	eventually(w.t, timeout, "every job completed", func() error {
		out = out[:0]
		pending := 0
		for _, id := range ids {
			j, _ := w.gs.Sim.Job(id)
			if j.Status != "completed" {
				pending++
			}
			out = append(out, j)
		}
		if pending > 0 {
			return fmt.Errorf("%d of %d jobs not completed; claims: %s", pending, len(ids), w.claimSummary())
		}
		return nil
	})
	return out
}

// claimSummary lists the namespace's claims for failure messages.
func (w *poolWorld) claimSummary() string {
	var list hfv1.MachineClaimList
	_ = env.Client.List(context.Background(), &list, client.InNamespace(w.f.namespace))
	var b strings.Builder
	for _, c := range list.Items {
		fmt.Fprintf(&b, "%s=%s", c.Name, c.Status.Phase)
		if cond := hfv1.FindCondition(c.Status.Conditions, hfv1.ReadyCondition); cond != nil {
			fmt.Fprintf(&b, "(%s)", cond.Reason)
		}
		b.WriteString(" ")
	}
	return b.String()
}

func (w *poolWorld) pool(p *hfv1.RunnerPool) *hfv1.RunnerPool {
	w.t.Helper()
	var got hfv1.RunnerPool
	if err := env.Client.Get(context.Background(), client.ObjectKeyFromObject(p), &got); err != nil {
		w.t.Fatal(err)
	}
	return &got
}

// waitPool waits until cond accepts the pool.
func (w *poolWorld) waitPool(p *hfv1.RunnerPool, what string, timeout time.Duration, cond func(*hfv1.RunnerPool) error) *hfv1.RunnerPool {
	w.t.Helper()
	var got *hfv1.RunnerPool
	eventually(w.t, timeout, what, func() error {
		got = w.pool(p)
		if err := cond(got); err != nil {
			return fmt.Errorf("%w; status %+v; claims: %s", err, got.Status, w.claimSummary())
		}
		return nil
	})
	return got
}

// claims lists the pool's claims.
func (w *poolWorld) claims(p *hfv1.RunnerPool) []hfv1.MachineClaim {
	w.t.Helper()
	var list hfv1.MachineClaimList
	if err := env.Client.List(context.Background(), &list, client.InNamespace(p.Namespace), client.MatchingLabels{hfv1.RunnerPoolLabel: p.Name}); err != nil {
		w.t.Fatal(err)
	}
	return list.Items
}

// assertDrained checks that nothing of the pool is left: no live claim,
// no VM, no registered runner.
func (w *poolWorld) assertDrained(p *hfv1.RunnerPool, timeout time.Duration) {
	w.t.Helper()
	eventually(w.t, timeout, "the pool drained", func() error {
		for _, c := range w.claims(p) {
			if c.Status.Phase != hfv1.MachineClaimFinished {
				return fmt.Errorf("claim %s is %s (deleting %v, finalizers %v, ready %+v)", c.Name, c.Status.Phase, !c.DeletionTimestamp.IsZero(), c.Finalizers, hfv1.FindCondition(c.Status.Conditions, hfv1.ReadyCondition))
			}
		}
		if vms := operatorVMs(w.sim); len(vms) != 0 {
			return fmt.Errorf("%d VMs left", len(vms))
		}
		for _, r := range w.gs.Sim.Runners() {
			if !r.Removed {
				return fmt.Errorf("runner %s still registered (%s)", r.Name, r.Status)
			}
		}
		return nil
	})
}

// poolEvents returns the reasons of the pool's events.
func poolEventReasons(t *testing.T, p *hfv1.RunnerPool) map[string]int {
	t.Helper()
	var list corev1.EventList
	if err := env.Client.List(context.Background(), &list, client.InNamespace(p.Namespace)); err != nil {
		t.Fatal(err)
	}
	out := map[string]int{}
	for _, e := range list.Items {
		if e.InvolvedObject.Kind == "RunnerPool" && e.InvolvedObject.Name == p.Name {
			out[e.Reason] += int(max(e.Count, 1))
		}
	}
	return out
}

// TestRunnerPoolServesJobs: a pool from zero serves a burst of jobs with
// at most maxReplicas VMs, one fresh VM per job, and shrinks back to zero
// with nothing left behind.
func TestRunnerPoolServesJobs(t *testing.T) {
	w := startPoolWorld(t, poolWorldOptions{})
	pool := w.newPool("burst", nil)
	w.waitPool(pool, "the pool is ready and empty", 30*time.Second, func(p *hfv1.RunnerPool) error {
		if !hfv1.IsConditionTrue(p.Status.Conditions, hfv1.ReadyCondition) || p.Status.Replicas != 0 {
			return fmt.Errorf("not ready/empty")
		}
		return nil
	})
	ids := w.enqueue("burst", 10, time.Second)
	w.waitPool(pool, "the pool at maxReplicas", 60*time.Second, func(p *hfv1.RunnerPool) error {
		c := hfv1.FindCondition(p.Status.Conditions, hfv1.RunnerPoolCapacityCondition)
		if p.Status.DesiredReplicas != 4 || c == nil || c.Reason != string(hfv1.AtMaxReplicasReason) {
			return fmt.Errorf("desired %d, capacity %+v", p.Status.DesiredReplicas, c)
		}
		return nil
	})
	jobs := w.waitJobs(ids, 4*time.Minute)
	runners := map[string]int64{}
	for _, j := range jobs {
		if j.Conclusion != "success" {
			t.Errorf("job %d concluded %q on %s, want success", j.ID, j.Conclusion, j.RunnerName)
		}
		if prev, dup := runners[j.RunnerName]; dup {
			t.Errorf("runner %s ran jobs %d and %d; each VM must run exactly one", j.RunnerName, prev, j.ID)
		}
		runners[j.RunnerName] = j.ID
		if !strings.HasPrefix(j.RunnerName, "burst-") {
			t.Errorf("job %d ran on %q, not a pool runner", j.ID, j.RunnerName)
		}
	}
	w.assertDrained(pool, 2*time.Minute)
	got := w.waitPool(pool, "the pool back to zero", 30*time.Second, func(p *hfv1.RunnerPool) error {
		if p.Status.Replicas != 0 || p.Status.PendingJobs != 0 || p.Status.DesiredReplicas != 0 {
			return fmt.Errorf("not empty")
		}
		return nil
	})
	if n := w.maxVMs.Load(); n > 4 {
		t.Errorf("%d VMs existed at once; maxReplicas is 4", n)
	}
	if got.Status.Selector != hfv1.RunnerPoolLabel+"=burst" || got.Status.LastScaleTime == nil {
		t.Errorf("status selector %q, lastScaleTime %v", got.Status.Selector, got.Status.LastScaleTime)
	}
	reasons := poolEventReasons(t, pool)
	// At maxReplicas is an event (a person may raise it); scaling with
	// demand is routine, a log line and the Scaling condition.
	if reasons[string(hfv1.AtMaxReplicasReason)] == 0 || reasons["ScaledUp"] != 0 {
		t.Errorf("pool events %v: want AtMaxReplicas and no ScaledUp", reasons)
	}
	// Each job's queue and run times were observed once, under its
	// repository and (unnamed in the simulator) workflow, and the VMs'
	// lives, charged to the repository, cover the jobs' run times.
	queued, _ := jobHistogram(t, "hyperfleet_job_queue_seconds", pool)
	ran, runSeconds := jobHistogram(t, "hyperfleet_job_run_seconds", pool)
	charged := vmSeconds(t, pool)
	if queued != 10 || ran != 10 {
		t.Errorf("%d queue and %d run times observed, want 10 each", queued, ran)
	}
	if charged["octo-org/app"] < runSeconds || runSeconds < 10 {
		t.Errorf("VM-seconds %v; the jobs ran %vs in all (10 jobs of 1s)", charged, runSeconds)
	}
	// The jobs' demand records name the runners that took them.
	var cijobs hfv1.CIJobList
	if err := env.Client.List(context.Background(), &cijobs, client.InNamespace(pool.Namespace)); err != nil {
		t.Fatal(err)
	}
	for _, cj := range cijobs.Items {
		if cj.Status.State != hfv1.CIJobCompleted || runners[cj.Status.RunnerName] != cj.Spec.JobID {
			t.Errorf("CIJob %s: state %s runner %s", cj.Name, cj.Status.State, cj.Status.RunnerName)
		}
	}
}

// TestRunnerPoolWarmPoolAndResync: a warm pool keeps minIdle registered
// runners, refills after they take jobs, and jobs whose webhooks were all
// lost are still found by the resync, served and recorded as completed.
func TestRunnerPoolWarmPoolAndResync(t *testing.T) {
	w := startPoolWorld(t, poolWorldOptions{})
	// A repository pool: the resync reads the queued jobs of its
	// repository at every resync (an organization pool's repositories
	// without recorded jobs in turns).
	pool := w.newPool("warm", func(p *hfv1.RunnerPool) {
		p.Spec.Scaling.MinIdle = ptr.To[int32](2)
		p.Spec.Workload.GitHub.Repository = "octo-org/app"
	})
	warm := w.waitPool(pool, "two warm runners", 90*time.Second, func(p *hfv1.RunnerPool) error {
		if p.Status.IdleReplicas != 2 || p.Status.Replicas != 2 {
			return fmt.Errorf("idle %d", p.Status.IdleReplicas)
		}
		return nil
	})
	if warm.Status.LastResyncTime == nil {
		t.Errorf("status.lastResyncTime unset")
	}
	warmClaims := map[string]bool{}
	for _, c := range w.claims(pool) {
		if c.Status.Phase != hfv1.MachineClaimReady || c.Status.Bootstrap == nil || c.Status.Bootstrap.RunnerState != hfv1.RunnerStateIdle {
			t.Errorf("warm claim %s: phase %s bootstrap %+v", c.Name, c.Status.Phase, c.Status.Bootstrap)
		}
		warmClaims[c.Status.Bootstrap.RunnerName] = true
	}

	// Every webhook from now on is lost.
	w.gs.Sim.DropWebhooks(0, 1)
	ids := w.enqueue("warm", 3, 2*time.Second)
	jobs := w.waitJobs(ids, 3*time.Minute)
	tookWarm := 0
	for _, j := range jobs {
		if warmClaims[j.RunnerName] {
			tookWarm++
		}
	}
	if tookWarm != 2 {
		t.Errorf("%d jobs ran on the two warm runners, want 2", tookWarm)
	}
	// The warm runners may take two jobs before any resync sees them
	// queued (nothing needed scaling for them); the third needed a new VM,
	// which only the resync could have asked for.
	eventually(t, 60*time.Second, "the resync recorded the jobs it found as completed", func() error {
		recorded := 0
		for _, id := range ids {
			var cj hfv1.CIJob
			err := env.Client.Get(context.Background(), client.ObjectKey{Namespace: pool.Namespace, Name: hfv1.CIJobName(hfv1.WorkloadGitHubActions, strconv.FormatInt(id, 10))}, &cj)
			if apierrors.IsNotFound(err) {
				continue
			}
			if err != nil {
				return err
			}
			recorded++
			if cj.Status.State != hfv1.CIJobCompleted || cj.Status.Source != "resync" {
				return fmt.Errorf("CIJob %s: %s from %s", cj.Name, cj.Status.State, cj.Status.Source)
			}
		}
		if recorded == 0 {
			return fmt.Errorf("no job recorded")
		}
		return nil
	})
	w.waitPool(pool, "the warm pool refilled", 90*time.Second, func(p *hfv1.RunnerPool) error {
		if p.Status.IdleReplicas != 2 || p.Status.BusyReplicas != 0 || p.Status.PendingJobs != 0 {
			return fmt.Errorf("not refilled")
		}
		return nil
	})
	for _, c := range w.claims(pool) {
		if c.Status.Phase == hfv1.MachineClaimReady && warmClaims[c.Status.Bootstrap.RunnerName] {
			t.Errorf("claim %s ran a job yet is still a warm runner", c.Name)
		}
	}
}

// TestRunnerPoolDrift: after a template change idle VMs are replaced at
// once; a busy VM finishes its job first (never cancelled), then goes.
func TestRunnerPoolDrift(t *testing.T) {
	w := startPoolWorld(t, poolWorldOptions{})
	pool := w.newPool("drift", func(p *hfv1.RunnerPool) { p.Spec.Scaling.MinReplicas = 2 })
	before := w.waitPool(pool, "two idle runners", 90*time.Second, func(p *hfv1.RunnerPool) error {
		if p.Status.IdleReplicas != 2 || p.Status.TemplateHash == "" {
			return fmt.Errorf("idle %d", p.Status.IdleReplicas)
		}
		return nil
	})
	ids := w.enqueue("drift", 1, 15*time.Second)
	w.waitPool(pool, "one busy runner", 60*time.Second, func(p *hfv1.RunnerPool) error {
		if p.Status.BusyReplicas != 1 {
			return fmt.Errorf("busy %d", p.Status.BusyReplicas)
		}
		return nil
	})
	var busy string
	for _, c := range w.claims(pool) {
		if c.Status.Bootstrap != nil && c.Status.Bootstrap.JobID == ids[0] {
			busy = c.Name
		}
	}
	err := retry.RetryOnConflict(conflictRetry, func() error {
		var tmpl hfv1.HypervisorMachineTemplate
		if err := env.Client.Get(context.Background(), client.ObjectKeyFromObject(w.f.template), &tmpl); err != nil {
			return err
		}
		tmpl.Spec.Resources.CPU = 3
		return env.Client.Update(context.Background(), &tmpl)
	})
	if err != nil {
		t.Fatal(err)
	}
	w.waitPool(pool, "the stale idle runner replaced", 60*time.Second, func(p *hfv1.RunnerPool) error {
		if p.Status.TemplateHash == before.Status.TemplateHash {
			return fmt.Errorf("template hash unchanged")
		}
		for _, c := range w.claims(pool) {
			if c.Name == busy {
				if !c.DeletionTimestamp.IsZero() {
					return fmt.Errorf("the busy claim %s is being deleted", c.Name)
				}
				continue
			}
			if c.Status.Phase != hfv1.MachineClaimFinished && c.Status.TemplateHash == before.Status.TemplateHash {
				return fmt.Errorf("claim %s still on the old template", c.Name)
			}
		}
		return nil
	})
	// The replaced idle runners' VMs ran no job: chargeback counts them
	// as the pool's idle time.
	eventually(t, 30*time.Second, "the replaced idle VMs counted as idle", func() error {
		if v := vmSeconds(t, pool)[metrics.IdleLabel]; v <= 0 {
			return fmt.Errorf("VM-seconds %v", vmSeconds(t, pool))
		}
		return nil
	})
	jobs := w.waitJobs(ids, 60*time.Second)
	if jobs[0].Conclusion != "success" {
		t.Errorf("the busy runner's job concluded %q; drift must not cancel it", jobs[0].Conclusion)
	}
	w.waitPool(pool, "only fresh runners", 90*time.Second, func(p *hfv1.RunnerPool) error {
		if p.Status.StaleReplicas != 0 || p.Status.IdleReplicas != 2 {
			return fmt.Errorf("stale %d idle %d", p.Status.StaleReplicas, p.Status.IdleReplicas)
		}
		return nil
	})
	if reasons := poolEventReasons(t, pool); reasons[string(hfv1.ReplacingStaleReason)] == 0 {
		t.Errorf("no %s event: %v", hfv1.ReplacingStaleReason, reasons)
	}
}

// TestRunnerPoolBurstProvisioning: 55 queued jobs make 55 claims
// provisioning at once, each created exactly once, each with its own VM.
func TestRunnerPoolBurstProvisioning(t *testing.T) {
	longScenario(t)
	w := startPoolWorld(t, poolWorldOptions{noGuest: true})
	pool := w.newPool("wide", func(p *hfv1.RunnerPool) { p.Spec.Scaling.MaxReplicas = 60 })
	w.enqueue("wide", 55, time.Hour)
	eventually(t, 8*time.Minute, "55 claims with a VM each", func() error {
		claims := w.claims(pool)
		if len(claims) > 55 {
			return fmt.Errorf("%d claims for 55 jobs", len(claims))
		}
		vms := map[int32]string{}
		for _, c := range claims {
			if c.Status.VMRef == nil {
				return fmt.Errorf("claim %s has no VM yet (%d claims)", c.Name, len(claims))
			}
			if other, dup := vms[c.Status.VMRef.VMID]; dup {
				t.Fatalf("claims %s and %s share VM %d", other, c.Name, c.Status.VMRef.VMID)
			}
			vms[c.Status.VMRef.VMID] = c.Name
		}
		if len(claims) != 55 {
			return fmt.Errorf("%d of 55 claims", len(claims))
		}
		return nil
	})
	if n := len(w.claims(pool)); n != 55 {
		t.Errorf("%d claims for 55 jobs", n)
	}
	if vms := operatorVMs(w.sim); len(vms) > 55 {
		t.Errorf("%d VMs for 55 claims", len(vms))
	}
	// The pool's counts are written with its next status write, at most
	// the manager's counts interval after the last (runnerpool_statusbatch.go).
	eventually(t, time.Minute, "the pool's status counting 55", func() error {
		if got := w.pool(pool); got.Status.PendingJobs != 55 || got.Status.DesiredReplicas != 55 {
			return fmt.Errorf("status: pendingJobs %d desiredReplicas %d, want 55", got.Status.PendingJobs, got.Status.DesiredReplicas)
		}
		return nil
	})
	for _, c := range w.claims(pool) {
		if !metav1.IsControlledBy(&c, w.pool(pool)) || !strings.HasPrefix(c.Name, "wide-") || c.Labels[hfv1.RunnerPoolLabel] != "wide" {
			t.Errorf("claim %s: owner %v labels %v", c.Name, c.OwnerReferences, c.Labels)
		}
	}
}

// TestRunnerPoolLifecycleLimits: every limit ends its VMs with the reason
// recorded, in four pools at once (with the shortest limits the API
// admits): idleTimeout drains an idle runner; jobTimeout cancels the job
// on GitHub before destroying a busy runner's VM; maxLifetime ends a VM
// whatever it does; bootstrapTimeout fails a VM whose runner never comes
// online, keeps one failed VM stopped for debugging and releases it after
// its TTL. Finished claims stay as history.
func TestRunnerPoolLifecycleLimits(t *testing.T) {
	longScenario(t)
	w := startPoolWorld(t, poolWorldOptions{})
	minute := &metav1.Duration{Duration: time.Minute}
	history := &hfv1.ClaimHistory{Limit: 5, TTL: &metav1.Duration{Duration: time.Hour}}
	idle := w.newPool("idle", func(p *hfv1.RunnerPool) {
		p.Spec.Scaling.MinReplicas = 1
		p.Spec.Lifecycle = hfv1.Lifecycle{IdleTimeout: minute, History: history}
	})
	jobto := w.newPool("jobto", func(p *hfv1.RunnerPool) {
		p.Spec.Lifecycle = hfv1.Lifecycle{JobTimeout: minute, History: history}
	})
	life := w.newPool("life", func(p *hfv1.RunnerPool) {
		p.Spec.Scaling.MinReplicas = 1
		p.Spec.Lifecycle = hfv1.Lifecycle{MaxLifetime: minute, JobTimeout: minute, BootstrapTimeout: &metav1.Duration{Duration: 30 * time.Second}, History: history}
	})
	noboot := w.newPool("noboot", func(p *hfv1.RunnerPool) {
		p.Spec.Scaling.MinReplicas = 2
		p.Spec.Lifecycle = hfv1.Lifecycle{
			BootstrapTimeout: &metav1.Duration{Duration: 30 * time.Second},
			FailedRetention:  &hfv1.FailedRetention{MaxRetained: 1, TTL: minute},
		}
	})
	ids := w.enqueue("jobto", 1, 10*time.Minute)

	// finished waits for a claim of pool that ended with reason.
	finished := func(pool *hfv1.RunnerPool, reason string) hfv1.MachineClaim {
		t.Helper()
		var got hfv1.MachineClaim
		eventually(t, 3*time.Minute, pool.Name+": a claim finished with "+reason, func() error {
			for _, c := range w.claims(pool) {
				if c.Status.Phase == hfv1.MachineClaimFinished && strings.HasPrefix(c.Status.TerminationReason, reason+":") {
					got = c
					return nil
				}
			}
			return fmt.Errorf("claims: %s", w.claimSummary())
		})
		return got
	}
	c := finished(idle, "idle_timeout")
	if c.Status.Bootstrap == nil || c.Status.Bootstrap.JobID != 0 || c.Status.Bootstrap.RegisteredAt == nil {
		t.Errorf("idle_timeout claim %s: bootstrap %+v", c.Name, c.Status.Bootstrap)
	}
	c = finished(jobto, "job_timeout")
	if c.Status.Bootstrap == nil || c.Status.Bootstrap.JobID != ids[0] {
		t.Errorf("job_timeout claim %s: bootstrap %+v, want job %d", c.Name, c.Status.Bootstrap, ids[0])
	}
	if j, _ := w.gs.Sim.Job(ids[0]); j.Status != "completed" || j.Conclusion != "cancelled" {
		t.Errorf("the timed-out job is %s/%s; it must be cancelled on GitHub before its VM goes", j.Status, j.Conclusion)
	}
	finished(life, "max_lifetime")

	// bootstrap timeouts: one failed VM is kept, stopped; the others go.
	var kept hfv1.MachineClaim
	eventually(t, 3*time.Minute, "one failed VM retained", func() error {
		var retained []hfv1.MachineClaim
		for _, c := range w.claims(noboot) {
			if c.Status.Phase == hfv1.MachineClaimFailed && c.Status.VMRef != nil && c.DeletionTimestamp.IsZero() {
				if cond := hfv1.FindCondition(c.Status.Conditions, hfv1.ReadyCondition); cond != nil && cond.Reason == string(hfv1.RetainedReason) {
					retained = append(retained, c)
				}
			}
		}
		if len(retained) != 1 {
			return fmt.Errorf("%d retained; claims: %s", len(retained), w.claimSummary())
		}
		kept = retained[0]
		if vm := findVM(t, w.sim, int(kept.Status.VMRef.VMID)); vm.Status != "stopped" {
			return fmt.Errorf("retained VM %d is %s", kept.Status.VMRef.VMID, vm.Status)
		}
		return nil
	})
	if !strings.HasPrefix(kept.Status.TerminationReason, "bootstrap_timeout:") {
		t.Errorf("retained claim %s: terminationReason %q", kept.Name, kept.Status.TerminationReason)
	}
	if got := w.pool(noboot); got.Status.RetainedReplicas > 1 {
		t.Errorf("status.retainedReplicas = %d, maxRetained is 1", got.Status.RetainedReplicas)
	}
	eventually(t, 3*time.Minute, "the retained VM released after its TTL", func() error {
		var c hfv1.MachineClaim
		err := env.Client.Get(context.Background(), client.ObjectKeyFromObject(&kept), &c)
		if !apierrors.IsNotFound(err) {
			return fmt.Errorf("claim %s still there (%w)", kept.Name, err)
		}
		for _, vm := range operatorVMs(w.sim) {
			if vm.VMID == int(kept.Status.VMRef.VMID) {
				return fmt.Errorf("VM %d still there", vm.VMID)
			}
		}
		return nil
	})
	reasons := poolEventReasons(t, noboot)
	if reasons["BootstrapTimeout"] == 0 || reasons["RetainedVMReleased"] == 0 {
		t.Errorf("noboot pool events: %v", reasons)
	}
	if reasons := poolEventReasons(t, jobto); reasons["JobCancelled"] == 0 {
		t.Errorf("jobto pool events: %v", reasons)
	}
}

// TestRunnerPoolTemplateMetadata: the claims a pool creates carry the
// template's spec.metadata labels and annotations next to HyperFleet's own
// labels.
func TestRunnerPoolTemplateMetadata(t *testing.T) {
	w := startPoolWorld(t, poolWorldOptions{noGuest: true})
	if err := retry.RetryOnConflict(conflictRetry, func() error {
		var cur hfv1.HypervisorMachineTemplate
		if err := env.Client.Get(context.Background(), client.ObjectKeyFromObject(w.f.template), &cur); err != nil {
			return err
		}
		cur.Spec.Metadata = &hfv1.ObjectMetadata{
			Labels:      map[string]string{"team": "payments", "example.com/cost-center": "cc-42"},
			Annotations: map[string]string{"example.com/owner": "payments-oncall@example.com"},
		}
		return env.Client.Update(context.Background(), &cur)
	}); err != nil {
		t.Fatal(err)
	}
	waitTemplate(t, w.f.template, metav1.ConditionTrue, "")
	pool := w.newPool("labelled", func(p *hfv1.RunnerPool) { p.Spec.Scaling.MinReplicas = 1 })
	var claim hfv1.MachineClaim
	eventually(t, 60*time.Second, "the pool's claim", func() error {
		claims := w.claims(pool)
		if len(claims) == 0 {
			return fmt.Errorf("no claim yet")
		}
		claim = claims[0]
		return nil
	})
	want := map[string]string{
		"team": "payments", "example.com/cost-center": "cc-42",
		hfv1.ManagedByLabel: hfv1.ManagedByValue, hfv1.RunnerPoolLabel: pool.Name, hfv1.MachineTemplateLabel: w.f.template.Name,
	}
	for k, v := range want {
		if claim.Labels[k] != v {
			t.Errorf("claim label %s = %q, want %q (labels %v)", k, claim.Labels[k], v, claim.Labels)
		}
	}
	if got := claim.Annotations["example.com/owner"]; got != "payments-oncall@example.com" {
		t.Errorf("claim annotation example.com/owner = %q (annotations %v)", got, claim.Annotations)
	}
}

// jobHistogram is the number and sum of the observations of a job
// histogram for the pool, all repositories and workflows together.
func jobHistogram(t *testing.T, name string, pool *hfv1.RunnerPool) (uint64, float64) {
	t.Helper()
	var n uint64
	var sum float64
	for _, m := range poolSeries(t, name, pool) {
		n += m.GetHistogram().GetSampleCount()
		sum += m.GetHistogram().GetSampleSum()
	}
	return n, sum
}

// vmSeconds is the pool's hyperfleet_vm_seconds_total by repository.
func vmSeconds(t *testing.T, pool *hfv1.RunnerPool) map[string]float64 {
	t.Helper()
	out := map[string]float64{}
	for _, m := range poolSeries(t, "hyperfleet_vm_seconds_total", pool) {
		for _, l := range m.GetLabel() {
			if l.GetName() == "repository" {
				out[l.GetValue()] += m.GetCounter().GetValue()
			}
		}
	}
	return out
}

// poolSeries gathers the series of a metric labelled with the pool's
// namespace and name from the operator's registry.
func poolSeries(t *testing.T, name string, pool *hfv1.RunnerPool) []*dto.Metric {
	t.Helper()
	families, err := crmetrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var out []*dto.Metric
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			var ns, name string
			for _, l := range m.GetLabel() {
				switch l.GetName() {
				case "namespace":
					ns = l.GetValue()
				case "pool":
					name = l.GetValue()
				}
			}
			if ns == pool.Namespace && name == pool.Name {
				out = append(out, m)
			}
		}
	}
	return out
}

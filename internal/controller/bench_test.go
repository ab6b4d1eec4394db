package controller_test

import (
	"context"
	"fmt"
	"maps"
	"net/http"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	crmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/prometheus/common/expfmt"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/agentconfig"
	"github.com/hyperfleet/hyperfleet/internal/manager"
	githubsim "github.com/hyperfleet/hyperfleet/internal/testworld/simulator/github"
	"github.com/hyperfleet/hyperfleet/internal/testworld/simulator/github/githubsimtest"
	proxmoxsim "github.com/hyperfleet/hyperfleet/internal/testworld/simulator/proxmox"
)

// BenchmarkOperator1000Claims measures the operator with 1,000 active
// claims over 10 HypervisorClusters (targets: docs/architecture.md,
// "Performance targets"):
//
//   - overhead-p50/p99-ms: a new claim created -> its clone request
//     reaching the hypervisor, with 1,000 claims active (target p99 <
//     100 ms);
//   - poweroff-p50/p99-s: a VM powering itself off -> VM destroyed and
//     claim gone (the claim's deletion as a watch sees it), for 100 VMs
//     powering off at once (target p99 < 10 s), split into
//     poweroff-detect (-> the operator's confirming status read of the
//     VM) and poweroff-destroy (-> its destroy request), and into
//     poweroff-hinted (half of the VMs announce their power-off as the
//     agent does) and poweroff-listing (the others, found by the listing);
//   - webhook-clone-p50/p95/p99-ms: a job queued on GitHub (its
//     workflow_job webhook sent) -> the clone request of the VM its
//     RunnerPool creates for it, one job at a time (target p95 < 250 ms).
//
// Each cluster is its own simulator with short task latencies and the
// operator's default clone limits; the clusters poll every 5 s (the
// default) and the simulators refresh /cluster/resources every 10 s, as
// Proxmox does (the realistic preset's refresh). HF_BENCH_SIZE=2x10 runs
// 2 clusters of 10 claims.
// Setup (1,000 VMs) is not timed. Run with -benchtime 1x.
//
// A probe (a claim or a job) is sent once no clone runs on its cluster
// (waitNoClone): these are latency measures, and a clone that must wait
// for a clone slot waits for the user's configured throttle, not for the
// operator. Burst throughput is covered by the RunnerPool burst test.
//
// Investigation aids: HF_BENCH_SMALL=1 runs 2 clusters with one claim each;
// HF_BENCH_TRACE=<file> appends, for every probe slower than 100 ms, the
// simulator requests and the operator's log lines for that claim.
func BenchmarkOperator1000Claims(b *testing.B) {
	clusters, perCluster := 10, 100
	if os.Getenv("HF_BENCH_SMALL") != "" {
		// A quick variant for investigating the overhead path alone.
		clusters, perCluster = 2, 1
	}
	if v := os.Getenv("HF_BENCH_SIZE"); v != "" {
		// <clusters>x<claims per cluster>, e.g. 2x10 for a quick look at
		// the power-off paths.
		if _, err := fmt.Sscanf(v, "%dx%d", &clusters, &perCluster); err != nil || clusters < 1 || perCluster < 1 {
			b.Fatalf("HF_BENCH_SIZE=%q: want <clusters>x<claims per cluster>", v)
		}
	}
	// Proxmox's own status refresh (pvestatd, every 10 s): what power-off
	// detection is up against on a real cluster.
	realistic, err := proxmoxsim.Preset(proxmoxsim.PresetRealistic)
	if err != nil {
		b.Fatal(err)
	}
	sims := make([]*simulator, clusters)
	for i := range sims {
		sims[i] = startSim(b, func(c *proxmoxsim.Config) {
			c.Nodes[0].Memory, c.Nodes[0].CPUs = 4<<40, 1024
			c.RefreshInterval = realistic.RefreshInterval
			c.Guest.AddressRange = "10.99.0.1-10.99.3.250"
			c.Guest.Prefix = 22
		})
	}
	// A GitHub simulator delivers workflow_job webhooks to the operator's
	// receiver for the webhook -> clone measurement.
	certFile, keyFile, hookClient := webhookCertificate(b)
	gs := githubsimtest.Start(b, githubsim.Config{
		Organizations: []githubsim.OrgConfig{{Login: "octo-org"}},
		Repositories:  []githubsim.RepoConfig{{Name: "octo-org/app"}},
	}, githubsim.WithWebhookClient(hookClient))
	op := startOperator(b, operatorOptions{
		webhook: &manager.WebhookOptions{Addr: "127.0.0.1:0", CertFile: certFile, KeyFile: keyFile, Platforms: []manager.WebhookPlatform{{Platform: hfv1.WorkloadGitHubActions, OwnerSecrets: map[string][]byte{"octo-org": []byte(poolWebhookSecret)}}}},
		// The binary's default log level, unless tracing needs the debug
		// lines.
		infoLogs: os.Getenv("HF_BENCH_TRACE") == "",
	})
	<-op.components.Webhook.Ready()
	if _, err := gs.Sim.AddWebhook(githubsim.Webhook{URL: "https://" + op.components.Webhook.Addr().String() + "/webhooks/github", Secret: poolWebhookSecret}); err != nil {
		b.Fatal(err)
	}
	fixtures := make([]*fixture, clusters)
	for i := range fixtures {
		fixtures[i] = newFixture(b, sims[i], func(c *hfv1.HypervisorCluster) { c.Spec.PollInterval = nil })
	}
	for i := range clusters * perCluster {
		fixtures[i%clusters].newClaim(fmt.Sprintf("load-%04d", i))
	}
	eventually(b, 20*time.Minute, "1,000 claims running", func() error {
		n := 0
		for _, f := range fixtures {
			var list hfv1.MachineClaimList
			if err := env.Client.List(context.Background(), &list, client.InNamespace(f.namespace)); err != nil {
				return err
			}
			for _, c := range list.Items {
				if c.Status.Phase == hfv1.MachineClaimBootstrapping {
					n++
				}
			}
		}
		if n < clusters*perCluster {
			time.Sleep(time.Second)
			return fmt.Errorf("%d running", n)
		}
		return nil
	})
	b.ResetTimer()

	for range b.N {
		// Overhead: one new claim at a time, each on the next cluster.
		var apiBefore map[string]float64
		if os.Getenv("HF_BENCH_TRACE") != "" {
			apiBefore = claimWriteLatency(b)
		}
		var overhead []time.Duration
		for i := range 100 {
			sim := sims[i%clusters]
			waitNoClone(b, sim)
			cloned := make(chan time.Time, 1)
			start := time.Now()
			var trace []string
			var traceMu sync.Mutex
			hook := func(r *http.Request) {
				traceMu.Lock()
				trace = append(trace, fmt.Sprintf("%s %s %s", time.Since(start).Round(time.Millisecond), r.Method, r.URL.Path))
				traceMu.Unlock()
				if r.Method == http.MethodPost && strings.HasSuffix(r.URL.Path, "/clone") {
					select {
					case cloned <- time.Now():
					default:
					}
				}
			}
			sim.onRequest.Store(&hook)
			fixtures[i%clusters].newClaim(fmt.Sprintf("probe-%d-%d", b.N, i))
			// "Created" is when the API server has stored the claim, that
			// is when Create returns; the API server's own write latency
			// is not the operator's overhead.
			traceMu.Lock()
			start = time.Now()
			traceMu.Unlock()
			select {
			case at := <-cloned:
				overhead = append(overhead, at.Sub(start))
				if os.Getenv("HF_BENCH_TRACE") != "" && at.Sub(start) > 100*time.Millisecond {
					traceMu.Lock()
					name := fmt.Sprintf("probe-%d-%d", b.N, i)
					var lines []string
					for _, l := range strings.Split(op.logs.String(), "\n") {
						if strings.Contains(l, name) {
							lines = append(lines, l)
						}
					}
					if f, err := os.OpenFile(os.Getenv("HF_BENCH_TRACE"), os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o600); err == nil {
						fmt.Fprintf(f, "slow clone request after %s (start %s): %v\nlog: %s\n\n", at.Sub(start), start.Format("15:04:05.000000"), trace, strings.Join(lines, "\n"))
						f.Close()
					}
					traceMu.Unlock()
				}
			case <-time.After(time.Minute):
				b.Fatalf("no clone request within a minute of creating claim %d", i)
			}
			sim.onRequest.Store(nil)
		}

		if os.Getenv("HF_BENCH_TRACE") != "" {
			logAPIServerLatency(b, apiBefore)
		}

		// Power-off: 10 VMs per cluster power off at once. The latency is
		// split at the simulator's requests for each VM: detection (power-off
		// -> the operator's confirming status read), destruction (-> the
		// destroy request) and removal (-> the claim's deletion, seen
		// through a watch, not by polling).
		gone, stopWatch := watchClaimDeletions(b)
		steps := &vmRequestLog{}
		for ci, sim := range sims {
			cluster := fixtures[ci].cluster.Name
			hook := func(r *http.Request) { steps.record(cluster, r) }
			sim.onRequest.Store(&hook)
		}
		type victim struct {
			claim *hfv1.MachineClaim
			vmid  int
			off   time.Time
			// hinted VMs announce their power-off as the agent does
			// (docs/architecture.md, "Power-off hints"); the others are
			// left to the listing.
			hinted bool
		}
		var victims []victim
		for ci, f := range fixtures {
			var list hfv1.MachineClaimList
			if err := env.Client.List(context.Background(), &list, client.InNamespace(f.namespace)); err != nil {
				b.Fatal(err)
			}
			n := 0
			for i := range list.Items {
				c := &list.Items[i]
				if c.Status.Phase != hfv1.MachineClaimBootstrapping || !strings.HasPrefix(c.Name, "load-") || n == 10 {
					continue
				}
				hinted := n%2 == 0
				if hinted {
					// The agent's notice, as its HTTPS handler passes it on
					// (the endpoint itself: TestPowerOffHintEndsClaimBeforeListingRefresh),
					// right before the power-off.
					ref := agentconfig.PowerOffNotice{ClaimRef: agentconfig.ClaimRef{Namespace: c.Namespace, Name: c.Name, UID: string(c.UID)}}
					if err := op.components.PowerOffNotices.AuthorizePowerOff(ref.ClaimRef, testSigner.PowerOffToken(c.Namespace, c.Name, string(c.UID))); err != nil {
						b.Fatal(err)
					}
					if err := op.components.PowerOffNotices.PowerOffNotice(context.Background(), ref); err != nil {
						b.Fatal(err)
					}
				}
				if err := sims[ci].GuestPowerOff(int(c.Status.VMRef.VMID)); err != nil {
					b.Fatal(err)
				}
				victims = append(victims, victim{claim: c, vmid: int(c.Status.VMRef.VMID), off: time.Now(), hinted: hinted})
				n++
			}
		}
		var poweroff, detect, destroy, hintedOff, listingOff []time.Duration
		eventually(b, 5*time.Minute, "powered-off claims gone", func() error {
			left := 0
			var first *hfv1.MachineClaim
			for _, v := range victims {
				if _, ok := gone.at(v.claim.UID); !ok {
					gone.seenGone(b, v.claim)
				}
				if _, ok := gone.at(v.claim.UID); !ok {
					left++
					if first == nil {
						first = v.claim
					}
				}
			}
			if left > 0 {
				time.Sleep(100 * time.Millisecond)
				// Say where the first one stands, for a run that fails.
				got, err := getClaim(b, first)
				if err != nil {
					return fmt.Errorf("%d claims left; %s: %w", left, first.Name, err)
				}
				return fmt.Errorf("%d claims left; %s: phase %s, end %+v, conditions %+v", left, first.Name, got.Status.Phase, got.Status.End, got.Status.Conditions)
			}
			return nil
		})
		stopWatch()
		if gone.reopened > 0 || gone.fallbacks > 0 {
			b.Logf("the claim watch was closed by the API server %d times; %d of %d deletions were seen by a read (up to a pass of the wait loop late)", gone.reopened, gone.fallbacks, len(victims))
		}
		for _, sim := range sims {
			sim.onRequest.Store(nil)
		}
		for _, v := range victims {
			at, _ := gone.at(v.claim.UID)
			poweroff = append(poweroff, at.Sub(v.off))
			if v.hinted {
				hintedOff = append(hintedOff, at.Sub(v.off))
			} else {
				listingOff = append(listingOff, at.Sub(v.off))
			}
			if t, ok := steps.first(v.claim.Status.VMRef.HypervisorCluster, v.vmid, http.MethodGet, "/status/current", v.off); ok {
				detect = append(detect, t.Sub(v.off))
			}
			if t, ok := steps.first(v.claim.Status.VMRef.HypervisorCluster, v.vmid, http.MethodDelete, "", v.off); ok {
				destroy = append(destroy, t.Sub(v.off))
			}
		}
		if os.Getenv("HF_BENCH_TRACE") != "" {
			logQueueWait(b)
		}

		// Webhook -> clone: a RunnerPool from zero; each queued job's
		// webhook makes the pool create a claim whose clone request is
		// timed, one job at a time, with the 1,000 claims still active.
		pool := &hfv1.RunnerPool{
			ObjectMeta: metav1.ObjectMeta{Namespace: fixtures[0].namespace, Name: fmt.Sprintf("bench-%d", b.N)},
			Spec: hfv1.RunnerPoolSpec{
				TemplateRef: hfv1.ObjectName{Name: fixtures[0].template.Name},
				Workload:    hfv1.Workload{Type: hfv1.WorkloadGitHubActions, GitHub: &hfv1.GitHubWorkload{Labels: []string{"bench"}}},
				Scaling:     hfv1.Scaling{MinReplicas: 0, MaxReplicas: 200, ScaleDownDelay: &metav1.Duration{Duration: time.Hour}},
			},
		}
		fixtures[0].create(pool)
		// The receiver routes a job to the pools it knows: queue the first
		// job only once the operator has seen the pool.
		eventually(b, time.Minute, "pool observed", func() error {
			var got hfv1.RunnerPool
			if err := env.Client.Get(context.Background(), client.ObjectKeyFromObject(pool), &got); err != nil {
				return err
			}
			if got.Status.ObservedGeneration != got.Generation {
				return fmt.Errorf("observed generation %d of %d", got.Status.ObservedGeneration, got.Generation)
			}
			return nil
		})
		var webhookToClone []time.Duration
		for i := range 100 {
			cloned := make(chan time.Time, 1)
			hook := func(r *http.Request) {
				if r.Method == http.MethodPost && strings.HasSuffix(r.URL.Path, "/clone") {
					select {
					case cloned <- time.Now():
					default:
					}
				}
			}
			waitNoClone(b, sims[0])
			sims[0].onRequest.Store(&hook)
			// Queued is when the simulator emits the webhook, as GitHub
			// would when the job is queued.
			start := time.Now()
			if _, err := gs.Sim.EnqueueJob(githubsim.JobRequest{Repository: "octo-org/app", Labels: []string{"self-hosted", "bench"}, Duration: time.Hour}); err != nil {
				b.Fatal(err)
			}
			select {
			case at := <-cloned:
				webhookToClone = append(webhookToClone, at.Sub(start))
			case <-time.After(time.Minute):
				b.Fatalf("no clone request within a minute of queueing job %d", i)
			}
			sims[0].onRequest.Store(nil)
		}
		b.ReportMetric(percentile(webhookToClone, 50).Seconds()*1000, "webhook-clone-p50-ms")
		b.ReportMetric(percentile(webhookToClone, 95).Seconds()*1000, "webhook-clone-p95-ms")
		b.ReportMetric(percentile(webhookToClone, 99).Seconds()*1000, "webhook-clone-p99-ms")
		b.ReportMetric(percentile(overhead, 50).Seconds()*1000, "overhead-p50-ms")
		b.ReportMetric(percentile(overhead, 90).Seconds()*1000, "overhead-p90-ms")
		b.ReportMetric(percentile(overhead, 99).Seconds()*1000, "overhead-p99-ms")
		b.ReportMetric(percentile(poweroff, 50).Seconds(), "poweroff-p50-s")
		b.ReportMetric(percentile(poweroff, 99).Seconds(), "poweroff-p99-s")
		b.ReportMetric(percentile(hintedOff, 50).Seconds(), "poweroff-hinted-p50-s")
		b.ReportMetric(percentile(hintedOff, 99).Seconds(), "poweroff-hinted-p99-s")
		b.ReportMetric(percentile(listingOff, 50).Seconds(), "poweroff-listing-p50-s")
		b.ReportMetric(percentile(listingOff, 99).Seconds(), "poweroff-listing-p99-s")
		b.ReportMetric(percentile(detect, 50).Seconds(), "poweroff-detect-p50-s")
		b.ReportMetric(percentile(detect, 99).Seconds(), "poweroff-detect-p99-s")
		b.ReportMetric(percentile(destroy, 50).Seconds(), "poweroff-destroy-p50-s")
		b.ReportMetric(percentile(destroy, 99).Seconds(), "poweroff-destroy-p99-s")
	}
}

// percentile returns the p-th percentile (nearest rank).
func percentile(ds []time.Duration, p int) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	i := (p*len(s)+99)/100 - 1
	return s[max(0, min(i, len(s)-1))]
}

// logQueueWait writes the MachineClaim controller's workqueue wait
// histogram to the trace file: it tells time spent queued from time spent
// before an event reached the queue.
func logQueueWait(b *testing.B) {
	families, err := crmetrics.Registry.Gather()
	if err != nil {
		b.Fatal(err)
	}
	f, err := os.OpenFile(os.Getenv("HF_BENCH_TRACE"), os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o600)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	for _, fam := range families {
		if fam.GetName() != "workqueue_queue_duration_seconds" && fam.GetName() != "controller_runtime_reconcile_time_seconds" {
			continue
		}
		for _, m := range fam.GetMetric() {
			for _, l := range m.GetLabel() {
				if (l.GetName() == "name" || l.GetName() == "controller") && l.GetValue() == "machineclaim" {
					for _, bk := range m.GetHistogram().GetBucket() {
						fmt.Fprintf(f, "%s <= %gs: %d\n", fam.GetName(), bk.GetUpperBound(), bk.GetCumulativeCount())
					}
					fmt.Fprintf(f, "%s count %d\n", fam.GetName(), m.GetHistogram().GetSampleCount())
				}
			}
		}
	}
}

// vmRequestLog records when each VM's hypervisor requests arrived, by
// cluster and VM id (ids repeat across clusters).
type vmRequestLog struct {
	mu   sync.Mutex
	seen []vmRequest
}

type vmRequest struct {
	cluster string
	vmid    int
	method  string
	rest    string // the path after /qemu/<vmid>
	at      time.Time
}

var vmPath = regexp.MustCompile(`/qemu/(\d+)(/[^?]*)?$`)

func (l *vmRequestLog) record(cluster string, r *http.Request) {
	m := vmPath.FindStringSubmatch(r.URL.Path)
	if m == nil {
		return
	}
	vmid, _ := strconv.Atoi(m[1])
	l.mu.Lock()
	l.seen = append(l.seen, vmRequest{cluster: cluster, vmid: vmid, method: r.Method, rest: m[2], at: time.Now()})
	l.mu.Unlock()
}

// first is the first request for the VM with this method and path suffix
// that arrived after since.
func (l *vmRequestLog) first(cluster string, vmid int, method, rest string, since time.Time) (time.Time, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, q := range l.seen {
		if q.cluster == cluster && q.vmid == vmid && q.method == method && q.rest == rest && !q.at.Before(since) {
			return q.at, true
		}
	}
	return time.Time{}, false
}

// claimDeletions holds when each MachineClaim's deletion reached a watch.
type claimDeletions struct {
	mu sync.Mutex
	m  map[types.UID]time.Time
	// reopened counts watches the API server closed; fallbacks the
	// deletions recorded by a read instead of an event.
	reopened, fallbacks int
}

func (d *claimDeletions) at(uid types.UID) (time.Time, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	t, ok := d.m[uid]
	return t, ok
}

// watchClaimDeletions watches every MachineClaim and records when each one
// is deleted, so that a claim's end is timed by the API server's event,
// not by a polling loop's pass. The API server closes a watch whose reader
// falls behind (a loaded machine): the watch is then opened again, and
// seenGone records, by a read, what fell in the gap (counted in
// fallbacks). stop ends the watch.
func watchClaimDeletions(b *testing.B) (*claimDeletions, func()) {
	b.Helper()
	wc, err := client.NewWithWatch(env.Config, client.Options{Scheme: env.Scheme})
	if err != nil {
		b.Fatal(err)
	}
	d := &claimDeletions{m: map[types.UID]time.Time{}}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			w, err := wc.Watch(ctx, &hfv1.MachineClaimList{})
			if err != nil {
				time.Sleep(100 * time.Millisecond)
				continue
			}
			for ev := range w.ResultChan() {
				if ev.Type != watch.Deleted {
					continue
				}
				if c, ok := ev.Object.(*hfv1.MachineClaim); ok {
					d.mu.Lock()
					if _, seen := d.m[c.UID]; !seen {
						d.m[c.UID] = time.Now()
					}
					d.mu.Unlock()
				}
			}
			w.Stop()
			if ctx.Err() == nil {
				d.mu.Lock()
				d.reopened++
				d.mu.Unlock()
			}
		}
	}()
	return d, func() { cancel(); <-done }
}

// seenGone records the claim as deleted now if a read finds it gone and no
// watch event said so (a gap between two watches).
func (d *claimDeletions) seenGone(b *testing.B, c *hfv1.MachineClaim) {
	if _, ok := d.at(c.UID); ok {
		return
	}
	if _, err := getClaim(b, c); apierrors.IsNotFound(err) {
		d.mu.Lock()
		if _, seen := d.m[c.UID]; !seen {
			d.m[c.UID] = time.Now()
			d.fallbacks++
		}
		d.mu.Unlock()
	}
}

// waitNoClone waits until no clone runs on the simulator. The probes are
// paced by it: the simulated storage runs one clone at a time (as a
// Proxmox storage lock does), so probes sent faster than clones finish
// would fill the cluster's clone slots and time the clone queue, the
// throttle the user configured, instead of the operator's own latency.
func waitNoClone(b *testing.B, sim *simulator) {
	b.Helper()
	eventually(b, time.Minute, "no clone running", func() error {
		for _, vm := range sim.VMs() {
			if vm.Lock == "clone" {
				return fmt.Errorf("VM %d is being cloned", vm.VMID)
			}
		}
		return nil
	})
}

// claimWriteLatency reads the API server's own request latency histogram
// for MachineClaim writes (PATCH and UPDATE, main resource and status):
// cumulative counts by "verb subresource le".
func claimWriteLatency(b *testing.B) map[string]float64 {
	b.Helper()
	hc, err := rest.HTTPClientFor(env.Config)
	if err != nil {
		b.Fatal(err)
	}
	resp, err := hc.Get(strings.TrimSuffix(env.Config.Host, "/") + "/metrics")
	if err != nil {
		b.Fatal(err)
	}
	defer resp.Body.Close()
	var parser expfmt.TextParser
	families, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		b.Fatal(err)
	}
	out := map[string]float64{}
	fam := families["apiserver_request_duration_seconds"]
	if fam == nil {
		return out
	}
	for _, m := range fam.GetMetric() {
		l := map[string]string{}
		for _, lp := range m.GetLabel() {
			l[lp.GetName()] = lp.GetValue()
		}
		if l["resource"] != "machineclaims" || (l["verb"] != "PATCH" && l["verb"] != "UPDATE") {
			continue
		}
		for _, bk := range m.GetHistogram().GetBucket() {
			out[fmt.Sprintf("%s %s le=%g", l["verb"], l["subresource"], bk.GetUpperBound())] += float64(bk.GetCumulativeCount())
		}
	}
	return out
}

// logAPIServerLatency writes how the API server's MachineClaim write
// latency grew since before, to the trace file: it tells the API server's
// own time from the operator's.
func logAPIServerLatency(b *testing.B, before map[string]float64) {
	b.Helper()
	after := claimWriteLatency(b)
	keys := slices.Sorted(maps.Keys(after))
	f, err := os.OpenFile(os.Getenv("HF_BENCH_TRACE"), os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o600)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	for _, k := range keys {
		fmt.Fprintf(f, "apiserver_request_duration_seconds %s: %g\n", k, after[k]-before[k])
	}
}

package controller_test

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"
	crmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/manager"
	githubsim "github.com/hyperfleet/hyperfleet/internal/simulator/github"
	"github.com/hyperfleet/hyperfleet/internal/simulator/github/githubsimtest"
	proxmoxsim "github.com/hyperfleet/hyperfleet/internal/simulator/proxmox"
)

// BenchmarkOperator1000Claims measures the operator with 1,000 active
// claims over 10 HypervisorClusters (DESIGN.md targets):
//
//   - overhead-p50/p99-ms: a new claim created -> its clone request
//     reaching the hypervisor, with 1,000 claims active (target p99 <
//     100 ms);
//   - poweroff-p50/p99-s: a VM powering itself off -> VM destroyed and
//     claim gone, for 100 VMs powering off at once (target p99 < 10 s);
//   - webhook-clone-p50/p95/p99-ms: a job queued on GitHub (its
//     workflow_job webhook sent) -> the clone request of the VM its
//     RunnerPool creates for it, one job at a time (target p95 < 250 ms).
//
// Each cluster is its own simulator with short task latencies and the
// operator's default clone limits; the clusters poll every 5 s (the
// default) and the simulators refresh /cluster/resources every 2 s.
// Setup (1,000 VMs) is not timed. Run with -benchtime 1x.
//
// Investigation aids: HF_BENCH_SMALL=1 runs 2 clusters with one claim each;
// HF_BENCH_TRACE=<file> appends, for every probe slower than 200 ms, the
// simulator requests and the operator's log lines for that claim.
func BenchmarkOperator1000Claims(b *testing.B) {
	clusters, perCluster := 10, 100
	if os.Getenv("HF_BENCH_SMALL") != "" {
		// A quick variant for investigating the overhead path alone.
		clusters, perCluster = 2, 1
	}
	sims := make([]*simulator, clusters)
	for i := range sims {
		sims[i] = startSim(b, func(c *proxmoxsim.Config) {
			c.Nodes[0].Memory, c.Nodes[0].CPUs = 4<<40, 1024
			c.RefreshInterval = proxmoxsim.Duration(2 * time.Second)
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
	op := startOperator(b, operatorOptions{webhook: &manager.WebhookOptions{Addr: "127.0.0.1:0", CertFile: certFile, KeyFile: keyFile, Secret: []byte(poolWebhookSecret)}})
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
		var overhead []time.Duration
		for i := range 100 {
			sim := sims[i%clusters]
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
				if os.Getenv("HF_BENCH_TRACE") != "" && at.Sub(start) > 200*time.Millisecond {
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

		// Power-off: 10 VMs per cluster power off at once.
		type victim struct {
			claim *hfv1.MachineClaim
			off   time.Time
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
				if err := sims[ci].GuestPowerOff(int(c.Status.VMRef.VMID)); err != nil {
					b.Fatal(err)
				}
				victims = append(victims, victim{claim: c, off: time.Now()})
				n++
			}
		}
		var poweroff []time.Duration
		pending := victims
		eventually(b, 5*time.Minute, "powered-off claims gone", func() error {
			var still []victim
			for _, v := range pending {
				_, err := getClaim(b, v.claim)
				switch {
				case apierrors.IsNotFound(err):
					poweroff = append(poweroff, time.Since(v.off))
				case err != nil:
					return err
				default:
					still = append(still, v)
				}
			}
			pending = still
			if len(pending) > 0 {
				time.Sleep(100 * time.Millisecond)
				return fmt.Errorf("%d claims left", len(pending))
			}
			return nil
		})
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

//go:build chaos

package chaos

import (
	"context"
	"crypto/tls"
	"fmt"
	"net/http"
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/testworld/devenv"
)

// recorder keeps each claim's history as the watch saw it (phase,
// deletion, VM, the Provisioned and Ending reasons), the time of the last
// change of any claim, and the invariants' results.
type recorder struct {
	mu      sync.Mutex
	history map[string][]string // claim UID -> lines
	names   map[string]string   // claim UID -> namespace/name
	changes []time.Time         // every claim change seen, in order
	// checks counts how often each invariant was checked; violations
	// holds the first few violations of each.
	checks     map[string]int
	violations map[string][]string
	// created are the claims of overflowPool as they were first seen:
	// when, and the template each was built from.
	created []createdClaim
}

// createdClaim is a claim first seen at at, built from template.
type createdClaim struct {
	at       time.Time
	template string
}

func newRecorder() *recorder {
	return &recorder{history: map[string][]string{}, names: map[string]string{}, checks: map[string]int{}, violations: map[string][]string{}}
}

// watchClaims records every change of the claims until ctx ends, watching
// again after the API server's restarts.
func (r *recorder) watchClaims(ctx context.Context, w *devenv.World) {
	wc, err := client.NewWithWatch(w.API.Config, client.Options{Scheme: w.API.Scheme})
	if err != nil {
		r.violate("watch", err.Error())
		return
	}
	for ctx.Err() == nil {
		wt, err := wc.Watch(ctx, &hfv1.MachineClaimList{}, client.InNamespace(devenv.Namespace))
		if err != nil {
			time.Sleep(200 * time.Millisecond)
			continue
		}
		for ev := range wt.ResultChan() {
			c, ok := ev.Object.(*hfv1.MachineClaim)
			if !ok {
				continue
			}
			r.observe(ev.Type, c)
		}
		wt.Stop()
	}
}

// observe records one event about claim c.
func (r *recorder) observe(typ watch.EventType, c *hfv1.MachineClaim) {
	line := fmt.Sprintf("%s %s phase=%s", time.Now().Format("15:04:05.000"), typ, c.Status.Phase)
	if c.DeletionTimestamp != nil {
		line += " deleting"
	}
	if ref := c.Status.VMRef; ref != nil {
		line += fmt.Sprintf(" vm=%s/%s", ref.HypervisorCluster, ref.ID())
	}
	for _, cond := range c.Status.Conditions {
		if cond.Type == string(hfv1.MachineClaimProvisionedCondition) || cond.Status == "True" && cond.Type != "Ready" {
			line += fmt.Sprintf(" %s=%s/%s", cond.Type, cond.Status, cond.Reason)
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	uid := string(c.UID)
	if _, seen := r.names[uid]; !seen && c.Spec.RunnerPoolRef != nil && c.Spec.RunnerPoolRef.Name == overflowPool {
		r.created = append(r.created, createdClaim{at: time.Now(), template: c.Spec.TemplateRef.Name})
	}
	r.names[uid] = c.Namespace + "/" + c.Name
	if h := r.history[uid]; len(h) == 0 || !strings.HasSuffix(h[len(h)-1], line[len("15:04:05.000"):]) {
		if len(h) >= 200 {
			h = h[1:]
		}
		r.history[uid] = append(h, line)
		r.changes = append(r.changes, time.Now())
	}
}

// firstChangeAfter is the first claim change seen after t (zero if none).
func (r *recorder) firstChangeAfter(t time.Time) time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	i := sort.Search(len(r.changes), func(i int) bool { return r.changes[i].After(t) })
	if i == len(r.changes) {
		return time.Time{}
	}
	return r.changes[i]
}

// historyOf is the recorded history of the claim with uid, and the
// Kubernetes events about it.
func (r *recorder) historyOf(ctx context.Context, w *devenv.World, uid string) string {
	r.mu.Lock()
	name := r.names[uid]
	lines := slices.Clone(r.history[uid])
	r.mu.Unlock()
	var b strings.Builder
	fmt.Fprintf(&b, "history of claim %s (uid %s):\n  %s\n", name, uid, strings.Join(lines, "\n  "))
	var evs corev1.EventList
	if err := w.API.Client.List(ctx, &evs, client.InNamespace(devenv.Namespace)); err == nil {
		b.WriteString("  its events:\n")
		for _, e := range evs.Items {
			if string(e.InvolvedObject.UID) == uid {
				fmt.Fprintf(&b, "    %s %s %s: %s\n", e.LastTimestamp.Format("15:04:05"), e.Type, e.Reason, e.Message)
			}
		}
	}
	return b.String()
}

// check counts one check of invariant name; violation, when not empty,
// records it.
func (r *recorder) check(name, violation string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.checks[name]++
	if violation != "" && len(r.violations[name]) < 5 {
		r.violations[name] = append(r.violations[name], violation)
	}
}

func (r *recorder) violate(name, violation string) { r.check(name, violation) }

// uidInDescription finds the claim UID in a VM's ownership block.
var uidInDescription = regexp.MustCompile(`uid: ([0-9a-f-]{36})`)

// sampleVMs checks that no claim has two VMs on any cluster, and returns
// the VMs' owners (claim UID -> cluster/vmid of its VMs).
func (c *chaosWorld) sampleVMs(r *recorder) map[string][]string {
	owners := map[string][]string{}
	for name, sim := range c.sims {
		for _, vm := range sim.VMs() {
			if vm.Template {
				continue
			}
			if m := uidInDescription.FindStringSubmatch(vm.Description); m != nil {
				owners[m[1]] = append(owners[m[1]], fmt.Sprintf("%s/%d(%s)", name, vm.VMID, vm.Status))
			}
		}
	}
	violation := ""
	for uid, vms := range owners {
		if len(vms) > 1 {
			violation = fmt.Sprintf("claim %s has %d VMs: %v", uid, len(vms), vms)
			break
		}
	}
	r.check(invOneVM, violation)
	return owners
}

// The invariants.
const (
	invOneVM        = "never two VMs for one claim"
	invBusy         = "no runner removed while busy"
	invOnce         = "every job run exactly once, to success"
	invVMs          = "no VM leaked"
	invISOs         = "no ISO leaked"
	invIPs          = "no IP address leaked"
	invRunners      = "no runner leaked"
	invSPIRE        = "no SPIRE entry leaked"
	invConverged    = "pools back to their minimum within the bound"
	invWebhooksUp   = "the webhook receiver answers through leader failovers"
	invLeaderUnique = "at most one leader at a time"
	invOverflow     = "an overflowing pool spills to its next cluster during a partition and returns after it"
)

// invariantOrder is the report's order.
var invariantOrder = []string{invOneVM, invBusy, invLeaderUnique, invWebhooksUp, invOnce, invVMs, invISOs, invIPs, invRunners, invSPIRE, invConverged, invOverflow}

// busyRunners checks that no runner holding a job was removed before its
// job completed: prev are the busy runners of the last sample (runner id
// -> job id); it returns this sample's.
func (c *chaosWorld) busyRunners(r *recorder, prev map[int64]int64) map[int64]int64 {
	now := map[int64]int64{}
	removed := map[int64]bool{}
	for _, ru := range c.w.GitHub.AllRunners() {
		if ru.Removed {
			removed[ru.ID] = true
		} else if ru.Busy && ru.JobID != 0 {
			now[ru.ID] = ru.JobID
		}
	}
	violation := ""
	for id, job := range prev {
		if !removed[id] {
			continue
		}
		if j, ok := c.w.GitHub.Job(job); ok && j.Status != "completed" {
			violation = fmt.Sprintf("runner %d was removed while running job %d (status %s)", id, job, j.Status)
		}
	}
	r.check(invBusy, violation)
	return now
}

// prober calls the webhook receiver through its Service every 100 ms and
// keeps the times it did not answer.
type prober struct {
	mu     sync.Mutex
	failed []time.Time
	calls  int
}

func (p *prober) run(ctx context.Context, url string) {
	c := &http.Client{Timeout: time.Second, Transport: &http.Transport{
		// The receiver's certificate is the world's own; the probe only
		// asks whether anything answers.
		TLSClientConfig:   &tls.Config{InsecureSkipVerify: true}, //nolint:gosec // a liveness probe of a test server
		DisableKeepAlives: true,
	}}
	for ctx.Err() == nil {
		start := time.Now()
		res, err := c.Get(url)
		if err == nil {
			_ = res.Body.Close()
		}
		p.mu.Lock()
		p.calls++
		if err != nil {
			p.failed = append(p.failed, start)
		}
		p.mu.Unlock()
		time.Sleep(100 * time.Millisecond)
	}
}

// gap is the longest run of consecutive failed probes between from and to,
// as a duration (0 when every probe there was answered).
func (p *prober) gap(from, to time.Time) time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	var longest time.Duration
	var runStart, last time.Time
	for _, f := range p.failed {
		if f.Before(from) || f.After(to) {
			continue
		}
		if runStart.IsZero() || f.Sub(last) > 400*time.Millisecond {
			runStart = f
		}
		last = f
		if d := last.Sub(runStart) + 100*time.Millisecond; d > longest {
			longest = d
		}
	}
	return longest
}

// overflowFigures counts overflowPool's claims by where and when they
// were built: on its overflow template during cluster B's partition (its
// detection can lag the cut, so until the heal), and on its own template
// after the heal.
func (r *churn) overflowFigures() (spilled, returned, before int) {
	r.rec.mu.Lock()
	defer r.rec.mu.Unlock()
	for _, c := range r.rec.created {
		switch {
		case r.cutAt.IsZero() || c.at.Before(r.cutAt):
			before++
		case c.template == devenv.OverflowTemplate(overflowPool) && (r.healedAt.IsZero() || !c.at.After(r.healedAt)):
			spilled++
		case !r.healedAt.IsZero() && c.at.After(r.healedAt) && c.template == overflowPool:
			returned++
		}
	}
	return spilled, returned, before
}

// checkOverflow: while cluster B was partitioned overflowPool built VMs
// on cluster A, and after the heal on B again.
func (r *churn) checkOverflow() {
	spilled, returned, _ := r.overflowFigures()
	violation := ""
	switch {
	case r.cutAt.IsZero() || r.healedAt.IsZero():
		violation = "the run ended before the partition was healed"
	case spilled == 0:
		violation = fmt.Sprintf("no claim of %s was built from %s during the partition", overflowPool, devenv.OverflowTemplate(overflowPool))
	case returned == 0:
		violation = fmt.Sprintf("no claim of %s was built from its own template on %s after the partition", overflowPool, clusterB)
	}
	r.rec.check(invOverflow, violation)
}

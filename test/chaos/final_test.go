//go:build chaos

package chaos

import (
	"context"
	"fmt"
	"regexp"
	"testing"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
)

// webhookGapBound is the longest the webhook receiver may go without
// answering during a leader failover: the standby serves it throughout.
const webhookGapBound = 2 * time.Second

// allocated is the addresses the static pool's IPPool reports held.
func (c *chaosWorld) allocated(ctx context.Context) (int64, error) {
	var pool hfv1.IPPool
	if err := c.w.API.Client.Get(ctx, client.ObjectKey{Name: staticPool}, &pool); err != nil {
		return 0, fmt.Errorf("read IPPool %s: %w", staticPool, err)
	}
	return pool.Status.Allocated, nil
}

// finalChecks checks, after the run converged (or did not), that every
// job ran exactly once to success, that nothing leaked, and that the
// webhook receiver answered through each leader failover; a failed
// invariant prints the history of the claims concerned.
func (r *churn) finalChecks(ctx context.Context, t *testing.T) {
	c := r.c
	for i := range r.failovers {
		f := &r.failovers[i]
		f.webhooks = r.probe.gap(f.killed, f.killed.Add(time.Minute))
		if next := r.rec.firstChangeAfter(f.killed.Add(f.takeover)); !next.IsZero() {
			f.controllers = next.Sub(f.killed)
		}
		v := ""
		if f.webhooks > webhookGapBound {
			v = fmt.Sprintf("the receiver did not answer for %s after the leader kill at %s", f.webhooks, f.killed.Format("15:04:05"))
		}
		r.rec.check(invWebhooksUp, v)
	}
	// Every job once, to success.
	runs, twice := 0, ""
	for _, ru := range c.w.GitHub.AllRunners() {
		runs += ru.JobsRun
		if ru.JobsRun > 1 {
			twice = fmt.Sprintf("runner %s ran %d jobs", ru.Name, ru.JobsRun)
		}
	}
	v := twice
	for _, ids := range r.jobs {
		for _, id := range ids {
			j, ok := c.w.GitHub.Job(id)
			if !ok || j.Status != "completed" || j.Conclusion != "success" {
				v = fmt.Sprintf("job %d: %s/%s on runner %q", id, j.Status, j.Conclusion, j.RunnerName)
			}
		}
	}
	if v == "" && runs != r.total {
		v = fmt.Sprintf("runners started %d jobs for %d queued", runs, r.total)
	}
	r.rec.check(invOnce, v)

	s, err := r.snapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	live := map[string]bool{}
	var claims hfv1.MachineClaimList
	if err := c.w.API.Client.List(ctx, &claims); err != nil {
		t.Fatal(err)
	}
	for _, cl := range claims.Items {
		live[string(cl.UID)] = true
	}
	owners := c.sampleVMs(r.rec)
	v = ""
	if s.vms != s.min {
		v = fmt.Sprintf("%d VMs for a minimum of %d", s.vms, s.min)
	}
	for uid, vms := range owners {
		if !live[uid] {
			v = fmt.Sprintf("VM %v of claim %s, which is gone", vms, uid)
		}
	}
	r.rec.check(invVMs, v)
	v = ""
	if s.isos > s.vms {
		v = fmt.Sprintf("%d seed ISOs for %d VMs", s.isos, s.vms)
	}
	r.rec.check(invISOs, v)
	v = ""
	if s.allocated != s.staticClaims {
		v = fmt.Sprintf("IPPool %s holds %d addresses for %d claims", staticPool, s.allocated, s.staticClaims)
	}
	r.rec.check(invIPs, v)
	v = ""
	if s.runners != len(s.claims) {
		v = fmt.Sprintf("%d runners registered for %d claims", s.runners, len(s.claims))
	}
	r.rec.check(invRunners, v)
	left, err := c.w.SPIRELeftovers(ctx)
	v = ""
	if err != nil {
		v = err.Error()
	} else if len(left) > 0 {
		v = fmt.Sprintf("left on the SPIRE server: %v", left)
	}
	r.rec.check(invSPIRE, v)
	v = ""
	if r.converged == 0 || r.converged > convergenceBound {
		v = fmt.Sprintf("not back to the minimum within %s of the last fault: %s", convergenceBound, r.status(ctx))
	}
	r.rec.check(invConverged, v)
	// The histories of the claims a violation names.
	for _, vs := range r.rec.violations {
		for _, violation := range vs {
			for _, uid := range uuid.FindAllString(violation, 3) {
				t.Log(r.rec.historyOf(ctx, c.w, uid))
			}
		}
	}
}

var uuid = regexp.MustCompile(`[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}`)

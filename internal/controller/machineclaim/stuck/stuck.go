// Package stuck detects MachineClaims that stay in a phase longer than the
// manager's bound for it (Check, whose verdict the claim's status turns
// into its Stuck condition), and reports them: one warning event per stay,
// and the hyperfleet_claims_stuck gauge (docs/operations.md). It reads
// only the claim's status and writes none of it.
package stuck

import (
	"context"
	"fmt"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"
	ctrl "sigs.k8s.io/controller-runtime"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/conditions"
	"github.com/hyperfleet/hyperfleet/internal/metrics"
)

// Bounds are how long a claim may stay in each phase before it is
// reported Stuck (condition, event, hyperfleet_claims_stuck). Zero turns
// the check off for that phase. Ready, Failed and Finished have none:
// waiting there is what those phases are for, and the RunnerPool's
// lifecycle limits bound them.
type Bounds struct {
	Pending, Provisioning, Bootstrapping, Draining, Terminating time.Duration
}

// DefaultBounds are the manager's defaults (docs/operations.md). They sit
// above what each phase takes when it works: Pending covers a wait for
// capacity behind a burst; Provisioning a wait for a clone slot (the VM id
// is reserved by then) and a full clone of a large disk;
// Bootstrapping the pool's default bootstrapTimeout (10m) plus margin;
// Draining the default jobTimeout (3h) plus margin; Terminating a stop and
// a destroy.
func DefaultBounds() Bounds {
	return Bounds{
		Pending:       15 * time.Minute,
		Provisioning:  30 * time.Minute,
		Bootstrapping: 15 * time.Minute,
		Draining:      4 * time.Hour,
		Terminating:   15 * time.Minute,
	}
}

// Bound is the limit of phase; zero when it has none.
func (b Bounds) Bound(phase hfv1.MachineClaimPhase) time.Duration {
	switch phase {
	case hfv1.MachineClaimPending:
		return b.Pending
	case hfv1.MachineClaimProvisioning:
		return b.Provisioning
	case hfv1.MachineClaimBootstrapping:
		return b.Bootstrapping
	case hfv1.MachineClaimDraining:
		return b.Draining
	case hfv1.MachineClaimTerminating:
		return b.Terminating
	}
	return 0
}

// Verdict is one claim's check.
type Verdict struct {
	Stuck bool
	// Since is when the claim entered its phase; Wake is how long until
	// it would become stuck (zero when stuck or without a bound).
	Since time.Time
	Wake  time.Duration
}

// Check decides from status.phaseTimes whether claim overstayed its phase
// at now.
func Check(claim *hfv1.MachineClaim, phase hfv1.MachineClaimPhase, bounds Bounds, now time.Time) Verdict {
	limit := bounds.Bound(phase)
	pt := claim.Status.PhaseTimes
	if limit <= 0 || pt == nil {
		return Verdict{}
	}
	entered := PhaseTime(pt, phase)
	if entered == nil || *entered == nil {
		return Verdict{}
	}
	since := (*entered).Time
	if left := since.Add(limit).Sub(now); left > 0 {
		return Verdict{Since: since, Wake: left}
	}
	return Verdict{Stuck: true, Since: since}
}

// WaitingOn says what a claim waits for: its hypervisor task (task, ""
// without one: the claim's status does not record it) and the condition
// that explains its phase.
func WaitingOn(claim *hfv1.MachineClaim, phase hfv1.MachineClaimPhase, task string) string {
	out := task
	cond := hfv1.MachineClaimProvisionedCondition
	if phase != hfv1.MachineClaimPending && phase != hfv1.MachineClaimProvisioning {
		cond = hfv1.ReadyCondition
	}
	if c := meta.FindStatusCondition(claim.Status.Conditions, string(cond)); c != nil && c.Status != metav1.ConditionTrue {
		if out != "" {
			out += "; "
		}
		out += fmt.Sprintf("%s=%s %s: %s", c.Type, c.Status, c.Reason, conditions.Truncate(c.Message, 500))
	}
	if out == "" {
		return "nothing the operator recorded"
	}
	return out
}

// Detector reports the stuck claims of one controller and counts them by
// phase for hyperfleet_claims_stuck (bounded: one series per phase, never
// per claim). Its zero value checks nothing until Bounds are set.
type Detector struct {
	Bounds   Bounds
	Recorder record.EventRecorder

	mu sync.Mutex
	m  map[types.NamespacedName]hfv1.MachineClaimPhase
}

// Set records the claim's phase when stuck (or forgets it) and refreshes
// the gauge of the phases involved.
func (d *Detector) Set(key types.NamespacedName, phase hfv1.MachineClaimPhase, stuck bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.m == nil {
		d.m = map[types.NamespacedName]hfv1.MachineClaimPhase{}
	}
	old, had := d.m[key]
	switch {
	case stuck && had && old == phase, !stuck && !had:
		return
	case stuck:
		d.m[key] = phase
	default:
		delete(d.m, key)
	}
	counts := map[hfv1.MachineClaimPhase]int{}
	for _, p := range d.m {
		counts[p]++
	}
	for _, p := range []hfv1.MachineClaimPhase{old, phase} {
		if p != "" {
			metrics.ClaimsStuck.WithLabelValues(string(p)).Set(float64(counts[p]))
		}
	}
}

// Forget drops a claim that is gone.
func (d *Detector) Forget(key types.NamespacedName) { d.Set(key, "", false) }

// Reset forgets every stuck claim and sets the gauge of each phase with a
// bound to zero: the series exist (a dashboard shows none stuck, an alert
// has something to compare) before the first claim gets stuck.
func (d *Detector) Reset() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.m = nil
	for _, p := range []hfv1.MachineClaimPhase{hfv1.MachineClaimPending, hfv1.MachineClaimProvisioning, hfv1.MachineClaimBootstrapping,
		hfv1.MachineClaimDraining, hfv1.MachineClaimTerminating} {
		if d.Bounds.Bound(p) > 0 {
			metrics.ClaimsStuck.WithLabelValues(string(p)).Set(0)
		}
	}
}

// Report reports a claim after a reconcile, from the verdict on its
// phase: it counts the claim in hyperfleet_claims_stuck, records the
// warning event (and a log line) when the claim became stuck this pass
// (nowStuck, the Stuck condition's message, "" otherwise), and asks for a
// reconcile when the claim would become stuck, so that a claim nothing
// else wakes is still reported. A Finished claim is forgotten. It changes
// nothing in the claim: its Stuck condition is set with its other
// conditions (internal/controller/machineclaim's status.go).
func (d *Detector) Report(ctx context.Context, claim *hfv1.MachineClaim, phase hfv1.MachineClaimPhase, v Verdict, nowStuck string, res ctrl.Result) ctrl.Result {
	key := types.NamespacedName{Namespace: claim.Namespace, Name: claim.Name}
	if phase == hfv1.MachineClaimFinished {
		d.Forget(key)
		return res
	}
	d.Set(key, phase, v.Stuck)
	if nowStuck != "" {
		d.Recorder.Event(claim, corev1.EventTypeWarning, string(hfv1.MachineClaimStuckCondition), nowStuck)
		ctrl.LoggerFrom(ctx).Info("MachineClaim is stuck", "phase", phase, "since", v.Since, "message", nowStuck)
	}
	if v.Wake > 0 && (res.RequeueAfter == 0 || v.Wake < res.RequeueAfter) {
		res.RequeueAfter = v.Wake
	}
	return res
}

// PhaseTime returns the pointer in t that records when phase began.
func PhaseTime(t *hfv1.PhaseTimes, phase hfv1.MachineClaimPhase) **metav1.Time {
	switch phase {
	case hfv1.MachineClaimPending:
		return &t.Pending
	case hfv1.MachineClaimProvisioning:
		return &t.Provisioning
	case hfv1.MachineClaimStandby:
		return &t.Standby
	case hfv1.MachineClaimBootstrapping:
		return &t.Bootstrapping
	case hfv1.MachineClaimReady:
		return &t.Ready
	case hfv1.MachineClaimDraining:
		return &t.Draining
	case hfv1.MachineClaimTerminating:
		return &t.Terminating
	case hfv1.MachineClaimFailed:
		return &t.Failed
	case hfv1.MachineClaimFinished:
		return &t.Finished
	}
	return nil
}

package controller

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/conditions"
	"github.com/hyperfleet/hyperfleet/internal/controller/machineclaim"
	"github.com/hyperfleet/hyperfleet/internal/metrics"
	"github.com/hyperfleet/hyperfleet/internal/scaling"
)

// The pool's standby tier (spec.standby, docs/runnerpool.md "Standby"):
// claims whose VMs are built, booted and suspended to disk with no
// credential (machineclaim/standby.go), counted apart from the pool's
// runners. scaling.Plan decides how many the demand takes (after the warm
// VMs, before new ones), how many are refilled behind it, and which go for
// drift, age or a smaller tier; this file applies that.

// defaultStandbyMaxAge is spec.standby.maxAge's default (the CRD's).
const defaultStandbyMaxAge = 24 * time.Hour

// standbyTier is the pool's standby claims sorted for the decision:
// ready ones (oldest suspend first: taken first, before they expire),
// those still being built, booted or suspended, and those to replace for
// drift (any stage) or age (ready ones past maxAge; stale wins).
type standbyTier struct {
	ready, building, stale, expired []*hfv1.MachineClaim
	// nextExpiry is when the first ready claim reaches maxAge; zero when
	// none is ready.
	nextExpiry time.Time
}

// standbyTier sorts the pool's standby claims, and sets the tier's size
// now (spec.standby.size raised by the open schedule windows).
func (s *poolScope) standbyTier() standbyTier {
	var t standbyTier
	base, maxAge := int32(0), defaultStandbyMaxAge
	if sb := s.pool.Spec.Standby; sb != nil {
		base = sb.Size
		if sb.MaxAge != nil {
			maxAge = sb.MaxAge.Duration
		}
	}
	s.standbySize = s.sched.StandbySize(base)
	if why := standbyUnsupported(s.tmpl); why != "" && s.standbySize > 0 {
		s.standbyRefused, s.standbySize = why, 0
	}
	pc := s.claims
	for _, c := range pc.StandbyBuilding {
		if pc.Stale[c.UID] {
			t.stale = append(t.stale, c)
		} else {
			t.building = append(t.building, c)
		}
	}
	for _, c := range pc.StandbyReady {
		expiry := c.Status.Standby.SuspendedAt.Add(maxAge)
		switch {
		case pc.Stale[c.UID]:
			t.stale = append(t.stale, c)
		case !s.now.Before(expiry):
			t.expired = append(t.expired, c)
		default:
			t.ready = append(t.ready, c)
			if t.nextExpiry.IsZero() || expiry.Before(t.nextExpiry) {
				t.nextExpiry = expiry
			}
		}
	}
	return t
}

// standbyUnsupported says why the VMs of tmpl cannot stand by; empty when
// they can. A VM that attests with SPIRE gets its join token (or its TPM
// enrollment) issued with its build, for its build: standing by for hours,
// the token would expire before the VM's agent presents it, and a token
// kept valid that long would be a secret waiting on the SPIRE server for
// as long. Such templates keep warm and cold VMs only, for now.
func standbyUnsupported(tmpl *hfv1.HypervisorMachineTemplate) string {
	if tmpl == nil || !machineclaim.Attests(tmpl) {
		return ""
	}
	return fmt.Sprintf("template %s attests its VMs with SPIRE (spec.attestation.method %s), whose join token or TPM enrollment is issued with the VM's build and cannot wait in a standby tier; the pool keeps no standby VMs: remove spec.standby, or use a template that does not attest",
		tmpl.Name, tmpl.Spec.Attestation.Method)
}

// applyStandby ends the standby claims the decision removes and takes
// ready ones for the demand (activate), with the same gates as new
// claims: a pool whose scope is not verified or whose job feed is blocked
// takes none. The refill is created with the pass's other claims
// (scale).
func (r *RunnerPoolReconciler) applyStandby(ctx context.Context, s *poolScope, t standbyTier, d scaling.Decision) error {
	for _, c := range t.stale[:d.RemoveStaleStandby] {
		msg := fmt.Sprintf("a standby VM built from template hash %s; the template is now %s", shortHash(c.Status.TemplateHash), shortHash(s.templateHash(c)))
		if err := r.endClaim(ctx, s, c, scaling.DriftReplaced, msg, false); err != nil {
			return err
		}
	}
	for _, c := range t.expired[:d.RemoveExpiredStandby] {
		msg := fmt.Sprintf("stood by, suspended, since %s: spec.standby.maxAge reached", c.Status.Standby.SuspendedAt.UTC().Format(time.RFC3339))
		if err := r.endClaim(ctx, s, c, scaling.StandbyExpired, msg, false); err != nil {
			return err
		}
	}
	activate := t.ready[:d.Activate]
	for _, c := range t.ready[d.Activate : d.Activate+d.RemoveSurplusStandby] {
		msg := fmt.Sprintf("the standby tier is above its size (%d)", s.standbySize)
		if err := r.endClaim(ctx, s, c, scaling.ScaledDown, msg, false); err != nil {
			return err
		}
	}
	if !s.scopeVerified || s.feedBlocked != "" {
		return nil
	}
	for _, c := range activate {
		if err := r.activate(ctx, s, c); err != nil {
			return err
		}
	}
	return nil
}

// activate takes a ready standby claim for the pool's demand: its
// spec.standby is cleared, against the claim as the pool saw it (an
// optimistic lock: a claim changed since is left alone, and the next pass
// looks again), and its controller resumes the VM. The activation is
// remembered until the cache shows it (poolclaims.Expectations), so that a
// pass on a cache that lags does not take a second VM for the same job.
func (r *RunnerPoolReconciler) activate(ctx context.Context, s *poolScope, c *hfv1.MachineClaim) error {
	updated := c.DeepCopy()
	updated.Spec.Standby = false
	err := r.Client.Patch(ctx, updated, client.MergeFromWithOptions(c, client.MergeFromWithOptimisticLock{}))
	switch {
	case err == nil:
	case apierrors.IsConflict(err), apierrors.IsNotFound(err), apierrors.IsInvalid(err):
		ctrl.LoggerFrom(ctx).V(1).Info("Did not take a standby VM: the claim changed or went since the pool read it", "MachineClaim", klog.KObj(c), "err", err.Error())
		return nil
	default:
		return fmt.Errorf("take standby MachineClaim %s for a job: %w", c.Name, err)
	}
	r.expect.Activated(client.ObjectKeyFromObject(s.pool), c.UID, r.Clock.Now())
	s.activated++
	metrics.PoolScalingActions.WithLabelValues(s.pool.Namespace, s.pool.Name, "activate", "").Inc()
	ctrl.LoggerFrom(ctx).Info("Took a standby VM for the pool's demand", "MachineClaim", klog.KObj(c),
		"suspendedAt", c.Status.Standby.SuspendedAt.UTC().Format(time.RFC3339))
	return nil
}

// setStandbyStatus sets status.standby and the tier's metrics, and an
// event when the decision left the tier short for want of room.
func (r *RunnerPoolReconciler) setStandbyStatus(s *poolScope) {
	pool, d := s.pool, s.decision
	ns, name := pool.Namespace, pool.Name
	resuming := 0
	for _, c := range s.claims.Starting {
		if st := c.Status.Standby; st != nil && !s.ended[c.UID] {
			resuming++
		}
	}
	resuming += s.activated
	ready := len(s.tier.ready) - s.activated - d.RemoveSurplusStandby
	refilling := len(s.tier.building) + s.createdStandby
	metrics.PoolStandbySize.WithLabelValues(ns, name).Set(float64(s.standbySize))
	for state, n := range map[string]int{"ready": ready, "refilling": refilling, "resuming": resuming} {
		metrics.PoolStandby.WithLabelValues(ns, name, state).Set(float64(n))
	}
	st := &pool.Status
	switch {
	case s.standbyRefused != "":
		if old := hfv1.FindCondition(st.Conditions, hfv1.RunnerPoolStandbyCondition); old == nil || old.Reason != string(hfv1.StandbyUnsupportedReason) {
			r.Recorder.Event(pool, corev1.EventTypeWarning, string(hfv1.StandbyUnsupportedReason), s.standbyRefused)
		}
		conditions.Set(&st.Conditions, pool.Generation, hfv1.RunnerPoolStandbyCondition, metav1.ConditionFalse, hfv1.StandbyUnsupportedReason, s.standbyRefused)
	case pool.Spec.Standby != nil || s.standbySize > 0:
		conditions.Set(&st.Conditions, pool.Generation, hfv1.RunnerPoolStandbyCondition, metav1.ConditionTrue, hfv1.ReadyReason,
			fmt.Sprintf("Standby tier of %d: %d ready, %d refilling, %d resuming", s.standbySize, ready, refilling, resuming))
	default:
		meta.RemoveStatusCondition(&st.Conditions, string(hfv1.RunnerPoolStandbyCondition))
	}
	if s.standbySize == 0 && ready+refilling+resuming == 0 {
		pool.Status.Standby = nil
		return
	}
	pool.Status.Standby = &hfv1.PoolStandbyStatus{Size: s.standbySize, Ready: int32(ready), Refilling: int32(refilling), Resuming: int32(resuming)}
	short := int(s.standbySize) - ready - refilling
	if short <= 0 {
		return
	}
	// One event when the tier falls short for want of room, not one a
	// pass: an event is a write.
	was := s.read.Status.Standby
	wasShort := was != nil && was.Ready+was.Refilling < was.Size
	cause := ""
	switch {
	case d.StandbyLimit == scaling.AtMaxReplicas:
		cause = "max_replicas"
		if wasShort {
			break
		}
		r.Recorder.Eventf(pool, corev1.EventTypeWarning, string(hfv1.StandbyNotRefilledReason),
			"The standby tier is %d VMs short of its size (%d): spec.scaling.maxReplicas (%d) leaves no room beside the pool's runners; raise maxReplicas or lower standby.size",
			short, s.standbySize, pool.Spec.Scaling.MaxReplicas)
	case d.CreateStandby > s.createdStandby:
		// Room, but no new VMs now: the pool's Ready and
		// CapacityAvailable conditions say why.
		cause = "blocked"
	}
	if cause != "" {
		metrics.StandbyRefillShort.WithLabelValues(ns, name, cause).Inc()
	}
}

package controller

import (
	"cmp"
	"context"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/conditions"
	"github.com/hyperfleet/hyperfleet/internal/feeds"
	"github.com/hyperfleet/hyperfleet/internal/phase"
	"github.com/hyperfleet/hyperfleet/pkg/workload"
)

// FeedListeners runs the job feed listeners of pools that name a feed
// (spec.workload.github.scaleSet), on the leader: internal/feeds.Listeners.
type FeedListeners interface {
	Ensure(cfg feeds.Config) bool
	Stop(pool types.NamespacedName)
	State(pool types.NamespacedName) (feeds.State, bool)
}

// listenerRecheck is how often a listening pool's status takes the
// listener's latest counts; changes of the listener's phase wake the pool
// at once.
const listenerRecheck = 30 * time.Second

// ensureListener keeps the pool's feed listener running while the pool may
// listen, and reports it (condition Listening, status.scaleSet). A pool
// listens once its scope is verified, when no older pool names the same
// feed, and when its feed works with its template; otherwise its listener
// is stopped, and a pool whose feed cannot work builds no VMs
// (s.feedBlocked): its VMs would be runners of a feed nobody listens to.
func (r *RunnerPoolReconciler) ensureListener(ctx context.Context, s *poolScope) (phase.Result, error) {
	pool := s.pool
	key := types.NamespacedName{Namespace: pool.Namespace, Name: pool.Name}
	st := &pool.Status
	be, ps, ok := r.Workloads.Pool(pool, s.tmpl)
	if !ok || ps.Feed == nil {
		if r.Feeds != nil {
			r.Feeds.Stop(key)
		}
		meta.RemoveStatusCondition(&st.Conditions, string(hfv1.RunnerPoolListeningCondition))
		st.ScaleSet = nil
		return phase.Next(), nil
	}
	if st.ScaleSet == nil || st.ScaleSet.Name != ps.Feed.Name {
		st.ScaleSet = &hfv1.ScaleSetStatus{Name: ps.Feed.Name}
	}
	stopped := func(reason hfv1.ConditionReason, msg string, blocks bool) (phase.Result, error) {
		if r.Feeds != nil {
			r.Feeds.Stop(key)
		}
		st.ScaleSet.ListeningSince = nil
		if blocks {
			s.feedBlocked, s.feedBlockedReason = msg, reason
		}
		r.setListening(s, metav1.ConditionFalse, reason, msg)
		return phase.Next(), nil
	}
	switch {
	case s.refused != nil:
		return stopped(s.refused.Reason, "No listener: "+s.refused.Message, false)
	case s.mismatch != "":
		return stopped(hfv1.InvalidSpecReason, "No listener: "+s.mismatch, false)
	case ps.FeedRefusal != "":
		return stopped(hfv1.InvalidSpecReason, ps.FeedRefusal, true)
	case r.Feeds == nil || r.Providers == nil:
		return stopped(hfv1.ListenerFailedReason, ps.FeedField+": this manager runs no runner scale-set listeners; the pool's jobs come from webhooks and the resync only", true)
	case s.tmpl == nil || !s.scopeVerified:
		return stopped(hfv1.ScopeNotVerifiedReason, fmt.Sprintf("The scale set %s is opened once the pool's scope is verified (condition ScopeVerified)", ps.Feed.Name), false)
	}
	if other, err := r.olderFeedUser(ctx, pool, ps); err != nil {
		return phase.Stop(), err
	} else if other != "" {
		return stopped(hfv1.ScaleSetInUseReason, fmt.Sprintf("%s: RunnerPool %s, older than this one, names the same scale set %s in %s (runner group %s); "+
			"a scale set has one listener: give this pool another scale set name", ps.FeedField, other, ps.Feed.Name, ps.Scope, cmp.Or(ps.Feed.Group, "Default")), true)
	}
	t, _ := be.Template(s.tmpl)
	feed, poolCopy, tmplCopy := *ps.Feed, pool.DeepCopy(), s.tmpl.DeepCopy()
	cfg := feeds.Config{
		Pool:     key,
		Host:     ps.Scope.Host,
		Key:      fmt.Sprintf("%s|%s|%s|%s|%s|%s", ps.Scope, t.CredentialsKey, s.tmpl.Name, feed.Name, feed.Group, strings.Join(feed.Labels, ",")),
		Capacity: int(pool.Spec.Scaling.MaxReplicas),
		Open: func(ctx context.Context) (workload.Feed, error) {
			p, _, err := r.Providers.PoolProvider(ctx, poolCopy, tmplCopy)
			if err != nil {
				return nil, err
			}
			fp, ok := p.(workload.FeedProvider)
			if !ok {
				return nil, fmt.Errorf("%s: the %s back-end has no job feeds: %w", ps.FeedField, be.Name(), workload.ErrInvalidRequest)
			}
			return fp.OpenFeed(ctx, feed)
		},
	}
	if !r.Feeds.Ensure(cfg) {
		// The listeners start with the leadership, beside this
		// controller: try again in a moment.
		r.setListening(s, metav1.ConditionFalse, hfv1.ListenerStartingReason, fmt.Sprintf("Waiting for the scale-set listeners to start to listen to %s", feed.Name))
		return phase.Recheck(time.Second), nil
	}
	state, _ := r.Feeds.State(key)
	r.reportListener(s, ps, state)
	return phase.Recheck(listenerRecheck), nil
}

// reportListener turns the listener's state into the pool's Listening
// condition and status.scaleSet, with an event when it stops working or
// works again.
func (r *RunnerPoolReconciler) reportListener(s *poolScope, ps workload.Pool, state feeds.State) {
	ss := s.pool.Status.ScaleSet
	ss.ID = state.FeedID
	ss.ListeningSince, ss.LastMessageTime = timeOrNil(state.Since), timeOrNil(state.LastEvent)
	if st := state.Statistics; st != nil {
		ss.AssignedJobs, ss.RunningJobs, ss.RegisteredRunners = int32(st.Assigned), int32(st.Running), int32(st.Runners)
	}
	group := cmp.Or(ps.Feed.Group, "Default")
	retry := ""
	if !state.RetryAt.IsZero() {
		retry = "; trying again at " + state.RetryAt.UTC().Format(time.RFC3339)
	}
	errText := ""
	if state.Err != nil {
		errText = state.Err.Error()
	}
	switch state.Phase {
	case feeds.Listening:
		r.setListening(s, metav1.ConditionTrue, hfv1.ListeningReason, fmt.Sprintf("Listening to runner scale set %s (id %d) of %s, runner group %s: its jobs reach the pool without a webhook", ps.Feed.Name, state.FeedID, ps.Scope, group))
	case feeds.Refused:
		s.feedBlocked = fmt.Sprintf("the scale set %s was refused: %s", ps.Feed.Name, errText)
		s.feedBlockedReason = hfv1.ScaleSetRefusedReason
		r.setListening(s, metav1.ConditionFalse, hfv1.ScaleSetRefusedReason, fmt.Sprintf("%s: GitHub refused to create or adopt scale set %s in runner group %s of %s: %s. "+
			"Check that the runner group exists, that no scale set of that name is in another group, and that the template's credentials may manage runners there%s",
			ps.FeedField, ps.Feed.Name, group, ps.Scope, errText, retry))
	case feeds.Conflict:
		r.setListening(s, metav1.ConditionFalse, hfv1.SessionConflictReason, fmt.Sprintf("Another listener holds the message session of scale set %s (another install, or a previous leader whose session has not expired yet): %s%s",
			ps.Feed.Name, errText, retry))
	case feeds.Failed:
		r.setListening(s, metav1.ConditionFalse, hfv1.ListenerFailedReason, fmt.Sprintf("The listener of scale set %s stopped: %s%s; the pool's jobs come from webhooks and the resync meanwhile", ps.Feed.Name, errText, retry))
	default:
		r.setListening(s, metav1.ConditionFalse, hfv1.ListenerStartingReason, fmt.Sprintf("Opening runner scale set %s in runner group %s of %s", ps.Feed.Name, group, ps.Scope))
	}
}

// setListening sets the Listening condition, with an event when it turns
// False for another reason than starting, or True again.
func (r *RunnerPoolReconciler) setListening(s *poolScope, status metav1.ConditionStatus, reason hfv1.ConditionReason, msg string) {
	pool := s.pool
	old := hfv1.FindCondition(pool.Status.Conditions, hfv1.RunnerPoolListeningCondition)
	changed := old == nil || old.Status != status || old.Reason != string(reason)
	switch {
	case changed && status == metav1.ConditionTrue:
		r.Recorder.Event(pool, corev1.EventTypeNormal, string(reason), msg)
	case changed && reason != hfv1.ListenerStartingReason && reason != hfv1.ScopeNotVerifiedReason:
		r.Recorder.Event(pool, corev1.EventTypeWarning, string(reason), msg)
	}
	conditions.Set(&pool.Status.Conditions, pool.Generation, hfv1.RunnerPoolListeningCondition, status, reason, msg)
}

// olderFeedUser names the oldest other RunnerPool that names the same feed
// of the same scope (by creation, then namespace and name), when it is
// older than pool; empty when pool is the oldest.
func (r *RunnerPoolReconciler) olderFeedUser(ctx context.Context, pool *hfv1.RunnerPool, ps workload.Pool) (string, error) {
	var pools hfv1.RunnerPoolList
	if err := r.Client.List(ctx, &pools); err != nil {
		return "", fmt.Errorf("list RunnerPools for their scale sets: %w", err)
	}
	same := func(other *hfv1.RunnerPool) bool {
		if other.UID == pool.UID || !other.DeletionTimestamp.IsZero() || other.Spec.Workload.Type != pool.Spec.Workload.Type {
			return false
		}
		var tmpl hfv1.HypervisorMachineTemplate
		if err := r.Client.Get(ctx, client.ObjectKey{Namespace: other.Namespace, Name: other.Spec.TemplateRef.Name}, &tmpl); err != nil {
			return false
		}
		_, ops, ok := r.Workloads.Pool(other, &tmpl)
		return ok && ops.Feed != nil && strings.EqualFold(ops.Scope.String(), ps.Scope.String()) &&
			strings.EqualFold(ops.Feed.Name, ps.Feed.Name) && strings.EqualFold(cmp.Or(ops.Feed.Group, "Default"), cmp.Or(ps.Feed.Group, "Default"))
	}
	older := func(a, b *hfv1.RunnerPool) bool {
		if !a.CreationTimestamp.Equal(&b.CreationTimestamp) {
			return a.CreationTimestamp.Before(&b.CreationTimestamp)
		}
		return a.Namespace+"/"+a.Name < b.Namespace+"/"+b.Name
	}
	for i := range pools.Items {
		if other := &pools.Items[i]; same(other) && older(other, pool) {
			return other.Namespace + "/" + other.Name, nil
		}
	}
	return "", nil
}

func timeOrNil(t time.Time) *metav1.Time {
	if t.IsZero() {
		return nil
	}
	return &metav1.Time{Time: t}
}

package controller

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/conditions"
	"github.com/hyperfleet/hyperfleet/internal/phase"
)

// WebhookSecrets says how the webhook receiver verifies deliveries about
// an owner with the secrets it holds now (the manager's webhook Secret).
type WebhookSecrets interface {
	// WebhookSecretOf is how deliveries of platform from API host
	// (workload.Scope.Host) about owner are verified; false when the
	// receiver takes no webhooks of platform from host.
	WebhookSecretOf(platform hfv1.WorkloadType, host, owner string) (WebhookSecretUse, bool)
}

// WebhookSecretUse is how the deliveries about one owner are verified.
type WebhookSecretUse struct {
	// Loaded is false while the receiver holds no valid secrets (its
	// Secret does not exist yet): there is nothing to say.
	Loaded bool
	// Own: the owner has its own key. Shared: its deliveries verify with
	// the fallback secret. Neither: they are refused.
	Own, Shared bool
	// Source names where the secrets are, such as "Secret ns/name";
	// OwnKey and SharedKey are the owner's key there and the fallback's.
	Source, OwnKey, SharedKey string
}

// reportWebhookSecret sets the pool's WebhookSecretShared condition: which
// secret verifies the webhook deliveries about its owner. The shared
// fallback lets every owner whose webhook uses it sign deliveries about
// this one's jobs, so their in_progress and completed events cost a GitHub
// call each to confirm; a platform engineer must see which owners still
// depend on it. A pool without a scope, or whose platform's webhooks are
// not received, has no such condition.
func (r *RunnerPoolReconciler) reportWebhookSecret(_ context.Context, s *poolScope) (phase.Result, error) {
	pool := s.pool
	conds := &pool.Status.Conditions
	use, ok := r.webhookSecretOf(s)
	if !ok || !use.Loaded {
		meta.RemoveStatusCondition(conds, string(hfv1.RunnerPoolWebhookSecretSharedCondition))
		return phase.Next(), nil
	}
	_, ps, _ := r.Workloads.Pool(pool, s.tmpl)
	owner := ps.Scope.Owner
	status, reason := metav1.ConditionFalse, hfv1.OwnWebhookSecretReason
	msg := fmt.Sprintf("Webhook deliveries about %s are verified with its own key %s of %s", owner, use.OwnKey, use.Source)
	switch {
	case use.Shared:
		status, reason = metav1.ConditionTrue, hfv1.SharedWebhookSecretReason
		msg = fmt.Sprintf("Webhook deliveries about %s are verified with the shared fallback secret (key %s of %s), which every owner whose webhook uses it "+
			"can sign with: the pool's in_progress and completed events are confirmed with the CI platform before they change its demand (one API call per job). "+
			"Put the secret of %s's webhook (for a GitHub App, the App's webhook secret) under key %s",
			owner, use.SharedKey, use.Source, owner, use.OwnKey)
	case !use.Own:
		reason = hfv1.NoWebhookSecretReason
		msg = fmt.Sprintf("No key of %s verifies webhook deliveries about %s (no key %s, and the shared fallback is not accepted): they are refused "+
			"and the pool's jobs are recorded by the periodic resync only. Put the secret of %s's webhook under key %s",
			use.Source, owner, use.OwnKey, owner, use.OwnKey)
	}
	if reason != hfv1.OwnWebhookSecretReason && !hasReason(*conds, hfv1.RunnerPoolWebhookSecretSharedCondition, reason) {
		r.Recorder.Event(pool, corev1.EventTypeWarning, string(reason), msg)
	}
	conditions.Set(conds, pool.Generation, hfv1.RunnerPoolWebhookSecretSharedCondition, status, reason, msg)
	return phase.Next(), nil
}

// webhookSecretOf is how the deliveries about s's pool's owner are
// verified; false when that cannot be said (no receiver, no scope).
func (r *RunnerPoolReconciler) webhookSecretOf(s *poolScope) (WebhookSecretUse, bool) {
	if r.WebhookSecrets == nil {
		return WebhookSecretUse{}, false
	}
	_, ps, ok := r.Workloads.Pool(s.pool, s.tmpl)
	if !ok || ps.Scope.Owner == "" {
		return WebhookSecretUse{}, false
	}
	return r.WebhookSecrets.WebhookSecretOf(s.pool.Spec.Workload.Type, ps.Scope.Host, ps.Scope.Owner)
}

// hasReason reports whether conds holds a condition of type t with reason.
func hasReason(conds []metav1.Condition, t hfv1.ConditionType, reason hfv1.ConditionReason) bool {
	return hfv1.HasReason(hfv1.FindCondition(conds, t), reason)
}

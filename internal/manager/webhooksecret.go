package manager

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/predicate"

	"github.com/hyperfleet/hyperfleet/internal/metrics"
	"github.com/hyperfleet/hyperfleet/pkg/workload"
)

// Keys of the webhook Secret: the fallback secret, and one secret per
// owner (organization or user login) under the prefix.
const (
	WebhookSecretKey      = "webhook-secret"
	WebhookOwnerKeyPrefix = "owner."
)

// WebhookSecrets are the secrets of the webhook Secret.
type WebhookSecrets struct {
	// Global is the fallback for owners without their own.
	Global []byte
	// Owners are secrets per owner login (lower case).
	Owners map[string][]byte
}

// ParseWebhookSecrets checks the webhook Secret's keys: webhook-secret
// (the fallback) and owner.<login> (that owner's own), at least one of
// them, none empty, and no owner twice in different cases. secret names
// the Secret in errors.
func ParseWebhookSecrets(secret string, data map[string][]byte) (*WebhookSecrets, error) {
	out := &WebhookSecrets{Global: data[WebhookSecretKey], Owners: map[string][]byte{}}
	if v, ok := data[WebhookSecretKey]; ok && len(v) == 0 {
		return nil, fmt.Errorf("GitHub webhook Secret %s: key %q is empty: put the webhook's secret there or remove the key", secret, WebhookSecretKey)
	}
	for key, v := range data {
		login, ok := strings.CutPrefix(key, WebhookOwnerKeyPrefix)
		if !ok {
			continue
		}
		owner := strings.ToLower(login)
		switch {
		case owner == "":
			return nil, fmt.Errorf("GitHub webhook Secret %s: key %q names no owner: use %s<organization or user login>", secret, key, WebhookOwnerKeyPrefix)
		case len(v) == 0:
			return nil, fmt.Errorf("GitHub webhook Secret %s: key %q is empty: put the secret of %s's webhooks there or remove the key", secret, key, login)
		case out.Owners[owner] != nil:
			return nil, fmt.Errorf("GitHub webhook Secret %s: owner %q has more than one key (owner logins ignore case): keep one", secret, owner)
		}
		out.Owners[owner] = v
	}
	if len(out.Global) == 0 && len(out.Owners) == 0 {
		return nil, fmt.Errorf("GitHub webhook Secret %s has neither key %q nor keys %s<owner>: put the webhook's secret there", secret, WebhookSecretKey, WebhookOwnerKeyPrefix)
	}
	return out, nil
}

// rotatingParser verifies deliveries with the webhook Secret as it is now:
// the watcher swaps the parser when the Secret changes, so a rotated
// secret (by hand, or by External Secrets Operator) takes effect without a
// restart. Until a valid Secret exists, or after it is deleted, every
// delivery is refused with 503 (the platform retries; the resync covers
// demand meanwhile): an operator never accepts a delivery it cannot
// verify.
type rotatingParser struct {
	receiver workload.WebhookReceiver
	current  atomic.Pointer[workload.WebhookParser]
}

// Parse implements workload.WebhookParser.
func (p *rotatingParser) Parse(h http.Header, body []byte) (workload.JobEvent, error) {
	cur := p.current.Load()
	if cur == nil {
		return workload.JobEvent{}, workload.ErrWebhookNotConfigured
	}
	return (*cur).Parse(h, body)
}

// set installs the parser of secrets; nil refuses every delivery.
func (p *rotatingParser) set(secrets *WebhookSecrets) {
	if secrets == nil {
		p.current.Store(nil)
		return
	}
	parser := p.receiver.WebhookParser(secrets.Global, secrets.Owners)
	p.current.Store(&parser)
}

// webhookSecretWatcher reloads the webhook Secret whenever it changes.
// It watches the Secret's metadata only (the manager's Secret informer
// keeps no data, internal/manager/secrets.go) and reads its content
// straight from the API server.
type webhookSecretWatcher struct {
	reader client.Reader
	key    types.NamespacedName
	parser *rotatingParser
}

// Reconcile implements reconcile.Reconciler.
func (w *webhookSecretWatcher) Reconcile(ctx context.Context, _ ctrl.Request) (ctrl.Result, error) {
	log := ctrl.LoggerFrom(ctx).WithValues("secret", w.key.String())
	var s corev1.Secret
	switch err := w.reader.Get(ctx, w.key, &s); {
	case apierrors.IsNotFound(err):
		if w.parser.current.Load() != nil {
			log.Info("The GitHub webhook Secret is gone: deliveries are refused (503) until it exists again")
		}
		w.parser.set(nil)
		metrics.WebhookSecretReloads.WithLabelValues("missing").Inc()
		return ctrl.Result{}, nil
	case err != nil:
		metrics.WebhookSecretReloads.WithLabelValues("error").Inc()
		return ctrl.Result{}, fmt.Errorf("read the GitHub webhook Secret %s: %w", w.key, err)
	}
	secrets, err := ParseWebhookSecrets(w.key.String(), s.Data)
	if err != nil {
		// Keep the last valid secrets: a half-edited Secret must not stop
		// deliveries the previous one still verifies.
		log.Error(err, "The GitHub webhook Secret is not valid; deliveries are still verified with its last valid version")
		metrics.WebhookSecretReloads.WithLabelValues("invalid").Inc()
		return ctrl.Result{}, nil
	}
	w.parser.set(secrets)
	metrics.WebhookSecretReloads.WithLabelValues("loaded").Inc()
	log.Info("Loaded the GitHub webhook Secret", "fallbackSecret", len(secrets.Global) > 0, "ownersWithOwnSecret", len(secrets.Owners))
	return ctrl.Result{}, nil
}

// watchWebhookSecret loads the webhook Secret once and registers the
// watcher on the manager: a metadata-only watch of the one Secret, run on
// every replica (each serves webhooks), not only on the leader.
func watchWebhookSecret(ctx context.Context, mgr ctrl.Manager, key types.NamespacedName, parser *rotatingParser) error {
	w := &webhookSecretWatcher{reader: mgr.GetAPIReader(), key: key, parser: parser}
	if _, err := w.Reconcile(ctx, ctrl.Request{NamespacedName: key}); err != nil {
		return err
	}
	return ctrl.NewControllerManagedBy(mgr).
		Named("webhooksecret").
		For(&corev1.Secret{}, builder.OnlyMetadata, builder.WithPredicates(predicate.NewPredicateFuncs(func(o client.Object) bool {
			return o.GetNamespace() == key.Namespace && o.GetName() == key.Name
		}))).
		WithOptions(controller.Options{NeedLeaderElection: ptr.To(false)}).
		Complete(w)
}

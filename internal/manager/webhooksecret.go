package manager

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	crcontroller "sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/predicate"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/controller"
	"github.com/hyperfleet/hyperfleet/internal/metrics"
	"github.com/hyperfleet/hyperfleet/pkg/workload"
)

// Keys of the webhook Secret: the fallback secret, and one secret per
// owner (organization or user login) under the prefix.
const (
	WebhookSecretKey      = "webhook-secret"
	WebhookOwnerKeyPrefix = "owner."
)

// AllowSharedSecretFlag is the manager flag that accepts the shared
// fallback secret (WebhookOptions.AllowSharedSecret).
const AllowSharedSecretFlag = "--github-webhook-allow-fallback-secret"

// ErrSharedSecretNotAllowed: the webhook secrets hold the shared fallback
// secret, and the manager was not told to accept it.
var ErrSharedSecretNotAllowed = errors.New("the shared fallback webhook secret is not allowed")

// WebhookSecrets are the secrets of the webhook Secret.
type WebhookSecrets struct {
	// Global is the fallback for owners without their own.
	Global []byte
	// Owners are secrets per owner login (lower case).
	Owners map[string][]byte
}

// ParseWebhookSecrets checks the webhook Secret's keys: webhook-secret
// (the fallback) and owner.<login> (that owner's own), at least one of
// them, none empty, and no owner twice in different cases. The fallback is
// refused (ErrSharedSecretNotAllowed) unless allowShared: every owner
// whose webhook uses it can sign deliveries about every owner without a
// key of its own (docs/security.md, "Webhook intake"). secret names the
// Secret in errors.
func ParseWebhookSecrets(secret string, data map[string][]byte, allowShared bool) (*WebhookSecrets, error) {
	out := &WebhookSecrets{Global: data[WebhookSecretKey], Owners: map[string][]byte{}}
	if v, ok := data[WebhookSecretKey]; ok && len(v) == 0 {
		return nil, fmt.Errorf("GitHub webhook Secret %s: key %q is empty: put the webhook's secret there or remove the key", secret, WebhookSecretKey)
	}
	if _, ok := data[WebhookSecretKey]; ok && !allowShared {
		return nil, sharedSecretRefused("GitHub webhook Secret "+secret+" holds key "+WebhookSecretKey, WebhookSecretKey+" from it")
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

// sharedSecretRefused is the error of a fallback secret the manager was not
// told to accept: what holds it, and what to do.
func sharedSecretRefused(what, remove string) error {
	return fmt.Errorf("%s, the shared fallback secret: whoever holds it (every owner whose webhook uses it) can sign deliveries about "+
		"the repositories of every owner without a key of its own: %w. Give each organization or user its own key %s<login> holding "+
		"the secret of its webhook (for a GitHub App, the App's webhook secret under the key of each account it is installed on) and "+
		"remove %s, or start the manager with %s to accept it (docs/github.md, \"Webhooks\")",
		what, ErrSharedSecretNotAllowed, WebhookOwnerKeyPrefix, remove, AllowSharedSecretFlag)
}

// rotatingParser verifies deliveries with the webhook Secret as it is now:
// the watcher swaps the parser when the Secret changes, so a rotated
// secret (by hand, or by External Secrets Operator) takes effect without a
// restart. Until a valid Secret exists, or after it is deleted, every
// delivery is refused with 503 (the platform retries; the resync covers
// demand meanwhile): an operator never accepts a delivery it cannot
// verify. Secrets given as options (no Secret) are set once.
type rotatingParser struct {
	receiver workload.WebhookReceiver
	// platform is the workload type whose webhooks it parses, and host
	// the API host whose deliveries its secrets verify (workload.Scope's
	// Host: empty for the public service); source names where its secrets
	// come from, for the pools' conditions.
	platform hfv1.WorkloadType
	host     string
	source   string
	// allowShared accepts the fallback secret (AllowSharedSecretFlag).
	allowShared bool
	current     atomic.Pointer[workload.WebhookParser]
	secrets     atomic.Pointer[WebhookSecrets]
}

// Parse implements workload.WebhookParser. A delivery its secrets verify
// is the host's: its job is stamped with the host (workload.Job.Host), so
// it routes to that host's pools only.
func (p *rotatingParser) Parse(h http.Header, body []byte) (workload.JobEvent, error) {
	cur := p.current.Load()
	if cur == nil {
		return workload.JobEvent{}, workload.ErrWebhookNotConfigured
	}
	ev, err := (*cur).Parse(h, body)
	ev.Job.Host = p.host
	return ev, err
}

// hostParsers are one platform's parsers, one per API host whose
// deliveries the receiver takes. A delivery names its host in the
// platform's header (workload.WebhookFormat.HostHeader); that only chooses
// whose secrets verify it, and a delivery is a host's only once that
// host's secrets verified it (docs/security.md, "The API host is part of
// the scope"). One that names no host is the public service's, or the
// only host's when the receiver has one.
type hostParsers struct {
	format workload.WebhookFormat
	byHost map[string]*rotatingParser
}

// Parse implements workload.WebhookParser.
func (hp *hostParsers) Parse(h http.Header, body []byte) (workload.JobEvent, error) {
	host, named := hp.format.DeliveryHost(h)
	p := hp.byHost[host]
	if p == nil && !named && len(hp.byHost) == 1 {
		for _, only := range hp.byHost {
			p = only
		}
	}
	if p == nil {
		return workload.JobEvent{}, fmt.Errorf("%w: %s", workload.ErrUnknownHost, hostName(host))
	}
	return p.Parse(h, body)
}

// hostName prints a Scope.Host for messages.
func hostName(host string) string {
	if host == "" {
		return "the public service"
	}
	return host
}

// set installs the parser of secrets; nil refuses every delivery.
func (p *rotatingParser) set(secrets *WebhookSecrets) {
	if secrets == nil {
		p.current.Store(nil)
		p.secrets.Store(nil)
		return
	}
	parser := p.receiver.WebhookParser(secrets.Global, secrets.Owners)
	p.current.Store(&parser)
	p.secrets.Store(secrets)
}

// WebhookSecretOf implements controller.WebhookSecrets: how the receiver
// verifies deliveries about owner with the secrets it holds now.
func (p *rotatingParser) WebhookSecretOf(platform hfv1.WorkloadType, host, owner string) (controller.WebhookSecretUse, bool) {
	if platform != p.platform || host != p.host {
		return controller.WebhookSecretUse{}, false
	}
	// The keys whose secrets verify deliveries about owner: its own
	// (owner.<lower-case owner>), unless the platform keys owners its own
	// way (GitLab: a group's path, and the groups above it).
	keys := []string{strings.ToLower(owner)}
	if k, ok := p.receiver.(workload.WebhookOwnerKeyer); ok {
		keys = k.WebhookOwnerKeys(owner)
	}
	use := controller.WebhookSecretUse{Source: p.source, SharedKey: WebhookSecretKey}
	if len(keys) > 0 {
		use.OwnKey = WebhookOwnerKeyPrefix + keys[0]
	}
	secrets := p.secrets.Load()
	if secrets == nil {
		return use, true
	}
	use.Loaded = true
	for _, k := range keys {
		if len(secrets.Owners[strings.ToLower(k)]) > 0 {
			use.Own = true
		}
	}
	if !use.Own && len(secrets.Global) > 0 {
		use.Shared = true
	}
	return use, true
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
	return ctrl.Result{}, w.reload(ctx, false)
}

// reload reads the Secret and installs its secrets. An invalid Secret is
// logged and keeps the last valid secrets in use; at start (atStart) one
// that holds the fallback secret the manager was not told to accept is an
// error: the manager does not start, and says what to do.
func (w *webhookSecretWatcher) reload(ctx context.Context, atStart bool) error {
	log := ctrl.LoggerFrom(ctx).WithValues("secret", w.key.String())
	format := w.parser.receiver.WebhookFormat()
	var s corev1.Secret
	switch err := w.reader.Get(ctx, w.key, &s); {
	case apierrors.IsNotFound(err):
		switch {
		case w.parser.current.Load() != nil:
			log.Info("The " + format.Platform + " webhook Secret is gone: deliveries are refused (503) until it exists again")
		case atStart:
			log.Info(missingWebhookSecret(format, w.key))
		}
		w.parser.set(nil)
		metrics.WebhookSecretReloads.WithLabelValues("missing").Inc()
		return nil
	case err != nil:
		metrics.WebhookSecretReloads.WithLabelValues("error").Inc()
		return fmt.Errorf("read the %s webhook Secret %s: %w", format.Platform, w.key, err)
	}
	secrets, err := ParseWebhookSecrets(w.key.String(), s.Data, w.parser.allowShared)
	if err != nil {
		metrics.WebhookSecretReloads.WithLabelValues("invalid").Inc()
		if atStart && errors.Is(err, ErrSharedSecretNotAllowed) {
			return err
		}
		// Keep the last valid secrets: a half-edited Secret must not stop
		// deliveries the previous one still verifies.
		log.Error(err, "The "+format.Platform+" webhook Secret is not valid; deliveries are still verified with its last valid version")
		return nil
	}
	w.parser.set(secrets)
	metrics.WebhookSecretReloads.WithLabelValues("loaded").Inc()
	log.Info("Loaded the "+format.Platform+" webhook Secret", "fallbackSecret", len(secrets.Global) > 0, "ownersWithOwnSecret", len(secrets.Owners))
	logSharedSecret(log, secrets)
	return nil
}

// missingWebhookSecret says, once at start, that a receiver's Secret does
// not exist yet: its deliveries are refused (503) until it does, which is
// otherwise silent (the pod is Ready, the receiver answers). It names the
// Secret and how to create it; the watcher picks it up without a restart.
func missingWebhookSecret(format workload.WebhookFormat, key types.NamespacedName) string {
	return fmt.Sprintf("The %s webhook Secret %s does not exist: deliveries to %s are refused (503) until it does, and demand is read by the periodic resync only. "+
		"Create it, with one key %s<owner> per owner holding the secret of its webhooks: kubectl create secret generic %s --namespace %s --from-literal=%s<owner>=<secret>. "+
		"It is read without a restart; a receiver you do not use is turned off in the manager's flags (the chart's webhook values, docs/install.md)",
		format.Platform, key, format.Path, WebhookOwnerKeyPrefix, key.Name, key.Namespace, WebhookOwnerKeyPrefix)
}

// logSharedSecret warns, at every load, that the fallback secret is in
// use: the RunnerPools whose owner it serves say so too (condition
// WebhookSecretShared).
func logSharedSecret(log logr.Logger, secrets *WebhookSecrets) {
	if len(secrets.Global) == 0 {
		return
	}
	log.Info("Warning: the shared fallback webhook secret is accepted ("+AllowSharedSecretFlag+"): whoever holds it can sign deliveries about "+
		"every owner without a key of its own, so their in_progress and completed events are confirmed with GitHub (one API call per job). "+
		"Give each owner its own key "+WebhookOwnerKeyPrefix+"<login>; RunnerPools served by the fallback show the condition WebhookSecretShared",
		"ownersWithOwnSecret", len(secrets.Owners))
}

// webhookSecretControllerName names the watcher of platform's webhook
// Secret: controller names are unique in a manager and label its metrics.
func webhookSecretControllerName(platform hfv1.WorkloadType) string {
	if platform == hfv1.WorkloadGitHubActions {
		return "webhooksecret"
	}
	return "webhooksecret-" + string(platform)
}

// watchWebhookSecret loads the webhook Secret once and registers the
// watcher on the manager: a metadata-only watch of the one Secret, run on
// every replica (each serves webhooks), not only on the leader.
func watchWebhookSecret(ctx context.Context, mgr ctrl.Manager, key types.NamespacedName, parser *rotatingParser) error {
	w := &webhookSecretWatcher{reader: mgr.GetAPIReader(), key: key, parser: parser}
	if err := w.reload(ctx, true); err != nil {
		return err
	}
	return ctrl.NewControllerManagedBy(mgr).
		// One watcher per platform; GitHub's keeps the name it always had.
		Named(webhookSecretControllerName(parser.platform)).
		For(&corev1.Secret{}, builder.OnlyMetadata, builder.WithPredicates(predicate.NewPredicateFuncs(func(o client.Object) bool {
			return o.GetNamespace() == key.Namespace && o.GetName() == key.Name
		}))).
		WithOptions(crcontroller.Options{NeedLeaderElection: ptr.To(false)}).
		Complete(w)
}

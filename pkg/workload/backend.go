package workload

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/utils/clock"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
)

// Backend is one CI platform's side of the operator. Each platform has its
// part of the HyperFleet API: a section of a template's spec.bootstrap
// (its credentials, scope and runner software), of a RunnerPool's
// spec.workload (the jobs it serves) and of a MachineClaim's
// spec.workloadConfig (its own runner). A Backend reads that part into the
// neutral terms of this package and builds the Providers of the accounts it
// names, so the controllers, routing and metrics reach every platform
// through it and know none of them (docs/architecture.md, "CI platforms as
// plug-ins").
//
// The reading methods only read the objects they are given: no call, no
// side effect, the same answer every time, so a template's drift hash
// that depends on them is stable. Implementations are safe for concurrent
// use.
type Backend interface {
	// Name is the platform's name for messages and condition reasons,
	// such as GitHub.
	Name() string
	// TemplateField is the template's section for this platform, such as
	// spec.bootstrap.github (Template.Field), for the messages about a
	// template that has none.
	TemplateField() string
	// Template reads tmpl's section for this platform; false when tmpl
	// has none.
	Template(tmpl *hfv1.HypervisorMachineTemplate) (Template, bool)
	// Pool reads pool's section for this platform, with tmpl (its
	// template; nil when it does not exist) for what the pool leaves to
	// it; false when pool has no section for this platform.
	Pool(pool *hfv1.RunnerPool, tmpl *hfv1.HypervisorMachineTemplate) (Pool, bool)
	// Claim reads the runner claim asks for itself; zero when it leaves
	// everything to its pool and template.
	Claim(claim *hfv1.MachineClaim) ClaimRunner
	// Provider returns the account of scope with tmpl's credentials, read
	// with secrets from tmpl's namespace. Implementations keep a Provider
	// while the template's credentials and the scope stay the same, so
	// that its tokens and rate-limit state carry over between calls. An
	// error is classified (errclass) when the user must fix something.
	Provider(ctx context.Context, tmpl *hfv1.HypervisorMachineTemplate, scope Scope, secrets SecretReader) (Provider, error)
}

// NoRunner is implemented by a back-end with no CI platform behind it
// (generic): its VMs run the template's script (Template.Script) instead of
// a runner, so the operator issues no runner credential, observes and
// removes no runner, verifies no scope and routes no jobs to its pools,
// whose size is their minReplicas (docs/generic.md). Provider is never
// called for it.
type NoRunner interface {
	Backend
	// RunsNoRunner marks the back-end.
	RunsNoRunner()
}

// HasRunner reports whether be's VMs run a CI platform's runner (false
// for a NoRunner back-end such as generic).
func HasRunner(be Backend) bool {
	_, none := be.(NoRunner)
	return !none
}

// WebhookReceiver is implemented by back-ends whose platform reports jobs
// by webhook.
type WebhookReceiver interface {
	// WebhookFormat is how the platform delivers: the receiver's path and
	// the headers it reads before a delivery's body.
	WebhookFormat() WebhookFormat
	// WebhookParser verifies deliveries about an owner listed in
	// ownerSecrets with that owner's own secret only, and any other with
	// secret (the fallback; empty: listed owners only).
	WebhookParser(secret []byte, ownerSecrets map[string][]byte) WebhookParser
}

// WebhookOwnerKeyer is implemented by a WebhookReceiver whose webhook
// Secret keys owners other than by their lower-case name (the default,
// GitHub's: owner.<login>), or whose deliveries about an owner verify with
// other owners' keys too (GitLab: the key of any group above a project).
type WebhookOwnerKeyer interface {
	// WebhookOwnerKeys are the keys (after the Secret's owner. prefix) of
	// the secrets that verify deliveries about the repositories of owner
	// (a scope's Owner), the owner's own first; none when no key can.
	WebhookOwnerKeys(owner string) []string
}

// WebhookFormat is how one CI platform delivers its webhooks: what the
// operator's receiver (internal/webhook) reads from a delivery's headers
// before its body, and how it names the platform's parts in its answers,
// so that one receiver serves every platform at its own path.
type WebhookFormat struct {
	// Platform is the platform's name in answers and logs, such as GitHub.
	Platform string
	// Label is the platform's value of the platform label of the webhook
	// metrics: its workload type, such as github-actions.
	Label string
	// Path is the receiver's URL path, such as /webhooks/github.
	Path string
	// EventHeader names the header that says the delivery's event.
	EventHeader string
	// Events are the event names the receiver counts by name in its
	// metrics (any other counts as "other"): the header's values that
	// matter, a bounded set whatever a sender writes.
	Events []string
	// DeliveryHeader names the header holding the delivery's id, the same
	// on the platform's redeliveries, which the receiver requires before
	// it reads the body. Empty when the platform sends none: the parser
	// then sets JobEvent.DeliveryID from the verified body.
	DeliveryHeader string
	// SignatureHeader names the header that authenticates a delivery (a
	// signature or a secret token), for the answer to one that fails.
	SignatureHeader string
	// HostHeader names the header in which the platform names the
	// instance that sent a delivery (a host, or the instance's URL), such
	// as GitHub Enterprise Server's X-GitHub-Enterprise-Host; empty when
	// the platform sends none. It only chooses which host's secrets verify
	// the delivery (DeliveryHost): the header is not signed, and a
	// delivery is that host's only because its secret verified it.
	HostHeader string
	// PublicHosts are the hosts HostHeader names for the platform's
	// public service (whose scopes have an empty Scope.Host), such as
	// gitlab.com.
	PublicHosts []string
	// Used says which deliveries are used, for the answer to an ignored
	// one, such as "workflow_job queued, waiting, in_progress and
	// completed events".
	Used string
	// Operator is how the operator's flags configure the receiver.
	Operator WebhookFlags
}

// WebhookFlags describe the operator's flags of one platform's webhook
// receiver (cmd/hyperfleet binds them for every back-end that receives
// webhooks, in one loop): --<Name>-webhook-secret names the Secret with
// its secrets, --<Name>-webhook-allow-fallback-secret accepts the
// Secret's shared key, --<Name>-webhook-api-host names the instance whose
// deliveries it verifies.
type WebhookFlags struct {
	// Name is the platform's name in the flags, such as gitlab.
	Name string
	// DefaultSecret is --<Name>-webhook-secret's default; empty (the
	// platform's webhooks are received only when a Secret is named).
	DefaultSecret string
	// OwnerKeys says what the Secret's owner keys are, for the help, such
	// as "owner.<login> (the secret of one organization's or user's
	// webhooks, which only it may use)".
	OwnerKeys string
	// Owners names the owners in the fallback flag's help, such as "GitLab
	// group".
	Owners string
	// Docs is the page that explains the platform's webhooks, such as
	// docs/gitlab.md.
	Docs string
	// PublicService and ExampleHost are for the API host flag's help: the
	// public service an empty flag means (GitHub.com) and the API host of
	// another instance, such as gitlab.example.com (a self-managed GitLab).
	PublicService, ExampleHost string
}

// SecretReader reads the value of one key of a Secret in namespace; field
// is the API field that names it, for the error. A Secret or key that does
// not exist is an error the object waits on (a Secret watch wakes it).
type SecretReader func(ctx context.Context, field, namespace string, ref hfv1.LocalSecretKeySelector) ([]byte, error)

// Template is what a HypervisorMachineTemplate tells one CI platform:
// where its runners register, with which credentials, and the runner
// software its VMs run.
type Template struct {
	// Field is the template's section for the platform, such as
	// spec.bootstrap.github; messages name fields under it.
	Field string
	// Scope is the template's own scope; zero when it names none.
	Scope Scope
	// ScopeField is the field Scope comes from.
	ScopeField string
	// Endpoint is the platform API the credentials are for when it is not
	// the platform's public service (an Enterprise server); equal scopes
	// of different endpoints are different scopes (Scope.Host is its
	// host).
	Endpoint string
	// APIHosts are the hosts of every URL the operator calls with the
	// credentials, each with the field naming it; those not Public must be
	// allowed by the tenancy rules of the template's cluster
	// (internal/tenancy).
	APIHosts []APIHost
	// CredentialReuse, when not empty, says how the credential a VM of
	// the template receives can serve more than one job on the platform's
	// side (a registration token that registers any number of runners, a
	// runner token any process may poll with) and what limits it: the
	// template's ReusableCredential condition shows it. Empty when each
	// VM's credential is single-job on the platform's side.
	CredentialReuse string
	// Runner is the runner software, with the API's defaults applied.
	Runner RunnerSoftware
	// RegistrationURL is where a registration-token runner of Scope
	// registers.
	RegistrationURL string
	// RunnerGroup is the runner group runners join; empty for the
	// default.
	RunnerGroup string
	// DefaultLabels are the labels the platform gives every runner for
	// its operating system and architecture (see RunnerLabels).
	DefaultLabels []string
	// Secrets are the Secret keys, in the template's namespace, the
	// credentials are read from, by the field that names each.
	Secrets map[string]hfv1.LocalSecretKeySelector
	// CredentialsKey identifies the credentials: the API, the URLs they
	// are used at and which Secret keys hold them, never their values. A
	// pool's scope verification stands while it stays the same, so that
	// editing a template's resources or image keeps its pools routed.
	CredentialsKey string
	// AgentPlatform is the in-VM agent's runner kind for this platform
	// (the platform its agent config carries, declared by the platform's
	// own package, pkg/workload/<platform>/<platform>vm), and
	// BootstrapMethod the kind of runner credential its agent takes; both
	// empty for the agent config's default platform (GitHub Actions),
	// whose method is the template's spec.bootstrap.method.
	AgentPlatform, BootstrapMethod string
	// OneJobPerVM is true when every VM of the template takes a
	// credential for the one job its claim is bound to (ClaimRunner.Job):
	// a claim bound to none (a warm VM of its pool) gets no credential
	// until its RunnerPool binds it a job (internal/workloads).
	OneJobPerVM bool
	// Script is what the VMs of a NoRunner back-end (generic) run instead
	// of a runner, and TTL how long such a VM may live from its claim's
	// creation; empty and zero for CI platforms.
	Script string
	TTL    time.Duration
}

// KeyOf is the hex SHA-256 of v's JSON encoding: a key that tells two
// configurations apart without holding their values, for a
// Template.CredentialsKey or a ProviderCache fingerprint. Its encoding is
// what RunnerPools' status.scopeVerification records: changing it takes
// every pool out of routing until checked again.
func KeyOf(v any) string {
	raw, err := json.Marshal(v)
	if err != nil {
		// Only a value json cannot encode (a channel, a func) gets here:
		// a programming error, never a configuration's.
		panic(fmt.Sprintf("workload.KeyOf(%T): %v", v, err))
	}
	sum := sha256.Sum256(raw)
	return hex.EncodeToString(sum[:])
}

// RunnerSoftware is the CI runner package a template's VMs run and its
// place in them.
type RunnerSoftware struct {
	// OS and Arch are the runner's platform in the CI platform's naming,
	// such as linux and x64.
	OS, Arch string
	// Version is the release to resolve (a version or
	// LatestRunnerVersion; see RunnerReleases); empty when the package is
	// pinned by DownloadURL or installed in the VM template.
	Version string
	// DownloadURL and DownloadSHA256 are the package VMs download and its
	// checksum: the pinned one, else the release resolved for Version
	// (the template's status.runner); empty when it is installed in the
	// VM template.
	DownloadURL, DownloadSHA256 string
	// InstallPath is where the package is unpacked, WorkDir the jobs'
	// working directory, ConfigScript and RunScript the runner's scripts.
	InstallPath, WorkDir, ConfigScript, RunScript string
}

// Pool is what a RunnerPool, with its template, tells its CI platform.
type Pool struct {
	// Field is the pool's section for the platform, such as
	// spec.workload.github.
	Field string
	// Scope is where the pool's runners take jobs from: the pool's own
	// scope, else its template's; zero when neither names one.
	Scope Scope
	// ScopeField is the field Scope comes from.
	ScopeField string
	// OwnScope is true when the pool names Scope itself rather than
	// taking its template's.
	OwnScope bool
	// Labels are the pool's runner labels, without the platform's defaults
	// (see RunnerLabels).
	Labels []string
	// Claim is the spec.workloadConfig of the claims the pool creates.
	Claim *hfv1.WorkloadConfig
	// RunUntagged is true when the pool's runners take jobs that ask for
	// no labels (GitHub's runners always do; a GitLab runner only with
	// run_untagged). Routing gives a job without labels only to such
	// pools (internal/demand).
	RunUntagged bool
	// Feed is the job feed the pool listens to (feed.go), with its labels
	// (RunnerLabels of the pool's); nil for a pool that takes its demand
	// from webhooks and resync only. FeedField is the field naming it.
	Feed      *FeedSpec
	FeedField string
	// FeedRefusal, when set, says why the pool's feed cannot work with its
	// template (GitHub: a scale set's runners take JIT configurations
	// only, and enterprises' scale sets are not served): the pool opens
	// no feed and builds no VMs until it is fixed.
	FeedRefusal string
}

// ClaimRunner is the runner a MachineClaim asks for itself, in its
// spec.workloadConfig.
type ClaimRunner struct {
	// Name is the runner's name; empty for the default one.
	Name string
	// Labels are the runner's own labels; empty for its pool's.
	Labels []string
	// Group is the runner group; empty for the template's.
	Group string
	// RunUntagged, when set, says whether the runner takes jobs that ask
	// for no labels (see RunnerSpec.RunUntagged); nil for its pool's or
	// template's.
	RunUntagged *bool
	// Job is the queued job the claim was made for; empty for a claim
	// that takes any job of its labels. Only Buildkite binds claims to
	// jobs (spec.workloadConfig.buildkite.jobID).
	Job string
}

// Dependencies are what the operator gives every back-end it builds.
type Dependencies struct {
	// Transport is the base HTTP transport to the platforms (TLS
	// settings, such as an Enterprise server's CA); nil is
	// http.DefaultTransport.
	Transport http.RoundTripper
	// Clock stamps credentials and drives rate limits; nil is the real
	// clock.
	Clock clock.PassiveClock
	// Metrics is where a back-end registers its own metrics, if it has
	// any; nil registers none. Registering a collector that is already
	// there (a second operator in one process) is not an error: see
	// RegisterCollectors.
	Metrics prometheus.Registerer
	// Logger receives what a back-end logs outside any call's context (a
	// job feed's listener); nil discards it.
	Logger *slog.Logger
}

// RegisterCollectors registers collectors with reg (nil: none), keeping a
// collector that is already registered: a back-end's metrics are package
// state, and a process may build its back-ends more than once (tests, the
// local world's restarts).
func RegisterCollectors(reg prometheus.Registerer, collectors ...prometheus.Collector) error {
	if reg == nil {
		return nil
	}
	for _, c := range collectors {
		var already prometheus.AlreadyRegisteredError
		if err := reg.Register(c); err != nil && (!errors.As(err, &already) || already.ExistingCollector != c) {
			return err
		}
	}
	return nil
}

// DeliveryHost is the API host a delivery with header h says it comes
// from, in Scope.Host's terms (empty for the public service), and whether
// it names one at all (HostHeader set and present). A URL (GitLab's
// X-Gitlab-Instance) counts by its host.
func (f WebhookFormat) DeliveryHost(h http.Header) (host string, named bool) {
	if f.HostHeader == "" {
		return "", false
	}
	v := strings.TrimSpace(h.Get(f.HostHeader))
	if v == "" {
		return "", false
	}
	if strings.Contains(v, "://") {
		u, err := url.Parse(v)
		if err != nil || u.Host == "" {
			return v, true
		}
		host = CanonicalHost(u)
	} else {
		host = NormalizeHost(v)
	}
	if slices.Contains(f.PublicHosts, host) {
		return "", true
	}
	return host, true
}

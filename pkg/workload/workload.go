// Package workload is HyperFleet's neutral view of a CI platform: the
// Provider that issues the single-use credential a VM's runner registers
// with, removes runners, reports their state, lists the jobs waiting for
// runners and turns the platform's webhooks into job events (WebhookParser),
// and the Backend a platform plugs in with, registered by workload type
// (backend.go, registry.go).
//
// Long-lived platform credentials (a personal access token, an App private
// key, an installation token) stay inside an implementation. What leaves it
// for a VM is a Credential, whose secret part is a Secret that never prints.
package workload

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/pkg/errclass"
)

// Scope is where runners register and jobs come from: an owner (a GitHub
// organization, a GitLab group, a Buildkite organization), or one
// repository (a GitHub repository, a GitLab project, a Buildkite pipeline)
// under it. An owner may be a path of several segments (a GitLab subgroup,
// such as platform/ci); its scope holds everything under that path.
type Scope struct {
	// Host is the API host of the platform instance the scope is on, as
	// CanonicalHost writes it (such as ghes.example.com or
	// gitlab.example.com:8443); empty for the platform's public service
	// (api.github.com, gitlab.com, api.buildkite.com). The same owner on
	// two hosts is two scopes: a job routes only to pools of the host it
	// came from (internal/demand), so a server a tenant runs can vouch for
	// nothing on another host (docs/security.md, "The API host is part of
	// the scope").
	Host string
	// Owner is the organization, user or group (as its full path).
	Owner string
	// Repository is the repository's name under Owner (its last path
	// segment); empty for the whole owner.
	Repository string
	// Instance is the whole platform instance (GitLab's instance runners,
	// which serve every project): Owner and Repository are then empty.
	Instance bool
	// Enterprise is the GitHub enterprise whose runners serve the scope:
	// runners register at the enterprise (its runner group) and take the
	// jobs of Owner (an organization of the enterprise) or of Owner's
	// Repository. Alone, without an Owner, it names the enterprise's runners
	// but holds no repository: which organizations a runner group allows is
	// the platform's to say, so a pool names the organization it serves.
	Enterprise string
}

// InstanceScopeName is how an instance scope prints (Scope.String).
const InstanceScopeName = "(instance)"

// IsZero reports whether the scope names nothing.
func (s Scope) IsZero() bool {
	return s.Owner == "" && s.Repository == "" && !s.Instance && s.Enterprise == ""
}

// IsEnterprise reports whether the scope's runners are an enterprise's.
func (s Scope) IsEnterprise() bool { return s.Enterprise != "" }

// IsOrganization reports whether the scope is a whole owner (or the whole
// instance).
func (s Scope) IsOrganization() bool { return s.Repository == "" }

// String is owner or owner/repository; InstanceScopeName for the instance.
func (s Scope) String() string {
	if s.Instance {
		return InstanceScopeName
	}
	own := s.Owner
	if s.Repository != "" {
		own += "/" + s.Repository
	}
	if s.Enterprise != "" {
		if own == "" {
			return "enterprises/" + s.Enterprise
		}
		return "enterprises/" + s.Enterprise + "/" + own
	}
	return own
}

// Contains reports whether repository (its full path, such as owner/name
// or group/subgroup/project) is in the scope: the scope's repository
// itself, or any repository under the scope's owner path, subgroups
// included. Comparisons ignore case, as the platforms' names do.
func (s Scope) Contains(repository string) bool {
	if s.Instance {
		// Every project of the instance: a full path of a namespace and a
		// name.
		return strings.Contains(repository, "/") && !strings.HasPrefix(repository, "/") && !strings.HasSuffix(repository, "/")
	}
	if s.Owner == "" {
		// Nothing, or an enterprise without an organization (see
		// Enterprise).
		return false
	}
	if s.Repository != "" {
		return strings.EqualFold(repository, s.Owner+"/"+s.Repository)
	}
	n := len(s.Owner)
	return len(repository) > n+1 && repository[n] == '/' && strings.EqualFold(repository[:n], s.Owner) &&
		!strings.HasSuffix(repository, "/")
}

// HoldsJob reports whether job is in the scope: on the scope's API host
// and of a repository the scope contains. Routing asks it rather than
// Contains, so that a scope a server on one host vouched for never takes
// the jobs of another host's owner of the same name.
func (s Scope) HoldsJob(job Job) bool {
	return s.Host == job.Host && s.Contains(job.Repository)
}

// Method is the kind of single-use credential a runner receives.
type Method string

// Each platform names its own methods (github.MethodJIT,
// gitlab.MethodRunnerAuthToken, buildkite.MethodJobToken, ...), declared
// once with the platform's side of the VM (pkg/workload/<platform>/
// <platform>vm) and carried in the agent config as its bootstrapMethod.
// compat.go keeps the names some shared packages still use.

// RunnerSpec asks for the credential of one runner.
type RunnerSpec struct {
	// Name is the runner's name, unique within the scope.
	Name string
	// Labels are all the runner's labels, as RunnerLabels builds them.
	Labels []string
	// Group is the organization runner group; empty for the default.
	Group string
	// Method is the credential kind.
	Method Method
	// WorkFolder is the runner's work directory inside the VM.
	WorkFolder string
	// RunUntagged, when set, says whether the runner takes jobs that ask
	// for no labels, on a platform where such jobs go only to runners that
	// allow them (GitLab's run_untagged); nil leaves it to the template.
	// Platforms without the notion ignore it.
	RunUntagged *bool
	// Job is the id of the queued job the runner is made for; empty for a
	// runner that takes any job of its labels. Only Buildkite binds a
	// runner to it (MethodJobToken); other platforms ignore it.
	Job string
	// JobRepository is Job's repository (a Buildkite pipeline as
	// organization/pipeline), from the job's CIJob record.
	JobRepository string
	// Feed, when set, is the job feed whose runner this is (its pool's
	// Pool.Feed): the credential registers the runner as the feed's,
	// since a platform gives a feed's jobs only to its own runners. Only
	// a FeedProvider's platform has feeds.
	Feed *FeedSpec
	// JobTimeout is the longest the runner's job may run (its pool's
	// spec.lifecycle.jobTimeout); zero when no pool bounds it. A platform
	// that caps the jobs of a runner (GitLab's maximum_timeout) caps them
	// at it, so that a job runs no longer on the platform's side than the
	// operator lets its VM live for it; others ignore it.
	JobTimeout time.Duration
}

// Credential is what one VM's runner needs to register: single-use and
// short-lived. Only Secret is sensitive, and it never prints.
type Credential struct {
	// Method is the credential kind.
	Method Method
	// Secret is the JIT configuration or the registration token.
	Secret Secret
	// RunnerName is the runner's name.
	RunnerName string
	// RunnerID is the runner's id when the platform registered it up front
	// (MethodJIT); zero when the VM registers it.
	RunnerID int64
	// RegistrationURL is the URL a registration-token runner registers to.
	RegistrationURL string
	// IssuedAt is when the credential was issued.
	IssuedAt time.Time
	// ExpiresAt is when it stops being usable; zero when the platform does
	// not say (a JIT configuration lasts until its runner takes a job).
	ExpiresAt time.Time
	// Job is the one job the credential lets its runner take
	// (MethodJobToken); empty otherwise.
	Job string
}

// Secret is a credential's secret value. It formats as [redacted] with
// every verb and in JSON, so a log line or an event that includes it by
// mistake leaks nothing; Reveal returns the value for the one place that
// must write it (the VM's cloud-init).
type Secret struct{ value string }

// NewSecret wraps a secret value.
func NewSecret(v string) Secret { return Secret{value: v} }

// Reveal returns the secret value.
func (s Secret) Reveal() string { return s.value }

// IsZero reports whether the secret is empty.
func (s Secret) IsZero() bool { return s.value == "" }

const redacted = "[redacted]"

// String implements fmt.Stringer.
func (Secret) String() string { return redacted }

// GoString implements fmt.GoStringer (%#v).
func (Secret) GoString() string { return redacted }

// Format implements fmt.Formatter, so that no verb prints the value.
func (Secret) Format(f fmt.State, _ rune) { _, _ = f.Write([]byte(redacted)) }

// MarshalJSON implements json.Marshaler.
func (Secret) MarshalJSON() ([]byte, error) { return []byte(`"` + redacted + `"`), nil }

// MarshalText implements encoding.TextMarshaler (slog, YAML).
func (Secret) MarshalText() ([]byte, error) { return []byte(redacted), nil }

// RunnerState is a runner's state on the platform.
type RunnerState string

const (
	// RunnerOffline: registered, not connected (not started yet, or gone).
	RunnerOffline RunnerState = "offline"
	// RunnerIdle: connected and waiting for a job.
	RunnerIdle RunnerState = "idle"
	// RunnerBusy: running a job.
	RunnerBusy RunnerState = "busy"
)

// Runner is a registered runner.
type Runner struct {
	ID     int64
	Name   string
	State  RunnerState
	Labels []string
}

// JobState is where a job is in its life.
type JobState string

const (
	JobQueued     JobState = "queued"
	JobInProgress JobState = "in_progress"
	JobCompleted  JobState = "completed"
)

// Job is a CI job as the platform reports it.
type Job struct {
	// ID is the platform's id of the job as text: GitHub's and GitLab's
	// are decimal numbers, Buildkite's a UUID. Demand is de-duplicated by
	// it (with Platform: one CIJob per platform and id, hfv1.CIJobName).
	ID string
	// Platform is the workload type of the CI platform that runs the job;
	// the back-end that read the job sets it, so that records of two
	// platforms' jobs with the same id never meet.
	Platform hfv1.WorkloadType
	// Host is the API host of the platform instance the job is on
	// (Scope.Host; empty for the public service): the host whose webhook
	// secret verified the delivery, or of the pool whose account read it
	// (resync, a job feed). Jobs route only to pools of their host.
	Host string
	// RunID and RunAttempt identify the workflow run (cancel target).
	RunID      int64
	RunAttempt int64
	// Repository is owner/name.
	Repository string
	// Labels are the job's runs-on labels.
	Labels []string
	// LabelsUnknown is true when whoever read the job could not tell its
	// labels (a GitLab Job Hook carries the runner's tags, not the
	// job's): Labels is then empty and routing reads the job from the
	// platform first (internal/demand).
	LabelsUnknown bool
	State         JobState
	Conclusion    string
	WorkflowName  string
	Name          string
	// RunnerName and RunnerID are the runner that took the job; empty while
	// queued. Any runner whose labels cover the job's may take it.
	RunnerName string
	RunnerID   int64
	// CreatedAt, StartedAt and CompletedAt are the platform's times; zero
	// when unknown.
	CreatedAt   time.Time
	StartedAt   time.Time
	CompletedAt time.Time
}

// JobEvent is one webhook delivery about a job.
type JobEvent struct {
	// DeliveryID is the platform's id of the delivery (de-duplication).
	DeliveryID string
	// Action is the event's action, such as queued, waiting, in_progress
	// or completed; Job.State is its normalised form.
	Action string
	Job    Job
	// OwnerSigned is true when the delivery verified with a secret that
	// only the job's owner (and the platform) holds: that owner's own key.
	// False for a secret several owners share (the fallback), and for
	// anything not parsed from a delivery: such an event proves only that
	// one of the secret's holders sent it, so it does not take a job out
	// of demand unconfirmed (docs/security.md, "Webhook intake").
	OwnerSigned bool
}

// Provider is one CI platform account: a scope and the operator's
// credentials for it. Every method is safe for concurrent use, bounded by
// the configured HTTP timeout, and never waits out a rate limit: it returns
// a *RateLimitError instead, so controllers requeue.
type Provider interface {
	JobReader
	// Scope is where this provider registers runners.
	Scope() Scope
	// VerifyScope checks that the credentials can manage runners in
	// Scope(): the scope exists, the credentials can see it, and they hold
	// the permission that issuing a runner credential there needs. It
	// returns an error wrapping ErrNotFound (scope absent or invisible to
	// these credentials) or ErrUnauthorized (rejected credentials or a
	// missing permission) when they cannot, and ErrUnavailable or a
	// *RateLimitError when the platform could not answer. A pool whose
	// scope does not verify must not receive jobs (docs/security.md).
	VerifyScope(ctx context.Context) error
	// IssueCredential issues the single-use credential of one runner. For
	// MethodJIT it registers the runner; a name already taken returns
	// ErrNameTaken.
	IssueCredential(ctx context.Context, spec RunnerSpec) (Credential, error)
	// DeregisterRunner removes a runner by id (or, with id 0, by name).
	// A runner that is already gone is success; a busy one returns
	// ErrRunnerBusy and stays.
	DeregisterRunner(ctx context.Context, id int64, name string) error
	// GetRunner finds a runner by name; ErrNotFound when there is none.
	GetRunner(ctx context.Context, name string) (Runner, error)
	// ListRunners lists the scope's runners whose names start with prefix
	// (all of them with an empty prefix).
	ListRunners(ctx context.Context, prefix string) ([]Runner, error)
	// QueuedJobs lists the jobs waiting for a runner in the given
	// repositories (owner/name) of the scope, whatever the state of the
	// workflow run they belong to; demand resync uses it.
	QueuedJobs(ctx context.Context, repositories []string) ([]Job, error)
	// Repositories lists the repositories (owner/name) of the scope that
	// these credentials can see: the scope's repository, or an
	// organization's repositories (for a platform's app installation, the
	// ones it was granted). Demand resync scans them for jobs no webhook
	// reported. Implementations bound and cache the listing: it may be
	// minutes old.
	Repositories(ctx context.Context) ([]string, error)
	// CancelRun cancels a job's workflow run (hard limits cancel before
	// they destroy a busy runner's VM).
	CancelRun(ctx context.Context, repository string, runID int64) error
}

// RunnerPackage is one release of the CI platform's runner software for one
// platform: where a VM downloads it and the SHA-256 it must have.
type RunnerPackage struct {
	// Version is the release's version, such as 2.329.0.
	Version string
	// URL is the package's https:// download URL.
	URL string
	// SHA256 is the package's SHA-256, 64 lower-case hex digits, as the
	// platform publishes it with the release.
	SHA256 string
}

// LatestRunnerVersion asks RunnerReleases for the newest release.
const LatestRunnerVersion = "latest"

// RunnerReleases is implemented by providers whose platform publishes its
// runner software as releases, so templates can name a version (or
// LatestRunnerVersion) instead of pinning a URL and checksum that rot.
type RunnerReleases interface {
	// RunnerPackage resolves version (X.Y.Z or LatestRunnerVersion) for
	// the runner's os and arch (the platform's own names, such as linux
	// and x64). ErrNotFound when the release or its package does not
	// exist; a release that publishes no checksum for the package is an
	// error too (a VM never runs an unchecked download).
	RunnerPackage(ctx context.Context, version, os, arch string) (RunnerPackage, error)
}

// JobReader reads a job's current state from the CI platform's API
// (Provider implements it). Demand resync learns through it the state of
// a job whose webhooks were lost, and demand recording confirms through it
// the webhook events it cannot take as delivered: a completion for a job
// not known to be running, and events older than a bound
// (docs/security.md, "Webhook intake").
type JobReader interface {
	// GetJob reads one job of a repository (owner/name); ErrNotFound when
	// there is none.
	GetJob(ctx context.Context, repository string, id string) (Job, error)
}

// EventTime is when the platform reported the change a job event is
// about: its completion, its start or its creation, by state; zero when
// the event does not say.
func EventTime(j Job) time.Time {
	switch j.State {
	case JobCompleted:
		return j.CompletedAt
	case JobInProgress:
		return j.StartedAt
	}
	return j.CreatedAt
}

// WebhookParser verifies and decodes a platform's webhook deliveries.
type WebhookParser interface {
	// Parse verifies the delivery's signature over body (the raw bytes)
	// and decodes it. It returns ErrBadSignature for a missing or wrong
	// signature, ErrIgnoredEvent for a valid delivery that is not about a
	// job, and another error (wrapping ErrMalformed) for a body that
	// cannot be decoded.
	Parse(header http.Header, body []byte) (JobEvent, error)
}

// WebhookSecrets are the secrets a platform's WebhookParser verifies
// deliveries with (WebhookReceiver.WebhookParser): the owners' own, and a
// fallback for the others. One owner's secret never verifies a delivery
// about another owner (docs/security.md, "Webhook intake").
type WebhookSecrets struct {
	// Secret is the fallback for owners without their own. Empty: owners
	// listed in OwnerSecrets only.
	Secret []byte
	// OwnerSecrets are the owners' own secrets, keyed by the owner's name
	// as the platform gives it (case is ignored; see OwnerSecret).
	OwnerSecrets map[string][]byte
}

// SecretFor is the secret a delivery about owner must be verified with,
// and whether it is owner's own (OwnerSecret); else the fallback, nil when
// there is none.
func (w WebhookSecrets) SecretFor(owner string) (secret []byte, own bool) {
	if s, ok := OwnerSecret(w.OwnerSecrets, owner); ok {
		return s, true
	}
	return w.Secret, false
}

// OwnerSecret is the webhook secret of owner among secrets (a receiver's
// secrets per owner), owners compared ignoring case whatever case the keys
// are in, so that a key in another case never lets a shared fallback
// serve its owner; a lower-case key wins over another spelling. False for
// the empty owner or one with no secret of its own.
func OwnerSecret(secrets map[string][]byte, owner string) ([]byte, bool) {
	if owner == "" {
		return nil, false
	}
	if s, ok := secrets[strings.ToLower(owner)]; ok {
		return s, true
	}
	for key, s := range secrets {
		if strings.EqualFold(key, owner) {
			return s, true
		}
	}
	return nil, false
}

// Sentinel errors. Implementations wrap them so callers test with errors.Is.
// The ones a controller meets while provisioning carry their class
// (pkg/errclass): a refusal of the credentials or of the request is for the
// user to fix (see Classified), anything else is retried.
var (
	// ErrNotFound: the runner (or scope) does not exist.
	ErrNotFound = errclass.NewSentinel("not found on the CI platform", errclass.ClassConfiguration, reasonRequestRefused)
	// ErrNameTaken: a runner of that name is already registered.
	ErrNameTaken = errclass.NewSentinel("a runner of that name is already registered", errclass.ClassTransient, "")
	// ErrRunnerBusy: the runner is running a job and was not removed.
	ErrRunnerBusy = errclass.NewSentinel("the runner is running a job", errclass.ClassTransient, "")
	// ErrUnauthorized: the platform rejected the operator's credentials or
	// they lack a permission.
	ErrUnauthorized = errclass.NewSentinel("the CI platform rejected the credentials", errclass.ClassConfiguration, "Unauthorized")
	// ErrInvalidRequest: the platform refused the request as invalid (a
	// configuration problem, such as an unknown runner group).
	ErrInvalidRequest = errclass.NewSentinel("the CI platform refused the request", errclass.ClassConfiguration, reasonRequestRefused)
	// ErrRateLimited: see RateLimitError.
	ErrRateLimited = errclass.NewSentinel("rate limited by the CI platform", errclass.ClassTransient, "")
	// ErrUnavailable: the platform did not answer or answered 5xx.
	ErrUnavailable = errclass.NewSentinel("the CI platform is unavailable", errclass.ClassTransient, "")
)

// ErrJobNotBindable: the job a runner was made for (RunnerSpec.Job) is not
// one it may be bound to: not its pool's, not on its queue, or no longer
// waiting for an agent. The operator shows it on the claim as reason
// JobNotBindable (internal/workloads), a configuration error.
var ErrJobNotBindable = errors.New("the job cannot be bound to the runner")

// Webhook errors, about a delivery rather than a call to the platform.
var (
	// ErrWebhookNotConfigured: the receiver has no valid webhook secret
	// (its Secret does not exist yet, or was deleted); deliveries are
	// refused with 503 so that the platform retries them.
	ErrWebhookNotConfigured = errors.New("no webhook secret is configured")
	// ErrBadSignature: a webhook's signature is missing or does not match.
	ErrBadSignature = errors.New("webhook signature missing or invalid")
	// ErrUnknownHost: a delivery names an API host (WebhookFormat.HostHeader)
	// for which the receiver holds no secrets; it is refused unread.
	ErrUnknownHost = errors.New("webhook delivery from an API host the receiver has no secrets for")
	// ErrIgnoredEvent: a valid webhook that carries no job event.
	ErrIgnoredEvent = errors.New("webhook event is not a job event")
	// ErrMalformed: a webhook body that cannot be decoded.
	ErrMalformed = errors.New("malformed webhook payload")
)

// reasonRequestRefused is the reason of a request the platform refused.
const reasonRequestRefused = "RequestRefused"

// Classified returns err as the conditions of the object it fails report
// it. A refusal of the operator's credentials or of its request (an error
// wrapping ErrUnauthorized, ErrInvalidRequest or ErrNotFound) is a
// configuration problem for the user, and its reason names the platform
// that refused, such as GitHubUnauthorized or GitHubRequestRefused for
// platform GitHub (Backend.Name): the user must know where to look. An
// error that is already classified, and any other error, is returned as it
// is (errclass.Classify then calls it transient).
func Classified(platform string, err error) error {
	var classified *errclass.Error
	var s *errclass.Sentinel
	if errors.As(err, &classified) || !errors.As(err, &s) || s.Class() != errclass.ClassConfiguration {
		return err
	}
	return &errclass.Error{Class: errclass.ClassConfiguration, Reason: platform + s.Reason(), Err: err}
}

// RateLimitError says when a call may be retried. It matches
// ErrRateLimited with errors.Is.
type RateLimitError struct {
	// RetryAt is the earliest time to retry.
	RetryAt time.Time
	// Secondary is true for a secondary (abuse) limit, false for the
	// primary hourly budget.
	Secondary bool
	// Reserve is true when the budget left is kept for cleanup calls
	// (deregistration, cancellation) and the call was not made.
	Reserve bool
}

func (e *RateLimitError) Error() string {
	kind := "primary"
	switch {
	case e.Reserve:
		kind = "reserve kept for cleanup,"
	case e.Secondary:
		kind = "secondary"
	}
	return fmt.Sprintf("rate limited by the CI platform (%s limit): retry at %s", kind, e.RetryAt.UTC().Format(time.RFC3339))
}

// Is makes errors.Is(err, ErrRateLimited) true.
func (e *RateLimitError) Is(target error) bool { return target == ErrRateLimited }

// RetryAfter returns how long until a rate-limited call may be retried, and
// whether err is a rate limit at all.
func RetryAfter(err error, now time.Time) (time.Duration, bool) {
	var rl *RateLimitError
	if !errors.As(err, &rl) {
		return 0, false
	}
	return max(rl.RetryAt.Sub(now), 0), true
}

// Default runner labels added to every runner's own labels.
const (
	// LabelSelfHosted marks every self-hosted runner.
	LabelSelfHosted = "self-hosted"
	// LabelHyperFleet marks runners HyperFleet created.
	LabelHyperFleet = "hyperfleet"
)

// RunnerLabels is the full label set of a runner: self-hosted, the OS and
// architecture labels a self-hosted runner gets by default (Linux, X64 and
// so on, in the platform's spelling, given by the caller), hyperfleet and
// the pool's labels, without duplicates (case-insensitive) and in that
// order. Issuing credentials and routing jobs both use it, so a pool
// serves exactly the jobs its runners can take.
func RunnerLabels(defaults, labels []string) []string {
	out := make([]string, 0, 2+len(defaults)+len(labels))
	seen := map[string]bool{}
	add := func(l string) {
		k := strings.ToLower(l)
		if l == "" || seen[k] {
			return
		}
		seen[k] = true
		out = append(out, l)
	}
	add(LabelSelfHosted)
	for _, l := range defaults {
		add(l)
	}
	add(LabelHyperFleet)
	for _, l := range labels {
		add(l)
	}
	return out
}

// Covers reports whether a runner with runnerLabels may take a job asking
// for jobLabels: every job label is among the runner's, ignoring case.
func Covers(runnerLabels, jobLabels []string) bool {
	have := make(map[string]bool, len(runnerLabels))
	for _, l := range runnerLabels {
		have[strings.ToLower(l)] = true
	}
	for _, l := range jobLabels {
		if !have[strings.ToLower(l)] {
			return false
		}
	}
	return true
}

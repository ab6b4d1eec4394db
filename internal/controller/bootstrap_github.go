package controller

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/cloudinit"
	"github.com/hyperfleet/hyperfleet/internal/demand"
	"github.com/hyperfleet/hyperfleet/internal/metrics"
	"github.com/hyperfleet/hyperfleet/internal/ownership"
	"github.com/hyperfleet/hyperfleet/pkg/provider"
	"github.com/hyperfleet/hyperfleet/pkg/workload"
	ghworkload "github.com/hyperfleet/hyperfleet/pkg/workload/github"
)

// GitHubBootstrap is the BootstrapSource for GitHub Actions. For each VM it
// issues one single-use credential (a JIT runner configuration, or a
// registration token in runner-token mode) with the template's GitHub
// credentials, which never leave the operator; and it removes the runner
// when the claim goes.
//
// Issuance is recoverable without keeping the credential anywhere: the
// runner name is derived from the claim, so if the operator restarts
// between registering a JIT runner and recording it, the next attempt
// finds the name taken, removes that never-started runner and registers
// a new one. Its id is recorded in status.bootstrap with the status patch
// that follows the delivery.
type GitHubBootstrap struct {
	// Client reads templates' Secrets and RunnerPools.
	Client client.Reader
	// Clock stamps issuance; nil is the real clock.
	Clock clock.PassiveClock
	// Transport is the base HTTP transport to GitHub (TLS settings); nil
	// uses http.DefaultTransport.
	Transport http.RoundTripper
	// Signer marks default runner names as this install's
	// (ownership.Signer.RunnerName), which lets the orphan sweep remove a
	// runner whose claim is gone; nil leaves names unmarked and the
	// sweep never touches them.
	Signer *ownership.Signer

	mu        sync.Mutex
	providers map[string]cachedWorkload
}

type cachedWorkload struct {
	fingerprint string
	provider    workload.Provider
}

var _ BootstrapSource = (*GitHubBootstrap)(nil)

// BootstrapVars implements BootstrapSource.
func (b *GitHubBootstrap) BootstrapVars(ctx context.Context, claim *hfv1.MachineClaim, tmpl *hfv1.HypervisorMachineTemplate, vars *cloudinit.Vars) error {
	if wc := claim.Spec.WorkloadConfig; wc != nil && wc.Type != hfv1.WorkloadGitHubActions {
		// Another CI platform's claim: not ours to issue for. (A claim
		// without workloadConfig gets a runner of its template's scope.)
		return nil
	}
	if vars.SPIFFEEnabled {
		// Broker mode: the VM fetches its credential after attesting; none
		// goes into cloud-init.
		return nil
	}
	p, err := b.providerFor(ctx, claim, tmpl)
	if err != nil {
		return workloadError(err)
	}
	labels, err := b.runnerLabels(ctx, claim, tmpl)
	if err != nil {
		return err
	}
	vars.RunnerName = b.runnerName(claim, vars.RunnerName)
	spec := workload.RunnerSpec{
		Name: vars.RunnerName, Labels: labels, Group: vars.RunnerGroup,
		Method: workload.Method(vars.BootstrapMethod), WorkFolder: vars.RunnerConfig.WorkDir,
	}
	cred, err := b.issue(ctx, p, spec)
	if err != nil {
		return workloadError(err)
	}
	vars.Labels = cloudinit.List(labels)
	vars.RunnerName = cred.RunnerName
	switch cred.Method {
	case workload.MethodJIT:
		vars.JITConfig = cred.Secret.Reveal()
	case workload.MethodRegistrationToken:
		vars.RunnerToken = cred.Secret.Reveal()
		if cred.RegistrationURL != "" {
			vars.RegistrationURL = cred.RegistrationURL
		}
	}
	vars.ExpiresAt = cloudinit.Time{Time: cred.ExpiresAt}
	st := &hfv1.BootstrapStatus{RunnerName: cred.RunnerName, RunnerID: cred.RunnerID, CredentialIssuedAt: &metav1.Time{Time: cred.IssuedAt}}
	if !cred.ExpiresAt.IsZero() {
		st.CredentialExpiresAt = &metav1.Time{Time: cred.ExpiresAt}
	}
	if old := claim.Status.Bootstrap; old != nil {
		st.SPIFFEID, st.JobID, st.JobStartedAt = old.SPIFFEID, old.JobID, old.JobStartedAt
	}
	claim.Status.Bootstrap = st
	metrics.RunnerCredentials.WithLabelValues(string(cred.Method)).Inc()
	ctrl.LoggerFrom(ctx).Info("Issued a single-use runner credential", "method", cred.Method, "runner", cred.RunnerName, "runnerID", cred.RunnerID, "scope", p.Scope().String())
	return nil
}

// issue asks for the credential; a JIT name already taken by a runner that
// never came online (an earlier attempt of this claim) is removed once and
// the request repeated.
func (b *GitHubBootstrap) issue(ctx context.Context, p workload.Provider, spec workload.RunnerSpec) (workload.Credential, error) {
	cred, err := p.IssueCredential(ctx, spec)
	if !errors.Is(err, workload.ErrNameTaken) {
		return cred, err
	}
	old, gerr := p.GetRunner(ctx, spec.Name)
	switch {
	case errors.Is(gerr, workload.ErrNotFound):
		// Removed in between: try again.
	case gerr != nil:
		return workload.Credential{}, gerr
	case old.State != workload.RunnerOffline:
		return workload.Credential{}, fmt.Errorf("runner name %s is taken by a runner that is %s (id %d) in %s: %w; "+
			"give the claim another workloadConfig.github.runnerName", spec.Name, old.State, old.ID, p.Scope(), errRunnerNameTaken)
	default:
		if err := p.DeregisterRunner(ctx, old.ID, old.Name); err != nil {
			return workload.Credential{}, err
		}
		ctrl.LoggerFrom(ctx).Info("Removed an earlier, never started registration of this claim's runner", "runner", old.Name, "runnerID", old.ID)
	}
	return p.IssueCredential(ctx, spec)
}

// Release implements BootstrapSource: it removes the claim's runner from
// GitHub. A runner GitHub already removed (ephemeral runners go after
// their job) is success; a busy one returns workload.ErrRunnerBusy.
func (b *GitHubBootstrap) Release(ctx context.Context, claim *hfv1.MachineClaim, tmpl *hfv1.HypervisorMachineTemplate) error {
	st := claim.Status.Bootstrap
	if st == nil || st.RunnerName == "" && st.RunnerID == 0 {
		return nil
	}
	p, err := b.providerFor(ctx, claim, tmpl)
	if err != nil {
		return err
	}
	if err := p.DeregisterRunner(ctx, st.RunnerID, st.RunnerName); err != nil {
		return err
	}
	metrics.RunnersDeregistered.Inc()
	return nil
}

// errRunnerNameTaken: a live runner already has the claim's runner name.
var errRunnerNameTaken = errors.New("runner name taken")

// workloadError classifies a workload error for the claim's conditions.
func workloadError(err error) error {
	var classified *provider.Error
	switch {
	case errors.As(err, &classified):
		return err
	case errors.Is(err, errSecretMissing):
		return newConfigError(hfv1.SecretNotFoundReason, err)
	case errors.Is(err, workload.ErrUnauthorized):
		return newConfigError("GitHubUnauthorized", err)
	case errors.Is(err, workload.ErrInvalidRequest), errors.Is(err, workload.ErrNotFound):
		return newConfigError("GitHubRequestRefused", err)
	case errors.Is(err, errRunnerNameTaken):
		return newConfigError("RunnerNameTaken", err)
	}
	return err
}

// runnerLabels are the labels the claim's runner registers with: the
// claim's own, else its pool's, plus the default ones.
func (b *GitHubBootstrap) runnerLabels(ctx context.Context, claim *hfv1.MachineClaim, tmpl *hfv1.HypervisorMachineTemplate) ([]string, error) {
	var labels []string
	if wc := claim.Spec.WorkloadConfig; wc != nil && wc.GitHub != nil {
		labels = wc.GitHub.Labels
	}
	if len(labels) == 0 {
		pool, err := b.poolOf(ctx, claim)
		if err != nil {
			return nil, err
		}
		if pool != nil && pool.Spec.Workload.GitHub != nil {
			labels = pool.Spec.Workload.GitHub.Labels
		}
	}
	os, arch := runnerPlatform(tmpl)
	return ghworkload.RunnerLabels(os, arch, labels), nil
}

// runnerPlatform is the template's runner OS and architecture.
func runnerPlatform(tmpl *hfv1.HypervisorMachineTemplate) (string, string) {
	os, arch := "linux", "x64"
	if r := tmpl.Spec.Bootstrap.GitHub.Runner; r != nil {
		os, arch = orDefault(string(r.OS), os), orDefault(string(r.Arch), arch)
	}
	return os, arch
}

func (b *GitHubBootstrap) poolOf(ctx context.Context, claim *hfv1.MachineClaim) (*hfv1.RunnerPool, error) {
	ref := claim.Spec.RunnerPoolRef
	if ref == nil {
		return nil, nil
	}
	var pool hfv1.RunnerPool
	if err := b.Client.Get(ctx, client.ObjectKey{Namespace: claim.Namespace, Name: ref.Name}, &pool); err != nil {
		return nil, client.IgnoreNotFound(err)
	}
	return &pool, nil
}

// scopeOf is where the claim's runner registers: its pool's repository or
// organization when the pool narrows it, else the template's.
func (b *GitHubBootstrap) scopeOf(ctx context.Context, claim *hfv1.MachineClaim, tmpl *hfv1.HypervisorMachineTemplate) (workload.Scope, error) {
	gh := tmpl.Spec.Bootstrap.GitHub
	scope := workload.Scope{Owner: gh.Owner, Repository: gh.Repository}
	if gh.Organization != "" {
		scope = workload.Scope{Owner: gh.Organization}
	}
	pool, err := b.poolOf(ctx, claim)
	if err != nil || pool == nil || pool.Spec.Workload.GitHub == nil {
		return scope, err
	}
	switch pw := pool.Spec.Workload.GitHub; {
	case pw.Repository != "":
		owner, repo, _ := strings.Cut(pw.Repository, "/")
		scope = workload.Scope{Owner: owner, Repository: repo}
	case pw.Organization != "":
		scope = workload.Scope{Owner: pw.Organization}
	}
	return scope, nil
}

// providerFor returns the GitHub provider of the claim's scope with the
// template's credentials, reusing a cached one (and so its installation
// token and rate-limit state) while nothing changed.
func (b *GitHubBootstrap) providerFor(ctx context.Context, claim *hfv1.MachineClaim, tmpl *hfv1.HypervisorMachineTemplate) (workload.Provider, error) {
	scope, err := b.scopeOf(ctx, claim, tmpl)
	if err != nil {
		return nil, err
	}
	p, _, err := b.scopedProvider(ctx, tmpl, scope)
	return p, err
}

// PoolProvider returns the GitHub provider of a pool's scope (the pool's
// repository or organization, else its template's) with the template's
// credentials, and a key that is equal for pools sharing credentials and
// scope, so that a resync calls GitHub once for all of them.
func (b *GitHubBootstrap) PoolProvider(ctx context.Context, pool *hfv1.RunnerPool, tmpl *hfv1.HypervisorMachineTemplate) (workload.Provider, string, error) {
	scope, ok := demand.PoolScope(pool.Spec.Workload.GitHub, &tmpl.Spec.Bootstrap.GitHub)
	if !ok {
		return nil, "", newConfigError("GitHubScopeMissing", fmt.Errorf("RunnerPool %s: neither spec.workload.github nor template %s spec.bootstrap.github names a repository or organization", pool.Name, tmpl.Name))
	}
	p, key, err := b.scopedProvider(ctx, tmpl, scope)
	return p, key, workloadError(err)
}

// CancelJob implements JobCanceller: it cancels the workflow run of job
// on GitHub.
func (b *GitHubBootstrap) CancelJob(ctx context.Context, pool *hfv1.RunnerPool, tmpl *hfv1.HypervisorMachineTemplate, job *hfv1.CIJob) error {
	p, _, err := b.PoolProvider(ctx, pool, tmpl)
	if err != nil {
		return err
	}
	if job.Spec.RunID == 0 {
		return fmt.Errorf("job %d has no workflow run id to cancel: %w", job.Spec.JobID, workload.ErrNotFound)
	}
	return p.CancelRun(ctx, job.Spec.Repository, job.Spec.RunID)
}

// scopedProvider returns the cached provider of tmpl's credentials in
// scope, and its cache key.
func (b *GitHubBootstrap) scopedProvider(ctx context.Context, tmpl *hfv1.HypervisorMachineTemplate, scope workload.Scope) (workload.Provider, string, error) {
	cfg, err := b.config(ctx, tmpl, scope)
	if err != nil {
		return nil, "", err
	}
	key := tmpl.Namespace + "/" + tmpl.Name + "/" + scope.String()
	fp := ghworkload.Fingerprint(cfg)
	b.mu.Lock()
	defer b.mu.Unlock()
	if c, ok := b.providers[key]; ok && c.fingerprint == fp {
		return c.provider, key, nil
	}
	p, err := ghworkload.New(cfg)
	if err != nil {
		return nil, "", newConfigError("GitHubCredentialsInvalid", fmt.Errorf("spec.bootstrap.github of HypervisorMachineTemplate %s: %w", tmpl.Name, err))
	}
	if b.providers == nil {
		b.providers = map[string]cachedWorkload{}
	}
	b.providers[key] = cachedWorkload{fingerprint: fp, provider: p}
	return p, key, nil
}

// config builds the provider configuration from the template and its
// Secrets (in the template's namespace only).
func (b *GitHubBootstrap) config(ctx context.Context, tmpl *hfv1.HypervisorMachineTemplate, scope workload.Scope) (ghworkload.Config, error) {
	gh := tmpl.Spec.Bootstrap.GitHub
	cfg := ghworkload.Config{
		BaseURL: orDefault(gh.APIBaseURL, ghworkload.DefaultBaseURL), Scope: scope,
		Transport: b.Transport, Clock: b.Clock,
		RunnerURL:   runnerURLFor(gh, scope),
		ObserveCall: metrics.ObserveGitHubCall, ObserveRate: metrics.ObserveGitHubRate(scope.Owner),
	}
	if t := tmpl.Spec.Bootstrap.HTTPTimeout; t != nil {
		cfg.HTTPTimeout = t.Duration
	}
	if u := gh.RegistrationURLs; u != nil {
		r := strings.NewReplacer("{owner}", scope.Owner, "{repo}", scope.Repository)
		if scope.IsOrganization() {
			cfg.RegistrationTokenURL = r.Replace(u.Organization)
		} else {
			cfg.RegistrationTokenURL = r.Replace(u.Repository)
		}
	}
	read := func(field string, sel hfv1.LocalSecretKeySelector) ([]byte, error) {
		return secretValue(ctx, b.Client, field, tmpl.Namespace, sel.Name, sel.Key)
	}
	creds := gh.Credentials
	switch {
	case creds.PAT != nil:
		v, err := read("spec.bootstrap.github.credentials.pat", *creds.PAT)
		if err != nil {
			return cfg, err
		}
		cfg.Token = strings.TrimSpace(string(v))
	case creds.App != nil:
		appID, err := read("spec.bootstrap.github.credentials.app.appId", creds.App.AppID)
		if err != nil {
			return cfg, err
		}
		inst, err := read("spec.bootstrap.github.credentials.app.installationId", creds.App.InstallationID)
		if err != nil {
			return cfg, err
		}
		key, err := read("spec.bootstrap.github.credentials.app.privateKey", creds.App.PrivateKey)
		if err != nil {
			return cfg, err
		}
		a := &ghworkload.AppCredentials{PrivateKey: key}
		if a.AppID, err = strconv.ParseInt(strings.TrimSpace(string(appID)), 10, 64); err != nil {
			return cfg, newConfigError("GitHubCredentialsInvalid", fmt.Errorf("spec.bootstrap.github.credentials.app.appId: Secret %s key %s must hold the App's numeric id", creds.App.AppID.Name, creds.App.AppID.Key))
		}
		if a.InstallationID, err = strconv.ParseInt(strings.TrimSpace(string(inst)), 10, 64); err != nil {
			return cfg, newConfigError("GitHubCredentialsInvalid", fmt.Errorf("spec.bootstrap.github.credentials.app.installationId: Secret %s key %s must hold the installation's numeric id", creds.App.InstallationID.Name, creds.App.InstallationID.Key))
		}
		cfg.App = a
	default:
		return cfg, newConfigError("GitHubCredentialsInvalid", errors.New("spec.bootstrap.github.credentials sets neither app nor pat"))
	}
	return cfg, nil
}

// runnerURLFor is the URL a registration-token runner of scope registers
// to (spec.bootstrap.github.runnerURLs, else the web URL of the scope).
func runnerURLFor(gh hfv1.GitHubBootstrap, scope workload.Scope) string {
	g := gh
	g.Owner, g.Repository = scope.Owner, scope.Repository
	return registrationURL(g)
}

// newConfigError classifies err as a configuration problem the user must
// fix, with reason for the claim's condition.
func newConfigError(reason string, err error) error {
	return &provider.Error{Class: provider.ClassConfiguration, Reason: reason, Err: err}
}

// retryAfterWorkload is the requeue for a rate-limited workload call.
func retryAfterWorkload(err error, now time.Time) (time.Duration, bool) {
	d, ok := workload.RetryAfter(err, now)
	if ok && d < time.Second {
		d = time.Second
	}
	return d, ok
}

// runnerName is the name the claim's runner registers under: a name the
// claim sets (workloadConfig.github.runnerName) as given, since it is the
// user's and the orphan sweep must never remove that runner; otherwise the
// default name marked as this install's (ownership.Signer.RunnerName), so
// that the sweep can remove the runner once its claim is gone.
func (b *GitHubBootstrap) runnerName(claim *hfv1.MachineClaim, name string) string {
	if wc := claim.Spec.WorkloadConfig; b.Signer == nil || wc != nil && wc.GitHub != nil && wc.GitHub.RunnerName != "" {
		return name
	}
	return b.Signer.RunnerName(name)
}

package github

import (
	"bytes"
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/pkg/errclass"
	"github.com/hyperfleet/hyperfleet/pkg/workload"
	"github.com/hyperfleet/hyperfleet/pkg/workload/platformbackend"
)

// The API sections GitHub Actions reads, for messages.
const (
	templateField = "spec.bootstrap.github"
	poolField     = "spec.workload.github"
)

// Runner software defaults, the same as the CRD's, for objects created
// before a default existed.
const (
	defaultInstallPath  = "/opt/actions-runner"
	defaultWorkDir      = "/var/lib/hyperfleet/work"
	defaultConfigScript = "config.sh"
	defaultRunScript    = "run.sh"
	defaultOS           = "linux"
	defaultArch         = "x64"
)

// reasonCredentialsInvalid: the template's GitHub credentials cannot make a
// client (an App id that is not a number, a key that does not parse).
const reasonCredentialsInvalid = "GitHubCredentialsInvalid"

// Backend is GitHub Actions as a workload.Backend: it reads
// spec.bootstrap.github of templates, spec.workload.github of RunnerPools
// and spec.workloadConfig.github of MachineClaims, builds Providers with a
// template's personal access token or App installation, and parses
// workflow_job webhooks. Register it under hfv1.WorkloadGitHubActions with
// NewBackend.
type Backend struct {
	platformbackend.Base[*Provider]
}

var _ workload.WebhookReceiver = (*Backend)(nil)

// NewBackend is the workload.Factory of GitHub Actions. It registers the
// CI platform API metrics (pkg/workload/workloadmetrics) with deps.Metrics.
var NewBackend = platformbackend.Factory[*Provider, Backend](platformbackend.Identity{
	Name: "GitHub", TemplateField: templateField, Webhooks: WebhookFormat,
})

// Template implements workload.Backend for a template with a
// spec.bootstrap.github.
func (*Backend) Template(tmpl *hfv1.HypervisorMachineTemplate) (workload.Template, bool) {
	gh := tmpl.Spec.Bootstrap.GitHub
	if gh == nil {
		return workload.Template{}, false
	}
	t := workload.Template{
		Field:           templateField,
		Runner:          runnerSoftware(tmpl),
		RegistrationURL: registrationURL(gh),
		RunnerGroup:     gh.RunnerGroup,
		Secrets:         secretRefs(gh.Credentials),
		CredentialsKey:  credentialsKey(gh),
	}
	t.Scope, t.ScopeField = templateScope(gh)
	if base := cmp.Or(gh.APIBaseURL, DefaultBaseURL); base != DefaultBaseURL {
		t.Endpoint = base
	}
	t.Scope.Host = scopeHost(gh)
	t.APIHosts = apiHosts(gh)
	t.DefaultLabels = DefaultLabels(t.Runner.OS, t.Runner.Arch)
	t.CredentialReuse = credentialReuse(tmpl.Spec.Bootstrap.Method)
	return t, true
}

// credentialReuse is workload.Template.CredentialReuse for a template's
// bootstrap method: a JIT configuration is single-job on GitHub's side (its
// runner is registered by the operator and GitHub gives it one job); a
// registration token is not, at any scope, a repository's included.
func credentialReuse(method hfv1.BootstrapMethod) string {
	if method != hfv1.BootstrapRunnerToken {
		return ""
	}
	return "spec.bootstrap.method is runner-token: each VM receives a registration token that, for an hour, registers any number of runners, " +
		"ephemeral or not, each of which GitHub gives jobs of the token's scope (its repository, or any repository of its organization or enterprise " +
		"that the runner group admits), so a job that reads it from its VM can run runners elsewhere that take other jobs and their secrets; " +
		"set spec.bootstrap.method: jit-config, which gives each VM one runner the operator registers and GitHub gives one job only"
}

// publicAPIHost is the host of GitHub.com's REST API (DefaultBaseURL).
const publicAPIHost = "api.github.com"

// scopeHost is the API host of the template's scopes
// (workload.Scope.Host): empty for GitHub.com, else the host of
// apiBaseURL (a GitHub Enterprise Server, whose webhooks name it in
// WebhookHostHeader).
func scopeHost(gh *hfv1.GitHubBootstrap) string {
	return workload.ScopeHostOf(cmp.Or(gh.APIBaseURL, DefaultBaseURL), publicAPIHost)
}

// apiHosts are the hosts of the URLs the operator calls with the
// template's credentials: apiBaseURL and the registration-token URLs
// (runnerURLs are the VMs', not the operator's). The URLs' placeholders
// are path segments, never the host.
func apiHosts(gh *hfv1.GitHubBootstrap) []workload.APIHost {
	out := []workload.APIHost{workload.APIHostOf(templateField+".apiBaseURL", cmp.Or(gh.APIBaseURL, DefaultBaseURL), publicAPIHost)}
	if r := gh.RegistrationURLs; r != nil {
		fill := strings.NewReplacer("{owner}", "o", "{repo}", "r")
		for field, u := range map[string]string{".registrationURLs.repository": r.Repository, ".registrationURLs.organization": r.Organization} {
			if u != "" {
				out = append(out, workload.APIHostOf(templateField+field, fill.Replace(u), publicAPIHost))
			}
		}
		slices.SortFunc(out[1:], func(a, b workload.APIHost) int { return strings.Compare(a.Field, b.Field) })
	}
	return out
}

// Pool implements workload.Backend for a github-actions pool.
func (*Backend) Pool(pool *hfv1.RunnerPool, tmpl *hfv1.HypervisorMachineTemplate) (workload.Pool, bool) {
	w := pool.Spec.Workload.GitHub
	if pool.Spec.Workload.Type != hfv1.WorkloadGitHubActions || w == nil {
		return workload.Pool{}, false
	}
	var b *hfv1.GitHubBootstrap
	if tmpl != nil {
		b = tmpl.Spec.Bootstrap.GitHub
	}
	p := workload.Pool{
		Field:  poolField,
		Labels: w.Labels,
		// A GitHub job always has runs-on labels; a runner takes any job
		// its labels cover.
		RunUntagged: true,
		Claim: &hfv1.WorkloadConfig{Type: hfv1.WorkloadGitHubActions, GitHub: &hfv1.GitHubRunnerConfig{
			Labels: append([]string(nil), w.Labels...), RunnerGroup: w.RunnerGroup,
		}},
	}
	p.Scope, _ = poolScope(w, b)
	if b != nil {
		// A pool names an owner or repository, never a host: its
		// template's API decides where the pool's scope is.
		p.Scope.Host = scopeHost(b)
	}
	if w.ScaleSet != nil {
		// The template's runner group is its organization runners'
		// default; a repository's scale set is in the repository's
		// Default group (internal/workloads, runnerGroup).
		group := w.RunnerGroup
		if group == "" && b != nil && p.Scope.IsOrganization() {
			group = b.RunnerGroup
		}
		os, arch := defaultOS, defaultArch
		if tmpl != nil {
			rs := runnerSoftware(tmpl)
			os, arch = rs.OS, rs.Arch
		}
		p.Feed = &workload.FeedSpec{Name: w.ScaleSet.Name, Group: group, Labels: RunnerLabels(os, arch, w.Labels)}
		p.FeedField = poolField + ".scaleSet"
		switch {
		case b != nil && b.Enterprise != "":
			p.FeedRefusal = fmt.Sprintf("%s: runner scale sets of enterprise runners (%s.enterprise %s) are not served; remove scaleSet and take the pool's jobs from webhooks, or use a template of organization runners", p.FeedField, templateField, b.Enterprise)
		case tmpl != nil && tmpl.Spec.Bootstrap.Method == hfv1.BootstrapRunnerToken:
			p.FeedRefusal = fmt.Sprintf("%s: a scale set's runners register with just-in-time configurations only, and HypervisorMachineTemplate %s has spec.bootstrap.method %s; set it to %s or remove scaleSet", p.FeedField, tmpl.Name, hfv1.BootstrapRunnerToken, hfv1.BootstrapJITConfig)
		}
	}
	switch {
	case w.Repository != "":
		p.ScopeField, p.OwnScope = poolField+".repository", true
	case w.Organization != "":
		p.ScopeField, p.OwnScope = poolField+".organization", true
	default:
		p.ScopeField = "the template's " + templateField + " scope"
	}
	return p, true
}

// Claim implements workload.Backend: spec.workloadConfig.github.
func (*Backend) Claim(claim *hfv1.MachineClaim) workload.ClaimRunner {
	wc := claim.Spec.WorkloadConfig
	if wc == nil || wc.GitHub == nil {
		return workload.ClaimRunner{}
	}
	return workload.ClaimRunner{Name: wc.GitHub.RunnerName, Labels: wc.GitHub.Labels, Group: wc.GitHub.RunnerGroup}
}

// WebhookFormat is how GitHub delivers webhooks (workload.WebhookFormat).
var WebhookFormat = workload.WebhookFormat{
	Platform: "GitHub", Label: string(hfv1.WorkloadGitHubActions), Path: "/webhooks/github",
	EventHeader: WebhookEventHeader, Events: []string{WebhookEventWorkflowJob, WebhookEventPing},
	DeliveryHeader: WebhookDeliveryHeader, SignatureHeader: WebhookSignatureHeader,
	// GitHub Enterprise Server names itself; GitHub.com sends no such
	// header.
	HostHeader: WebhookEnterpriseHostHeader, PublicHosts: []string{"github.com", publicAPIHost},
	Used: "workflow_job queued, waiting, in_progress and completed events",
	Operator: workload.WebhookFlags{
		Name: "github", DefaultSecret: "hyperfleet-github-webhook",
		OwnerKeys: "owner.<login> (the secret of one organization's or user's webhooks, which only it may use)",
		Owners:    "owner", Docs: "docs/install.md",
		PublicService: "GitHub.com", ExampleHost: "ghes.example.com (a GitHub Enterprise Server)",
	},
}

// WebhookParser implements workload.WebhookReceiver.
func (*Backend) WebhookParser(secret []byte, ownerSecrets map[string][]byte) workload.WebhookParser {
	return WebhookParser{WebhookSecrets: workload.WebhookSecrets{Secret: secret, OwnerSecrets: ownerSecrets}}
}

// Provider implements workload.Backend: the provider of scope with tmpl's
// credentials, reused (and so its installation token and rate-limit state)
// while the configuration and credentials it was built from stay the same.
func (b *Backend) Provider(ctx context.Context, tmpl *hfv1.HypervisorMachineTemplate, scope workload.Scope, secrets workload.SecretReader) (workload.Provider, error) {
	cfg, err := b.config(ctx, tmpl, scope, secrets)
	if err != nil {
		return nil, err
	}
	return b.CachedProvider(tmpl, scope, Fingerprint(cfg), func() (*Provider, error) { return New(cfg) })
}

// config builds the provider configuration from the template and its
// Secrets (in the template's namespace only).
func (b *Backend) config(ctx context.Context, tmpl *hfv1.HypervisorMachineTemplate, scope workload.Scope, secrets workload.SecretReader) (Config, error) {
	gh := tmpl.Spec.Bootstrap.GitHub
	if gh == nil {
		return Config{}, b.ErrNoSection(tmpl)
	}
	cfg := Config{
		BaseURL: cmp.Or(gh.APIBaseURL, DefaultBaseURL), Scope: scope,
		Transport: b.Transport, Clock: b.Clock, Logger: b.Logger,
		RunnerURL:   runnerURLFor(gh, scope),
		ObserveCall: observeCall, ObserveRate: observeRate(cmp.Or(scope.Owner, scope.Enterprise)),
		RunnerGroup: gh.RunnerGroup, HTTPTimeout: platformbackend.HTTPTimeout(tmpl),
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
		return secrets(ctx, field, tmpl.Namespace, sel)
	}
	creds := gh.Credentials
	switch {
	case creds.PAT != nil:
		v, err := read(templateField+".credentials.pat", *creds.PAT)
		if err != nil {
			return cfg, err
		}
		cfg.Token = strings.TrimSpace(string(v))
	case creds.App != nil:
		app, err := appCredentials(creds.App, read)
		if err != nil {
			return cfg, err
		}
		cfg.App = app
		if scope.IsEnterprise() {
			return cfg, errclass.Errorf(errclass.ClassConfiguration, reasonCredentialsInvalid,
				"%s.enterprise needs %s.credentials.pat (a personal access token (classic) with manage_runners:enterprise): GitHub Apps cannot manage enterprise runners", templateField, templateField)
		}
	default:
		return cfg, errclass.Errorf(errclass.ClassConfiguration, reasonCredentialsInvalid, "%s.credentials sets neither app nor pat", templateField)
	}
	return cfg, nil
}

// appCredentials reads a GitHub App's id, installation id and private key.
func appCredentials(app *hfv1.GitHubAppCredentials, read func(string, hfv1.LocalSecretKeySelector) ([]byte, error)) (*AppCredentials, error) {
	field := templateField + ".credentials.app"
	appID, err := read(field+".appID", app.AppID)
	if err != nil {
		return nil, err
	}
	inst, err := read(field+".installationID", app.InstallationID)
	if err != nil {
		return nil, err
	}
	key, err := read(field+".privateKey", app.PrivateKey)
	if err != nil {
		return nil, err
	}
	a := &AppCredentials{PrivateKey: key}
	if a.AppID, err = strconv.ParseInt(strings.TrimSpace(string(appID)), 10, 64); err != nil {
		return nil, errclass.Errorf(errclass.ClassConfiguration, reasonCredentialsInvalid, "%s.appID: Secret %s key %s must hold the App's numeric id", field, app.AppID.Name, app.AppID.Key)
	}
	if a.InstallationID, err = strconv.ParseInt(strings.TrimSpace(string(inst)), 10, 64); err != nil {
		return nil, errclass.Errorf(errclass.ClassConfiguration, reasonCredentialsInvalid, "%s.installationID: Secret %s key %s must hold the installation's numeric id", field, app.InstallationID.Name, app.InstallationID.Key)
	}
	return a, nil
}

// secretRefs lists every Secret key the credentials are read from, with
// the field that names it.
func secretRefs(creds hfv1.GitHubCredentials) map[string]hfv1.LocalSecretKeySelector {
	out := map[string]hfv1.LocalSecretKeySelector{}
	if creds.PAT != nil {
		out[templateField+".credentials.pat"] = *creds.PAT
	}
	if app := creds.App; app != nil {
		out[templateField+".credentials.app.appID"] = app.AppID
		out[templateField+".credentials.app.privateKey"] = app.PrivateKey
		out[templateField+".credentials.app.installationID"] = app.InstallationID
	}
	return out
}

// credentialsKey identifies the GitHub credentials a template gives its
// pools: the API, the registration URLs and which Secret keys hold the
// credentials (never their values). Rotating a Secret's value is caught
// by the periodic re-check of the pools' scopes instead. Its encoding is
// what RunnerPools' status.scopeVerification records: changing it would
// take every pool out of routing until checked again.
func credentialsKey(gh *hfv1.GitHubBootstrap) string {
	raw, _ := json.Marshal(struct {
		API   string
		Reg   *hfv1.ScopedURLs
		Creds hfv1.GitHubCredentials
	}{gh.APIBaseURL, gh.RegistrationURLs, gh.Credentials})
	// The key is computed as before the API spelt appId and installationId
	// with ID (api/v1alpha1/spelling.go), so that pools keep their
	// verification across the upgrade. Neither key can occur inside a
	// value: Secret names and keys hold no quote.
	raw = bytes.Replace(raw, []byte(`"appID":`), []byte(`"appId":`), 1)
	raw = bytes.Replace(raw, []byte(`"installationID":`), []byte(`"installationId":`), 1)
	sum := sha256.Sum256(raw)
	return hex.EncodeToString(sum[:])
}

// templateScope is a template's own scope and the field it comes from:
// owner and repository for repository runners, the organization for
// organization runners; zero when the template names neither.
func templateScope(b *hfv1.GitHubBootstrap) (workload.Scope, string) {
	switch {
	case b == nil:
	case b.Repository != "" && b.Owner != "":
		return workload.Scope{Owner: b.Owner, Repository: b.Repository}, templateField + ".repository"
	case b.Organization != "":
		return workload.Scope{Owner: b.Organization}, templateField + ".organization"
	case b.Enterprise != "":
		return workload.Scope{Enterprise: b.Enterprise}, templateField + ".enterprise"
	}
	return workload.Scope{}, ""
}

// poolScope is the scope a pool serves: its own repository (owner/name)
// or organization, else its template's. False when neither says. Under a
// template of enterprise runners the pool's repository or organization is
// served by the enterprise's runners; without either the scope is the
// bare enterprise, which holds no job (workload.Scope.Enterprise) and
// VerifyScope refuses.
func poolScope(w *hfv1.GitHubWorkload, b *hfv1.GitHubBootstrap) (workload.Scope, bool) {
	enterprise := ""
	if b != nil {
		enterprise = b.Enterprise
	}
	switch {
	case w != nil && w.Repository != "":
		owner, name, ok := strings.Cut(w.Repository, "/")
		if !ok || owner == "" || name == "" {
			return workload.Scope{}, false
		}
		return workload.Scope{Enterprise: enterprise, Owner: owner, Repository: name}, true
	case w != nil && w.Organization != "":
		return workload.Scope{Enterprise: enterprise, Owner: w.Organization}, true
	}
	s, _ := templateScope(b)
	return s, !s.IsZero()
}

// runnerSoftware is the template's runner package and its place in the VM,
// with the defaults applied and a resolved release (status.runner) in
// place of the version it was resolved from.
func runnerSoftware(tmpl *hfv1.HypervisorMachineTemplate) workload.RunnerSoftware {
	rs := workload.RunnerSoftware{
		InstallPath: defaultInstallPath, WorkDir: defaultWorkDir,
		ConfigScript: defaultConfigScript, RunScript: defaultRunScript, OS: defaultOS, Arch: defaultArch,
	}
	gh := tmpl.Spec.Bootstrap.GitHub
	if gh == nil || gh.Runner == nil {
		return rs
	}
	r := gh.Runner
	rs.InstallPath = cmp.Or(r.InstallPath, rs.InstallPath)
	rs.WorkDir = cmp.Or(r.WorkDir, rs.WorkDir)
	rs.ConfigScript = cmp.Or(r.ConfigScript, rs.ConfigScript)
	rs.RunScript = cmp.Or(r.RunScript, rs.RunScript)
	rs.OS = cmp.Or(string(r.OS), rs.OS)
	rs.Arch = cmp.Or(string(r.Arch), rs.Arch)
	rs.Version = r.Version
	rs.DownloadURL = strings.NewReplacer("{os}", rs.OS, "{arch}", rs.Arch).Replace(r.DownloadURL)
	rs.DownloadSHA256 = r.DownloadSHA256
	if rr := tmpl.Status.Runner; r.Version != "" && rr != nil {
		// Resolved by the template controller from the release.
		rs.DownloadURL, rs.DownloadSHA256 = rr.DownloadURL, rr.DownloadSHA256
	}
	return rs
}

// registrationURL is where runners register: the runnerURLs template for
// the template's scope, or GitHub's web URL derived from apiBaseURL.
func registrationURL(gh *hfv1.GitHubBootstrap) string {
	repo := gh.Repository
	owner := gh.Owner
	if u := gh.RunnerURLs; u != nil {
		r := strings.NewReplacer("{owner}", owner, "{repo}", repo)
		if repo != "" && u.Repository != "" {
			return r.Replace(u.Repository)
		}
		if repo == "" && u.Organization != "" {
			return r.Replace(u.Organization)
		}
	}
	web := "https://github.com"
	if api := strings.TrimRight(gh.APIBaseURL, "/"); api != "" && api != DefaultBaseURL {
		// GitHub Enterprise Server serves its API under /api/v3.
		web = strings.TrimSuffix(api, "/api/v3")
	}
	if gh.Enterprise != "" {
		// Enterprise runners register to the enterprise, whichever
		// organization's jobs they take.
		return web + "/enterprises/" + gh.Enterprise
	}
	if repo != "" {
		return web + "/" + owner + "/" + repo
	}
	return web + "/" + owner
}

// runnerURLFor is the URL a registration-token runner of scope registers
// to (spec.bootstrap.github.runnerURLs, else the web URL of the scope).
func runnerURLFor(gh *hfv1.GitHubBootstrap, scope workload.Scope) string {
	c := *gh
	c.Owner, c.Repository, c.Enterprise = scope.Owner, scope.Repository, scope.Enterprise
	return registrationURL(&c)
}

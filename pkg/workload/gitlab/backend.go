package gitlab

import (
	"cmp"
	"context"
	"path"
	"strings"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/pkg/workload"
	"github.com/hyperfleet/hyperfleet/pkg/workload/gitlab/gitlabvm"
	"github.com/hyperfleet/hyperfleet/pkg/workload/platformbackend"
)

// The API sections GitLab CI reads, for messages.
const (
	templateField = "spec.bootstrap.gitlab"
	poolField     = "spec.workload.gitlab"
)

// Runner defaults, the same as the CRD's, for objects created before a
// default existed.
const (
	defaultRunnerPath = "/usr/local/bin/gitlab-runner"
	defaultBuildsDir  = "/var/lib/hyperfleet/builds"
	defaultOS         = "linux"
	defaultArch       = "amd64"
)

// Backend is GitLab CI as a workload.Backend. Register it under
// hfv1.WorkloadGitLabCI with NewBackend.
type Backend struct {
	platformbackend.Base[*Provider]
}

var _ workload.WebhookReceiver = (*Backend)(nil)

// NewBackend is the workload.Factory of GitLab CI. It registers the GitLab
// CI platform API metrics (pkg/workload/workloadmetrics) with deps.Metrics.
var NewBackend = platformbackend.Factory[*Provider, Backend](platformbackend.Identity{
	Name: "GitLab", TemplateField: templateField, Webhooks: WebhookFormat,
})

// ScopeOf is the neutral scope of a GitLab project or group full path: a
// project a/b/c is Owner a/b, Repository c; a group a/b is Owner a/b.
func ScopeOf(project, group string, instance bool) workload.Scope {
	switch {
	case project != "":
		i := strings.LastIndex(project, "/")
		if i <= 0 {
			return workload.Scope{}
		}
		return workload.Scope{Owner: project[:i], Repository: project[i+1:]}
	case group != "":
		return workload.Scope{Owner: group}
	case instance:
		return workload.Scope{Instance: true}
	}
	return workload.Scope{}
}

// templateScope is a template's scope and the field it comes from.
func templateScope(g *hfv1.GitLabBootstrap) (workload.Scope, string) {
	if g == nil {
		return workload.Scope{}, ""
	}
	s := ScopeOf(g.Project, g.Group, g.Instance)
	switch {
	case g.Project != "":
		return s, templateField + ".project"
	case g.Group != "":
		return s, templateField + ".group"
	case g.Instance:
		return s, templateField + ".instance"
	}
	return s, ""
}

// Template implements workload.Backend for a template with a
// spec.bootstrap.gitlab.
func (*Backend) Template(tmpl *hfv1.HypervisorMachineTemplate) (workload.Template, bool) {
	g := tmpl.Spec.Bootstrap.GitLab
	if g == nil {
		return workload.Template{}, false
	}
	t := workload.Template{
		Field:           templateField,
		Runner:          runnerSoftware(g),
		RegistrationURL: instanceURL(g),
		AgentPlatform:   string(gitlabvm.Platform),
		BootstrapMethod: string(MethodRunnerAuthToken),
		Secrets:         map[string]hfv1.LocalSecretKeySelector{templateField + ".credentials.token": g.Credentials.Token},
		CredentialsKey:  credentialsKey(g),
	}
	t.Scope, t.ScopeField = templateScope(g)
	if u := instanceURL(g); u != DefaultURL {
		t.Endpoint = u
	}
	t.Scope.Host = scopeHost(g)
	t.APIHosts = []workload.APIHost{workload.APIHostOf(templateField+".url", instanceURL(g), publicHost)}
	t.CredentialReuse = credentialReuse
	return t, true
}

// credentialReuse is workload.Template.CredentialReuse of every GitLab
// template: a runner authentication token is multi-job on GitLab's side,
// whatever HyperFleet does; what limits it is said with it.
const credentialReuse = "a GitLab runner authentication token is multi-job on GitLab's side: until the runner is deleted, any process holding it may ask " +
	"for jobs of the runner's scope and tags (a not_protected runner's include protected-branch jobs and their protected variables); " +
	"gitlab-runner's --max-builds 1 binds only the VM's own runner. HyperFleet limits it: the runner is paused as soon as its first job " +
	"is seen (Job Hook or resync), after which GitLab gives it no other job; its maximum_timeout is the pool's spec.lifecycle.jobTimeout; " +
	"in the VM, gitlab-runner runs as root and the job as the runner user (the agent's --run-as), who cannot read the token; " +
	"the runner is deleted with the VM"

// publicHost is GitLab.com's host (DefaultURL).
const publicHost = "gitlab.com"

// scopeHost is the API host of the template's scopes
// (workload.Scope.Host): empty for GitLab.com, else the self-managed
// instance's host, which its Job Hooks name in WebhookInstanceHeader.
func scopeHost(g *hfv1.GitLabBootstrap) string {
	return workload.ScopeHostOf(instanceURL(g), publicHost)
}

// instanceURL is the template's GitLab instance, defaulted.
func instanceURL(g *hfv1.GitLabBootstrap) string {
	return strings.TrimRight(cmp.Or(g.URL, DefaultURL), "/")
}

// runnerSoftware is the gitlab-runner binary and its builds directory, with
// the defaults applied: InstallPath is the binary's directory and RunScript
// its file name (as the VM's agent runs it), WorkDir the builds directory. A
// downloaded runner (GitLab publishes the bare binary) goes into a directory
// of its own (DownloadedRunnerDir), which the VM's agent empties after the
// job; a runner baked into the image stays where the template says.
func runnerSoftware(g *hfv1.GitLabBootstrap) workload.RunnerSoftware {
	rs := workload.RunnerSoftware{WorkDir: defaultBuildsDir, OS: defaultOS, Arch: defaultArch}
	bin := defaultRunnerPath
	if r := g.Runner; r != nil {
		bin = cmp.Or(r.Path, bin)
		rs.WorkDir = cmp.Or(r.BuildsDir, rs.WorkDir)
		rs.OS = cmp.Or(string(r.OS), rs.OS)
		rs.Arch = cmp.Or(string(r.Arch), rs.Arch)
		rs.DownloadURL = strings.NewReplacer("{os}", rs.OS, "{arch}", rs.Arch).Replace(r.DownloadURL)
		rs.DownloadSHA256 = r.DownloadSHA256
	}
	rs.InstallPath, rs.RunScript = path.Dir(bin), path.Base(bin)
	if rs.DownloadURL != "" {
		rs.InstallPath, rs.RunScript = DownloadedRunnerDir, "gitlab-runner"
	}
	return rs
}

// DownloadedRunnerDir is where a VM puts a downloaded gitlab-runner binary.
const DownloadedRunnerDir = "/opt/gitlab-runner"

// credentialsKey identifies the GitLab credentials a template gives its
// pools: the instance and which Secret key holds the token (never its
// value); see workload.Template.CredentialsKey.
func credentialsKey(g *hfv1.GitLabBootstrap) string {
	return workload.KeyOf(struct {
		URL   string
		Creds hfv1.GitLabCredentials
	}{instanceURL(g), g.Credentials})
}

// Pool implements workload.Backend for a gitlab-ci pool: its tags are its
// runners' labels, its scope its own project or group, else its
// template's.
func (*Backend) Pool(pool *hfv1.RunnerPool, tmpl *hfv1.HypervisorMachineTemplate) (workload.Pool, bool) {
	w := pool.Spec.Workload.GitLab
	if pool.Spec.Workload.Type != hfv1.WorkloadGitLabCI || w == nil {
		return workload.Pool{}, false
	}
	p := workload.Pool{
		Field:  poolField,
		Labels: w.Tags,
		Claim: &hfv1.WorkloadConfig{Type: hfv1.WorkloadGitLabCI, GitLab: &hfv1.GitLabRunnerConfig{
			Tags: append([]string(nil), w.Tags...), RunUntagged: w.RunUntagged,
		}},
	}
	if tmpl != nil && tmpl.Spec.Bootstrap.GitLab != nil {
		p.RunUntagged = tmpl.Spec.Bootstrap.GitLab.RunUntagged
	}
	if w.RunUntagged != nil {
		p.RunUntagged = *w.RunUntagged
	}
	switch {
	case w.Project != "":
		p.Scope, p.ScopeField, p.OwnScope = ScopeOf(w.Project, "", false), poolField+".project", true
	case w.Group != "":
		p.Scope, p.ScopeField, p.OwnScope = ScopeOf("", w.Group, false), poolField+".group", true
	default:
		p.ScopeField = "the template's " + templateField + " scope"
		if tmpl != nil {
			p.Scope, _ = templateScope(tmpl.Spec.Bootstrap.GitLab)
		}
	}
	if tmpl != nil && tmpl.Spec.Bootstrap.GitLab != nil {
		// A pool names a project or group, never an instance: its
		// template's decides where the pool's scope is.
		p.Scope.Host = scopeHost(tmpl.Spec.Bootstrap.GitLab)
	}
	return p, true
}

// Claim implements workload.Backend: spec.workloadConfig.gitlab.
func (*Backend) Claim(claim *hfv1.MachineClaim) workload.ClaimRunner {
	wc := claim.Spec.WorkloadConfig
	if wc == nil || wc.GitLab == nil {
		return workload.ClaimRunner{}
	}
	return workload.ClaimRunner{Labels: wc.GitLab.Tags, RunUntagged: wc.GitLab.RunUntagged}
}

// WebhookParser implements workload.WebhookReceiver; ownerSecrets are keyed
// by OwnerKey.
func (*Backend) WebhookParser(secret []byte, ownerSecrets map[string][]byte) workload.WebhookParser {
	return WebhookParser{WebhookSecrets: workload.WebhookSecrets{Secret: secret, OwnerSecrets: ownerSecrets}}
}

// Provider implements workload.Backend: the provider of scope with tmpl's
// token, reused while the template's configuration and the token stay the
// same.
func (b *Backend) Provider(ctx context.Context, tmpl *hfv1.HypervisorMachineTemplate, scope workload.Scope, secrets workload.SecretReader) (workload.Provider, error) {
	g := tmpl.Spec.Bootstrap.GitLab
	if g == nil {
		return nil, b.ErrNoSection(tmpl)
	}
	tok, err := secrets(ctx, templateField+".credentials.token", tmpl.Namespace, g.Credentials.Token)
	if err != nil {
		return nil, err
	}
	cfg := Config{
		URL: instanceURL(g), Token: strings.TrimSpace(string(tok)), Scope: scope,
		RunUntagged: g.RunUntagged, AccessLevel: string(g.AccessLevel),
		Transport: b.Transport, Clock: b.Clock, HTTPTimeout: platformbackend.HTTPTimeout(tmpl),
	}
	// The fingerprint holds the token's hash only inside this process's
	// map, never in a status or a log.
	fp := workload.KeyOf([]any{cfg.URL, cfg.Token, cfg.Scope, cfg.RunUntagged, cfg.AccessLevel, cfg.HTTPTimeout})
	return b.CachedProvider(tmpl, scope, fp, func() (*Provider, error) { return New(cfg) })
}

// Package buildkite is Buildkite as a HyperFleet CI platform: a
// workload.Backend reading spec.bootstrap.buildkite of templates,
// spec.workload.buildkite of RunnerPools and spec.workloadConfig.buildkite
// of MachineClaims, a workload.Provider over Buildkite's REST API (with
// github.com/buildkite/go-buildkite/v4) and its Stacks API that gives each
// VM a job acquisition token for the one job its claim is bound to, and a
// webhook parser for Buildkite's job events (docs/buildkite.md).
package buildkite

import (
	"cmp"
	"context"
	"path"
	"strings"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/pkg/workload"
	"github.com/hyperfleet/hyperfleet/pkg/workload/buildkite/buildkitevm"
	"github.com/hyperfleet/hyperfleet/pkg/workload/platformbackend"
)

// The API sections Buildkite reads, for messages.
const (
	templateField = "spec.bootstrap.buildkite"
	poolField     = "spec.workload.buildkite"
)

// Defaults, the same as the CRD's, for objects created before a default
// existed.
const (
	// DefaultAPIURL is Buildkite's REST API (without /v2).
	DefaultAPIURL = "https://api.buildkite.com"
	// DefaultAgentEndpoint is the agent API buildkite-agent talks to.
	DefaultAgentEndpoint = "https://agent.buildkite.com/v3"
	defaultAgentPath     = "/usr/local/bin/buildkite-agent"
	defaultBuildPath     = "/var/lib/hyperfleet/builds"
	defaultOS            = "linux"
	defaultArch          = "amd64"
)

// Backend is Buildkite as a workload.Backend. Register it under
// hfv1.WorkloadBuildkite with NewBackend.
type Backend struct {
	platformbackend.Base[*Provider]
}

var _ workload.WebhookReceiver = (*Backend)(nil)

// NewBackend is the workload.Factory of Buildkite.
var NewBackend = platformbackend.Factory[*Provider, Backend](platformbackend.Identity{
	Name: "Buildkite", TemplateField: templateField, Webhooks: WebhookFormat,
})

// Template implements workload.Backend for a template with a
// spec.bootstrap.buildkite.
func (*Backend) Template(tmpl *hfv1.HypervisorMachineTemplate) (workload.Template, bool) {
	bk := tmpl.Spec.Bootstrap.Buildkite
	if bk == nil {
		return workload.Template{}, false
	}
	t := workload.Template{
		Field:           templateField,
		Scope:           workload.Scope{Owner: bk.Organization},
		ScopeField:      templateField + ".organization",
		Runner:          agentSoftware(bk),
		RegistrationURL: cmp.Or(bk.AgentEndpoint, DefaultAgentEndpoint),
		AgentPlatform:   string(buildkitevm.Platform),
		// Every VM is bound to one job and gets a job acquisition token
		// for it, never a cluster agent token (docs/buildkite.md, "One job
		// per VM"): a warm VM waits with no credential until its pool
		// binds it a job. No method of this template serves more than one
		// job, so CredentialReuse stays empty.
		BootstrapMethod: string(MethodJobToken),
		OneJobPerVM:     true,
		Secrets:         map[string]hfv1.LocalSecretKeySelector{templateField + ".credentials.apiToken": bk.Credentials.APIToken},
		CredentialsKey:  credentialsKey(bk),
	}
	if u := cmp.Or(bk.APIURL, DefaultAPIURL); u != DefaultAPIURL {
		t.Endpoint = u
	}
	t.Scope.Host = scopeHost(bk)
	t.APIHosts = []workload.APIHost{
		workload.APIHostOf(templateField+".apiURL", cmp.Or(bk.APIURL, DefaultAPIURL), publicAPIHost),
		// The Stacks API (job acquisition tokens) is the agent
		// endpoint's.
		workload.APIHostOf(templateField+".agentEndpoint", cmp.Or(bk.AgentEndpoint, DefaultAgentEndpoint), publicAgentHost),
	}
	return t, true
}

// The hosts of Buildkite's public REST API (DefaultAPIURL) and agent API
// (DefaultAgentEndpoint).
const (
	publicAPIHost   = "api.buildkite.com"
	publicAgentHost = "agent.buildkite.com"
)

// scopeHost is the API host of the template's scopes
// (workload.Scope.Host): empty for Buildkite's public API, else apiURL's
// host.
func scopeHost(bk *hfv1.BuildkiteBootstrap) string {
	return workload.ScopeHostOf(cmp.Or(bk.APIURL, DefaultAPIURL), publicAPIHost)
}

// agentSoftware is the template's buildkite-agent with the API's defaults:
// InstallPath is the binary's directory and RunScript its file name, WorkDir
// the build path. A downloaded agent is unpacked into a directory of its own
// (DownloadedAgentDir), which the VM's agent empties after the job; an agent
// baked into the image stays where the template says.
func agentSoftware(bk *hfv1.BuildkiteBootstrap) workload.RunnerSoftware {
	a := bk.Agent
	if a == nil {
		a = &hfv1.BuildkiteAgentSoftware{}
	}
	bin := cmp.Or(a.Path, defaultAgentPath)
	dir, file := path.Dir(bin), path.Base(bin)
	if a.DownloadURL != "" {
		dir, file = DownloadedAgentDir, "buildkite-agent"
	}
	os, arch := cmp.Or(string(a.OS), defaultOS), cmp.Or(string(a.Arch), defaultArch)
	return workload.RunnerSoftware{
		OS: os, Arch: arch,
		// A release archive's URL may name the platform, in Buildkite's
		// release names (the VM's agent refuses a URL still holding them).
		DownloadURL:    strings.NewReplacer("{os}", os, "{arch}", arch).Replace(a.DownloadURL),
		DownloadSHA256: a.DownloadSHA256,
		InstallPath:    dir, RunScript: file,
		WorkDir: cmp.Or(a.BuildPath, defaultBuildPath),
	}
}

// DownloadedAgentDir is where a VM unpacks a downloaded buildkite-agent
// release (its archive has the binary at its root).
const DownloadedAgentDir = "/opt/buildkite-agent"

// credentialsKey identifies the Buildkite credentials a template gives its
// pools: the API, the cluster and which Secret key holds the token (never
// its value).
func credentialsKey(bk *hfv1.BuildkiteBootstrap) string {
	return workload.KeyOf(struct {
		API, Org, Cluster string
		Token             hfv1.LocalSecretKeySelector
	}{cmp.Or(bk.APIURL, DefaultAPIURL), bk.Organization, bk.Cluster, bk.Credentials.APIToken})
}

// Pool implements workload.Backend for a buildkite pool. Its labels are its
// agents' tags as key=value, queue first: a job is the pool's when its
// agent query rules (JobLabels) are all among them.
func (*Backend) Pool(pool *hfv1.RunnerPool, tmpl *hfv1.HypervisorMachineTemplate) (workload.Pool, bool) {
	w := pool.Spec.Workload.Buildkite
	if pool.Spec.Workload.Type != hfv1.WorkloadBuildkite || w == nil {
		return workload.Pool{}, false
	}
	p := workload.Pool{
		Field:  poolField,
		Labels: poolLabels(w),
		// Buildkite has no untagged jobs to keep apart: every job's agent
		// query rules name its queue (queue:default when they do not).
		RunUntagged: true,
		Claim: &hfv1.WorkloadConfig{Type: hfv1.WorkloadBuildkite, Buildkite: &hfv1.BuildkiteAgentConfig{
			Queue: w.Queue, Tags: append([]string(nil), w.Tags...),
		}},
		ScopeField: "the template's " + templateField + ".organization",
	}
	if tmpl != nil && tmpl.Spec.Bootstrap.Buildkite != nil {
		bk := tmpl.Spec.Bootstrap.Buildkite
		p.Scope = workload.Scope{Host: scopeHost(bk), Owner: bk.Organization}
	}
	if w.Pipeline != "" {
		p.Scope.Repository = w.Pipeline
		p.ScopeField, p.OwnScope = poolField+".pipeline", true
	}
	return p, true
}

// Claim implements workload.Backend: spec.workloadConfig.buildkite. A
// claim that names a queue runs an agent of that queue with its own tags.
func (*Backend) Claim(claim *hfv1.MachineClaim) workload.ClaimRunner {
	wc := claim.Spec.WorkloadConfig
	if wc == nil || wc.Buildkite == nil {
		return workload.ClaimRunner{}
	}
	cr := workload.ClaimRunner{Job: wc.Buildkite.JobID}
	if wc.Buildkite.Queue != "" {
		cr.Labels = AgentTags(wc.Buildkite.Queue, wc.Buildkite.Tags)
	}
	return cr
}

// poolLabels are a pool's agent tags, with DefaultQueueLabel when its queue
// is the cluster's default.
func poolLabels(w *hfv1.BuildkiteWorkload) []string {
	out := AgentTags(w.Queue, w.Tags)
	if w.DefaultQueue {
		out = append(out, DefaultQueueLabel)
	}
	return out
}

// AgentTags are an agent's tags for queue and tags (key=value), queue
// first, as the agent's --tags and as the labels routing compares.
func AgentTags(queue string, tags []string) []string {
	out := make([]string, 0, 1+len(tags))
	if queue != "" {
		out = append(out, "queue="+queue)
	}
	return append(out, tags...)
}

// WebhookParser implements workload.WebhookReceiver.
func (b *Backend) WebhookParser(secret []byte, ownerSecrets map[string][]byte) workload.WebhookParser {
	return &WebhookParser{WebhookSecrets: workload.WebhookSecrets{Secret: secret, OwnerSecrets: ownerSecrets}, Clock: b.Clock}
}

// Provider implements workload.Backend: the provider of scope with tmpl's
// token, reused while the configuration and the token stay the same.
func (b *Backend) Provider(ctx context.Context, tmpl *hfv1.HypervisorMachineTemplate, scope workload.Scope, secrets workload.SecretReader) (workload.Provider, error) {
	bk := tmpl.Spec.Bootstrap.Buildkite
	if bk == nil {
		return nil, b.ErrNoSection(tmpl)
	}
	field := templateField + ".credentials.apiToken"
	token, err := secrets(ctx, field, tmpl.Namespace, bk.Credentials.APIToken)
	if err != nil {
		return nil, err
	}
	cfg := Config{
		APIURL: cmp.Or(bk.APIURL, DefaultAPIURL), AgentEndpoint: cmp.Or(bk.AgentEndpoint, DefaultAgentEndpoint),
		Organization: bk.Organization, Cluster: bk.Cluster, Scope: scope, Token: string(token),
		Transport: b.Transport, Clock: b.Clock, HTTPTimeout: platformbackend.HTTPTimeout(tmpl),
	}
	return b.CachedProvider(tmpl, scope, cfg.fingerprint(), func() (*Provider, error) { return New(cfg) })
}

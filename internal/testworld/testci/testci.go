// Package testci is a CI platform that exists only in tests: TestCI, whose
// runners register with a single-use token and whose jobs arrive by
// webhook. It plugs in exactly as a shipped platform does, through the
// public mechanisms only (workload.Register for its back-end,
// agentconfig.RegisterPlatform for its part of the agent config), so that
// tests can drive a claim and a pool of it through the shared code
// (internal/workloads, internal/vmspec, internal/cloudinit,
// internal/agentconfig, the webhook flags and receiver) and prove that one
// more platform needs no edit there.
//
// The API has no section for it: a template names TestCI's scope in an
// annotation (OwnerAnnotation), a pool asks for it by workload type
// (Type), and its accounts live in the process (Provider).
package testci

import (
	"context"
	"crypto/subtle"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/agentconfig"
	"github.com/hyperfleet/hyperfleet/pkg/workload"
)

// TestCI's names: its workload type, the platform its agent config
// carries (the same, as for every platform) and its runner credential.
const (
	Type        hfv1.WorkloadType           = "testci"
	Platform    agentconfig.Platform        = agentconfig.Platform(Type)
	MethodToken agentconfig.BootstrapMethod = "testci-token"
)

// OwnerAnnotation, on a HypervisorMachineTemplate, names the TestCI owner
// its runners register with: a template with it is TestCI's.
// LabelsAnnotation, on a RunnerPool, lists its runners' labels, separated
// by commas.
const (
	OwnerAnnotation  = "testci.hyperfleet.test/owner"
	LabelsAnnotation = "testci.hyperfleet.test/labels"
)

// RegistrationURL is where TestCI's runners register (the agent config's
// registrationURL).
const RegistrationURL = "https://ci.testci.example"

// TagPrefix marks the labels TestCI's runner takes; the others are the
// operator's routing marks, which its Shape drops, as Buildkite's does.
const TagPrefix = "testci:"

// The VM's runner software.
const (
	InstallPath = "/opt/testci"
	RunScript   = "testci-runner"
	WorkDir     = "/var/lib/hyperfleet/work"
)

// Spec is TestCI's part of the agent config.
var Spec = agentconfig.PlatformSpec{
	Platform: Platform,
	Methods:  []agentconfig.MethodSpec{{Method: MethodToken, Secret: "the TestCI runner token"}},
	Shape: func(c *agentconfig.Config) {
		var tags []string
		for _, l := range c.Runner.Labels {
			if strings.HasPrefix(l, TagPrefix) {
				tags = append(tags, l)
			}
		}
		c.Runner.Labels, c.Runner.Group = tags, ""
	},
	Validate: func(c *agentconfig.Config, bad agentconfig.Reporter) {
		if c.RegistrationURL != RegistrationURL {
			bad("registrationURL", "is %q; TestCI's runners register at %s", c.RegistrationURL, RegistrationURL)
		}
		agentconfig.ValidateBinaryRunner(c, agentconfig.BinaryRunner{Name: RunScript, Checksum: "the binary's"}, bad)
		for i, l := range c.Runner.Labels {
			if !strings.HasPrefix(l, TagPrefix) {
				bad(fmt.Sprintf("runner.labels[%d]", i), "%q is not a TestCI tag (%s...)", l, TagPrefix)
			}
		}
	},
}

var registerOnce sync.Once

// Register makes TestCI a platform of this process, as a binary's main
// does for the platforms it ships: its back-end under Type, its agent
// config under Platform. Tests call it as often as they like.
func Register() {
	registerOnce.Do(func() {
		workload.Register(Type, NewBackend)
		agentconfig.RegisterPlatform(Spec)
	})
}

// Backend is TestCI's workload.Backend and workload.WebhookReceiver. Its
// accounts are in memory, one per owner, shared by every Backend of the
// process (Accounts).
type Backend struct{}

var (
	_ workload.WebhookReceiver = Backend{}
	_ workload.Factory         = NewBackend
)

// NewBackend is TestCI's workload.Factory.
func NewBackend(workload.Dependencies) (workload.Backend, error) { return Backend{}, nil }

// Name implements workload.Backend.
func (Backend) Name() string { return "TestCI" }

// TemplateField implements workload.Backend.
func (Backend) TemplateField() string { return "metadata.annotations[" + OwnerAnnotation + "]" }

// Template implements workload.Backend for a template with OwnerAnnotation.
func (Backend) Template(tmpl *hfv1.HypervisorMachineTemplate) (workload.Template, bool) {
	owner, ok := tmpl.Annotations[OwnerAnnotation]
	if !ok {
		return workload.Template{}, false
	}
	field := Backend{}.TemplateField()
	return workload.Template{
		Field: field, Scope: workload.Scope{Owner: owner}, ScopeField: field,
		Runner:          workload.RunnerSoftware{OS: "linux", Arch: "amd64", InstallPath: InstallPath, WorkDir: WorkDir, RunScript: RunScript},
		RegistrationURL: RegistrationURL,
		AgentPlatform:   string(Platform), BootstrapMethod: string(MethodToken),
		CredentialsKey: "testci/" + owner,
	}, true
}

// Pool implements workload.Backend: a pool of workload type Type, in its
// template's scope, with the labels of its LabelsAnnotation.
func (b Backend) Pool(pool *hfv1.RunnerPool, tmpl *hfv1.HypervisorMachineTemplate) (workload.Pool, bool) {
	if pool.Spec.Workload.Type != Type {
		return workload.Pool{}, false
	}
	p := workload.Pool{Field: "spec.workload", Claim: &hfv1.WorkloadConfig{Type: Type}, RunUntagged: true}
	if l := pool.Annotations[LabelsAnnotation]; l != "" {
		p.Labels = strings.Split(l, ",")
	}
	if tmpl != nil {
		if t, ok := b.Template(tmpl); ok {
			p.Scope, p.ScopeField = t.Scope, t.ScopeField
		}
	}
	return p, true
}

// Claim implements workload.Backend: a TestCI claim asks for nothing of
// its own.
func (Backend) Claim(*hfv1.MachineClaim) workload.ClaimRunner { return workload.ClaimRunner{} }

// Provider implements workload.Backend: the in-memory account of scope.
func (Backend) Provider(_ context.Context, _ *hfv1.HypervisorMachineTemplate, scope workload.Scope, _ workload.SecretReader) (workload.Provider, error) {
	return Accounts.of(scope), nil
}

// WebhookFormat is how TestCI delivers webhooks: a token in a header, the
// delivery id in the body.
var WebhookFormat = workload.WebhookFormat{
	Platform: "TestCI", Label: string(Type), Path: "/webhooks/testci",
	EventHeader: "X-TestCI-Event", Events: []string{"job"}, SignatureHeader: "X-TestCI-Token",
	Used: "job events",
	Operator: workload.WebhookFlags{
		Name: "testci", OwnerKeys: "owner.<owner> (one owner's token)", Owners: "TestCI owner",
		Docs: "internal/testworld/testci", PublicService: "TestCI's public service", ExampleHost: "testci.example.com",
	},
}

// WebhookFormat implements workload.WebhookReceiver.
func (Backend) WebhookFormat() workload.WebhookFormat { return WebhookFormat }

// WebhookParser implements workload.WebhookReceiver.
func (Backend) WebhookParser(secret []byte, ownerSecrets map[string][]byte) workload.WebhookParser {
	return parser{secret: secret, owners: ownerSecrets}
}

type parser struct {
	secret []byte
	owners map[string][]byte
}

// Delivery is a TestCI webhook body.
type Delivery struct {
	ID         string   `json:"id"`
	Job        string   `json:"job"`
	Repository string   `json:"repository"`
	Labels     []string `json:"labels"`
}

// Parse implements workload.WebhookParser: the token must be the
// repository owner's own, else the fallback.
func (p parser) Parse(h http.Header, body []byte) (workload.JobEvent, error) {
	var d Delivery
	if err := json.Unmarshal(body, &d); err != nil {
		return workload.JobEvent{}, fmt.Errorf("%w: %w", workload.ErrMalformed, err)
	}
	owner, _, _ := strings.Cut(d.Repository, "/")
	want, own := p.owners[strings.ToLower(owner)]
	if !own {
		want = p.secret
	}
	if got := h.Get("X-TestCI-Token"); len(want) == 0 || subtle.ConstantTimeCompare([]byte(got), want) != 1 {
		return workload.JobEvent{}, workload.ErrBadSignature
	}
	if h.Get("X-TestCI-Event") != "job" {
		return workload.JobEvent{}, workload.ErrIgnoredEvent
	}
	return workload.JobEvent{DeliveryID: d.ID, Action: "queued", OwnerSigned: own, Job: workload.Job{
		ID: d.Job, Platform: Type, Repository: d.Repository, Labels: d.Labels, State: workload.JobQueued,
	}}, nil
}

// Accounts are TestCI's accounts, one per owner.
var Accounts = &accounts{byOwner: map[string]*Provider{}}

type accounts struct {
	mu      sync.Mutex
	byOwner map[string]*Provider
}

func (a *accounts) of(scope workload.Scope) *Provider {
	a.mu.Lock()
	defer a.mu.Unlock()
	p := a.byOwner[scope.Owner]
	if p == nil {
		p = &Provider{scope: scope, runners: map[string]workload.Runner{}}
		a.byOwner[scope.Owner] = p
	}
	return p
}

// Of is the account of owner (created empty when it has none yet).
func (a *accounts) Of(owner string) *Provider { return a.of(workload.Scope{Owner: owner}) }

// Provider is one TestCI account: the runners registered with it.
type Provider struct {
	scope   workload.Scope
	mu      sync.Mutex
	nextID  int64
	runners map[string]workload.Runner
}

var _ workload.Provider = (*Provider)(nil)

// Scope implements workload.Provider.
func (p *Provider) Scope() workload.Scope { return p.scope }

// VerifyScope implements workload.Provider: every owner exists.
func (p *Provider) VerifyScope(context.Context) error { return nil }

// IssueCredential implements workload.Provider: a runner registered with
// spec's labels and a token of MethodToken.
func (p *Provider) IssueCredential(_ context.Context, spec workload.RunnerSpec) (workload.Credential, error) {
	if spec.Method != workload.Method(MethodToken) {
		return workload.Credential{}, fmt.Errorf("testci: method %q is not TestCI's: %w", spec.Method, workload.ErrInvalidRequest)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, taken := p.runners[spec.Name]; taken {
		return workload.Credential{}, workload.ErrNameTaken
	}
	p.nextID++
	p.runners[spec.Name] = workload.Runner{ID: p.nextID, Name: spec.Name, State: workload.RunnerOffline, Labels: spec.Labels}
	now := time.Now()
	return workload.Credential{Method: spec.Method, Secret: workload.NewSecret(fmt.Sprintf("tci_%s_%d", p.scope.Owner, p.nextID)),
		RunnerName: spec.Name, RunnerID: p.nextID, IssuedAt: now, ExpiresAt: now.Add(time.Hour)}, nil
}

// DeregisterRunner implements workload.Provider.
func (p *Provider) DeregisterRunner(_ context.Context, id int64, name string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	for n, r := range p.runners {
		if r.ID == id || id == 0 && n == name {
			delete(p.runners, n)
		}
	}
	return nil
}

// GetRunner implements workload.Provider.
func (p *Provider) GetRunner(_ context.Context, name string) (workload.Runner, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	r, ok := p.runners[name]
	if !ok {
		return workload.Runner{}, workload.ErrNotFound
	}
	return r, nil
}

// ListRunners implements workload.Provider.
func (p *Provider) ListRunners(_ context.Context, prefix string) ([]workload.Runner, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []workload.Runner
	for n, r := range p.runners {
		if strings.HasPrefix(n, prefix) {
			out = append(out, r)
		}
	}
	return out, nil
}

// QueuedJobs implements workload.Provider: TestCI reports jobs by webhook
// only.
func (p *Provider) QueuedJobs(context.Context, []string) ([]workload.Job, error) { return nil, nil }

// Repositories implements workload.Provider.
func (p *Provider) Repositories(context.Context) ([]string, error) { return nil, nil }

// CancelRun implements workload.Provider.
func (p *Provider) CancelRun(context.Context, string, int64) error { return nil }

// GetJob implements workload.JobReader.
func (p *Provider) GetJob(context.Context, string, string) (workload.Job, error) {
	return workload.Job{}, workload.ErrNotFound
}

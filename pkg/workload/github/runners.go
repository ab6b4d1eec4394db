package github

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"

	gh "github.com/google/go-github/v88/github"

	"github.com/hyperfleet/hyperfleet/pkg/workload"
)

// maxLabels is GitHub's limit on a JIT runner's labels.
const maxLabels = 100

// IssueCredential implements workload.Provider.
func (p *Provider) IssueCredential(ctx context.Context, spec workload.RunnerSpec) (workload.Credential, error) {
	switch spec.Method {
	case MethodJIT, "":
		if spec.Feed != nil {
			return p.scaleSetJIT(ctx, spec)
		}
		return p.jitConfig(ctx, spec)
	case MethodRegistrationToken:
		if spec.Feed != nil {
			return workload.Credential{}, fmt.Errorf("github: runners of scale set %s register with JIT configurations only (spec.bootstrap.method jit-config): %w", spec.Feed.Name, workload.ErrInvalidRequest)
		}
		return p.registrationToken(ctx, spec)
	}
	return workload.Credential{}, fmt.Errorf("github: unknown credential method %q: %w", spec.Method, workload.ErrInvalidRequest)
}

func (p *Provider) jitConfig(ctx context.Context, spec workload.RunnerSpec) (workload.Credential, error) {
	if spec.Name == "" {
		return workload.Credential{}, fmt.Errorf("github: a JIT runner needs a name: %w", workload.ErrInvalidRequest)
	}
	if len(spec.Labels) == 0 || len(spec.Labels) > maxLabels {
		return workload.Credential{}, fmt.Errorf("github: a JIT runner needs 1 to %d labels, got %d: %w", maxLabels, len(spec.Labels), workload.ErrInvalidRequest)
	}
	group, err := p.runnerGroupID(ctx, spec.Group)
	if err != nil {
		return workload.Credential{}, err
	}
	req := &gh.GenerateJITConfigRequest{Name: spec.Name, RunnerGroupID: group, Labels: spec.Labels}
	if spec.WorkFolder != "" {
		req.WorkFolder = gh.Ptr(spec.WorkFolder)
	}
	issued := p.clock.Now()
	var cfg *gh.JITRunnerConfig
	var resp *gh.Response
	switch s := p.cfg.Scope; {
	case s.IsEnterprise():
		cfg, resp, err = p.client.Enterprise.GenerateEnterpriseJITConfig(ctx, s.Enterprise, req)
	case s.IsOrganization():
		cfg, resp, err = p.client.Actions.GenerateOrgJITConfig(ctx, s.Owner, req)
	default:
		cfg, resp, err = p.client.Actions.GenerateRepoJITConfig(ctx, s.Owner, s.Repository, req)
	}
	if err != nil {
		return workload.Credential{}, p.mapErr("generate the JIT configuration of runner "+spec.Name, resp, err)
	}
	if cfg.GetEncodedJITConfig() == "" {
		return workload.Credential{}, fmt.Errorf("github: the JIT configuration of runner %s came back empty: %w", spec.Name, workload.ErrUnavailable)
	}
	return workload.Credential{
		Method:     MethodJIT,
		Secret:     workload.NewSecret(cfg.GetEncodedJITConfig()),
		RunnerName: spec.Name,
		RunnerID:   cfg.GetRunner().GetID(),
		IssuedAt:   issued,
	}, nil
}

func (p *Provider) registrationToken(ctx context.Context, spec workload.RunnerSpec) (workload.Credential, error) {
	issued := p.clock.Now()
	var tok *gh.RegistrationToken
	var resp *gh.Response
	var err error
	s := p.cfg.Scope
	switch {
	case p.cfg.RegistrationTokenURL != "":
		// A user-given endpoint (a proxy, or an Enterprise path layout):
		// the same request and answer as the standard one.
		var req *http.Request
		if req, err = p.client.NewRequest(ctx, http.MethodPost, p.cfg.RegistrationTokenURL, nil); err == nil {
			tok = new(gh.RegistrationToken)
			resp, err = p.client.Do(req, tok)
		}
	case s.IsEnterprise():
		tok, resp, err = p.client.Enterprise.CreateRegistrationToken(ctx, s.Enterprise)
	case s.IsOrganization():
		tok, resp, err = p.client.Actions.CreateOrganizationRegistrationToken(ctx, s.Owner)
	default:
		tok, resp, err = p.client.Actions.CreateRegistrationToken(ctx, s.Owner, s.Repository)
	}
	if err != nil {
		return workload.Credential{}, p.mapErr("create a registration token for "+s.String(), resp, err)
	}
	if tok.GetToken() == "" {
		return workload.Credential{}, fmt.Errorf("github: the registration token for %s came back empty: %w", s, workload.ErrUnavailable)
	}
	return workload.Credential{
		Method:          MethodRegistrationToken,
		Secret:          workload.NewSecret(tok.GetToken()),
		RunnerName:      spec.Name,
		RegistrationURL: p.cfg.RunnerURL,
		IssuedAt:        issued,
		ExpiresAt:       tok.GetExpiresAt().Time,
	}, nil
}

// runnerGroupID resolves a runner group name (organization scope only);
// the empty name is the Default group.
func (p *Provider) runnerGroupID(ctx context.Context, name string) (int64, error) {
	s := p.cfg.Scope
	if s.IsEnterprise() {
		return p.enterpriseGroupID(ctx, name)
	}
	if name == "" || strings.EqualFold(name, "default") {
		return defaultRunnerGroupID, nil
	}
	if !s.IsOrganization() {
		return 0, fmt.Errorf("github: runner group %q: runner groups apply to organization runners, and %s is a repository; remove runnerGroup: %w", name, s, workload.ErrInvalidRequest)
	}
	p.mu.Lock()
	id, ok := p.groups[name]
	p.mu.Unlock()
	if ok {
		return id, nil
	}
	opts := &gh.ListOrgRunnerGroupOptions{ListOptions: gh.ListOptions{PerPage: 100}}
	for {
		groups, resp, err := p.client.Actions.ListOrganizationRunnerGroups(ctx, s.Owner, opts)
		if err != nil {
			return 0, p.mapErr("list the runner groups of "+s.Owner, resp, err)
		}
		for _, g := range groups.RunnerGroups {
			if g.GetName() == name {
				p.mu.Lock()
				p.groups[name] = g.GetID()
				p.mu.Unlock()
				return g.GetID(), nil
			}
		}
		if resp.NextPage == 0 {
			break
		}
		opts.Page = resp.NextPage
	}
	return 0, fmt.Errorf("github: organization %s has no runner group %q; create it or fix runnerGroup: %w", s.Owner, name, workload.ErrInvalidRequest)
}

// DeregisterRunner implements workload.Provider.
func (p *Provider) DeregisterRunner(ctx context.Context, id int64, name string) error {
	ctx = withCleanup(ctx)
	id, found, err := workload.RunnerToRemove(ctx, p.GetRunner, id, name)
	if !found || err != nil {
		return err
	}
	var resp *gh.Response
	switch s := p.cfg.Scope; {
	case s.IsEnterprise():
		resp, err = p.client.Enterprise.RemoveRunner(ctx, s.Enterprise, id)
	case s.IsOrganization():
		resp, err = p.client.Actions.RemoveOrganizationRunner(ctx, s.Owner, id)
	default:
		resp, err = p.client.Actions.RemoveRunner(ctx, s.Owner, s.Repository, id)
	}
	if err == nil {
		return nil
	}
	if resp != nil {
		switch resp.StatusCode {
		case http.StatusNotFound:
			return nil
		case http.StatusUnprocessableEntity:
			return fmt.Errorf("github: runner %d (%s) %s: %w", id, name, apiMessage(err), workload.ErrRunnerBusy)
		}
	}
	return p.mapErr(fmt.Sprintf("remove runner %d (%s)", id, name), resp, err)
}

// GetRunner implements workload.Provider.
func (p *Provider) GetRunner(ctx context.Context, name string) (workload.Runner, error) {
	runners, err := p.listRunners(ctx, name, true)
	if err != nil {
		return workload.Runner{}, err
	}
	for _, r := range runners {
		if r.Name == name {
			return r, nil
		}
	}
	return workload.Runner{}, fmt.Errorf("github: runner %s in %s: %w", name, p.cfg.Scope, workload.ErrNotFound)
}

// ListRunners implements workload.Provider.
func (p *Provider) ListRunners(ctx context.Context, prefix string) ([]workload.Runner, error) {
	return p.listRunners(ctx, prefix, false)
}

// listRunners pages through the scope's runners; exact asks GitHub to
// filter by name.
func (p *Provider) listRunners(ctx context.Context, name string, exact bool) ([]workload.Runner, error) {
	opts := &gh.ListRunnersOptions{ListOptions: gh.ListOptions{PerPage: 100}}
	if exact {
		opts.Name = gh.Ptr(name)
	}
	var out []workload.Runner
	s := p.cfg.Scope
	for {
		var page *gh.Runners
		var resp *gh.Response
		var err error
		switch {
		case s.IsEnterprise():
			page, resp, err = p.client.Enterprise.ListRunners(ctx, s.Enterprise, opts)
		case s.IsOrganization():
			page, resp, err = p.client.Actions.ListOrganizationRunners(ctx, s.Owner, opts)
		default:
			page, resp, err = p.client.Actions.ListRunners(ctx, s.Owner, s.Repository, opts)
		}
		if err != nil {
			return nil, p.mapErr("list the runners of "+s.String(), resp, err)
		}
		for _, r := range page.Runners {
			if exact || strings.HasPrefix(r.GetName(), name) {
				out = append(out, runnerOf(r))
			}
		}
		if resp.NextPage == 0 {
			return out, nil
		}
		opts.Page = resp.NextPage
	}
}

func runnerOf(r *gh.Runner) workload.Runner {
	out := workload.Runner{ID: r.GetID(), Name: r.GetName(), State: workload.RunnerOffline}
	switch {
	case r.GetStatus() != "online":
	case r.GetBusy():
		out.State = workload.RunnerBusy
	default:
		out.State = workload.RunnerIdle
	}
	for _, l := range r.Labels {
		out.Labels = append(out.Labels, l.GetName())
	}
	return out
}

// mapErr turns a go-github error into one that wraps a workload sentinel
// and says what failed; GitHub's own message is kept, the request URL and
// credentials never appear.
func (p *Provider) mapErr(what string, resp *gh.Response, err error) error {
	var rl *workload.RateLimitError
	var primary *gh.RateLimitError
	var abuse *gh.AbuseRateLimitError
	var ue *url.Error
	switch {
	case asRateLimit(err, &rl):
		return fmt.Errorf("github: %s: %w", what, rl)
	case errors.As(err, &primary):
		return fmt.Errorf("github: %s: %w", what, &workload.RateLimitError{RetryAt: primary.Rate.Reset.Time})
	case errors.As(err, &abuse):
		at := p.gate.snapshot().BlockedUntil
		if abuse.RetryAfter != nil {
			at = p.clock.Now().Add(*abuse.RetryAfter)
		}
		if !at.After(p.clock.Now()) {
			at = p.clock.Now().Add(secondaryBackoffBase)
		}
		return fmt.Errorf("github: %s: %w", what, &workload.RateLimitError{RetryAt: at, Secondary: true})
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
		return fmt.Errorf("github: %s: %w: %w", what, workload.ErrUnavailable, err)
	case errors.As(err, &ue):
		// Transport failures: no status code came back.
		return fmt.Errorf("github: %s: %w: %w", what, workload.ErrUnavailable, ue.Err)
	}
	code := 0
	if resp != nil {
		code = resp.StatusCode
	}
	msg := apiMessage(err)
	var sentinel error
	switch code {
	case http.StatusUnauthorized:
		sentinel = workload.ErrUnauthorized
		msg += "; check the token or the App's id, key and installation id"
	case http.StatusForbidden:
		sentinel = workload.ErrUnauthorized
		msg += "; the credentials lack a permission (repository runners need Administration: write, organization runners Self-hosted runners: write)"
	case http.StatusNotFound:
		sentinel = workload.ErrNotFound
	case http.StatusConflict:
		sentinel = workload.ErrNameTaken
	case http.StatusUnprocessableEntity, http.StatusBadRequest:
		sentinel = workload.ErrInvalidRequest
	default:
		sentinel = workload.ErrUnavailable
	}
	return fmt.Errorf("github: %s: %w (HTTP %d: %s)", what, sentinel, code, msg)
}

// apiMessage is GitHub's message from an error response.
func apiMessage(err error) string {
	var er *gh.ErrorResponse
	if errors.As(err, &er) && er.Message != "" {
		return er.Message
	}
	return err.Error()
}

func asRateLimit(err error, target **workload.RateLimitError) bool {
	return errors.As(err, target)
}

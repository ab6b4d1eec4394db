package buildkite

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	bk "github.com/buildkite/go-buildkite/v4"

	"github.com/hyperfleet/hyperfleet/pkg/workload"
)

// Every claim's VM gets a job acquisition token (bkjat_) for the one job
// the claim is bound to, never a cluster agent token: Buildkite's Stacks
// API (agent API, /v3/stacks/...) lets a stack controller holding a
// cluster agent token reserve a scheduled job and issue a token good for
// registering one agent that acquires that job only. The operator is the
// stack controller, and the claim's own cluster agent token
// (IssueCredential) is the one that calls the Stacks API: Buildkite
// refuses a job acquisition token whose issuing agent token is no longer
// active, so deleting that token once the agent registered
// (RetireRegistration) or when the claim ends (DeregisterRunner) revokes
// the job token too. The cluster token itself never leaves the operator,
// and a job token is refused by the Stacks API.

const (
	// MaxJobTokenLifetime is the longest job acquisition token Buildkite
	// issues (token_lifetime_seconds at most 3600).
	MaxJobTokenLifetime = time.Hour
	// stackKeyPrefix starts the key of the stack the operator registers
	// for each queue it serves ("hyperfleet-<queue key>"): stacks are few
	// per organization, so one per queue rather than one per claim.
	stackKeyPrefix = "hyperfleet-"
	// stackType is what Buildkite asks third-party stacks to register as.
	stackType = "custom"
	// maxStacksBody bounds a Stacks API answer the provider reads.
	maxStacksBody = 1 << 20
)

// stacksCall is one Stacks API call with the agent token; out receives the
// JSON answer. Errors are the workload sentinels, as apiError makes them.
func (p *Provider) stacksCall(ctx context.Context, token, method, path string, in, out any) error {
	body, err := json.Marshal(in)
	if err != nil {
		return fmt.Errorf("buildkite: stacks request: %w", err)
	}
	u := strings.TrimSuffix(p.cfg.AgentEndpoint, "/") + "/" + path
	req, err := http.NewRequestWithContext(ctx, method, u, bytes.NewReader(body))
	if err != nil {
		return fmt.Errorf("buildkite: stacks request: %w", err)
	}
	req.Header.Set("Authorization", "Token "+token)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json")
	req.Header.Set("User-Agent", "hyperfleet")
	resp, err := p.stacks.Do(req)
	if err != nil {
		return apiError(method+" "+path, err)
	}
	defer func() { _ = resp.Body.Close() }()
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxStacksBody))
	if err != nil {
		return apiError(method+" "+path, err)
	}
	if resp.StatusCode/100 != 2 {
		// The same error shape as the REST API's ({"message": ...}), so
		// the same mapping onto the workload sentinels applies.
		er := &bk.ErrorResponse{Response: resp}
		_ = json.Unmarshal(data, er)
		return apiError(method+" "+path, er)
	}
	if err := json.Unmarshal(data, out); err != nil {
		return fmt.Errorf("buildkite: %s %s: answer: %w: %w", method, path, workload.ErrUnavailable, err)
	}
	return nil
}

// queueKey is the cluster queue the runner's labels name, or the
// cluster's default queue when they name none.
func (p *Provider) queueKey(ctx context.Context, labels []string) (string, error) {
	for _, l := range labels {
		if k, v, ok := strings.Cut(l, "="); ok && k == "queue" && v != "" {
			return v, nil
		}
	}
	c, _, err := p.client.Clusters.Get(ctx, p.cfg.Organization, p.cfg.Cluster)
	if err != nil {
		return "", apiError("cluster "+p.cfg.Cluster, err)
	}
	qs, _, err := p.client.ClusterQueues.List(ctx, p.cfg.Organization, p.cfg.Cluster, &bk.ClusterQueuesListOptions{ListOptions: bk.ListOptions{PerPage: 100}})
	if err != nil {
		return "", apiError("queues of cluster "+p.cfg.Cluster, err)
	}
	for _, q := range qs {
		if q.ID == c.DefaultQueueID {
			return q.Key, nil
		}
	}
	return "", fmt.Errorf("buildkite: cluster %s has no default queue; the pool must name one: %w", p.cfg.Cluster, workload.ErrInvalidRequest)
}

// jobCredential turns the claim's fresh cluster agent token into a job
// acquisition token for spec.Job: it registers the queue's stack, reserves
// the job for as long as the token lives, and issues the token. A job
// another stack holds or that no longer waits is ErrNotFound: the claim
// cannot be bound to it.
func (p *Provider) jobCredential(ctx context.Context, spec workload.RunnerSpec, agentToken string, now time.Time) (workload.Credential, error) {
	queue, err := p.queueKey(ctx, spec.Labels)
	if err != nil {
		return workload.Credential{}, err
	}
	if err := p.checkJob(ctx, spec, queue); err != nil {
		return workload.Credential{}, err
	}
	lifetime := min(p.cfg.TokenLifetime, MaxJobTokenLifetime)
	secs := int(lifetime / time.Second)
	key := stackKeyPrefix + queue
	var reg struct {
		Key string `json:"key"`
	}
	if err := p.stacksCall(ctx, agentToken, http.MethodPost, "stacks/register", map[string]any{
		"key": key, "type": stackType, "queue_key": queue,
		"metadata": map[string]string{"controller": "hyperfleet", "cluster": p.cfg.Cluster},
	}, &reg); err != nil {
		return workload.Credential{}, err
	}
	base := "stacks/" + url.PathEscape(key)
	var res struct {
		Reserved []string `json:"reserved"`
	}
	if err := p.stacksCall(ctx, agentToken, http.MethodPut, base+"/scheduled-jobs/batch-reserve",
		map[string]any{"job_uuids": []string{spec.Job}, "reservation_expiry_seconds": secs}, &res); err != nil {
		return workload.Credential{}, err
	}
	if !slices.Contains(res.Reserved, spec.Job) {
		return workload.Credential{}, fmt.Errorf("buildkite: job %s could not be reserved for %s (not scheduled in cluster %s, or held by another stack): %w", spec.Job, spec.Name, p.cfg.Cluster, workload.ErrJobNotBindable)
	}
	var iss struct {
		Tokens []struct {
			Job       string    `json:"job_uuid"`
			Token     string    `json:"job_acquisition_token"`
			ExpiresAt time.Time `json:"expires_at"`
		} `json:"job_acquisition_tokens"`
	}
	if err := p.stacksCall(ctx, agentToken, http.MethodPost, base+"/job-acquisition-tokens",
		map[string]any{"job_uuids": []string{spec.Job}, "token_lifetime_seconds": secs}, &iss); err != nil {
		return workload.Credential{}, err
	}
	for _, t := range iss.Tokens {
		if t.Job != spec.Job || t.Token == "" {
			continue
		}
		return workload.Credential{
			Method: MethodJobToken, Secret: workload.NewSecret(t.Token), RunnerName: spec.Name,
			RegistrationURL: p.cfg.AgentEndpoint, IssuedAt: now, ExpiresAt: t.ExpiresAt, Job: spec.Job,
		}, nil
	}
	return workload.Credential{}, fmt.Errorf("buildkite: no job acquisition token was issued for job %s of %s: %w", spec.Job, spec.Name, workload.ErrJobNotBindable)
}

// checkJob verifies, with the REST API, that the job a runner is made for
// is one it may be bound to: a job of spec.JobRepository (a pipeline of the
// organization), waiting for an agent, on the runner's queue. A claim names
// its job itself, so this is what keeps it from taking another pool's. The
// cluster is checked by the reservation (the claim's cluster token
// reserves jobs of its cluster only).
func (p *Provider) checkJob(ctx context.Context, spec workload.RunnerSpec, queue string) error {
	j, err := p.GetJob(ctx, spec.JobRepository, spec.Job)
	switch {
	case errors.Is(err, workload.ErrNotFound):
		return fmt.Errorf("buildkite: job %s is not a job of %s: %w", spec.Job, spec.JobRepository, workload.ErrJobNotBindable)
	case err != nil:
		return err
	case j.State != workload.JobQueued:
		return fmt.Errorf("buildkite: job %s no longer waits for an agent (%s): %w", spec.Job, j.State, workload.ErrJobNotBindable)
	}
	jobQueue := ""
	for _, l := range j.Labels {
		if k, v, ok := strings.Cut(l, "="); ok && k == "queue" {
			jobQueue = v
		}
	}
	if jobQueue == "" {
		// The job runs on the cluster's default queue.
		if jobQueue, err = p.queueKey(ctx, nil); err != nil {
			return err
		}
	}
	if jobQueue != queue {
		return fmt.Errorf("buildkite: job %s runs on queue %s, not on the runner's queue %s: %w", spec.Job, jobQueue, queue, workload.ErrJobNotBindable)
	}
	return nil
}

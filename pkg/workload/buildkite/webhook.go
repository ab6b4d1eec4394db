package buildkite

import (
	"crypto/hmac"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	bk "github.com/buildkite/go-buildkite/v4"
	"k8s.io/utils/clock"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/pkg/workload"
)

// Webhook headers Buildkite sets (buildkite.com/docs/apis/webhooks).
const (
	// WebhookEventHeader is the event, such as job.scheduled or ping.
	WebhookEventHeader = "X-Buildkite-Event"
	// WebhookTokenHeader carries the notification service's token itself,
	// when the service is set to send it plainly.
	WebhookTokenHeader = "X-Buildkite-Token"
	// WebhookSignatureHeader carries timestamp=<unix seconds>,signature=<hex
	// HMAC-SHA256 of "<timestamp>.<body>" keyed by the token>, when the
	// service is set to sign (preferred: the token never travels).
	WebhookSignatureHeader = "X-Buildkite-Signature"
)

// The job events the parser decodes.
const (
	EventJobScheduled = "job.scheduled"
	EventJobStarted   = "job.started"
	EventJobFinished  = "job.finished"
	EventPing         = "ping"
)

// MaxSignatureAge bounds how far a signed delivery's timestamp may be from
// now: an older one is a replay.
const MaxSignatureAge = 5 * time.Minute

// WebhookFormat is how Buildkite delivers webhooks. It sends no delivery
// id: the parser derives one from the verified body (a job's event happens
// once: its id and the event name).
var WebhookFormat = workload.WebhookFormat{
	Platform: "Buildkite", Label: string(hfv1.WorkloadBuildkite), Path: "/webhooks/buildkite",
	EventHeader: WebhookEventHeader, Events: []string{EventJobScheduled, EventJobStarted, EventJobFinished, EventPing},
	SignatureHeader: WebhookSignatureHeader,
	Used:            "job.scheduled, job.started and job.finished events",
	Operator: workload.WebhookFlags{
		Name:          "buildkite",
		OwnerKeys:     "owner.<organization slug> (the token of one organization's notification service, which only it may use)",
		Owners:        "Buildkite organization",
		Docs:          "docs/buildkite.md",
		PublicService: "Buildkite's public API", ExampleHost: "buildkite.example.com",
	},
}

// WebhookParser verifies and decodes Buildkite's job webhooks. It
// implements workload.WebhookParser.
//
// A delivery is authenticated by X-Buildkite-Signature when it has one (an
// HMAC of the timestamp and body, the timestamp within MaxSignatureAge),
// else by X-Buildkite-Token equal to the secret, compared in constant
// time. The secret is chosen by the delivery's organization: an
// organization listed in OwnerSecrets is verified with its own secret
// only, any other with Secret. The event is the verified body's (its event
// field), which the signature covers; an X-Buildkite-Event header that
// says otherwise is refused (signedEvent).
type WebhookParser struct {
	// WebhookSecrets are the webhooks' secrets, the owners' keyed by
	// organization slug.
	workload.WebhookSecrets
	// Clock is now, for the signature's age; nil is the real clock.
	Clock clock.PassiveClock
}

var _ workload.WebhookParser = (*WebhookParser)(nil)

// webhookPayload is the part of a job delivery the parser reads; job and
// build are the REST API's shapes.
type webhookPayload struct {
	Event    string   `json:"event"`
	Job      bk.Job   `json:"job"`
	Build    bk.Build `json:"build"`
	Pipeline struct {
		Slug string `json:"slug"`
	} `json:"pipeline"`
}

// organizationOf is the organization's slug a payload is about, from the
// build's web URL (https://buildkite.com/<org>/<pipeline>/builds/<n>), in
// lower case; empty when it does not say.
func organizationOf(p *webhookPayload) string {
	for _, raw := range []string{p.Build.WebURL, p.Job.WebURL} {
		u, err := url.Parse(raw)
		if err != nil || u.Path == "" {
			continue
		}
		if org, _, ok := strings.Cut(strings.TrimPrefix(u.Path, "/"), "/"); ok && org != "" {
			return strings.ToLower(org)
		}
	}
	return ""
}

func (p *WebhookParser) now() time.Time {
	if p.Clock == nil {
		return time.Now()
	}
	return p.Clock.Now()
}

// verify authenticates a delivery with secret.
func (p *WebhookParser) verify(header http.Header, body, secret []byte) error {
	if sig := header.Get(WebhookSignatureHeader); sig != "" {
		return verifySignature(sig, body, secret, p.now())
	}
	tok := header.Get(WebhookTokenHeader)
	if tok == "" {
		return fmt.Errorf("%w: neither %s nor %s", workload.ErrBadSignature, WebhookSignatureHeader, WebhookTokenHeader)
	}
	if subtle.ConstantTimeCompare([]byte(tok), secret) != 1 {
		return fmt.Errorf("%w: %s does not match", workload.ErrBadSignature, WebhookTokenHeader)
	}
	return nil
}

// verifySignature checks an X-Buildkite-Signature value against body.
func verifySignature(header string, body, secret []byte, now time.Time) error {
	var stamp, sig string
	for _, part := range strings.Split(header, ",") {
		k, v, _ := strings.Cut(strings.TrimSpace(part), "=")
		switch k {
		case "timestamp":
			stamp = v
		case "signature":
			sig = v
		}
	}
	secs, err := strconv.ParseInt(stamp, 10, 64)
	if err != nil {
		return fmt.Errorf("%w: %s has no numeric timestamp", workload.ErrBadSignature, WebhookSignatureHeader)
	}
	got, err := hex.DecodeString(sig)
	if err != nil || len(got) != sha256.Size {
		return fmt.Errorf("%w: %s has no hex SHA-256 signature", workload.ErrBadSignature, WebhookSignatureHeader)
	}
	mac := hmac.New(sha256.New, secret)
	mac.Write([]byte(stamp + "."))
	mac.Write(body)
	if !hmac.Equal(got, mac.Sum(nil)) {
		return fmt.Errorf("%w: %s does not match the body", workload.ErrBadSignature, WebhookSignatureHeader)
	}
	// The age is checked after the HMAC, so that only a genuine but old
	// delivery is called a replay.
	if d := now.Sub(time.Unix(secs, 0)); d > MaxSignatureAge || d < -MaxSignatureAge {
		return fmt.Errorf("%w: %s is %s away from now (a replay, or a clock off)", workload.ErrBadSignature, WebhookSignatureHeader, d.Round(time.Second))
	}
	return nil
}

// SignWebhook is the X-Buildkite-Signature value of body under secret at
// ts, as Buildkite computes it (tests use it).
func SignWebhook(secret, body []byte, ts time.Time) string {
	stamp := strconv.FormatInt(ts.Unix(), 10)
	mac := hmac.New(sha256.New, secret)
	mac.Write([]byte(stamp + "."))
	mac.Write(body)
	return "timestamp=" + stamp + ",signature=" + hex.EncodeToString(mac.Sum(nil))
}

// Parse implements workload.WebhookParser.
func (p *WebhookParser) Parse(header http.Header, body []byte) (workload.JobEvent, error) {
	var payload webhookPayload
	decodeErr := json.Unmarshal(body, &payload)
	// The organization picks the key; it is read from the body before the
	// body is trusted, and then the body must verify with that key.
	org := organizationOf(&payload)
	secret, own := p.SecretFor(org)
	if len(secret) == 0 {
		return workload.JobEvent{}, fmt.Errorf("%w: no webhook secret is configured for organization %q", workload.ErrBadSignature, truncate(org, 64))
	}
	if err := p.verify(header, body, secret); err != nil {
		return workload.JobEvent{}, err
	}
	event, err := signedEvent(header, &payload, decodeErr)
	if err != nil {
		return workload.JobEvent{}, err
	}
	switch event {
	case EventJobScheduled, EventJobStarted, EventJobFinished:
	default:
		return workload.JobEvent{}, fmt.Errorf("%w: %s", workload.ErrIgnoredEvent, truncate(event, 64))
	}
	j := payload.Job
	if j.ID == "" || org == "" || payload.Pipeline.Slug == "" {
		return workload.JobEvent{}, fmt.Errorf("%w: a job event without a job id, organization or pipeline", workload.ErrMalformed)
	}
	if j.Type != "" && j.Type != "script" {
		// Wait, block, trigger and input steps need no agent.
		return workload.JobEvent{}, fmt.Errorf("%w: a %s job", workload.ErrIgnoredEvent, truncate(j.Type, 32))
	}
	repo := org + "/" + payload.Pipeline.Slug
	job := workload.Job{
		ID: j.ID, Platform: hfv1.WorkloadBuildkite, RunID: int64(payload.Build.Number), RunAttempt: 1,
		Repository: repo, Labels: JobLabels(j.AgentQueryRules), State: jobState(j.State),
		Name: j.Label, WorkflowName: payload.Pipeline.Slug, RunnerName: j.Agent.Name,
		CreatedAt: ts(j.CreatedAt), StartedAt: ts(j.StartedAt), CompletedAt: ts(j.FinishedAt),
	}
	// The event says where the job is, whatever state the embedded job
	// had when the payload was built.
	switch event {
	case EventJobScheduled:
		job.State = workload.JobQueued
	case EventJobStarted:
		job.State = workload.JobInProgress
	case EventJobFinished:
		job.State = workload.JobCompleted
		job.Conclusion = j.State
	}
	return workload.JobEvent{
		// A job's event happens once; Buildkite sends no delivery id.
		DeliveryID: j.ID + "/" + event,
		Action:     strings.TrimPrefix(event, "job."),
		Job:        job, OwnerSigned: own,
	}, nil
}

// signedEvent is the delivery's event as its verified body says it. The
// signature covers the timestamp and the body only, not the
// X-Buildkite-Event header: a captured delivery sent again within
// MaxSignatureAge under another header (a job.scheduled turned into a
// job.finished) must not change what the operator records. A header that
// disagrees with the body is refused as a forgery; the header is never
// what decides.
func signedEvent(header http.Header, payload *webhookPayload, decodeErr error) (string, error) {
	if decodeErr != nil {
		return "", fmt.Errorf("%w: %w", workload.ErrMalformed, decodeErr)
	}
	event := payload.Event
	if h := header.Get(WebhookEventHeader); h != "" && h != event {
		return "", fmt.Errorf("%w: the unsigned %s %q is not the signed body's event %q", workload.ErrBadSignature,
			WebhookEventHeader, truncate(h, 64), truncate(event, 64))
	}
	return event, nil
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}

package github

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"

	gh "github.com/google/go-github/v88/github"

	"github.com/hyperfleet/hyperfleet/pkg/workload"
)

// Webhook header names GitHub sets on every delivery.
const (
	// WebhookSignatureHeader carries sha256=<hex HMAC-SHA256(secret, body)>.
	WebhookSignatureHeader = "X-Hub-Signature-256"
	// WebhookEventHeader is the event type, such as workflow_job or ping.
	WebhookEventHeader = "X-GitHub-Event"
	// WebhookDeliveryHeader is the delivery's GUID; a redelivery keeps it.
	WebhookDeliveryHeader = "X-GitHub-Delivery"

	// WebhookEventWorkflowJob is the only event type WebhookParser decodes.
	WebhookEventWorkflowJob = "workflow_job"
	// WebhookEventPing is sent when a webhook is created; it carries no job.
	WebhookEventPing = "ping"
)

const webhookSignaturePrefix = "sha256="

// WebhookParser verifies and decodes GitHub workflow_job webhooks. It
// implements workload.WebhookParser.
//
// The signature must be X-Hub-Signature-256 (HMAC-SHA256 of the raw body,
// keyed by Secret), compared in constant time. There is deliberately no
// fallback to the SHA-1 X-Hub-Signature header: a delivery that carries
// only that is rejected. An empty Secret rejects every delivery.
type WebhookParser struct {
	// Secret is the webhook's secret, as configured on GitHub.
	Secret []byte
}

var _ workload.WebhookParser = WebhookParser{}

// VerifySignature checks header's X-Hub-Signature-256 against body; the
// error wraps workload.ErrBadSignature and says why, never what was
// expected.
func (p WebhookParser) VerifySignature(header http.Header, body []byte) error {
	if len(p.Secret) == 0 {
		return fmt.Errorf("%w: no webhook secret is configured", workload.ErrBadSignature)
	}
	sig := header.Get(WebhookSignatureHeader)
	if sig == "" {
		return fmt.Errorf("%w: no %s header (only SHA-256 signatures are accepted)", workload.ErrBadSignature, WebhookSignatureHeader)
	}
	hexSig, ok := strings.CutPrefix(sig, webhookSignaturePrefix)
	if !ok {
		return fmt.Errorf("%w: %s does not start with %q", workload.ErrBadSignature, WebhookSignatureHeader, webhookSignaturePrefix)
	}
	got, err := hex.DecodeString(hexSig)
	if err != nil || len(got) != sha256.Size {
		return fmt.Errorf("%w: %s is not a hex SHA-256 digest", workload.ErrBadSignature, WebhookSignatureHeader)
	}
	mac := hmac.New(sha256.New, p.Secret)
	mac.Write(body)
	if !hmac.Equal(got, mac.Sum(nil)) {
		return fmt.Errorf("%w: %s does not match the body", workload.ErrBadSignature, WebhookSignatureHeader)
	}
	return nil
}

// SignWebhook returns the X-Hub-Signature-256 value of body under secret, as
// GitHub computes it (tests and the GitHub simulator use it).
func SignWebhook(secret, body []byte) string {
	mac := hmac.New(sha256.New, secret)
	mac.Write(body)
	return webhookSignaturePrefix + hex.EncodeToString(mac.Sum(nil))
}

// Parse implements workload.WebhookParser. The signature is checked first;
// then an event other than workflow_job (ping included), or a workflow_job
// action other than queued, waiting, in_progress or completed, returns an
// error wrapping workload.ErrIgnoredEvent; a body that cannot be decoded or
// lacks the job id or the repository returns one wrapping
// workload.ErrMalformed that names what is wrong.
func (p WebhookParser) Parse(header http.Header, body []byte) (workload.JobEvent, error) {
	if err := p.VerifySignature(header, body); err != nil {
		return workload.JobEvent{}, err
	}
	if ev := header.Get(WebhookEventHeader); ev != WebhookEventWorkflowJob {
		if ev == "" {
			return workload.JobEvent{}, fmt.Errorf("%w: no %s header", workload.ErrIgnoredEvent, WebhookEventHeader)
		}
		return workload.JobEvent{}, fmt.Errorf("%w: event %q", workload.ErrIgnoredEvent, webhookTruncate(ev, 64))
	}
	var payload gh.WorkflowJobEvent
	if err := json.Unmarshal(body, &payload); err != nil {
		return workload.JobEvent{}, fmt.Errorf("%w: decoding the workflow_job payload: %v", workload.ErrMalformed, err)
	}
	action := payload.GetAction()
	if action == "" {
		return workload.JobEvent{}, fmt.Errorf("%w: the payload has no action", workload.ErrMalformed)
	}
	state, ok := webhookJobState(action)
	if !ok {
		return workload.JobEvent{}, fmt.Errorf("%w: workflow_job action %q", workload.ErrIgnoredEvent, webhookTruncate(action, 64))
	}
	wj := payload.WorkflowJob
	if wj == nil {
		return workload.JobEvent{}, fmt.Errorf("%w: the payload has no workflow_job object", workload.ErrMalformed)
	}
	if wj.GetID() <= 0 {
		return workload.JobEvent{}, fmt.Errorf("%w: workflow_job.id is missing or not positive", workload.ErrMalformed)
	}
	repo := payload.GetRepo().GetFullName()
	if owner, name, ok := strings.Cut(repo, "/"); !ok || owner == "" || name == "" {
		return workload.JobEvent{}, fmt.Errorf("%w: repository.full_name is missing or not owner/name", workload.ErrMalformed)
	}
	return workload.JobEvent{
		DeliveryID: header.Get(WebhookDeliveryHeader),
		Action:     action,
		Job:        jobOf(repo, wj, state),
	}, nil
}

// webhookJobState maps a workflow_job action to the neutral state.
func webhookJobState(action string) (workload.JobState, bool) {
	switch action {
	case "queued", "waiting":
		return workload.JobQueued, true
	case "in_progress":
		return workload.JobInProgress, true
	case "completed":
		return workload.JobCompleted, true
	}
	return "", false
}

// webhookTruncate keeps error messages short when a header or field is hostile.
func webhookTruncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}

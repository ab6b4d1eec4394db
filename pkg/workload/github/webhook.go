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
	// WebhookEnterpriseHostHeader is the host name of the GitHub
	// Enterprise Server that sent a delivery.
	WebhookEnterpriseHostHeader = "X-GitHub-Enterprise-Host"

	// WebhookEventWorkflowJob is the only event type WebhookParser decodes.
	WebhookEventWorkflowJob = "workflow_job"
	// WebhookEventPing is sent when a webhook is created; it carries no job.
	WebhookEventPing = "ping"
)

const webhookSignaturePrefix = "sha256="

// WebhookParser verifies and decodes GitHub workflow_job webhooks. It
// implements workload.WebhookParser.
//
// The signature must be X-Hub-Signature-256 (HMAC-SHA256 of the raw body),
// compared in constant time. There is deliberately no fallback to the
// SHA-1 X-Hub-Signature header: a delivery that carries only that is
// rejected.
//
// The key is chosen by the delivery's owner (the repository's owner, else
// the organization; see workload.WebhookSecrets.SecretFor): an owner listed in OwnerSecrets is
// verified with its own secret only, any other owner with Secret. One
// owner's secret therefore cannot sign deliveries about another owner's
// repositories (docs/security.md, "Webhook intake"). A delivery for which
// no secret is configured is rejected.
type WebhookParser struct {
	// WebhookSecrets are the webhooks' secrets as configured on GitHub,
	// the owners' keyed by organization or user login.
	workload.WebhookSecrets
}

var _ workload.WebhookParser = WebhookParser{}

// webhookOwnerFields are the parts of a payload that name its owner.
type webhookOwnerFields struct {
	Repository struct {
		FullName string `json:"full_name"`
	} `json:"repository"`
	Organization struct {
		Login string `json:"login"`
	} `json:"organization"`
}

// deliveryOwner is the owner a delivery is about, in lower case: the
// repository's owner, else the organization; empty when the body names
// neither (or is not JSON). It reads the unverified body only to choose
// the key the body is then verified with.
func deliveryOwner(body []byte) string {
	var f webhookOwnerFields
	if json.Unmarshal(body, &f) != nil {
		return ""
	}
	if owner, _, ok := strings.Cut(f.Repository.FullName, "/"); ok && owner != "" {
		return strings.ToLower(owner)
	}
	return strings.ToLower(f.Organization.Login)
}

// VerifySignature checks header's X-Hub-Signature-256 against body with
// the secret of the owner body names (SecretFor); the error wraps
// workload.ErrBadSignature and says why, never what was expected.
func (p WebhookParser) VerifySignature(header http.Header, body []byte) error {
	owner := deliveryOwner(body)
	secret, _ := p.SecretFor(owner)
	if len(secret) == 0 {
		return fmt.Errorf("%w: no webhook secret is configured for owner %q", workload.ErrBadSignature, webhookTruncate(owner, 64))
	}
	return verifyHMAC(header, body, secret)
}

// verifyHMAC checks header's X-Hub-Signature-256 against body under secret.
func verifyHMAC(header http.Header, body, secret []byte) error {
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
	mac := hmac.New(sha256.New, secret)
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
		return workload.JobEvent{}, fmt.Errorf("%w: decoding the workflow_job payload: %w", workload.ErrMalformed, err)
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
	owner, name, ok := strings.Cut(repo, "/")
	if !ok || owner == "" || name == "" {
		return workload.JobEvent{}, fmt.Errorf("%w: repository.full_name is missing or not owner/name", workload.ErrMalformed)
	}
	own, err := p.checkSignedFor(header, body, owner)
	if err != nil {
		return workload.JobEvent{}, err
	}
	return workload.JobEvent{
		DeliveryID:  header.Get(WebhookDeliveryHeader),
		Action:      action,
		Job:         jobOf(repo, wj, state),
		OwnerSigned: own,
	}, nil
}

// checkSignedFor makes the key binding explicit on the decoded event: the
// body verified above must also verify with the secret of the repository
// owner the job is recorded for. It costs a second HMAC and guards against
// the owner read before verification and the owner decoded after it ever
// differing. own reports whether that secret is the owner's own key (not
// the fallback Secret every other owner's deliveries verify with).
func (p WebhookParser) checkSignedFor(header http.Header, body []byte, owner string) (own bool, _ error) {
	secret, own := p.SecretFor(owner)
	if len(secret) == 0 {
		return false, fmt.Errorf("%w: no webhook secret is configured for owner %q", workload.ErrBadSignature, webhookTruncate(owner, 64))
	}
	return own, verifyHMAC(header, body, secret)
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

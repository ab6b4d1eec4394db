package gitlab

import (
	"crypto/subtle"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"time"

	gl "gitlab.com/gitlab-org/api/client-go"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/pkg/workload"
)

// Webhook headers GitLab sets on every delivery.
const (
	// WebhookTokenHeader carries the hook's secret token as configured on
	// GitLab, in clear: GitLab signs nothing, so the token is compared.
	WebhookTokenHeader = "X-Gitlab-Token"
	// WebhookEventHeader is the event's name, such as Job Hook.
	WebhookEventHeader = "X-Gitlab-Event"
	// WebhookEventUUIDHeader is the event's id: the same in every hook's
	// delivery of one event (a project hook and its group's), so the
	// receiver takes each event once.
	WebhookEventUUIDHeader = "X-Gitlab-Event-UUID"
	// WebhookInstanceHeader is the URL of the GitLab instance that sent
	// a delivery, such as https://gitlab.example.com.
	WebhookInstanceHeader = "X-Gitlab-Instance"
	// WebhookEventJob is the only event WebhookParser decodes.
	WebhookEventJob = string(gl.EventTypeJob)
)

// WebhookFormat is how GitLab delivers webhooks (workload.WebhookFormat).
var WebhookFormat = workload.WebhookFormat{
	Platform: "GitLab", Label: string(hfv1.WorkloadGitLabCI), Path: "/webhooks/gitlab",
	EventHeader: WebhookEventHeader, Events: []string{WebhookEventJob},
	DeliveryHeader: WebhookEventUUIDHeader, SignatureHeader: WebhookTokenHeader,
	HostHeader: WebhookInstanceHeader, PublicHosts: []string{publicHost},
	Used: "Job Hook events (object_kind build) of pending, running and finished jobs",
	Operator: workload.WebhookFlags{
		Name: "gitlab",
		OwnerKeys: "owner.<group path> (the token of one group's hooks, its full path in lower case with each / written as .., such as owner.acme..platform; " +
			"deliveries about the projects under the group verify with it)",
		Owners: "GitLab group", Docs: "docs/gitlab.md",
		PublicService: "GitLab.com", ExampleHost: "gitlab.example.com (a self-managed GitLab)",
	},
}

// OwnerKey is how a group's own webhook token is keyed in the webhook
// Secret, after its owner. prefix: the group's full path in lower case with
// each / written as .. (Secret keys cannot hold /; GitLab paths do not
// hold two special characters in a row, so .. is not part of a path),
// such as owner.acme..platform for acme/platform.
func OwnerKey(groupPath string) string {
	return strings.ReplaceAll(strings.ToLower(groupPath), "/", "..")
}

// WebhookOwnerKeys implements workload.WebhookOwnerKeyer: deliveries about
// the projects of a group (or under a project's namespace) verify with the
// token of that group or any group above it, keyed by OwnerKey, the
// group's own first; none for the instance (no owner).
func (*Backend) WebhookOwnerKeys(owner string) []string {
	var keys []string
	for path := strings.Trim(owner, "/"); path != ""; {
		keys = append(keys, OwnerKey(path))
		i := strings.LastIndex(path, "/")
		if i < 0 {
			break
		}
		path = path[:i]
	}
	return keys
}

// WebhookParser verifies and decodes GitLab Job Hook deliveries. It
// implements workload.WebhookParser.
//
// GitLab authenticates a delivery with the hook's secret token in
// X-Gitlab-Token, compared here in constant time. A delivery about a
// project is verified with the tokens of the groups above it that have
// their own (OwnerSecrets, keyed as OwnerKey writes them): a hook on any of
// those groups, or on a project under one, uses that group's token, and
// whoever holds it administers the project's group; OwnerSigned is then
// true. Projects under no such group are verified with Secret (the shared
// fallback; OwnerSigned false). A delivery about a project under a group
// with its own token never verifies with the fallback, so the fallback's
// holders cannot forge events of that group (docs/security.md, "Webhook
// intake").
type WebhookParser struct {
	// WebhookSecrets are the Job Hooks' secret tokens, the groups' keyed
	// by OwnerKey. A delivery is verified with ownerSecrets, not
	// SecretFor: a project's hook may be any group's above it.
	workload.WebhookSecrets
}

var _ workload.WebhookParser = WebhookParser{}

// hookProject is the part of a Job Hook body client-go's JobEvent does not
// decode: the project's full path.
type hookProject struct {
	Project struct {
		PathWithNamespace string `json:"path_with_namespace"`
	} `json:"project"`
}

// ownerSecrets are the tokens a delivery about project (its full path)
// verifies with: those of the groups above it that have their own, and
// whether there are any; else the fallback.
func (p WebhookParser) ownerSecrets(project string) ([][]byte, bool) {
	var own [][]byte
	path := strings.ToLower(project)
	for i := strings.LastIndex(path, "/"); i > 0; i = strings.LastIndex(path[:i], "/") {
		for key, s := range p.OwnerSecrets {
			if strings.EqualFold(key, OwnerKey(path[:i])) {
				own = append(own, s)
			}
		}
	}
	if len(own) > 0 {
		return own, true
	}
	if len(p.Secret) == 0 {
		return nil, false
	}
	return [][]byte{p.Secret}, false
}

// Parse implements workload.WebhookParser. The job's labels are not in a
// Job Hook (it carries the runner's tags, not the job's): JobEvent.Job
// has none and says so (LabelsUnknown); routing reads the job's tags with
// GetJob (internal/demand).
func (p WebhookParser) Parse(header http.Header, body []byte) (workload.JobEvent, error) {
	// The unverified body is read only to choose the tokens it is verified
	// with; one that is not JSON names no project and meets the fallback,
	// and is malformed only once its token verified, so that a sender
	// without a token learns nothing about the body's handling.
	var proj hookProject
	decodeErr := json.Unmarshal(body, &proj)
	secrets, own := p.ownerSecrets(proj.Project.PathWithNamespace)
	if len(secrets) == 0 {
		return workload.JobEvent{}, fmt.Errorf("%w: no webhook token is configured for project %q", workload.ErrBadSignature, truncate(proj.Project.PathWithNamespace, 255))
	}
	got := []byte(header.Get(WebhookTokenHeader))
	if len(got) == 0 {
		return workload.JobEvent{}, fmt.Errorf("%w: no %s header", workload.ErrBadSignature, WebhookTokenHeader)
	}
	ok := false
	for _, s := range secrets {
		// Every candidate is compared, so the time taken does not say
		// which one matched.
		if subtle.ConstantTimeCompare(got, s) == 1 {
			ok = true
		}
	}
	if !ok {
		return workload.JobEvent{}, fmt.Errorf("%w: %s does not match", workload.ErrBadSignature, WebhookTokenHeader)
	}
	if decodeErr != nil {
		return workload.JobEvent{}, fmt.Errorf("%w: %w", workload.ErrMalformed, decodeErr)
	}
	if ev := header.Get(WebhookEventHeader); ev != WebhookEventJob {
		return workload.JobEvent{}, fmt.Errorf("%w: %s %q", workload.ErrIgnoredEvent, WebhookEventHeader, truncate(ev, 64))
	}
	parsed, err := gl.ParseWebhook(gl.EventTypeJob, body)
	if err != nil {
		return workload.JobEvent{}, fmt.Errorf("%w: %w", workload.ErrMalformed, err)
	}
	ev, isJob := parsed.(*gl.JobEvent)
	if !isJob || ev.ObjectKind != "build" {
		return workload.JobEvent{}, fmt.Errorf("%w: object_kind is not build", workload.ErrIgnoredEvent)
	}
	if notYet[ev.BuildStatus] {
		// Not waiting for a runner yet (a later stage, a manual or
		// delayed job, one waiting for its resource group): no demand
		// until its pending event.
		return workload.JobEvent{}, fmt.Errorf("%w: job status %s does not wait for a runner yet", workload.ErrIgnoredEvent, truncate(ev.BuildStatus, 32))
	}
	if ev.BuildID <= 0 || ev.BuildStatus == "" || proj.Project.PathWithNamespace == "" {
		return workload.JobEvent{}, fmt.Errorf("%w: a Job Hook without build_id, build_status or project.path_with_namespace", workload.ErrMalformed)
	}
	job := workload.Job{
		ID: formatJobID(ev.BuildID), Platform: hfv1.WorkloadGitLabCI, RunID: ev.PipelineID, Repository: proj.Project.PathWithNamespace,
		State: jobState(ev.BuildStatus), Name: ev.BuildName, WorkflowName: ev.BuildStage, LabelsUnknown: true,
		RunnerName: ev.Runner.Description, RunnerID: ev.Runner.ID,
		CreatedAt: hookTime(ev.BuildCreatedAt), StartedAt: hookTime(ev.BuildStartedAt), CompletedAt: hookTime(ev.BuildFinishedAt),
	}
	if job.State == workload.JobCompleted {
		job.Conclusion = ev.BuildStatus
	}
	return workload.JobEvent{
		DeliveryID: header.Get(WebhookEventUUIDHeader), Action: ev.BuildStatus, Job: job, OwnerSigned: own,
	}, nil
}

// notYet are the job statuses of a job that does not wait for a runner
// yet: GitLab makes it pending (and sends that event) when it does.
var notYet = map[string]bool{"created": true, "manual": true, "scheduled": true, "waiting_for_resource": true, "waiting_for_callback": true}

// hookTime reads a Job Hook time: GitLab writes 2006-01-02 15:04:05 UTC
// (older versions an RFC 3339 time); zero when absent or unreadable.
func hookTime(s string) time.Time {
	for _, layout := range []string{"2006-01-02 15:04:05 MST", "2006-01-02 15:04:05 -0700", time.RFC3339} {
		if t, err := time.Parse(layout, s); err == nil {
			return t
		}
	}
	return time.Time{}
}

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n] + "…"
	}
	return s
}

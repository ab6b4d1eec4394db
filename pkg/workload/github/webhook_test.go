package github

import (
	"encoding/json"
	"errors"
	"net/http"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/testworld/testdeps"
	"github.com/hyperfleet/hyperfleet/pkg/workload"
)

var testSecret = []byte("It's a Secret to Everybody")

// signedHeader is the header of a GitHub delivery of body.
func signedHeader(secret, body []byte, event string) http.Header {
	h := http.Header{}
	h.Set(WebhookSignatureHeader, SignWebhook(secret, body))
	h.Set(WebhookEventHeader, event)
	h.Set(WebhookDeliveryHeader, "72d3162e-cc78-11e3-81ab-4c9367dc0958")
	h.Set("Content-Type", "application/json")
	return h
}

const queuedBody = `{
  "action": "queued",
  "workflow_job": {
    "id": 4242, "run_id": 77, "run_attempt": 2, "status": "queued",
    "labels": ["self-hosted", "Linux", "gpu"], "runner_id": null, "runner_name": null,
    "workflow_name": "CI", "name": "build",
    "created_at": "2024-05-01T10:00:00Z", "started_at": "2024-05-01T10:00:00Z", "completed_at": null
  },
  "repository": {"full_name": "octo-org/app"}
}`

func TestSignWebhookKnownVector(t *testing.T) {
	// GitHub's documented example ("Validating webhook deliveries").
	got := SignWebhook(testSecret, []byte("Hello, World!"))
	want := "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17"
	if got != want {
		t.Fatalf("SignWebhook = %s, want %s", got, want)
	}
}

func TestParseQueued(t *testing.T) {
	body := []byte(queuedBody)
	ev, err := WebhookParser{WebhookSecrets: workload.WebhookSecrets{Secret: testSecret}}.Parse(signedHeader(testSecret, body, "workflow_job"), body)
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	want := workload.JobEvent{
		DeliveryID: "72d3162e-cc78-11e3-81ab-4c9367dc0958",
		Action:     "queued",
		Job: workload.Job{
			ID: "4242", Platform: hfv1.WorkloadGitHubActions, RunID: 77, RunAttempt: 2, Repository: "octo-org/app",
			Labels: []string{"self-hosted", "Linux", "gpu"}, State: workload.JobQueued,
			WorkflowName: "CI", Name: "build",
			CreatedAt: time.Date(2024, 5, 1, 10, 0, 0, 0, time.UTC),
			StartedAt: time.Date(2024, 5, 1, 10, 0, 0, 0, time.UTC),
		},
	}
	if !equalEvents(ev, want) {
		t.Fatalf("Parse =\n%+v\nwant\n%+v", ev, want)
	}
}

func equalEvents(a, b workload.JobEvent) bool {
	la, lb := a.Job.Labels, b.Job.Labels
	a.Job.Labels, b.Job.Labels = nil, nil
	ta := []time.Time{a.Job.CreatedAt, a.Job.StartedAt, a.Job.CompletedAt}
	tb := []time.Time{b.Job.CreatedAt, b.Job.StartedAt, b.Job.CompletedAt}
	a.Job.CreatedAt, a.Job.StartedAt, a.Job.CompletedAt = time.Time{}, time.Time{}, time.Time{}
	b.Job.CreatedAt, b.Job.StartedAt, b.Job.CompletedAt = time.Time{}, time.Time{}, time.Time{}
	for i := range ta {
		if !ta[i].Equal(tb[i]) {
			return false
		}
	}
	return reflect.DeepEqual(a, b) && slices.Equal(la, lb)
}

func TestParseErrors(t *testing.T) {
	body := []byte(queuedBody)
	replace := func(old, repl string) []byte { return []byte(strings.Replace(queuedBody, old, repl, 1)) }
	tests := []struct {
		name    string
		header  func(body []byte) http.Header
		body    []byte
		secret  []byte
		want    error
		message string
	}{
		{
			name: "no signature",
			header: func(b []byte) http.Header {
				h := signedHeader(testSecret, b, "workflow_job")
				h.Del(WebhookSignatureHeader)
				return h
			},
			body: body, want: workload.ErrBadSignature, message: "X-Hub-Signature-256",
		},
		{
			name: "sha1 only is not enough",
			header: func(b []byte) http.Header {
				h := signedHeader(testSecret, b, "workflow_job")
				h.Del(WebhookSignatureHeader)
				h.Set("X-Hub-Signature", "sha1=d03207e4b030cf234e3447bac4d93add4c6643d8")
				return h
			},
			body: body, want: workload.ErrBadSignature,
		},
		{
			name: "wrong secret",
			header: func(b []byte) http.Header {
				return signedHeader([]byte("another secret"), b, "workflow_job")
			},
			body: body, want: workload.ErrBadSignature, message: "does not match",
		},
		{
			name: "signature of another body",
			header: func(b []byte) http.Header {
				return signedHeader(testSecret, append(b, ' '), "workflow_job")
			},
			body: body, want: workload.ErrBadSignature,
		},
		{
			name: "sha1 prefix in the sha256 header",
			header: func(b []byte) http.Header {
				h := signedHeader(testSecret, b, "workflow_job")
				h.Set(WebhookSignatureHeader, strings.Replace(h.Get(WebhookSignatureHeader), "sha256=", "sha1=", 1))
				return h
			},
			body: body, want: workload.ErrBadSignature,
		},
		{
			name: "not hex",
			header: func(b []byte) http.Header {
				h := signedHeader(testSecret, b, "workflow_job")
				h.Set(WebhookSignatureHeader, "sha256=zz")
				return h
			},
			body: body, want: workload.ErrBadSignature,
		},
		{
			name: "truncated digest",
			header: func(b []byte) http.Header {
				h := signedHeader(testSecret, b, "workflow_job")
				h.Set(WebhookSignatureHeader, h.Get(WebhookSignatureHeader)[:40])
				return h
			},
			body: body, want: workload.ErrBadSignature,
		},
		{
			name:   "no secret configured",
			header: func(b []byte) http.Header { return signedHeader(nil, b, "workflow_job") },
			body:   body, secret: []byte{}, want: workload.ErrBadSignature,
		},
		{
			name:   "ping",
			header: func(b []byte) http.Header { return signedHeader(testSecret, b, "ping") },
			body:   []byte(`{"zen":"Keep it logically awesome.","hook_id":1}`), want: workload.ErrIgnoredEvent, message: "ping",
		},
		{
			name:   "push",
			header: func(b []byte) http.Header { return signedHeader(testSecret, b, "push") },
			body:   body, want: workload.ErrIgnoredEvent,
		},
		{
			name:   "no event header",
			header: func(b []byte) http.Header { return signedHeader(testSecret, b, "") },
			body:   body, want: workload.ErrIgnoredEvent,
		},
		{
			name:   "unknown action",
			header: func(b []byte) http.Header { return signedHeader(testSecret, b, "workflow_job") },
			body:   replace(`"action": "queued"`, `"action": "requested"`), want: workload.ErrIgnoredEvent, message: "requested",
		},
		{
			name:   "bad json",
			header: func(b []byte) http.Header { return signedHeader(testSecret, b, "workflow_job") },
			body:   []byte(`{"action": "queued",`), want: workload.ErrMalformed,
		},
		{
			name:   "wrong type",
			header: func(b []byte) http.Header { return signedHeader(testSecret, b, "workflow_job") },
			body:   replace(`"id": 4242`, `"id": "4242"`), want: workload.ErrMalformed,
		},
		{
			name:   "no action",
			header: func(b []byte) http.Header { return signedHeader(testSecret, b, "workflow_job") },
			body:   replace(`"action": "queued",`, ``), want: workload.ErrMalformed, message: "action",
		},
		{
			name:   "no job",
			header: func(b []byte) http.Header { return signedHeader(testSecret, b, "workflow_job") },
			body:   []byte(`{"action":"queued","repository":{"full_name":"a/b"}}`), want: workload.ErrMalformed, message: "workflow_job",
		},
		{
			name:   "no job id",
			header: func(b []byte) http.Header { return signedHeader(testSecret, b, "workflow_job") },
			body:   replace(`"id": 4242,`, ``), want: workload.ErrMalformed, message: "workflow_job.id",
		},
		{
			name:   "no repository",
			header: func(b []byte) http.Header { return signedHeader(testSecret, b, "workflow_job") },
			body:   replace(`"full_name": "octo-org/app"`, `"name": "app"`), want: workload.ErrMalformed, message: "repository.full_name",
		},
		{
			name:   "repository not owner/name",
			header: func(b []byte) http.Header { return signedHeader(testSecret, b, "workflow_job") },
			body:   replace(`"octo-org/app"`, `"app"`), want: workload.ErrMalformed, message: "repository.full_name",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			secret := testSecret
			if tc.secret != nil {
				secret = tc.secret
			}
			_, err := WebhookParser{WebhookSecrets: workload.WebhookSecrets{Secret: secret}}.Parse(tc.header(tc.body), tc.body)
			if !errors.Is(err, tc.want) {
				t.Fatalf("Parse error = %v, want %v", err, tc.want)
			}
			if !strings.Contains(err.Error(), tc.message) {
				t.Fatalf("Parse error %q does not mention %q", err, tc.message)
			}
			if strings.Contains(err.Error(), string(testSecret)) {
				t.Fatalf("error leaks the secret: %v", err)
			}
		})
	}
}

func TestParseStates(t *testing.T) {
	for action, want := range map[string]workload.JobState{
		"queued": workload.JobQueued, "waiting": workload.JobQueued,
		"in_progress": workload.JobInProgress, "completed": workload.JobCompleted,
	} {
		body := []byte(strings.Replace(queuedBody, `"action": "queued"`, `"action": "`+action+`"`, 1))
		ev, err := WebhookParser{WebhookSecrets: workload.WebhookSecrets{Secret: testSecret}}.Parse(signedHeader(testSecret, body, "workflow_job"), body)
		if err != nil {
			t.Fatalf("%s: %v", action, err)
		}
		if ev.Job.State != want || ev.Action != action {
			t.Errorf("%s: state %q action %q, want %q", action, ev.Job.State, ev.Action, want)
		}
	}
}

// octokitExample is the part of a @octokit/webhooks-examples entry the
// tests read.
type octokitExample struct {
	Action      string `json:"action"`
	WorkflowJob struct {
		ID         int64    `json:"id"`
		RunID      int64    `json:"run_id"`
		Labels     []string `json:"labels"`
		RunnerName *string  `json:"runner_name"`
		Conclusion *string  `json:"conclusion"`
	} `json:"workflow_job"`
	Repository struct {
		FullName string `json:"full_name"`
	} `json:"repository"`
}

func TestParseOctokitExamples(t *testing.T) {
	for i, raw := range testdeps.WebhookExamples(t, "workflow_job") {
		var want octokitExample
		if err := json.Unmarshal(raw, &want); err != nil {
			t.Fatalf("example %d: %v", i, err)
		}
		ev, err := WebhookParser{WebhookSecrets: workload.WebhookSecrets{Secret: testSecret}}.Parse(signedHeader(testSecret, raw, "workflow_job"), raw)
		if err != nil {
			t.Fatalf("example %d (%s): %v", i, want.Action, err)
		}
		wj := want.WorkflowJob
		if ev.Action != want.Action || ev.Job.ID != strconv.FormatInt(wj.ID, 10) || ev.Job.RunID != wj.RunID ||
			ev.Job.Repository != want.Repository.FullName || !slices.Equal(ev.Job.Labels, wj.Labels) {
			t.Errorf("example %d: parsed %+v, want %+v", i, ev, want)
		}
		if wj.RunnerName != nil && ev.Job.RunnerName != *wj.RunnerName {
			t.Errorf("example %d: runner %q, want %q", i, ev.Job.RunnerName, *wj.RunnerName)
		}
		if wj.Conclusion != nil && ev.Job.Conclusion != *wj.Conclusion {
			t.Errorf("example %d: conclusion %q, want %q", i, ev.Job.Conclusion, *wj.Conclusion)
		}
		if want.Action == "completed" && (ev.Job.State != workload.JobCompleted || ev.Job.CompletedAt.IsZero()) {
			t.Errorf("example %d: completed job parsed as %q, completedAt %v", i, ev.Job.State, ev.Job.CompletedAt)
		}
	}
}

func TestParseOwnerSecrets(t *testing.T) {
	orgSecret, globalSecret := []byte("octo-org's own secret"), []byte("the fallback secret")
	body := func(repo string) []byte {
		return []byte(strings.Replace(queuedBody, `"octo-org/app"`, `"`+repo+`"`, 1))
	}
	parser := WebhookParser{WebhookSecrets: workload.WebhookSecrets{Secret: globalSecret, OwnerSecrets: map[string][]byte{"octo-org": orgSecret}}}
	tests := []struct {
		name   string
		parser WebhookParser
		body   []byte
		secret []byte
		ok     bool
		// own: the event says it verified with the owner's own key
		// (workload.JobEvent.OwnerSigned), not the shared fallback.
		own  bool
		says string
	}{
		{name: "owner with its own secret", parser: parser, body: body("octo-org/app"), secret: orgSecret, ok: true, own: true},
		{name: "owner's name in another case", parser: parser, body: body("Octo-Org/app"), secret: orgSecret, ok: true, own: true},
		{name: "owner with its own secret, signed with the fallback", parser: parser, body: body("octo-org/app"), secret: globalSecret, says: "does not match"},
		{name: "other owner with the fallback", parser: parser, body: body("someone/app"), secret: globalSecret, ok: true, own: false},
		{name: "other owner signed with octo-org's secret", parser: parser, body: body("someone/app"), secret: orgSecret, says: "does not match"},
		{
			name: "other owner without a fallback", body: body("someone/app"), secret: orgSecret, says: `no webhook secret is configured for owner "someone"`,
			parser: WebhookParser{WebhookSecrets: workload.WebhookSecrets{OwnerSecrets: map[string][]byte{"octo-org": orgSecret}}},
		},
		{
			name: "key in another case than the login", body: body("octo-org/app"), secret: globalSecret, says: "does not match",
			parser: WebhookParser{WebhookSecrets: workload.WebhookSecrets{Secret: globalSecret, OwnerSecrets: map[string][]byte{"Octo-Org": orgSecret}}},
		},
		{
			// encoding/json matches keys case-insensitively: whichever of
			// the two names both decodes settle on, the job must be signed
			// with that owner's secret.
			name: "owner smuggled in a second key", parser: parser, secret: globalSecret, says: "does not match",
			body: []byte(strings.Replace(queuedBody, `"full_name": "octo-org/app"`, `"full_name": "someone/app", "FULL_NAME": "octo-org/app"`, 1)),
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ev, err := tc.parser.Parse(signedHeader(tc.secret, tc.body, "workflow_job"), tc.body)
			if tc.ok {
				if err != nil || ev.Job.ID != "4242" || ev.OwnerSigned != tc.own {
					t.Fatalf("Parse = %+v, %v; want the job, owner-signed %v", ev, err, tc.own)
				}
				return
			}
			if !errors.Is(err, workload.ErrBadSignature) || !strings.Contains(err.Error(), tc.says) {
				t.Fatalf("Parse = %+v, %v; want ErrBadSignature saying %q", ev, err, tc.says)
			}
		})
	}
}

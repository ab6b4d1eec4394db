package github

import (
	"errors"
	"net/http"
	"testing"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/pkg/workload"
)

// FuzzWebhookParser checks that Parse never panics, that a delivery
// without a valid signature is always an error (ErrBadSignature), and that
// a validly signed one either decodes to a job with an id and a repository
// or returns one of the documented sentinel errors.
func FuzzWebhookParser(f *testing.F) {
	f.Add("workflow_job", "", true, []byte(queuedBody))
	f.Add("workflow_job", "sha256=00", false, []byte(queuedBody))
	f.Add("ping", "", true, []byte(`{"zen":"x"}`))
	f.Add("workflow_job", "", true, []byte(`{"action":"completed","workflow_job":{"id":1},"repository":{"full_name":"a/b"}}`))
	f.Add("workflow_job", "", true, []byte(`{"action":"in_progress","workflow_job":{"id":-1,"created_at":12},"repository":{"full_name":"/"}}`))
	f.Add("workflow_job", "", true, []byte(`null`))
	f.Add("workflow_job", "", true, []byte(`{"workflow_job":null,"action":"queued"}`))
	f.Add("", "sha1=abc", false, []byte{})
	parser := WebhookParser{WebhookSecrets: workload.WebhookSecrets{Secret: testSecret}}
	f.Fuzz(func(t *testing.T, event, signature string, sign bool, body []byte) {
		h := http.Header{}
		h.Set(WebhookEventHeader, event)
		validSig := SignWebhook(testSecret, body)
		if sign {
			signature = validSig
		}
		if signature != "" {
			h.Set(WebhookSignatureHeader, signature)
		}
		ev, err := parser.Parse(h, body)
		if h.Get(WebhookSignatureHeader) != validSig {
			if err == nil {
				t.Fatalf("accepted a delivery without a valid signature: %+v", ev)
			}
			if !errors.Is(err, workload.ErrBadSignature) {
				t.Fatalf("invalid signature gave %v, want ErrBadSignature", err)
			}
			return
		}
		if err != nil {
			if !errors.Is(err, workload.ErrIgnoredEvent) && !errors.Is(err, workload.ErrMalformed) {
				t.Fatalf("signed delivery gave an undocumented error: %v", err)
			}
			return
		}
		if _, ok := parseJobID(ev.Job.ID); !ok || ev.Job.Platform != hfv1.WorkloadGitHubActions || ev.Job.Repository == "" || ev.Job.State == "" {
			t.Fatalf("accepted an incomplete job: %+v", ev)
		}
	})
}

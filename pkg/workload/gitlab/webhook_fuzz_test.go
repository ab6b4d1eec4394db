package gitlab

import (
	"encoding/json"
	"errors"
	"net/http"
	"testing"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/pkg/workload"
)

const fuzzJobBody = `{"object_kind":"build","build_id":7,"build_status":"pending","pipeline_id":3,` +
	`"build_created_at":"2026-01-02 03:04:05 UTC","project":{"path_with_namespace":"acme/platform/app"}}`

// FuzzWebhookParser checks that Parse never panics, that a delivery
// without the right token is always ErrBadSignature (the group's own token
// for its projects, the fallback for others), and that one with it either
// decodes to a job with an id, a repository and a state, or returns one of
// the documented sentinel errors.
func FuzzWebhookParser(f *testing.F) {
	f.Add("Job Hook", "", true, []byte(fuzzJobBody))
	f.Add("Job Hook", "fallback", false, []byte(fuzzJobBody))
	f.Add("Push Hook", "", true, []byte(`{"object_kind":"push","project":{"path_with_namespace":"other/x"}}`))
	f.Add("Job Hook", "", true, []byte(`{"object_kind":"build","build_id":-1,"build_status":"","project":{"path_with_namespace":"/"}}`))
	f.Add("Job Hook", "", true, []byte(`null`))
	f.Add("Job Hook", "", true, []byte(`{"object_kind":"build","build_id":1,"build_status":"running","project":{"path_with_namespace":"a"}}`))
	f.Add("", "x", false, []byte{})
	parser := WebhookParser{WebhookSecrets: workload.WebhookSecrets{Secret: []byte("fallback"), OwnerSecrets: map[string][]byte{OwnerKey("acme/platform"): []byte("group")}}}
	f.Fuzz(func(t *testing.T, event, token string, useRight bool, body []byte) {
		var proj hookProject
		_ = json.Unmarshal(body, &proj)
		right := "fallback"
		if secrets, own := parser.ownerSecrets(proj.Project.PathWithNamespace); own {
			right = string(secrets[0])
		}
		if useRight {
			token = right
		}
		h := http.Header{}
		h.Set(WebhookEventHeader, event)
		if token != "" {
			h.Set(WebhookTokenHeader, token)
		}
		ev, err := parser.Parse(h, body)
		if h.Get(WebhookTokenHeader) != right {
			if !errors.Is(err, workload.ErrBadSignature) {
				t.Fatalf("a delivery without its token gave %v (%+v), want ErrBadSignature", err, ev)
			}
			return
		}
		if err != nil {
			if !errors.Is(err, workload.ErrIgnoredEvent) && !errors.Is(err, workload.ErrMalformed) {
				t.Fatalf("a delivery with its token gave an undocumented error: %v", err)
			}
			return
		}
		if _, ok := parseJobID(ev.Job.ID); !ok || ev.Job.Platform != hfv1.WorkloadGitLabCI || ev.Job.Repository == "" || ev.Job.State == "" {
			t.Fatalf("accepted an incomplete job: %+v", ev)
		}
	})
}

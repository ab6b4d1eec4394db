package controller

import (
	"context"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/record"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
)

// secretsSay answers WebhookSecretOf with use for GitHub Actions.
type secretsSay struct{ use WebhookSecretUse }

func (s secretsSay) WebhookSecretOf(platform hfv1.WorkloadType, _, _ string) (WebhookSecretUse, bool) {
	return s.use, platform == hfv1.WorkloadGitHubActions
}

// TestReportWebhookSecret: the pool's WebhookSecretShared condition says
// which secret verifies the deliveries about its owner, with a warning
// event when they rely on the shared secret or on none; no condition
// while no secrets are loaded or no receiver takes the platform's
// webhooks.
func TestReportWebhookSecret(t *testing.T) {
	base := WebhookSecretUse{Loaded: true, Source: "Secret hyperfleet-system/hooks", OwnKey: "owner.octo-org", SharedKey: "webhook-secret"}
	with := func(f func(*WebhookSecretUse)) WebhookSecretUse { u := base; f(&u); return u }
	for name, tc := range map[string]struct {
		secrets WebhookSecrets
		status  metav1.ConditionStatus // empty: no condition
		reason  hfv1.ConditionReason
		says    []string
		event   bool
	}{
		"own key":       {secrets: secretsSay{with(func(u *WebhookSecretUse) { u.Own = true })}, status: metav1.ConditionFalse, reason: hfv1.OwnWebhookSecretReason, says: []string{"own key owner.octo-org"}},
		"shared secret": {secrets: secretsSay{with(func(u *WebhookSecretUse) { u.Shared = true })}, status: metav1.ConditionTrue, reason: hfv1.SharedWebhookSecretReason, says: []string{"octo-org", "shared fallback secret (key webhook-secret of Secret hyperfleet-system/hooks)", "one API call per job", "under key owner.octo-org"}, event: true},
		"no secret":     {secrets: secretsSay{base}, status: metav1.ConditionFalse, reason: hfv1.NoWebhookSecretReason, says: []string{"refused", "resync only", "key owner.octo-org"}, event: true},
		"not loaded":    {secrets: secretsSay{WebhookSecretUse{}}},
		"no receiver":   {},
	} {
		t.Run(name, func(t *testing.T) {
			pool := &hfv1.RunnerPool{ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: "runners"}, Spec: hfv1.RunnerPoolSpec{
				Workload: hfv1.Workload{Type: hfv1.WorkloadGitHubActions, GitHub: &hfv1.GitHubWorkload{Organization: "octo-org"}}}}
			// A stale condition from an earlier state is replaced or removed.
			pool.Status.Conditions = []metav1.Condition{{Type: string(hfv1.RunnerPoolWebhookSecretSharedCondition), Status: metav1.ConditionUnknown, Reason: "Earlier"}}
			events := record.NewFakeRecorder(4)
			r := &RunnerPoolReconciler{Workloads: ciPlatforms, Recorder: events, WebhookSecrets: tc.secrets}
			for range 2 {
				if _, err := r.reportWebhookSecret(context.Background(), &poolScope{pool: pool}); err != nil {
					t.Fatal(err)
				}
			}
			c := hfv1.FindCondition(pool.Status.Conditions, hfv1.RunnerPoolWebhookSecretSharedCondition)
			switch {
			case tc.status == "" && c != nil:
				t.Fatalf("condition %+v, want none", c)
			case tc.status == "":
				return
			case c == nil || c.Status != tc.status || c.Reason != string(tc.reason):
				t.Fatalf("condition %+v, want %s %s", c, tc.status, tc.reason)
			}
			for _, s := range tc.says {
				if !strings.Contains(c.Message, s) {
					t.Errorf("message %q does not say %q", c.Message, s)
				}
			}
			if n := len(events.Events); n != map[bool]int{true: 1, false: 0}[tc.event] {
				t.Errorf("%d events after two passes, want %v once", n, tc.event)
			}
		})
	}
}

package githubsim

import (
	"encoding/json"
	"testing"
	"time"
)

// TestEnterpriseWebhooksAndGroups: a hook scoped to enterprises/octo-ent
// receives the jobs of the enterprise's organizations, whose payloads name
// the enterprise, and not those of other organizations; an enterprise
// runner of group hyperfleet (selected: ent-org) takes ent-org's job and
// not outside-org's; only a PAT with manage_runners:enterprise reaches the
// enterprise endpoints.
func TestEnterpriseWebhooksAndGroups(t *testing.T) {
	f := newFixture(t, func(c *Config) { c.HeartbeatTimeout = Duration(time.Hour) })
	hook, err := f.sim.AddWebhook(Webhook{URL: "http://127.0.0.1:1/unreachable", Secret: "s", Scope: "enterprises/octo-ent"})
	if err != nil {
		t.Fatal(err)
	}
	r := f.jitRunner("/enterprises/octo-ent", "ent-runner", "self-hosted", "ent")
	// jitRunner registers in Default; re-register in hyperfleet.
	f.mustCall("DELETE", "/enterprises/octo-ent/actions/runners/"+itoa(r.id), testPAT, nil, 204)
	_, cfg := f.jit("/enterprises/octo-ent", "ent-hyperfleet", 2, "self-hosted", "ent")
	r = &goRunner{f: f, id: cfg.runnerID, secret: cfg.secret}
	r.connect()
	outside := enqueue(t, f, "outside-org/app", time.Minute, "ent")
	inside := enqueue(t, f, "ent-org/app", time.Minute, "ent")
	enqueue(t, f, "octo-org/app", time.Minute, "nobody")
	r.poll()
	if j, _ := f.sim.Job(inside.ID); j.RunnerName != "ent-hyperfleet" {
		t.Errorf("ent-org's job went to %q, want ent-hyperfleet", j.RunnerName)
	}
	if j, _ := f.sim.Job(outside.ID); j.RunnerName != "" || j.Status != "queued" {
		t.Errorf("outside-org's job = %+v; group hyperfleet does not serve outside-org", j)
	}
	f.flush()
	repos := map[string]bool{}
	for _, d := range f.sim.Deliveries() {
		if d.HookID != hook.ID {
			continue
		}
		var p struct {
			Repository struct {
				FullName string `json:"full_name"`
			} `json:"repository"`
			Enterprise struct {
				Slug string `json:"slug"`
			} `json:"enterprise"`
		}
		if err := json.Unmarshal(d.Payload, &p); err != nil {
			t.Fatal(err)
		}
		repos[p.Repository.FullName] = true
		if p.Enterprise.Slug != "octo-ent" {
			t.Errorf("delivery for %s names enterprise %q", p.Repository.FullName, p.Enterprise.Slug)
		}
	}
	if !repos["ent-org/app"] || !repos["outside-org/app"] || repos["octo-org/app"] {
		t.Errorf("the enterprise hook got jobs of %v; want ent-org/app and outside-org/app only", repos)
	}
	// Credentials: a token without the scope is refused, an App's is not
	// shown the enterprise.
	if resp, _ := f.call("GET", "/enterprises/octo-ent/actions/runners", testPATLimited, nil); resp.StatusCode != 404 {
		t.Errorf("a PAT limited to another owner: %d, want 404", resp.StatusCode)
	}
	if resp, _ := f.call("GET", "/enterprises/octo-ent/actions/runners", f.installationToken(testOrgInst), nil); resp.StatusCode != 404 {
		t.Errorf("an installation token: %d, want 404", resp.StatusCode)
	}
	f.sim.mu.Lock()
	f.sim.pats[testPAT].Scopes = []string{"repo"}
	f.sim.mu.Unlock()
	if resp, _ := f.call("GET", "/enterprises/octo-ent/actions/runners", testPAT, nil); resp.StatusCode != 403 {
		t.Errorf("a PAT without manage_runners:enterprise: %d, want 403", resp.StatusCode)
	}
}

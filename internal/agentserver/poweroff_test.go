package agentserver

import (
	"context"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/hyperfleet/hyperfleet/internal/agentconfig"
)

// fakeReceiver accepts the one token "good" for claim ci/runner-1.
type fakeReceiver struct {
	mu       sync.Mutex
	accepted []agentconfig.PowerOffNotice
	retry    bool
}

func (f *fakeReceiver) PowerOffNotice(_ context.Context, c agentconfig.PowerOffNotice, token string) error {
	if token != "good" || c.Namespace != "ci" || c.Name != "runner-1" {
		return ErrBadToken
	}
	if f.retry {
		return ErrRetry
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.accepted = append(f.accepted, c)
	return nil
}

func notice(t *testing.T, url, auth, body string) *http.Response {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp
}

func TestPowerOffNotices(t *testing.T) {
	rcv := &fakeReceiver{}
	s, ts, _ := newTestServer(t, Options{PowerOff: rcv})
	if got := s.PowerOffURL(); got != "https://hyperfleet-agent.hyperfleet-system.svc:9443"+PowerOffPath {
		t.Fatalf("PowerOffURL = %q", got)
	}
	url := ts.URL + PowerOffPath
	claim := `{"namespace":"ci","name":"runner-1","uid":"u1"}`
	for _, c := range []struct {
		name, auth, body string
		want             int
	}{
		{"accepted", "Bearer good", claim, http.StatusAccepted},
		{"forged token", "Bearer forged", claim, http.StatusUnauthorized},
		{"another claim", "Bearer good", `{"namespace":"ci","name":"runner-2","uid":"u2"}`, http.StatusUnauthorized},
		{"no token", "", claim, http.StatusBadRequest},
		{"not JSON", "Bearer good", "namespace=ci", http.StatusBadRequest},
		{"too large", "Bearer good", `{"namespace":"` + strings.Repeat("a", 2000) + `"}`, http.StatusBadRequest},
	} {
		if resp := notice(t, url, c.auth, c.body); resp.StatusCode != c.want {
			t.Errorf("%s: %s, want %d", c.name, resp.Status, c.want)
		}
	}
	if resp, _ := get(t, http.MethodGet, url); resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("GET: %s", resp.Status)
	}
	if len(rcv.accepted) != 1 || rcv.accepted[0].UID != "u1" || rcv.accepted[0].JobStarted {
		t.Errorf("accepted %v, want the one good notice", rcv.accepted)
	}
	// What the agent saw its runner print comes along.
	if resp := notice(t, url, "Bearer good", `{"namespace":"ci","name":"runner-1","uid":"u1","runnerOnline":true,"jobStarted":true}`); resp.StatusCode != http.StatusAccepted {
		t.Errorf("notice with a report: %s", resp.Status)
	}
	if got := rcv.accepted[len(rcv.accepted)-1]; !got.RunnerOnline || !got.JobStarted || got.Name != "runner-1" {
		t.Errorf("notice with a report arrived as %+v", got)
	}
	rcv.retry = true
	if resp := notice(t, url, "Bearer good", claim); resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") != "1" {
		t.Errorf("not the leader: %s, Retry-After %q", resp.Status, resp.Header.Get("Retry-After"))
	}

	// Without a receiver the path is not served.
	s2, ts2, _ := newTestServer(t, Options{})
	if s2.PowerOffURL() != "" {
		t.Error("PowerOffURL without a receiver")
	}
	if resp := notice(t, ts2.URL+PowerOffPath, "Bearer good", claim); resp.StatusCode != http.StatusMethodNotAllowed && resp.StatusCode != http.StatusNotFound {
		t.Errorf("without a receiver: %s", resp.Status)
	}
}

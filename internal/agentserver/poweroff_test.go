package agentserver

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hyperfleet/hyperfleet/internal/agentconfig"
)

// fakeReceiver accepts the one token "good" for claim ci/runner-1/u1.
type fakeReceiver struct {
	mu       sync.Mutex
	accepted []agentconfig.PowerOffNotice
	ready    []agentconfig.ClaimRef
	retry    bool
}

var goodClaim = agentconfig.ClaimRef{Namespace: "ci", Name: "runner-1", UID: "u1"}

func (f *fakeReceiver) AuthorizePowerOff(c agentconfig.ClaimRef, token string) error {
	if token != "good" || c != goodClaim {
		return ErrBadToken
	}
	return nil
}

func (f *fakeReceiver) PowerOffNotice(_ context.Context, n agentconfig.PowerOffNotice) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.retry {
		return ErrRetry
	}
	f.accepted = append(f.accepted, n)
	return nil
}

func (f *fakeReceiver) AuthorizeReady(c agentconfig.ClaimRef, token string) error {
	return f.AuthorizePowerOff(c, token)
}

func (f *fakeReceiver) ReadyHint(_ context.Context, c agentconfig.ClaimRef) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.retry {
		return ErrRetry
	}
	f.ready = append(f.ready, c)
	return nil
}

func (f *fakeReceiver) readyHints() []agentconfig.ClaimRef {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]agentconfig.ClaimRef(nil), f.ready...)
}

func (f *fakeReceiver) notices() []agentconfig.PowerOffNotice {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]agentconfig.PowerOffNotice(nil), f.accepted...)
}

func notice(t *testing.T, url, auth, body string) (*http.Response, string) {
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
	defer resp.Body.Close()
	msg, _ := io.ReadAll(resp.Body)
	return resp, string(msg)
}

func TestPowerOffNotices(t *testing.T) {
	rcv := &fakeReceiver{}
	s, ts, _ := newTestServer(t, Options{PowerOff: rcv})
	if got := s.PowerOffURL(); got != "https://hyperfleet-agent.hyperfleet-system.svc:9443"+PowerOffPath {
		t.Fatalf("PowerOffURL = %q", got)
	}
	to := func(c agentconfig.ClaimRef) string {
		n := agentconfig.PowerOffNotify{URL: ts.URL + PowerOffPath, Claim: c}
		return n.NoticeURL()
	}
	good := to(goodClaim)
	if want := ts.URL + "/hints/v1/power-off/ci/runner-1/u1"; good != want {
		t.Fatalf("NoticeURL = %q, want %q", good, want)
	}
	for _, c := range []struct {
		name, url, auth, body string
		want                  int
	}{
		{"accepted", good, "Bearer good", `{"runnerOnline":true}`, http.StatusAccepted},
		{"accepted without a body", good, "Bearer good", "", http.StatusAccepted},
		{"forged token", good, "Bearer forged", `{}`, http.StatusUnauthorized},
		{"another claim", to(agentconfig.ClaimRef{Namespace: "ci", Name: "runner-2", UID: "u2"}), "Bearer good", `{}`, http.StatusUnauthorized},
		{"no token", good, "", `{}`, http.StatusUnauthorized},
		{"not JSON", good, "Bearer good", "runnerOnline=true", http.StatusBadRequest},
		{"too large", good, "Bearer good", `{"runnerOnline":true,"x":"` + strings.Repeat("a", 2000) + `"}`, http.StatusBadRequest},
		{"too few parts", ts.URL + PowerOffPath + "/ci/runner-1", "Bearer good", `{}`, http.StatusBadRequest},
		{"too many parts", good + "/more", "Bearer good", `{}`, http.StatusBadRequest},
		{"empty part", ts.URL + PowerOffPath + "/ci//u1", "Bearer good", `{}`, http.StatusBadRequest},
	} {
		resp, msg := notice(t, c.url, c.auth, c.body)
		if resp.StatusCode != c.want {
			t.Errorf("%s: %s (%s), want %d", c.name, resp.Status, strings.TrimSpace(msg), c.want)
		}
		if c.want != http.StatusAccepted && !resp.Close {
			t.Errorf("%s: a refusal keeps the connection open", c.name)
		}
	}
	if resp, _ := get(t, http.MethodGet, good); resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("GET: %s", resp.Status)
	}
	got := rcv.notices()
	if len(got) != 2 || got[0].ClaimRef != goodClaim || !got[0].RunnerOnline || got[0].JobStarted || got[1].RunnerOnline {
		t.Errorf("accepted %+v, want the two good notices", got)
	}
	// The claim is the path's: a body naming another (an old agent's)
	// changes nothing.
	if resp, _ := notice(t, good, "Bearer good", `{"namespace":"ci","name":"runner-9","uid":"u9","jobStarted":true}`); resp.StatusCode != http.StatusAccepted {
		t.Errorf("notice with extra fields: %s", resp.Status)
	}
	if got := rcv.notices(); got[len(got)-1].ClaimRef != goodClaim || !got[len(got)-1].JobStarted {
		t.Errorf("notice with extra fields arrived as %+v", got[len(got)-1])
	}
	rcv.retry = true
	if resp, _ := notice(t, good, "Bearer good", `{}`); resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") != "1" {
		t.Errorf("not the leader: %s, Retry-After %q", resp.Status, resp.Header.Get("Retry-After"))
	}

	// Without a receiver the path is not served.
	s2, ts2, _ := newTestServer(t, Options{})
	if s2.PowerOffURL() != "" {
		t.Error("PowerOffURL without a receiver")
	}
	if resp, _ := notice(t, ts2.URL+PowerOffPath+"/ci/runner-1/u1", "Bearer good", `{}`); resp.StatusCode != http.StatusMethodNotAllowed && resp.StatusCode != http.StatusNotFound {
		t.Errorf("without a receiver: %s", resp.Status)
	}
}

// TestPowerOffOldFormat: an agent from before the claim moved into the
// path POSTs its JSON claim to PowerOffPath itself; it gets 400 saying
// what changed, and its connection is closed.
func TestPowerOffOldFormat(t *testing.T) {
	rcv := &fakeReceiver{}
	_, ts, _ := newTestServer(t, Options{PowerOff: rcv})
	resp, msg := notice(t, ts.URL+PowerOffPath, "Bearer good", `{"namespace":"ci","name":"runner-1","uid":"u1","runnerOnline":true}`)
	if resp.StatusCode != http.StatusBadRequest || !resp.Close {
		t.Fatalf("old format: %s, close %v; want 400 and a closed connection", resp.Status, resp.Close)
	}
	for _, want := range []string{"old format", PowerOffPath + "/<namespace>/<name>/<uid>", "update the VM's agent"} {
		if !strings.Contains(msg, want) {
			t.Errorf("old format's answer %q does not say %q", msg, want)
		}
	}
	if len(rcv.notices()) != 0 {
		t.Error("an old-format notice was taken")
	}
}

// stalledNotice sends a notice's head declaring a body of 1,000 bytes and
// sends 4 of them, as the flood's attackers do, then reads the answer
// without sending more. It returns the status and whether the server
// closed the connection after it.
func stalledNotice(t *testing.T, addr, path, token string) (status int, closed bool) {
	t.Helper()
	conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	// Bounds the wait for an answer that is owed at once; not a timed
	// assertion: today's server answers only after its read timeout.
	_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
	fmt.Fprintf(conn, "POST %s HTTP/1.1\r\nHost: agent\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{\"ru", path, token)
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("no answer to a notice whose body never arrives: %v", err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	_ = resp.Body.Close()
	_, err = br.ReadByte()
	return resp.StatusCode, errors.Is(err, io.EOF)
}

// TestPowerOffTokenBeforeBody: a notice with a bad token whose body never
// arrives gets 401 at once, and its connection is closed; so does an
// old-format notice (400). Before the claim moved into the path the
// server read the body first and held the connection until its read
// timeout.
func TestPowerOffTokenBeforeBody(t *testing.T) {
	rcv := &fakeReceiver{}
	_, ts, _ := newTestServer(t, Options{PowerOff: rcv})
	addr := strings.TrimPrefix(ts.URL, "http://")
	for _, c := range []struct {
		name, path, token string
		want              int
	}{
		{"bogus token", PowerOffPath + "/ci/runner-1/u1", "bogus", http.StatusUnauthorized},
		{"another claim's token", PowerOffPath + "/ci/runner-2/u2", "good", http.StatusUnauthorized},
		{"old format", PowerOffPath, "bogus", http.StatusBadRequest},
	} {
		status, closed := stalledNotice(t, addr, c.path, c.token)
		if status != c.want || !closed {
			t.Errorf("%s: %d, connection closed %v; want %d and closed", c.name, status, closed, c.want)
		}
	}
	if len(rcv.notices()) != 0 {
		t.Error("a refused notice was taken")
	}
}

// TestReadyHints: a ready hint is taken with its claim's token and no
// body; a forged or missing token, another claim's, a body, a malformed
// path or another method are refused and the connection closed, and the
// token is checked before anything else of the request is looked at.
func TestReadyHints(t *testing.T) {
	rcv := &fakeReceiver{}
	s, ts, _ := newTestServer(t, Options{PowerOff: rcv})
	if got := s.ReadyURL(); got != "https://hyperfleet-agent.hyperfleet-system.svc:9443"+ReadyPath {
		t.Fatalf("ReadyURL = %q", got)
	}
	to := func(c agentconfig.ClaimRef) string {
		n := agentconfig.PowerOffNotify{URL: ts.URL + PowerOffPath, ReadyURL: ts.URL + ReadyPath, Claim: c}
		return n.ReadyHintURL()
	}
	good := to(goodClaim)
	if want := ts.URL + "/hints/v1/ready/ci/runner-1/u1"; good != want {
		t.Fatalf("ReadyHintURL = %q, want %q", good, want)
	}
	for _, c := range []struct {
		name, url, auth, body string
		want                  int
	}{
		{"accepted", good, "Bearer good", "", http.StatusAccepted},
		{"forged token", good, "Bearer forged", "", http.StatusUnauthorized},
		{"another claim", to(agentconfig.ClaimRef{Namespace: "ci", Name: "runner-2", UID: "u2"}), "Bearer good", "", http.StatusUnauthorized},
		{"no token", good, "", "", http.StatusUnauthorized},
		{"a body", good, "Bearer good", "{}", http.StatusBadRequest},
		{"too few parts", ts.URL + ReadyPath + "/ci/runner-1", "Bearer good", "", http.StatusBadRequest},
	} {
		resp, msg := notice(t, c.url, c.auth, c.body)
		if resp.StatusCode != c.want {
			t.Errorf("%s: %s (%s), want %d", c.name, resp.Status, strings.TrimSpace(msg), c.want)
		}
		if c.want != http.StatusAccepted && !resp.Close {
			t.Errorf("%s: a refusal keeps the connection open", c.name)
		}
	}
	if resp, _ := get(t, http.MethodGet, good); resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("GET: %s", resp.Status)
	}
	if got := rcv.readyHints(); len(got) != 1 || got[0] != goodClaim {
		t.Errorf("ready hints taken: %+v, want the one good hint", got)
	}
	if len(rcv.notices()) != 0 {
		t.Error("a ready hint was taken as a power-off notice")
	}
	rcv.retry = true
	if resp, _ := notice(t, good, "Bearer good", ""); resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") != "1" {
		t.Errorf("not the leader: %s, Retry-After %q", resp.Status, resp.Header.Get("Retry-After"))
	}

	// Token before body: a bogus token with a body that never arrives is
	// answered at once and the connection closed.
	addr := strings.TrimPrefix(ts.URL, "http://")
	for _, tok := range []string{"bogus", "good"} {
		want := map[string]int{"bogus": http.StatusUnauthorized, "good": http.StatusBadRequest}[tok]
		if status, closed := stalledNotice(t, addr, ReadyPath+"/ci/runner-1/u1", tok); status != want || !closed {
			t.Errorf("stalled ready hint with token %s: %d, closed %v; want %d and closed", tok, status, closed, want)
		}
	}
}

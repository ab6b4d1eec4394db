package buildkite_test

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"testing"
	"time"

	bksim "github.com/hyperfleet/hyperfleet/internal/testworld/simulator/buildkite"
	"github.com/hyperfleet/hyperfleet/pkg/workload"
	"github.com/hyperfleet/hyperfleet/pkg/workload/buildkite"
)

// capture records the simulator's webhook deliveries as they arrive.
type capture struct {
	mu   sync.Mutex
	got  []delivery
	done chan struct{}
	want int
}

type delivery struct {
	header http.Header
	body   []byte
}

func (c *capture) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	c.mu.Lock()
	c.got = append(c.got, delivery{r.Header.Clone(), body})
	if len(c.got) == c.want {
		close(c.done)
	}
	c.mu.Unlock()
}

// deliveries runs a build's job through scheduled, started and finished in
// the simulator with a webhook of token (signed or not) and returns the
// three deliveries, the build and the world.
func deliveries(t *testing.T, token string, signed bool) ([]delivery, bksim.Build, *world) {
	t.Helper()
	w := newWorld(t, bksim.Config{})
	c := &capture{done: make(chan struct{}), want: 3}
	hook := httptest.NewServer(c)
	t.Cleanup(hook.Close)
	w.sim.AddWebhook(bksim.Webhook{URL: hook.URL, Token: token, Signed: signed})
	tok, err := w.sim.CreateToken(w.cluster.ID, "test", time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	access, code := w.register(t, tok.Secret, "agent-1", "queue=linux")
	if code != http.StatusOK {
		t.Fatal(code)
	}
	b, err := w.sim.CreateBuild("app", "go", []bksim.Step{{Key: "test", Label: "unit tests", Command: "true", Agents: []string{"queue=linux"}}})
	if err != nil {
		t.Fatal(err)
	}
	id := b.JobIDs[0]
	if _, out := w.agentCall(t, http.MethodGet, "ping", access, nil); out["job"] == nil {
		t.Fatalf("ping: %v", out)
	}
	for _, step := range []struct{ path, body string }{{"accept", ""}, {"start", "x"}, {"finish", "x"}} {
		var body any
		if step.body != "" {
			body = map[string]any{"started_at": w.clock.Now().Format(time.RFC3339), "exit_status": "0"}
		}
		if code, out := w.agentCall(t, http.MethodPut, "jobs/"+id+"/"+step.path, access, body); code != http.StatusOK {
			t.Fatalf("%s: %d %v", step.path, code, out)
		}
	}
	select {
	case <-c.done:
	case <-time.After(5 * time.Second):
		t.Fatalf("the simulator delivered %d of 3 webhooks", len(c.got))
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]delivery(nil), c.got...), b, w
}

func TestWebhookSignedDeliveries(t *testing.T) {
	got, b, w := deliveries(t, "hook-secret", true)
	p := &buildkite.WebhookParser{WebhookSecrets: workload.WebhookSecrets{OwnerSecrets: map[string][]byte{"ACME": []byte("hook-secret")}}, Clock: passive{w.clock}}
	wantState := []workload.JobState{workload.JobQueued, workload.JobInProgress, workload.JobCompleted}
	for i, d := range got {
		ev, err := p.Parse(d.header, d.body)
		if err != nil {
			t.Fatalf("delivery %d (%s): %v", i, d.header.Get(buildkite.WebhookEventHeader), err)
		}
		j := ev.Job
		if j.ID != b.JobIDs[0] || j.Repository != "acme/app" || j.RunID != int64(b.Number) || j.State != wantState[i] ||
			j.Platform != "buildkite" || !ev.OwnerSigned || ev.DeliveryID != j.ID+"/"+d.header.Get(buildkite.WebhookEventHeader) {
			t.Errorf("delivery %d: %+v", i, ev)
		}
		if i == 2 && (j.Conclusion != "passed" || j.RunnerName != "agent-1") {
			t.Errorf("finished: %+v", j)
		}
	}
	// Another organization's secret cannot stand in, nor the fallback for a
	// listed organization.
	other := &buildkite.WebhookParser{WebhookSecrets: workload.WebhookSecrets{Secret: []byte("hook-secret"), OwnerSecrets: map[string][]byte{"acme": []byte("other")}}, Clock: passive{w.clock}}
	if _, err := other.Parse(got[0].header, got[0].body); !errors.Is(err, workload.ErrBadSignature) {
		t.Fatalf("with the wrong organization secret: %v", err)
	}
	fallback := &buildkite.WebhookParser{WebhookSecrets: workload.WebhookSecrets{Secret: []byte("hook-secret")}, Clock: passive{w.clock}}
	if ev, err := fallback.Parse(got[0].header, got[0].body); err != nil || ev.OwnerSigned {
		t.Fatalf("with the fallback secret: %+v, %v", ev, err)
	}
	// A tampered body, and a genuine delivery replayed later, are refused.
	tampered := append([]byte(nil), got[0].body...)
	tampered[len(tampered)-2] ^= 1
	if _, err := p.Parse(got[0].header, tampered); !errors.Is(err, workload.ErrBadSignature) {
		t.Fatalf("tampered: %v", err)
	}
	w.clock.Advance(buildkite.MaxSignatureAge + time.Minute)
	if _, err := p.Parse(got[0].header, got[0].body); !errors.Is(err, workload.ErrBadSignature) {
		t.Fatalf("replayed: %v", err)
	}
}

// TestWebhookEventHeaderReplay: Buildkite's signature covers the
// timestamp and the body, not the X-Buildkite-Event header. An attacker
// who captured a signed job.scheduled delivery sends it again, within the
// timestamp window, as job.started and as job.finished: the parser takes
// the event from the signed body and refuses the header that disagrees,
// so the replay cannot mark a queued job running or finished. Without a
// header the body's event is used.
func TestWebhookEventHeaderReplay(t *testing.T) {
	got, b, w := deliveries(t, "hook-secret", true)
	p := &buildkite.WebhookParser{WebhookSecrets: workload.WebhookSecrets{OwnerSecrets: map[string][]byte{"acme": []byte("hook-secret")}}, Clock: passive{w.clock}}
	scheduled := got[0]
	if e := scheduled.header.Get(buildkite.WebhookEventHeader); e != buildkite.EventJobScheduled {
		t.Fatalf("first delivery is %q", e)
	}
	for _, forged := range []string{buildkite.EventJobStarted, buildkite.EventJobFinished, "ping"} {
		h := scheduled.header.Clone()
		h.Set(buildkite.WebhookEventHeader, forged)
		ev, err := p.Parse(h, scheduled.body)
		if !errors.Is(err, workload.ErrBadSignature) {
			t.Errorf("the signed job.scheduled replayed as %s = %+v, %v; want ErrBadSignature", forged, ev, err)
		}
	}
	// Both ways round: the job.finished delivery under a job.scheduled
	// header cannot put a finished job back in the queue.
	h := got[2].header.Clone()
	h.Set(buildkite.WebhookEventHeader, buildkite.EventJobScheduled)
	if ev, err := p.Parse(h, got[2].body); !errors.Is(err, workload.ErrBadSignature) {
		t.Errorf("the signed job.finished replayed as job.scheduled = %+v, %v; want ErrBadSignature", ev, err)
	}
	h = scheduled.header.Clone()
	h.Del(buildkite.WebhookEventHeader)
	ev, err := p.Parse(h, scheduled.body)
	if err != nil || ev.Job.State != workload.JobQueued || ev.Job.ID != b.JobIDs[0] || ev.DeliveryID != b.JobIDs[0]+"/"+buildkite.EventJobScheduled {
		t.Errorf("without the header: %+v, %v; want the body's job.scheduled", ev, err)
	}
}

func TestWebhookTokenDeliveries(t *testing.T) {
	got, _, w := deliveries(t, "plain-token", false)
	p := &buildkite.WebhookParser{WebhookSecrets: workload.WebhookSecrets{Secret: []byte("plain-token")}, Clock: passive{w.clock}}
	if ev, err := p.Parse(got[0].header, got[0].body); err != nil || ev.Job.State != workload.JobQueued || ev.OwnerSigned {
		t.Fatalf("token delivery: %+v, %v", ev, err)
	}
	wrong := &buildkite.WebhookParser{WebhookSecrets: workload.WebhookSecrets{Secret: []byte("plain-tokem")}, Clock: passive{w.clock}}
	if _, err := wrong.Parse(got[0].header, got[0].body); !errors.Is(err, workload.ErrBadSignature) {
		t.Fatalf("wrong token: %v", err)
	}
	h := got[0].header.Clone()
	h.Del(buildkite.WebhookTokenHeader)
	if _, err := p.Parse(h, got[0].body); !errors.Is(err, workload.ErrBadSignature) {
		t.Fatalf("no token: %v", err)
	}
}

// TestWebhookSignatureAlgorithm checks SignWebhook and the parser against
// an HMAC computed here from Buildkite's documented recipe: hex
// HMAC-SHA256 of "<timestamp>.<body>" keyed by the token.
func TestWebhookSignatureAlgorithm(t *testing.T) {
	body := []byte(`{"event":"ping","service":{"id":"x"}}`)
	at := time.Unix(1767225600, 0)
	m := hmac.New(sha256.New, []byte("k"))
	m.Write([]byte(strconv.FormatInt(at.Unix(), 10) + "." + string(body)))
	want := "timestamp=1767225600,signature=" + hex.EncodeToString(m.Sum(nil))
	if got := buildkite.SignWebhook([]byte("k"), body, at); got != want {
		t.Fatalf("SignWebhook = %s; want %s", got, want)
	}
	if got := bksim.Sign("k", at, body); got != want {
		t.Fatalf("the simulator signs %s; want %s", got, want)
	}
	p := &buildkite.WebhookParser{WebhookSecrets: workload.WebhookSecrets{Secret: []byte("k")}, Clock: fixed(at.Add(time.Minute))}
	h := http.Header{}
	h.Set(buildkite.WebhookEventHeader, "ping")
	h.Set(buildkite.WebhookSignatureHeader, want)
	if _, err := p.Parse(h, body); !errors.Is(err, workload.ErrIgnoredEvent) {
		t.Fatalf("a signed ping = %v; want ErrIgnoredEvent", err)
	}
	// The event is the signed body's: a header that disagrees is a
	// forgery, and a job event whose body has no job is malformed.
	h.Set(buildkite.WebhookEventHeader, "job.scheduled")
	if _, err := p.Parse(h, body); !errors.Is(err, workload.ErrBadSignature) {
		t.Fatalf("a signed ping under a job.scheduled header = %v; want ErrBadSignature", err)
	}
	noJob := []byte(`{"event":"job.scheduled"}`)
	h.Set(buildkite.WebhookSignatureHeader, buildkite.SignWebhook([]byte("k"), noJob, at))
	if _, err := p.Parse(h, noJob); !errors.Is(err, workload.ErrMalformed) {
		t.Fatalf("a job event without a job = %v; want ErrMalformed", err)
	}
	h.Set(buildkite.WebhookSignatureHeader, want)
	for _, bad := range []string{"", "timestamp=1767225600", "signature=00", "timestamp=x,signature=" + want[len(want)-64:], "timestamp=1767225600,signature=zz"} {
		h.Set(buildkite.WebhookSignatureHeader, bad)
		if bad == "" {
			h.Del(buildkite.WebhookSignatureHeader)
		}
		if _, err := p.Parse(h, body); !errors.Is(err, workload.ErrBadSignature) {
			t.Errorf("signature %q = %v; want ErrBadSignature", bad, err)
		}
	}
}

type fixed time.Time

func (f fixed) Now() time.Time                  { return time.Time(f) }
func (f fixed) Since(t time.Time) time.Duration { return time.Time(f).Sub(t) }

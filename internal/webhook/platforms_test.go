package webhook

import (
	"bytes"
	"context"
	"crypto/subtle"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/hyperfleet/hyperfleet/pkg/workload"
	"github.com/hyperfleet/hyperfleet/pkg/workload/github"
)

// tokenFormat is a platform like GitLab's or Buildkite's: a secret token
// in a header instead of a signature, and no delivery id header, so the
// parser takes the id from the verified body.
var tokenFormat = workload.WebhookFormat{
	Platform: "Token CI", Label: "token-ci", Path: "/webhooks/token",
	EventHeader: "X-Token-Event", Events: []string{"job"},
	SignatureHeader: "X-Token", Used: "job events",
}

type tokenParser struct{ token string }

func (p tokenParser) Parse(h http.Header, body []byte) (workload.JobEvent, error) {
	if got := h.Get("X-Token"); got == "" || subtle.ConstantTimeCompare([]byte(got), []byte(p.token)) != 1 {
		return workload.JobEvent{}, workload.ErrBadSignature
	}
	if h.Get("X-Token-Event") != "job" {
		return workload.JobEvent{}, workload.ErrIgnoredEvent
	}
	var b struct {
		UUID string `json:"uuid"`
		Job  string `json:"job"`
	}
	if err := json.Unmarshal(body, &b); err != nil {
		return workload.JobEvent{}, fmt.Errorf("%w: %w", workload.ErrMalformed, err)
	}
	return workload.JobEvent{DeliveryID: b.UUID, Action: "queued", OwnerSigned: true,
		Job: workload.Job{ID: b.Job, Platform: "token-ci", State: workload.JobQueued, Repository: "group/sub/project"}}, nil
}

// TestServerServesEachPlatformAtItsPath: one listener serves every
// platform's receiver at its own path; each verifies with its own parser
// and names its own headers, and a platform that sends no delivery id
// header is de-duplicated by the id its parser reads from the body.
func TestServerServesEachPlatformAtItsPath(t *testing.T) {
	certFile, keyFile, pool := writeCert(t, t.TempDir())
	ghRec, tokRec := newFakeRecorder(), newFakeRecorder()
	gh, err := NewReceiver(Options{Format: github.WebhookFormat, Parser: github.WebhookParser{WebhookSecrets: workload.WebhookSecrets{Secret: testSecret}}, Router: routeTo("team", "gpu"), Recorder: ghRec})
	if err != nil {
		t.Fatal(err)
	}
	tok, err := NewReceiver(Options{Format: tokenFormat, Parser: tokenParser{token: "t0ken"}, Router: routeTo("team", "token"), Recorder: tokRec})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := NewServer(ServerOptions{Addr: "127.0.0.1:0", CertFile: certFile, KeyFile: keyFile, Receivers: []*Receiver{gh, gh}}); err == nil {
		t.Fatal("two receivers at one path were accepted")
	}
	if _, err := NewReceiver(Options{Format: workload.WebhookFormat{Platform: "x"}, Parser: tokenParser{}, Router: routeTo("a", "b"), Recorder: tokRec}); err == nil {
		t.Fatal("a receiver without a path and headers was accepted")
	}
	srv, err := NewServer(ServerOptions{Addr: "127.0.0.1:0", CertFile: certFile, KeyFile: keyFile, Receivers: []*Receiver{gh, tok}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Start(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Start: %v", err)
		}
	}()
	<-srv.Ready()
	c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	base := "https://" + srv.Addr().String()
	post := func(path string, header http.Header, body []byte) (int, string) {
		t.Helper()
		req, _ := http.NewRequest(http.MethodPost, base+path, bytes.NewReader(body))
		req.Header = header.Clone()
		req.Header.Set("Content-Type", "application/json")
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		msg, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(msg)
	}

	body := jobBody(77, "queued")
	if code, msg := post(github.WebhookFormat.Path, delivery("p-1", "workflow_job", body).Header, body); code != http.StatusAccepted {
		t.Fatalf("GitHub delivery: %d %s", code, msg)
	}
	if got := ghRec.wait(t); got.ev.Job.ID != "77" || got.pool.Name != "gpu" {
		t.Fatalf("GitHub receiver recorded %+v", got)
	}

	tokenBody := []byte(`{"uuid":"0b9d6a9e-5d3c-4a52-9a53-3d1f0c1e2f00","job":"0190f5a2-7a1d-4f0e-9c3b-2b6f4f1d8e11"}`)
	h := http.Header{"X-Token": {"t0ken"}, "X-Token-Event": {"job"}}
	if code, msg := post(tokenFormat.Path, h, tokenBody); code != http.StatusAccepted {
		t.Fatalf("token delivery: %d %s", code, msg)
	}
	if got := tokRec.wait(t); got.ev.Job.ID != "0190f5a2-7a1d-4f0e-9c3b-2b6f4f1d8e11" || got.pool.Name != "token" || got.ev.DeliveryID != "0b9d6a9e-5d3c-4a52-9a53-3d1f0c1e2f00" {
		t.Fatalf("token receiver recorded %+v", got)
	}
	if code, msg := post(tokenFormat.Path, h, tokenBody); code != http.StatusOK || !strings.Contains(msg, "duplicate") {
		t.Fatalf("the same delivery again: %d %s; want 200 duplicate", code, msg)
	}
	h.Set("X-Token", "wrong")
	if code, msg := post(tokenFormat.Path, h, tokenBody); code != http.StatusUnauthorized || !strings.Contains(msg, "X-Token header") {
		t.Fatalf("a wrong token: %d %s; want 401 naming X-Token", code, msg)
	}
	// A GitHub delivery sent to another platform's path is not verified
	// by GitHub's secret there.
	if code, msg := post(tokenFormat.Path, delivery("p-2", "workflow_job", body).Header, body); code != http.StatusUnauthorized {
		t.Fatalf("a GitHub delivery at the token path: %d %s; want 401", code, msg)
	}
	h.Set("X-Token", "t0ken")
	h.Set("X-Token-Event", "build")
	if code, msg := post(tokenFormat.Path, h, tokenBody); code != http.StatusOK || !strings.Contains(msg, "only job events are used") {
		t.Fatalf("another event: %d %s; want 200 ignored naming the events used", code, msg)
	}
	if ghRec.count() != 1 || tokRec.count() != 1 {
		t.Fatalf("recorded %d GitHub and %d token events; want 1 and 1", ghRec.count(), tokRec.count())
	}
}

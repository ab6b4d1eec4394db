package agent

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"net/http"
	"time"

	"github.com/hyperfleet/hyperfleet/internal/agentconfig"
)

// Power-off notice bounds: the notice is a hint that only speeds up the
// operator's detection (docs/architecture.md, "Power-off hints"), so it
// must never hold the VM up for long.
const (
	// notifyBudget bounds all attempts together.
	notifyBudget = 5 * time.Second
	// notifyRetry is the pause after an answer that asks to retry (503:
	// the replica reached is not the leader) or a failed connection.
	notifyRetry = 500 * time.Millisecond
)

// notifyPowerOff tells the operator the VM is about to power off, so that
// it reads this VM's state at once instead of waiting for the hypervisor's
// batch listing. Failures are logged and otherwise ignored: the listing
// still catches the power-off.
func (a *agent) notifyPowerOff() {
	n := a.notify
	if n == nil {
		return
	}
	hc, err := notifyClient(n.CA, a.proxy)
	if err != nil {
		a.log.Warn("power-off notice not sent", "error", err)
		return
	}
	body, err := json.Marshal(agentconfig.PowerOffNoticeBody{RunnerOnline: a.runnerOnline.Load(), JobStarted: a.jobStarted.Load(),
		ScriptExitStatus: a.scriptExit, AttestationError: a.attestationError, GuestRefusal: a.guestRefusal})
	if err != nil {
		a.log.Warn("power-off notice not sent", "error", err)
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), notifyBudget)
	defer cancel()
	a.sendHint(ctx, "power-off notice", n.URL, "powering off anyway", func(ctx context.Context) (int, error) {
		return PostNotice(ctx, hc, n, body)
	})
}

// sendHint sends one hint (what, to url) with post until the operator
// accepts it (202) or refuses it, retrying while it asks to (503: the
// replica reached does not lead; 429) or cannot be reached, until ctx
// ends; then meanwhile says what happens all the same. Failures are
// logged and otherwise ignored: hints only speed the operator up.
func (a *agent) sendHint(ctx context.Context, what, url, meanwhile string, post func(context.Context) (int, error)) {
	for attempt := 1; ; attempt++ {
		code, err := post(ctx)
		switch {
		case err == nil && code == http.StatusAccepted:
			a.log.Info("the operator took the "+what, "url", safeURL(url), "attempts", attempt)
			return
		case err == nil && code != http.StatusServiceUnavailable && code != http.StatusTooManyRequests:
			a.log.Warn("the operator refused the "+what, "url", safeURL(url), "status", code)
			return
		}
		select {
		case <-ctx.Done():
			a.log.Warn("the "+what+" was not delivered in time; "+meanwhile, "url", safeURL(url), "attempts", attempt, "lastError", errString(err), "lastStatus", code)
			return
		case <-time.After(notifyRetry):
		}
	}
}

// readyHintBudget bounds the ready hint's attempts: a hint only saves the
// operator's next look at the booting VM, and the secrets' wait goes on
// while it is sent.
const readyHintBudget = 10 * time.Second

// announceReady tells the operator that the agent runs and waits for the
// secrets it places in the VM (a ready hint, POSTed to the claim's URL
// under powerOffNotify.readyURL with the notice token), so that the
// operator looks at the VM now instead of at its next boot poll. It
// retries while the operator asks to (503, 429) or cannot be reached,
// within ctx; failures are logged and otherwise ignored: the operator
// still finds the VM running at its own pace.
func (a *agent) announceReady(ctx context.Context) {
	n := a.notify
	if n == nil || n.ReadyURL == "" {
		return
	}
	hc, err := notifyClient(n.CA, a.proxy)
	if err != nil {
		a.log.Warn("ready hint not sent", "error", err)
		return
	}
	a.sendHint(ctx, "ready hint", n.ReadyURL, "the operator finds the VM at its own pace", func(ctx context.Context) (int, error) {
		return PostReadyHint(ctx, hc, n)
	})
}

// PostReadyHint sends one ready hint to n's claim's URL
// (ReadyHintURL: the claim is in the path, so that the operator checks
// the token first; the body is empty) and returns the HTTP status; the
// operator accepts it with 202.
func PostReadyHint(ctx context.Context, hc *http.Client, n *agentconfig.PowerOffNotify) (int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, n.ReadyHintURL(), http.NoBody)
	if err != nil {
		return 0, err
	}
	req.Header.Set("Authorization", "Bearer "+n.Token)
	resp, err := hc.Do(req)
	if err != nil {
		return 0, err
	}
	_ = resp.Body.Close()
	return resp.StatusCode, nil
}

// PostNotice sends one power-off notice (body, an
// agentconfig.PowerOffNoticeBody as JSON) to n's claim's URL (NoticeURL:
// the claim is in the path, so that the operator checks the token before
// it reads the body) and returns the HTTP status; the operator accepts it
// with 202.
func PostNotice(ctx context.Context, hc *http.Client, n *agentconfig.PowerOffNotify, body []byte) (int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, n.NoticeURL(), bytes.NewReader(body))
	if err != nil {
		return 0, err
	}
	req.Header.Set("Authorization", "Bearer "+n.Token)
	req.Header.Set("Content-Type", "application/json")
	resp, err := hc.Do(req)
	if err != nil {
		return 0, err
	}
	_ = resp.Body.Close()
	return resp.StatusCode, nil
}

// notifyClient trusts ca when given, else what downloads trust.
func notifyClient(ca string, proxy *agentconfig.Proxy) (*http.Client, error) {
	if ca == "" {
		return defaultHTTPClient(proxy)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM([]byte(ca)) {
		return nil, fmt.Errorf("powerOffNotify.ca holds no PEM certificate")
	}
	// The proxy's settings as for every other request: a transport of its
	// own would otherwise go direct whatever the VM's proxy says.
	tr := &http.Transport{Proxy: proxy.Func(), TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}}
	return &http.Client{Transport: tr, Timeout: notifyBudget}, nil
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

package proxmox

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/hyperfleet/hyperfleet/pkg/provider"
)

// credentialHeaders are the headers that carry Proxmox credentials.
var credentialHeaders = []string{"Authorization", "Cookie", "CSRFPreventionToken"}

// witness is a TLS server that records every request it receives; with
// the httptest certificate shared by every httptest server, a client that
// pins the endpoint's certificate would also trust it.
type witness struct {
	srv *httptest.Server
	mu  sync.Mutex
	got []http.Header
}

func newWitness(t *testing.T) *witness {
	w := &witness{}
	w.srv = httptest.NewTLSServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		w.mu.Lock()
		w.got = append(w.got, r.Header.Clone())
		w.mu.Unlock()
		rw.Header().Set("Content-Type", "application/json")
		_, _ = rw.Write([]byte(`{"data":{"version":"8.2.4","release":"8.2","repoid":"x"}}`))
	}))
	t.Cleanup(w.srv.Close)
	return w
}

// expectNoCredentials fails if the witness ever saw a credential header.
func (w *witness) expectNoCredentials(t *testing.T) {
	t.Helper()
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, h := range w.got {
		for _, name := range credentialHeaders {
			if h.Get(name) != "" {
				t.Errorf("the other host received the %s header", name)
			}
		}
	}
}

// redirectingEndpoint is a Proxmox endpoint that hands out tickets but
// redirects every other API call to target.
func redirectingEndpoint(t *testing.T, target string, code int) *httptest.Server {
	srv := httptest.NewTLSServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/api2/json/access/ticket" {
			rw.Header().Set("Content-Type", "application/json")
			_ = json.NewEncoder(rw).Encode(map[string]any{"data": map[string]any{
				"ticket": "PVE:hyperfleet@pve:TICKET", "CSRFPreventionToken": "CSRF-TOKEN", "username": opUser,
			}})
			return
		}
		http.Redirect(rw, r, target+r.URL.Path, code)
	}))
	t.Cleanup(srv.Close)
	return srv
}

// TestRedirectsAreRefused: an endpoint that redirects API calls to another
// host never gets the credentials sent there (token, ticket cookie or CSRF
// token), whatever the redirect's code; the error names the field to fix.
func TestRedirectsAreRefused(t *testing.T) {
	for _, code := range []int{http.StatusFound, http.StatusTemporaryRedirect, http.StatusPermanentRedirect} {
		for _, auth := range []string{"token", "ticket"} {
			t.Run(http.StatusText(code)+"/"+auth, func(t *testing.T) {
				other := newWitness(t)
				srv := redirectingEndpoint(t, other.srv.URL, code)
				cfg := provider.ClusterConfig{Name: "redirect", Endpoint: srv.URL + "/api2/json", FingerprintSHA256: fingerprint(srv)}
				if auth == "token" {
					cfg.TokenID, cfg.TokenSecret = opUser+"!"+opTokenName, opTokenSecret
				} else {
					cfg.Username, cfg.Password = opUser, opPassword
				}
				p, err := New(cfg, provider.Deps{Signer: testSigner(t, operatorID)})
				if err != nil {
					t.Fatal(err)
				}
				_, err = p.Probe(context.Background())
				if err == nil || !errors.Is(err, errRedirect) || provider.Classify(err) != provider.ClassConfiguration || provider.ReasonOf(err) != "Redirected" || !strings.Contains(err.Error(), "spec.endpoint") {
					t.Fatalf("Probe through a redirect: %s %v, want a Configuration error naming spec.endpoint", provider.Classify(err), err)
				}
				// A write carries the CSRF token with a ticket.
				err = p.api.call(context.Background(), http.MethodPost, "/nodes/pve1/qemu/100/status/stop", nil, nil, nil)
				if !errors.Is(err, errRedirect) {
					t.Fatalf("POST through a redirect: %v", err)
				}
				other.expectNoCredentials(t)
				other.mu.Lock()
				n := len(other.got)
				other.mu.Unlock()
				if n != 0 {
					t.Errorf("the redirect target received %d requests, want none", n)
				}
			})
		}
	}
}

// TestCredentialsOnlyToEndpointHost: a request the provider's client is
// asked to send to another host fails before anything is sent.
func TestCredentialsOnlyToEndpointHost(t *testing.T) {
	e := newEnv(t)
	other := newWitness(t)
	req, err := http.NewRequestWithContext(context.Background(), http.MethodGet, other.srv.URL+"/api2/json/version", nil)
	if err != nil {
		t.Fatal(err)
	}
	res, err := e.p.api.http.Do(req)
	if err == nil {
		_ = res.Body.Close()
	}
	if !errors.Is(err, errForeignHost) {
		t.Fatalf("request to another host: %v, want %v", err, errForeignHost)
	}
	other.expectNoCredentials(t)
	if len(other.got) != 0 {
		t.Fatalf("the other host received %d requests, want none", len(other.got))
	}
}

// TestPlainHTTPRefused: an http:// endpoint is refused before any request,
// so no credential ever crosses the network in clear.
func TestPlainHTTPRefused(t *testing.T) {
	plain := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {
		t.Error("the plain-http endpoint received a request")
	}))
	t.Cleanup(plain.Close)
	cfg := provider.ClusterConfig{Name: "plain", Endpoint: plain.URL + "/api2/json", TokenID: opUser + "!" + opTokenName, TokenSecret: opTokenSecret}
	_, err := New(cfg, provider.Deps{Signer: testSigner(t, operatorID)})
	if err == nil || provider.Classify(err) != provider.ClassConfiguration || !strings.Contains(err.Error(), "https://") {
		t.Fatalf("New with an http:// endpoint: %v, want a Configuration error asking for https://", err)
	}
}

// TestSameHostRedirectNotFollowed: even a redirect within the endpoint's
// host is not followed (it would resend the request and its body to a path
// the endpoint did not name).
func TestSameHostRedirectNotFollowed(t *testing.T) {
	var mu sync.Mutex
	moved := 0
	srv := httptest.NewTLSServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		if strings.HasPrefix(r.URL.Path, "/moved/") {
			mu.Lock()
			moved++
			mu.Unlock()
			rw.Header().Set("Content-Type", "application/json")
			_, _ = rw.Write([]byte(`{"data":{"version":"8.2.4"}}`))
			return
		}
		http.Redirect(rw, r, "/moved"+r.URL.Path, http.StatusTemporaryRedirect)
	}))
	t.Cleanup(srv.Close)
	cfg := provider.ClusterConfig{Name: "moved", Endpoint: srv.URL + "/api2/json", FingerprintSHA256: fingerprint(srv),
		TokenID: opUser + "!" + opTokenName, TokenSecret: opTokenSecret}
	p, err := New(cfg, provider.Deps{Signer: testSigner(t, operatorID)})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.Probe(context.Background()); !errors.Is(err, errRedirect) {
		t.Fatalf("Probe through a redirect: %v, want %v", err, errRedirect)
	}
	mu.Lock()
	defer mu.Unlock()
	if moved != 0 {
		t.Fatalf("the redirect was followed %d times", moved)
	}
}

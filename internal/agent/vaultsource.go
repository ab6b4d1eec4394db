package agent

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/hyperfleet/hyperfleet/internal/agentconfig"
)

// Errors of VaultSource, for errors.Is; each wraps the server's own
// message.
var (
	// ErrStoreLoginRefused: the JWT auth method refused the JWT-SVID (wrong
	// sub or aud, expired, unknown signing key, no such role).
	ErrStoreLoginRefused = errors.New("the secret store refused the login with this VM's JWT-SVID")
	// ErrCredentialGone: no credential at the path: it was read already (it
	// is deleted on read) or never written.
	ErrCredentialGone = errors.New("no credential in the secret store: it was read already or never written")
	// ErrStoreDenied: the login token may not read or delete the path.
	ErrStoreDenied = errors.New("the secret store denied access to the credential's path")
	// ErrStoreUnavailable: the store could not be reached, or answered with
	// a server error (5xx, 429).
	ErrStoreUnavailable = errors.New("the secret store is unavailable")
)

// roleNotFound is how Vault's JWT auth method refuses a login with a role
// that does not exist: for a VM, a role the operator has not written yet.
const roleNotFound = "could not be found"

// JWTSVIDFetcher returns a JWT-SVID for audience from the Workload API,
// such as go-spiffe's workloadapi.FetchJWTSVID(...).Marshal().
type JWTSVIDFetcher func(ctx context.Context, audience string) (string, error)

// VaultSource reads the runner credential from Vault or OpenBao: it logs in
// at auth/<authMount>/login with a JWT-SVID for the configured audience,
// reads <kvMount>/data/<path> and deletes the secret's metadata (every
// version) so that nothing can read it again.
//
// It speaks the three HTTP calls itself rather than through Vault's client,
// so the agent stays a small binary on the standard library; the tests check
// its requests against the official client's.
//
// With SPIRE set (spiffe.secretStore in the agent's configuration), it
// first attests exactly as BrokerSource does, with the same deadline, and
// fetches the JWT-SVID from that spire-agent (`spire-agent api fetch jwt`).
// The operator writes the credential only once it has seen the VM attest,
// so the source then asks until it is there: a login refused because the
// VM's role does not exist yet, a credential not (or no longer, while the
// operator writes it anew) at the path, and an unreachable or failing
// store are retried with a backoff up to 5 seconds until the deadline.
// Exit codes as for the broker: ExitAttestation when no SVID came,
// ExitBrokerRefused when the store refused the login or the read or held
// no valid credential, ExitBrokerUnavailable when no credential came
// before the deadline or the store's certificate is not trusted.
type VaultSource struct {
	// Store is the store's address, mounts, role, audience and path.
	Store agentconfig.SecretStore
	// FetchJWTSVID gets the VM's JWT-SVID.
	FetchJWTSVID JWTSVIDFetcher
	// HTTPClient replaces the client built from Store.CABundle (tests).
	HTTPClient *http.Client
	// Logger receives a warning when the delete after the read fails, and
	// the retries; nil discards them.
	Logger *slog.Logger
	// SPIRE, when set, attests first and supplies FetchJWTSVID when that is
	// nil (see above).
	SPIRE *BrokerSource
	// Proxy is the config's HTTP proxy; nil: the environment's.
	Proxy *agentconfig.Proxy
}

// useOptions fills in the agent's settings.
func (v *VaultSource) useOptions(o *Options) {
	if v.SPIRE != nil {
		v.SPIRE.useOptions(o)
	}
	v.Logger = o.Logger
}

// Backoff between attempts to read the credential (with SPIRE).
const (
	storeFirstBackoff = time.Second
	storeMaxBackoff   = 5 * time.Second
)

// Credential logs in, reads the credential and deletes it; with SPIRE it
// attests first and waits for the credential. A credential that was read
// but could not be deleted is still returned (the operator deletes it when
// the claim ends); the failure is logged.
func (v *VaultSource) Credential(ctx context.Context) (Credential, error) {
	if v.SPIRE == nil {
		return v.readOnce(ctx, v.FetchJWTSVID)
	}
	return v.SPIRE.withSVID(ctx, func(fetchCtx context.Context, run *spireRun, _ tls.Certificate) (Credential, error) {
		fetch := v.FetchJWTSVID
		if fetch == nil {
			fetch = func(ctx context.Context, audience string) (string, error) {
				return run.fetchJWT(ctx, audience, v.SPIRE.SPIFFE.SPIFFEID)
			}
		}
		return v.await(fetchCtx, fetch)
	})
}

// await reads the credential until it is there, a refusal, or ctx's end.
func (v *VaultSource) await(ctx context.Context, fetch JWTSVIDFetcher) (Credential, error) {
	backoff := storeFirstBackoff
	for attempt := 1; ; attempt++ {
		cred, err := v.readOnce(ctx, fetch)
		if err == nil {
			v.logger().InfoContext(ctx, "runner credential read from the secret store", "address", safeURL(v.Store.Address), "path", v.Store.Path, "attempts", attempt, "credential", cred)
			if cred.Method != v.SPIRE.Method {
				return Credential{}, fail(ExitBrokerRefused, "the secret store held a %s credential, but the config's bootstrapMethod is %s", cred.Method, v.SPIRE.Method)
			}
			return cred, nil
		}
		if ferr := v.final(ctx, err); ferr != nil {
			return Credential{}, ferr
		}
		if dl, ok := ctx.Deadline(); ok && time.Now().Add(backoff).After(dl) {
			return Credential{}, fail(ExitBrokerUnavailable, "no credential from the secret store %s before the deadline (--attest-timeout) after %d attempts; last: %v",
				safeURL(v.Store.Address), attempt, err)
		}
		v.logger().WarnContext(ctx, "runner credential not in the secret store yet; trying again", "attempt", attempt, "retryIn", backoff, "reason", err.Error())
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			return Credential{}, fail(ExitBrokerUnavailable, "no credential from the secret store %s: %v after %d attempts; last: %v", safeURL(v.Store.Address), ctx.Err(), attempt, err)
		case <-t.C:
		}
		backoff = min(2*backoff, storeMaxBackoff)
	}
}

// final is the exit for an attempt's error that no retry mends, nil for
// one worth retrying.
func (v *VaultSource) final(ctx context.Context, err error) error {
	var verr *tls.CertificateVerificationError
	switch {
	case ctx.Err() != nil:
		return fail(ExitBrokerUnavailable, "no credential from the secret store %s: %v; last: %v", safeURL(v.Store.Address), ctx.Err(), err)
	case errors.As(err, &verr):
		return fail(ExitBrokerUnavailable, "the secret store %s's certificate is not trusted (spiffe.secretStore.caBundle, or the system roots when empty): %w", safeURL(v.Store.Address), err)
	case errors.Is(err, errJWTSVID):
		return fail(ExitAttestation, "%w", err)
	case errors.Is(err, ErrStoreLoginRefused) && strings.Contains(err.Error(), roleNotFound),
		errors.Is(err, ErrCredentialGone), errors.Is(err, ErrStoreUnavailable):
		return nil
	}
	return fail(ExitBrokerRefused, "%w", err)
}

func (v *VaultSource) logger() *slog.Logger {
	if v.Logger == nil {
		return slog.New(slog.DiscardHandler)
	}
	return v.Logger
}

// errJWTSVID marks a failure to get the JWT-SVID from the Workload API.
var errJWTSVID = errors.New("no JWT-SVID")

// readOnce logs in with a fresh JWT-SVID, reads the credential and deletes
// it.
func (v *VaultSource) readOnce(ctx context.Context, fetch JWTSVIDFetcher) (Credential, error) {
	client, err := v.client()
	if err != nil {
		return Credential{}, err
	}
	if fetch == nil {
		return Credential{}, fail(ExitBadConfig, "the secret store source has no way to fetch a JWT-SVID")
	}
	jwt, err := fetch(ctx, v.Store.Audience)
	if err != nil {
		return Credential{}, fmt.Errorf("%w: fetching a JWT-SVID for audience %q: %w", errJWTSVID, v.Store.Audience, err)
	}
	token, err := v.login(ctx, client, jwt)
	if err != nil {
		return Credential{}, err
	}
	cred, err := v.read(ctx, client, token)
	if err != nil {
		return Credential{}, err
	}
	if err := v.delete(ctx, client, token); err != nil {
		v.logger().WarnContext(ctx, "Could not delete the credential after reading it; the operator deletes it when the claim ends",
			"path", v.Store.KVMount+"/metadata/"+v.Store.Path, "error", err)
	}
	return cred, nil
}

func (v *VaultSource) client() (*http.Client, error) {
	if v.HTTPClient != nil {
		return v.HTTPClient, nil
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.Proxy = v.Proxy.Func()
	if v.Store.CABundle != "" {
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM([]byte(v.Store.CABundle)) {
			return nil, errors.New("spiffe.secretStore.caBundle holds no PEM certificate")
		}
		tr.TLSClientConfig = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	}
	return &http.Client{Transport: tr, Timeout: 30 * time.Second}, nil
}

func (v *VaultSource) login(ctx context.Context, client *http.Client, jwt string) (string, error) {
	path := "auth/" + v.Store.AuthMount + "/login"
	body, err := json.Marshal(map[string]string{"role": v.Store.Role, "jwt": jwt})
	if err != nil {
		return "", err
	}
	var out struct {
		Auth *struct {
			ClientToken string `json:"client_token"`
		} `json:"auth"`
	}
	status, msgs, err := v.call(ctx, client, http.MethodPut, path, "", body, &out)
	switch {
	case err != nil:
		return "", err
	case status == http.StatusBadRequest || status == http.StatusForbidden:
		return "", fmt.Errorf("logging in at %s with role %q: %w: %s", path, v.Store.Role, ErrStoreLoginRefused, msgs)
	case unavailable(status):
		return "", fmt.Errorf("logging in at %s: %w: HTTP %d: %s", path, ErrStoreUnavailable, status, msgs)
	case status != http.StatusOK:
		return "", fmt.Errorf("logging in at %s: HTTP %d: %s", path, status, msgs)
	case out.Auth == nil || out.Auth.ClientToken == "":
		return "", fmt.Errorf("logging in at %s: the answer holds no client token", path)
	}
	return out.Auth.ClientToken, nil
}

func (v *VaultSource) read(ctx context.Context, client *http.Client, token string) (Credential, error) {
	path := v.Store.KVMount + "/data/" + v.Store.Path
	var out struct {
		Data *struct {
			Data *agentconfig.StoredCredential `json:"data"`
		} `json:"data"`
	}
	status, msgs, err := v.call(ctx, client, http.MethodGet, path, token, nil, &out)
	switch {
	case err != nil:
		return Credential{}, err
	case status == http.StatusNotFound:
		return Credential{}, fmt.Errorf("reading %s: %w", path, ErrCredentialGone)
	case status == http.StatusForbidden:
		return Credential{}, fmt.Errorf("reading %s: %w: %s", path, ErrStoreDenied, msgs)
	case unavailable(status):
		return Credential{}, fmt.Errorf("reading %s: %w: HTTP %d: %s", path, ErrStoreUnavailable, status, msgs)
	case status != http.StatusOK:
		return Credential{}, fmt.Errorf("reading %s: HTTP %d: %s", path, status, msgs)
	case out.Data == nil || out.Data.Data == nil:
		return Credential{}, fmt.Errorf("reading %s: %w (the secret's current version is deleted)", path, ErrCredentialGone)
	}
	sc := *out.Data.Data
	if err := sc.Validate(); err != nil {
		return Credential{}, fmt.Errorf("the credential at %s is not usable: %w", path, err)
	}
	return Credential{Method: sc.Method, JITConfig: sc.JITConfig, RegistrationToken: sc.RegistrationToken, RegistrationURL: sc.RegistrationURL, Job: sc.Job}, nil
}

func (v *VaultSource) delete(ctx context.Context, client *http.Client, token string) error {
	path := v.Store.KVMount + "/metadata/" + v.Store.Path
	status, msgs, err := v.call(ctx, client, http.MethodDelete, path, token, nil, nil)
	switch {
	case err != nil:
		return err
	case status == http.StatusForbidden:
		return fmt.Errorf("deleting %s: %w: %s", path, ErrStoreDenied, msgs)
	case status != http.StatusNoContent && status != http.StatusOK && status != http.StatusNotFound:
		return fmt.Errorf("deleting %s: HTTP %d: %s", path, status, msgs)
	}
	return nil
}

// call sends one request to /v1/<path> and decodes a 200 answer into out;
// for other statuses it returns Vault's error messages.
func (v *VaultSource) call(ctx context.Context, client *http.Client, method, path, token string, body []byte, out any) (int, string, error) {
	u, err := url.JoinPath(strings.TrimSuffix(v.Store.Address, "/"), "v1", path)
	if err != nil {
		return 0, "", fmt.Errorf("secret store URL: %w", err)
	}
	req, err := http.NewRequestWithContext(ctx, method, u, bytes.NewReader(body))
	if err != nil {
		return 0, "", err
	}
	if token != "" {
		req.Header.Set("X-Vault-Token", token)
	}
	// Vault's clients send it so that a server behind a proxy can tell
	// API calls from browsers.
	req.Header.Set("X-Vault-Request", "true")
	resp, err := client.Do(req)
	if err != nil {
		var verr *tls.CertificateVerificationError
		if errors.As(err, &verr) {
			return 0, "", fmt.Errorf("%s %s: %w", method, path, err)
		}
		return 0, "", fmt.Errorf("%s %s: %w: %w", method, path, ErrStoreUnavailable, err)
	}
	defer func() { _ = resp.Body.Close() }()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return 0, "", fmt.Errorf("%s %s: reading the answer: %w", method, path, err)
	}
	if resp.StatusCode == http.StatusOK && out != nil {
		if err := json.Unmarshal(raw, out); err != nil {
			return 0, "", fmt.Errorf("%s %s: decoding the answer: %w", method, path, err)
		}
		return resp.StatusCode, "", nil
	}
	return resp.StatusCode, vaultErrors(raw), nil
}

// unavailable reports whether status says the store cannot serve now.
func unavailable(status int) bool {
	return status >= 500 || status == http.StatusTooManyRequests
}

// vaultErrors is the "errors" list of a Vault error body, joined; the raw
// body (shortened) when it is not one.
func vaultErrors(raw []byte) string {
	var e struct {
		Errors []string `json:"errors"`
	}
	if err := json.Unmarshal(raw, &e); err == nil && e.Errors != nil {
		return strings.Join(e.Errors, "; ")
	}
	s := string(raw)
	if len(s) > 200 {
		s = s[:200] + "..."
	}
	return s
}

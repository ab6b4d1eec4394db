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
)

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
type VaultSource struct {
	// Store is the store's address, mounts, role, audience and path.
	Store agentconfig.SecretStore
	// FetchJWTSVID gets the VM's JWT-SVID.
	FetchJWTSVID JWTSVIDFetcher
	// HTTPClient replaces the client built from Store.CABundle (tests).
	HTTPClient *http.Client
	// Logger receives a warning when the delete after the read fails; nil
	// discards it.
	Logger *slog.Logger
}

// Credential logs in, reads the credential and deletes it. A credential
// that was read but could not be deleted is still returned (the operator
// deletes it when the claim ends); the failure is logged.
func (v *VaultSource) Credential(ctx context.Context) (Credential, error) {
	client, err := v.client()
	if err != nil {
		return Credential{}, err
	}
	jwt, err := v.FetchJWTSVID(ctx, v.Store.Audience)
	if err != nil {
		return Credential{}, fmt.Errorf("fetching a JWT-SVID for audience %q: %w", v.Store.Audience, err)
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
		log := v.Logger
		if log == nil {
			log = slog.New(slog.DiscardHandler)
		}
		log.WarnContext(ctx, "Could not delete the credential after reading it; the operator deletes it when the claim ends",
			"path", v.Store.KVMount+"/metadata/"+v.Store.Path, "error", err)
	}
	return cred, nil
}

func (v *VaultSource) client() (*http.Client, error) {
	if v.HTTPClient != nil {
		return v.HTTPClient, nil
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
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
	case status != http.StatusOK:
		return Credential{}, fmt.Errorf("reading %s: HTTP %d: %s", path, status, msgs)
	case out.Data == nil || out.Data.Data == nil:
		return Credential{}, fmt.Errorf("reading %s: %w (the secret's current version is deleted)", path, ErrCredentialGone)
	}
	sc := *out.Data.Data
	if err := sc.Validate(); err != nil {
		return Credential{}, fmt.Errorf("the credential at %s is not usable: %w", path, err)
	}
	return Credential{Method: sc.Method, JITConfig: sc.JITConfig, RegistrationToken: sc.RegistrationToken, RegistrationURL: sc.RegistrationURL}, nil
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
		return 0, "", fmt.Errorf("%s %s: %w", method, path, err)
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

package proxmox

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	proxmox "github.com/luthermonson/go-proxmox"
	"k8s.io/utils/clock"

	"github.com/hyperfleet/hyperfleet/pkg/provider"
)

// errFingerprintMismatch is returned by the pinning check; classify turns it
// into a Configuration error.
var errFingerprintMismatch = errors.New("the API certificate does not match tls.fingerprintSHA256")

// parseFingerprint accepts a SHA-256 fingerprint as Proxmox shows it
// (colon-separated hex pairs) or as plain hex, in any case.
func parseFingerprint(s string) ([]byte, error) {
	clean := strings.ToLower(strings.ReplaceAll(strings.TrimSpace(s), ":", ""))
	raw, err := hex.DecodeString(clean)
	if err != nil || len(raw) != sha256.Size {
		return nil, fmt.Errorf("tls.fingerprintSHA256 %q is not a SHA-256 fingerprint: give 32 hex bytes, colons optional (GET /nodes shows each node's ssl_fingerprint)", s)
	}
	return raw, nil
}

// tlsConfig builds the client TLS configuration from the cluster config and
// reports whether verification is off.
func tlsConfig(cfg provider.ClusterConfig) (*tls.Config, bool, error) {
	set := 0
	for _, on := range []bool{len(cfg.CABundle) > 0, cfg.FingerprintSHA256 != "", cfg.InsecureSkipVerify} {
		if on {
			set++
		}
	}
	if set > 1 {
		return nil, false, errors.New("tls: set at most one of caBundleRef, fingerprintSHA256 and insecureSkipVerify")
	}
	tc := &tls.Config{MinVersion: tls.VersionTLS12}
	switch {
	case cfg.FingerprintSHA256 != "":
		want, err := parseFingerprint(cfg.FingerprintSHA256)
		if err != nil {
			return nil, false, err
		}
		// Proxmox nodes present certificates signed by the cluster's own
		// CA, usually for names the endpoint does not use; pinning replaces
		// chain and name checks by an exact match on the leaf certificate.
		// No ClientSessionCache is set, so every handshake is a full one
		// and runs this check.
		tc.InsecureSkipVerify = true
		tc.VerifyPeerCertificate = func(rawCerts [][]byte, _ [][]*x509.Certificate) error {
			if len(rawCerts) == 0 {
				return errFingerprintMismatch
			}
			got := sha256.Sum256(rawCerts[0])
			if subtle.ConstantTimeCompare(got[:], want) != 1 {
				return fmt.Errorf("%w (server presented %s)", errFingerprintMismatch, strings.ToUpper(hex.EncodeToString(got[:])))
			}
			return nil
		}
	case len(cfg.CABundle) > 0:
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(cfg.CABundle) {
			return nil, false, errors.New("tls.caBundleRef: the CA bundle holds no PEM certificate (for Proxmox use /etc/pve/pve-root-ca.pem)")
		}
		tc.RootCAs = pool
	case cfg.InsecureSkipVerify:
		tc.InsecureSkipVerify = true
	}
	return tc, cfg.InsecureSkipVerify, nil
}

// exchange records what the API answered to one logical request, so that
// errors are classified by HTTP status and Proxmox's message rather than by
// go-proxmox's strings (it turns 500s into errors.New(status), 401 and 403
// both into ErrNotAuthorized, and lets a 595 through as an empty success).
type exchange struct {
	code int
	// reason is the status line's text: pveproxy puts the error message
	// there.
	reason string
	// location is a redirect's target, reported (never followed).
	location string
	// message and params come from an error body.
	message string
	params  map[string]string
	// refusal is a TLS proxy's refusal of the client certificate, read
	// from an error body that is not the API's (proxyRefusal).
	refusal string
}

type exchangeKey struct{}

func withExchange(ctx context.Context, x *exchange) context.Context {
	return context.WithValue(ctx, exchangeKey{}, x)
}

func exchangeFrom(ctx context.Context) *exchange {
	x, _ := ctx.Value(exchangeKey{}).(*exchange)
	return x
}

// instrumented reports every HTTP exchange to the Observer with a templated
// path and records the answer for the caller's classification.
type instrumented struct {
	next     http.RoundTripper
	basePath string
	obs      provider.Observer
}

// maxErrorBody bounds how much of an error response is read.
const maxErrorBody = 64 << 10

// RoundTrip implements http.RoundTripper.
func (t *instrumented) RoundTrip(req *http.Request) (*http.Response, error) {
	start := time.Now()
	res, err := t.next.RoundTrip(req)
	code := 0
	if err == nil {
		code = res.StatusCode
	}
	t.obs.APICall(req.Method, endpointTemplate(t.basePath, req.URL.Path), code, time.Since(start))
	x := exchangeFrom(req.Context())
	if x == nil || err != nil {
		return res, err
	}
	x.code = code
	x.reason = statusReason(res.Status)
	x.location = res.Header.Get("Location")
	if code >= 300 {
		raw, rerr := io.ReadAll(io.LimitReader(res.Body, maxErrorBody))
		_ = res.Body.Close()
		res.Body = io.NopCloser(bytes.NewReader(raw))
		if rerr == nil && len(raw) > 0 {
			var body struct {
				Message string            `json:"message"`
				Errors  map[string]string `json:"errors"`
			}
			if json.Unmarshal(raw, &body) == nil {
				x.message = strings.TrimSpace(body.Message)
				x.params = body.Errors
			} else {
				x.refusal = proxyRefusal(code, raw)
			}
		}
	}
	return res, nil
}

// statusReason strips the code from a status line ("500 VM is locked").
func statusReason(status string) string {
	if _, rest, ok := strings.Cut(status, " "); ok {
		return strings.TrimSpace(rest)
	}
	return status
}

// endpointTemplate turns a request path into the endpoint template the
// Observer sees: ids, node names, UPIDs and volume ids are replaced by
// placeholders, so metrics have a bounded label set and carry nothing
// specific to one VM or user.
func endpointTemplate(basePath, path string) string {
	path = strings.TrimPrefix(path, basePath)
	segs := strings.Split(strings.Trim(path, "/"), "/")
	out := make([]string, 0, len(segs))
	for i := 0; i < len(segs); i++ {
		seg := segs[i]
		out = append(out, placeholderFor(seg))
		if i+1 >= len(segs) {
			break
		}
		if seg == "content" {
			// Volume ids contain '/' ("local:iso/x.iso"): the rest is one
			// placeholder.
			return "/" + strings.Join(append(out, "{volume}"), "/")
		}
		if member, ok := memberPlaceholders[seg]; ok {
			out = append(out, member)
			i++
			if sub, ok := subMemberPlaceholders[member]; ok && i+1 < len(segs) {
				out = append(out, sub)
				i++
			}
		}
	}
	return "/" + strings.Join(out, "/")
}

// subMemberPlaceholders are the placeholders of the segment that follows
// a member and names one of its parts: a firewall security group's rule
// by position, an IPSet's entry by address.
var subMemberPlaceholders = map[string]string{
	"{group}": "{pos}",
	"{name}":  "{cidr}",
}

// memberPlaceholders are the placeholders of the segment that follows a
// collection of the API and names one of its members.
var memberPlaceholders = map[string]string{
	"nodes":   "{node}",
	"qemu":    "{vmid}",
	"lxc":     "{vmid}",
	"tasks":   "{upid}",
	"storage": "{storage}",
	"pools":   "{poolid}",
	// pve-firewall's: security groups, a VM's rules and IPSets.
	"groups": "{group}",
	"rules":  "{pos}",
	"ipset":  "{name}",
}

// placeholderFor hides a segment that is not a fixed word of the API.
func placeholderFor(seg string) string {
	switch {
	case strings.HasPrefix(seg, "UPID:"):
		return "{upid}"
	case seg != "" && strings.Trim(seg, "0123456789") == "":
		return "{id}"
	}
	return seg
}

// session is a Proxmox ticket and its CSRF token.
type session struct {
	ticket string
	csrf   string
	user   string
	at     time.Time
}

// Tickets last two hours; they are renewed well before.
const (
	ticketLifetime   = 2 * time.Hour
	ticketRenewAfter = 90 * time.Minute
)

// authenticator adds credentials to every request: the API token header,
// or a ticket cookie plus CSRF token that it obtains, renews before it
// expires and re-obtains once when the API rejects it.
type authenticator struct {
	next     http.RoundTripper
	loginURL string
	// endpoint is the API base URL: the only scheme and host that ever
	// receive the credentials.
	endpoint *url.URL
	// token is "user@realm!tokenid=secret"; empty for ticket logins.
	token    string
	username string
	password string
	clock    clock.PassiveClock

	mu      sync.Mutex
	session *session
}

// errForeignHost refuses a request for another scheme or host than the
// endpoint's: credentials go to the endpoint only.
var errForeignHost = errors.New("refusing to send Proxmox credentials to a host other than the endpoint's")

// errRedirect refuses to follow a redirect: pveproxy never redirects API
// calls, and a followed redirect would resend the request (with its body)
// somewhere the endpoint did not name.
var errRedirect = errors.New("the Proxmox API answered with a redirect, which HyperFleet never follows")

// refuseRedirect is the http.Client's CheckRedirect: no redirect is
// followed, whatever its target.
func refuseRedirect(req *http.Request, _ []*http.Request) error {
	return fmt.Errorf("%w (to %s://%s%s)", errRedirect, req.URL.Scheme, req.URL.Host, req.URL.Path)
}

// RoundTrip implements http.RoundTripper.
func (a *authenticator) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.URL.Scheme != a.endpoint.Scheme || !strings.EqualFold(req.URL.Host, a.endpoint.Host) {
		return nil, fmt.Errorf("%w (%s://%s, endpoint %s://%s)", errForeignHost, req.URL.Scheme, req.URL.Host, a.endpoint.Scheme, a.endpoint.Host)
	}
	if a.token != "" {
		r := req.Clone(req.Context())
		r.Header.Set("Authorization", "PVEAPIToken="+a.token)
		return a.next.RoundTrip(r)
	}
	s, err := a.current(req.Context(), nil)
	if err != nil {
		return nil, err
	}
	res, err := a.next.RoundTrip(withSession(req, s))
	if err != nil || res.StatusCode != http.StatusUnauthorized {
		return res, err
	}
	// The API rejected a ticket we believed valid (it expired early or the
	// cluster's auth key changed). A 401 is answered before the handler
	// runs, so sending the request again is safe, once, if its body can be
	// replayed.
	if req.Body != nil && req.GetBody == nil {
		return res, nil
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(res.Body, maxErrorBody))
	_ = res.Body.Close()
	s, err = a.current(req.Context(), s)
	if err != nil {
		return nil, err
	}
	retry := req.Clone(req.Context())
	if req.GetBody != nil {
		if retry.Body, err = req.GetBody(); err != nil {
			return nil, err
		}
	}
	return a.next.RoundTrip(withSession(retry, s))
}

func withSession(req *http.Request, s *session) *http.Request {
	r := req.Clone(req.Context())
	r.Header.Set("Cookie", "PVEAuthCookie="+s.ticket)
	if req.Method != http.MethodGet && req.Method != http.MethodHead {
		r.Header.Set("CSRFPreventionToken", s.csrf)
	}
	return r
}

// current returns a valid session. rejected, when set, is a session the API
// refused: it is replaced even if it looks young.
func (a *authenticator) current(ctx context.Context, rejected *session) (*session, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	s := a.session
	if s != nil && s != rejected && a.clock.Since(s.at) < ticketRenewAfter {
		return s, nil
	}
	if s != nil && s != rejected && a.clock.Since(s.at) < ticketLifetime {
		// Renewing posts the current ticket as the password; fall back to
		// the password if that fails.
		if ns, err := a.login(ctx, s.user, s.ticket); err == nil {
			a.session = ns
			return ns, nil
		}
	}
	ns, err := a.login(ctx, a.username, a.password)
	if err != nil {
		a.session = nil
		return nil, err
	}
	a.session = ns
	return ns, nil
}

// login posts to /access/ticket. Its exchange is recorded nowhere but the
// Observer: the caller's request is the one being classified.
func (a *authenticator) login(ctx context.Context, user, password string) (*session, error) {
	form := url.Values{"username": {user}, "password": {password}}
	req, err := http.NewRequestWithContext(withExchange(ctx, nil), http.MethodPost, a.loginURL, strings.NewReader(form.Encode()))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	res, err := a.next.RoundTrip(req)
	if err != nil {
		return nil, err
	}
	defer func() { _ = res.Body.Close() }()
	raw, err := io.ReadAll(io.LimitReader(res.Body, 1<<20))
	if err != nil {
		return nil, err
	}
	if res.StatusCode == http.StatusUnauthorized || res.StatusCode == http.StatusForbidden {
		return nil, provider.Errorf(provider.ClassConfiguration, "Unauthorized",
			"%w: Proxmox refused the login of %q (%d %s); check credentials.username and credentials.password", provider.ErrUnauthorized, user, res.StatusCode, statusReason(res.Status))
	}
	if res.StatusCode != http.StatusOK {
		return nil, httpError(&exchange{code: res.StatusCode, reason: statusReason(res.Status), refusal: proxyRefusal(res.StatusCode, raw)}, http.MethodPost, "/access/ticket")
	}
	var body struct {
		Data proxmox.Session `json:"data"`
	}
	if err := json.Unmarshal(raw, &body); err != nil || body.Data.Ticket == "" {
		return nil, provider.Errorf(provider.ClassTransient, "BadResponse", "log in to Proxmox: the ticket response could not be read")
	}
	name := body.Data.Username
	if name == "" {
		name = user
	}
	return &session{ticket: body.Data.Ticket, csrf: body.Data.CSRFPreventionToken, user: name, at: a.clock.Now()}, nil
}

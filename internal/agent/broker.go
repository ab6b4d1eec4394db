package agent

import (
	"cmp"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/hyperfleet/hyperfleet/internal/agentconfig"
)

// BrokerSource is workloadMethod broker: the agent proves its identity
// with SPIRE and fetches its runner credential from the operator's
// credential broker over mTLS with its X509-SVID.
//
// With attestationMethod join-token, Credential waits for the operator to
// place the join token and the broker proof in the running VM at the
// config's secretsFile (they are never in the config, whose seed can be
// read off the hypervisor's storage), reads and removes that file, writes
// a spire-agent config (join token included) into a private directory
// under SPIREDir, starts `spire-agent run`, fetches the X509-SVID from its
// Workload API with `spire-agent api fetch x509` until one is issued,
// removes the config as soon as the agent has attested, and calls the
// broker with the SVID and the proof. The
// agent drives SPIRE's own CLI rather than linking go-spiffe, so that it
// stays a small static binary of the standard library only (and go-tpm
// for the TPM enrollment, which SPIRE's CLI does not do).
//
// spire-agent runs until the credential is fetched (or the attempt
// failed), then is stopped and its directory removed: the X509-SVID is
// needed only for the broker call, and an identity left running or on the
// disk is one the job could use. Nothing of it outlives Credential.
//
// With attestationMethod tpm, the secrets at secretsFile are the
// enrollment proof and the broker proof (a join token there is refused):
// the agent enrolls a DevID in the VM's TPM at the operator's enrollment
// endpoints (enrollTPM, in tpm.go) and starts spire-agent with SPIRE's
// tpm_devid node attestor instead of the join token; the rest is the same.
//
// With SPIRESocket set, a pre-installed spire-agent serves the Workload
// API: nothing is started, no join token is used and no TPM enrolled
// (that agent attested by its own means); the broker proof is still
// waited for.
//
// Retry contract: the Workload API is asked every second until it issues
// an SVID; the broker is asked again after 429 or 503 (after Retry-After
// when given, else with a backoff up to 30 seconds) and after network
// errors. Both stop at the deadline: AttestTimeout from the start, and
// for the attestation never past ExpiresAt (the join token's expiry).
// The TPM enrollment endpoints are asked again likewise, within the
// attestation deadline.
//
// Exit codes: ExitAttestation when no SVID came (with tpm also: no TPM at
// spiffe.tpmDevicePath, the enrollment refused, the TPM unable to answer
// the challenge), ExitBrokerRefused when the broker answered with a
// refusal or no valid credential, ExitBrokerUnavailable when it (or the
// TPM enrollment endpoints) could not be reached, or stayed busy, until
// the deadline, or its certificate is not trusted.
type BrokerSource struct {
	// Method is the kind of credential to ask the broker for.
	Method agentconfig.BootstrapMethod
	// SPIFFE holds the attestation settings and the broker URL.
	SPIFFE *agentconfig.SPIFFE
	// ExpiresAt is the config's expiresAt: the join token is not usable
	// after it. Zero: no bound.
	ExpiresAt time.Time
	// SecretsFile is the config's secretsFile, where the join token and
	// the broker proof arrive (empty: none are waited for), and
	// SecretsDeadline its secretsDeadline. Zero: no bound.
	SecretsFile     string
	SecretsDeadline time.Time

	// The agent's settings (Options), filled in by Run.

	// Root prefixes SPIREDir (Options.Root).
	Root string
	// System is made fresh before the join token or the proofs are used
	// (Options.System); nil changes nothing.
	System GuestSystem
	// SPIREAgent is the spire-agent binary (DefaultSPIREAgent when empty).
	SPIREAgent string
	// SPIRESocket is a pre-installed spire-agent's Workload API socket;
	// empty: start spire-agent with the join token.
	SPIRESocket string
	// AttestTimeout bounds attesting and fetching the credential
	// (DefaultAttestTimeout when zero).
	AttestTimeout time.Duration
	// Logger receives progress (never a secret); slog.Default when nil.
	Logger *slog.Logger
	// UserAgent is sent to the broker.
	UserAgent string
	// Proxy is the config's HTTP proxy; nil: the environment's.
	Proxy *agentconfig.Proxy

	// proof is the broker proof the operator placed in the VM with the
	// join token; sent to the broker with the SVID.
	proof string
}

// useOptions fills in the agent's settings.
func (b *BrokerSource) useOptions(o *Options) {
	b.Root, b.SPIREAgent, b.SPIRESocket, b.AttestTimeout = o.Root, o.SPIREAgent, o.SPIRESocket, o.AttestTimeout
	b.Logger, b.UserAgent, b.System = o.Logger, "hyperfleet-agent/"+o.Version, guestSystem(o)
}

// Credential attests with SPIRE and fetches the runner credential from the
// broker (see BrokerSource).
func (b *BrokerSource) Credential(ctx context.Context) (Credential, error) {
	return b.withSVID(ctx, func(fetchCtx context.Context, run *spireRun, cert tls.Certificate) (Credential, error) {
		client, err := newBrokerClient(b.SPIFFE.BrokerURL, b.SPIFFE.BrokerCA, cert, b.UserAgent, b.Proxy)
		if err != nil {
			return Credential{}, err
		}
		client.log, client.proof = run.log, b.proof
		cred, err := client.credential(fetchCtx)
		if err != nil {
			return Credential{}, err
		}
		if cred.Method != b.Method {
			return Credential{}, fail(ExitBrokerRefused, "the broker returned a %s credential, but the config's bootstrapMethod is %s", cred.Method, b.Method)
		}
		return cred, nil
	})
}

// svidUser fetches the credential with the VM's identity: run is the
// attested spire-agent (its Workload API serves more SVIDs, such as
// JWT-SVIDs), cert its X509-SVID, and fetchCtx ends at the deadline.
type svidUser func(fetchCtx context.Context, run *spireRun, cert tls.Certificate) (Credential, error)

// withSVID attests as BrokerSource describes and hands the identity to
// use; spire-agent is stopped and its directory removed once use returns,
// whatever happened. The sources that fetch the credential with the VM's
// identity (the broker, VaultSource) share it.
func (b *BrokerSource) withSVID(ctx context.Context, use svidUser) (Credential, error) {
	s := b.SPIFFE
	if s == nil {
		return Credential{}, fail(ExitBadConfig, "spiffe: is missing; workloadMethod broker needs SPIFFE attestation settings")
	}
	switch s.AttestationMethod {
	case agentconfig.AttestationJoinToken, agentconfig.AttestationTPM:
	default:
		return Credential{}, fail(ExitUnsupported, "spiffe.attestationMethod %q is not one this agent implements (join-token, tpm)", s.AttestationMethod)
	}
	log := b.Logger
	if log == nil {
		log = slog.Default()
	}
	timeout := b.AttestTimeout
	if timeout <= 0 {
		timeout = DefaultAttestTimeout
	}
	fetchCtx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()

	run, err := newSPIRERun(log, cmp.Or(b.SPIREAgent, DefaultSPIREAgent), filepath.Join(b.Root, filepath.FromSlash(SPIREDir)))
	if err != nil {
		return Credential{}, err
	}
	// Stops spire-agent and removes its directory whatever happens, once
	// the credential is fetched.
	defer run.stop()
	cert, err := b.attest(ctx, fetchCtx, run)
	if err != nil {
		return Credential{}, err
	}
	return use(fetchCtx, run, cert)
}

// attest gets the X509-SVID through run: from a spire-agent it starts with
// the join token the operator placed in the VM or with the TPM DevID it
// enrolls (enrollTPM), or from SPIRESocket.
// fetchCtx bounds it, and ExpiresAt (the join token is useless after it);
// ctx is the agent's own, whose end (a signal) is not an attestation
// failure.
func (b *BrokerSource) attest(ctx, fetchCtx context.Context, run *spireRun) (tls.Certificate, error) {
	attestCtx := fetchCtx
	for _, at := range []time.Time{b.ExpiresAt, b.SecretsDeadline} {
		if !at.IsZero() {
			var cancel context.CancelFunc
			attestCtx, cancel = context.WithDeadline(attestCtx, at)
			defer cancel()
		}
	}
	tpm := b.SPIFFE.AttestationMethod == agentconfig.AttestationTPM
	var secrets agentconfig.GuestSecrets
	if f := b.SecretsFile; f != "" {
		var err error
		if secrets, err = waitGuestSecrets(ctx, attestCtx, run.log, systemOr(b.System, run.log), filepath.Join(b.Root, filepath.FromSlash(f)), ExitAttestation); err != nil {
			return tls.Certificate{}, err
		}
		switch {
		case tpm && secrets.JoinToken != "":
			// A join token where the operator enrolls TPMs was not
			// placed by this VM's operator, or the config is not its.
			return tls.Certificate{}, fail(ExitAttestation, "the secrets the operator placed at %s hold a join token, but spiffe.attestationMethod is tpm; not using it", f)
		case tpm && secrets.EnrollmentProof == "" && b.SPIRESocket == "":
			return tls.Certificate{}, fail(ExitAttestation, "the secrets the operator placed at %s hold no enrollment proof and broker proof (spiffe.attestationMethod tpm)", f)
		case !tpm && secrets.JoinToken == "":
			return tls.Certificate{}, fail(ExitAttestation, "the secrets the operator placed at %s hold no join token and broker proof", f)
		}
		b.proof = secrets.BrokerProof
	}
	switch {
	case b.SPIRESocket != "":
		run.log.Info("using the Workload API of a pre-installed spire-agent", "socket", b.SPIRESocket)
		run.useSocket(b.SPIRESocket)
	case tpm:
		if b.SecretsFile == "" {
			return tls.Certificate{}, fail(ExitBadConfig, "secretsFile: is empty; spiffe.attestationMethod tpm needs the enrollment proof the operator places there")
		}
		att, err := b.enrollTPM(ctx, attestCtx, run, secrets.EnrollmentProof)
		if err != nil {
			return tls.Certificate{}, err
		}
		if err := run.start(b.SPIFFE, att); err != nil {
			return tls.Certificate{}, err
		}
	default:
		if err := run.start(b.SPIFFE, nodeAttestor{joinToken: secrets.JoinToken}); err != nil {
			return tls.Certificate{}, err
		}
	}
	cert, id, err := run.waitSVID(ctx, attestCtx, b.SPIFFE)
	if err != nil {
		return tls.Certificate{}, err
	}
	run.log.Info("X509-SVID obtained", "spiffeID", id, "notAfter", cert.Leaf.NotAfter.UTC().Format(time.RFC3339))
	return cert, nil
}

// maxBrokerResponse bounds what is read of a broker response: a
// credential is a few kilobytes.
const maxBrokerResponse = 64 << 10

// Backoff between broker attempts without Retry-After.
const (
	brokerFirstBackoff = time.Second
	brokerMaxBackoff   = 30 * time.Second
	// brokerAttemptTimeout bounds one request.
	brokerAttemptTimeout = 30 * time.Second
)

// brokerClient asks the credential broker for the runner credential:
// POST brokerURL, empty body, the X509-SVID as the client certificate and
// the broker proof in agentconfig.BrokerProofHeader.
type brokerClient struct {
	url       string
	http      *http.Client
	userAgent string
	proof     string
	log       *slog.Logger
}

// newBrokerClient builds the mTLS client: cert is presented to the broker,
// whose certificate is verified against caPEM (the system roots when
// empty).
func newBrokerClient(brokerURL, caPEM string, cert tls.Certificate, userAgent string, proxy *agentconfig.Proxy) (*brokerClient, error) {
	hc, err := brokerHTTPClient(caPEM, []tls.Certificate{cert}, proxy)
	if err != nil {
		return nil, err
	}
	return &brokerClient{url: brokerURL, userAgent: userAgent, log: slog.Default(), http: hc}, nil
}

// brokerHTTPClient is the client of the operator's agent server (the
// broker, the TPM enrollment endpoints): its certificate verified against
// caPEM (spiffe.brokerCA; the system roots when empty), certs presented
// when it asks for a client certificate (none before the VM has its
// X509-SVID).
func brokerHTTPClient(caPEM string, certs []tls.Certificate, proxy *agentconfig.Proxy) (*http.Client, error) {
	tlsConf := &tls.Config{MinVersion: tls.VersionTLS12, Certificates: certs}
	if caPEM != "" {
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM([]byte(caPEM)) {
			return nil, fail(ExitBadConfig, "spiffe.brokerCA: holds no PEM certificate")
		}
		tlsConf.RootCAs = pool
	}
	transport := &http.Transport{
		Proxy:               proxy.Func(),
		TLSClientConfig:     tlsConf,
		TLSHandshakeTimeout: 10 * time.Second,
		ForceAttemptHTTP2:   true,
		DisableKeepAlives:   true,
	}
	return &http.Client{
		Transport: transport,
		// A redirect would resend the request elsewhere: the server
		// answers itself, so a redirect is an answer like any other.
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}, nil
}

// brokerAnswer is one attempt's outcome besides a credential or a final
// error: wait and try again.
type brokerAnswer struct {
	retryAfter time.Duration // 0: the client's backoff
	why        string
}

// credential asks the broker until it hands out a credential, refuses, or
// ctx ends.
func (c *brokerClient) credential(ctx context.Context) (Credential, error) {
	backoff := brokerFirstBackoff
	for attempt := 1; ; attempt++ {
		cred, retry, err := c.try(ctx)
		if err != nil {
			return Credential{}, err
		}
		if retry == nil {
			c.log.Info("runner credential fetched from the broker", "broker", safeURL(c.url), "attempts", attempt, "credential", cred)
			return cred, nil
		}
		wait := retry.retryAfter
		if wait <= 0 {
			wait = backoff
			backoff = min(2*backoff, brokerMaxBackoff)
		}
		if dl, ok := ctx.Deadline(); ok && time.Now().Add(wait).After(dl) {
			return Credential{}, fail(ExitBrokerUnavailable, "no credential from the broker %s before the deadline (--attest-timeout) after %d attempts; last: %s",
				safeURL(c.url), attempt, retry.why)
		}
		c.log.Warn("credential broker not available; trying again", "broker", safeURL(c.url), "attempt", attempt, "retryIn", wait, "reason", retry.why)
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return Credential{}, fail(ExitBrokerUnavailable, "no credential from the broker %s: %v after %d attempts; last: %s", safeURL(c.url), ctx.Err(), attempt, retry.why)
		case <-t.C:
		}
	}
}

// try makes one request.
func (c *brokerClient) try(ctx context.Context) (Credential, *brokerAnswer, error) {
	actx, cancel := context.WithTimeout(ctx, brokerAttemptTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(actx, http.MethodPost, c.url, http.NoBody)
	if err != nil {
		return Credential{}, nil, fail(ExitBadConfig, "spiffe.brokerURL: %v", err)
	}
	req.Header.Set("Accept", "application/json")
	if c.proof != "" {
		req.Header.Set(agentconfig.BrokerProofHeader, c.proof)
	}
	if c.userAgent != "" {
		req.Header.Set("User-Agent", c.userAgent)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		if ferr := c.fatalTransportError(ctx, err); ferr != nil {
			return Credential{}, nil, ferr
		}
		// Without the URL, which *url.Error repeats and the log already
		// shows without its query.
		var uerr *url.Error
		if errors.As(err, &uerr) {
			err = uerr.Err
		}
		return Credential{}, &brokerAnswer{why: err.Error()}, nil
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxBrokerResponse+1))
	if err != nil {
		return Credential{}, &brokerAnswer{why: fmt.Sprintf("reading the %s response: %v", resp.Status, err)}, nil
	}
	if len(body) > maxBrokerResponse {
		return Credential{}, nil, fail(ExitBrokerRefused, "the broker's %s response is larger than %d KiB", resp.Status, maxBrokerResponse>>10)
	}
	switch resp.StatusCode {
	case http.StatusOK:
		cred, err := parseBrokerCredential(body)
		return cred, nil, err
	case http.StatusTooManyRequests, http.StatusServiceUnavailable:
		return Credential{}, &brokerAnswer{retryAfter: retryAfter(resp.Header.Get("Retry-After")), why: resp.Status + refusalText(body)}, nil
	default:
		return Credential{}, nil, fail(ExitBrokerRefused, "the broker %s refused the credential: %s%s", safeURL(c.url), resp.Status, refusalText(body))
	}
}

// fatalTransportError is the error that ends the attempts for a transport
// failure no retry can mend (a TLS failure), nil for one worth retrying
// (refused connection, timeout, DNS).
func (c *brokerClient) fatalTransportError(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return fail(ExitBrokerUnavailable, "no credential from the broker %s: %v", safeURL(c.url), ctx.Err())
	}
	var verr *tls.CertificateVerificationError
	if errors.As(err, &verr) {
		return fail(ExitBrokerUnavailable, "the broker %s's certificate is not trusted (spiffe.brokerCA, or the system roots when empty): %w", safeURL(c.url), err)
	}
	var opErr *net.OpError
	if errors.As(err, &opErr) && opErr.Op == "remote error" {
		// A TLS alert from the broker: it did not accept the X509-SVID.
		return fail(ExitBrokerRefused, "the broker %s refused the TLS handshake (it did not accept this VM's X509-SVID): %w", safeURL(c.url), err)
	}
	return nil
}

// brokerCredential is the broker's 200 answer.
type brokerCredential struct {
	Method            agentconfig.BootstrapMethod `json:"method"`
	JITConfig         string                      `json:"jitConfig"`
	RegistrationToken string                      `json:"registrationToken"`
	RegistrationURL   string                      `json:"registrationURL"`
	Job               string                      `json:"job"`
	ExpiresAt         string                      `json:"expiresAt"`
}

// parseBrokerCredential decodes and checks a 200 answer. Its errors never
// quote the body, which holds the credential.
func parseBrokerCredential(body []byte) (Credential, error) {
	var bc brokerCredential
	if err := json.Unmarshal(body, &bc); err != nil {
		var syn *json.SyntaxError
		if errors.As(err, &syn) {
			return Credential{}, fail(ExitBrokerRefused, "the broker's 200 response is not JSON (syntax error at byte %d)", syn.Offset)
		}
		return Credential{}, fail(ExitBrokerRefused, "the broker's 200 response is not a credential: %v", err)
	}
	cred := Credential{Method: bc.Method, JITConfig: bc.JITConfig, RegistrationToken: bc.RegistrationToken, RegistrationURL: bc.RegistrationURL, Job: bc.Job}
	if err := cred.validate(); err != nil {
		return Credential{}, fail(ExitBrokerRefused, "%v", err)
	}
	if cred.RegistrationURL != "" {
		if u, err := url.Parse(cred.RegistrationURL); err != nil || u.Scheme != "https" || u.Host == "" {
			return Credential{}, fail(ExitBrokerRefused, "the broker's registrationURL is not an https:// URL")
		}
	}
	if bc.ExpiresAt != "" {
		exp, err := time.Parse(time.RFC3339, bc.ExpiresAt)
		if err != nil {
			return Credential{}, fail(ExitBrokerRefused, "the broker's expiresAt %q is not an RFC 3339 time", bc.ExpiresAt)
		}
		if !time.Now().Before(exp) {
			return Credential{}, fail(ExitExpired, "the broker's credential expired at %s; not trying it", exp.UTC().Format(time.RFC3339))
		}
	}
	return cred, nil
}

// refusalText is what an error shows of a refusal body: the broker's
// reason and message, or nothing when the body is not that JSON (it could
// be anything, such as a proxy's HTML page).
func refusalText(body []byte) string {
	var r struct {
		Reason  string `json:"reason"`
		Message string `json:"message"`
	}
	if json.Unmarshal(body, &r) != nil || (r.Reason == "" && r.Message == "") {
		return ""
	}
	return fmt.Sprintf(" (reason %s: %s)", printable(r.Reason, 100), printable(r.Message, 1000))
}

// printable bounds s and replaces control characters, so that a message
// from the broker cannot forge log lines.
func printable(s string, n int) string {
	if len(s) > n {
		s = s[:n] + "..."
	}
	return strings.Map(func(r rune) rune {
		if r < 0x20 || r == 0x7f {
			return ' '
		}
		return r
	}, s)
}

// retryAfter parses a Retry-After header: seconds, or an HTTP date; 0 when
// absent or invalid.
func retryAfter(h string) time.Duration {
	if h == "" {
		return 0
	}
	if n, err := strconv.Atoi(strings.TrimSpace(h)); err == nil && n >= 0 {
		return time.Duration(n) * time.Second
	}
	if t, err := http.ParseTime(h); err == nil {
		return max(time.Until(t), 0)
	}
	return 0
}

// optionsUser is a CredentialSource that needs the agent's Options (paths,
// deadlines, logger) besides the config; Run hands them over.
type optionsUser interface {
	useOptions(*Options)
}

// String describes b without the join token.
func (b BrokerSource) String() string {
	url := ""
	if b.SPIFFE != nil {
		url = safeURL(b.SPIFFE.BrokerURL)
	}
	return fmt.Sprintf("broker source (%s credential from %q, join token redacted)", b.Method, url)
}

// GoString is String, so %#v does not print the join token either.
func (b BrokerSource) GoString() string { return b.String() }

package agent

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"time"

	"github.com/hyperfleet/hyperfleet/internal/agentconfig"
	"github.com/hyperfleet/hyperfleet/internal/tpmdevid"
)

// The TPM failures the agent names in its power-off notice
// (agentconfig.AttestationTPMNotFound and the others): each points the
// operator at a different culprit, the template (no TPM), the operator's
// own checks (refused), or the TPM (activation).
var (
	errTPMNotFound          = errors.New("no TPM")
	errTPMEnrollmentRefused = errors.New("the operator refused the TPM enrollment")
	errTPMActivationFailed  = errors.New("the TPM could not activate the operator's challenge")
)

// maxTPMResponse bounds what is read of an enrollment endpoint's answer: a
// challenge is a few hundred bytes, a certificate chain a few kilobytes.
const maxTPMResponse = 64 << 10

// enrollTPM gives the VM's TPM a DevID the operator certifies, for
// spire-agent's tpm_devid attestor (docs/identity.md, "TPM"): it creates
// the attestation and DevID keys in the TPM (tpmdevid.Enroll), sends the
// enrollment to the operator's TPMEnrollPath with the enrollment proof,
// recovers the challenge's secret in the TPM (the operator made it for
// this TPM's EK alone), sends it to TPMActivatePath, and writes the DevID
// certificate the operator answers with (PEM: tpm_devid's devid_cert_path
// reads PEM CERTIFICATE blocks only) and the DevID's TPM blobs into run's
// private directory, 0600. The private blob is the TPM's own encryption of
// the key: useless outside this TPM. attestCtx bounds the attempts; ctx is
// the agent's own, whose end is not an attestation failure.
func (b *BrokerSource) enrollTPM(ctx, attestCtx context.Context, run *spireRun, proof string) (nodeAttestor, error) {
	s := b.SPIFFE
	// Under --root like every absolute path of the config: simulated VMs
	// sharing one host each have their TPM there.
	device := filepath.Join(b.Root, filepath.FromSlash(s.TPMDevicePath))
	if _, err := os.Stat(device); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nodeAttestor{}, fail(ExitAttestation, "%w at %s (spiffe.tpmDevicePath): the VM's template must give it a TPM (spec.attestation.tpm), and the guest's kernel must drive it: %w", errTPMNotFound, device, err)
		}
		return nodeAttestor{}, fail(ExitAttestation, "the TPM at %s (spiffe.tpmDevicePath): %w", device, err)
	}
	guest, enrollment, err := tpmdevid.Enroll(device)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nodeAttestor{}, fail(ExitAttestation, "%w at %s (spiffe.tpmDevicePath): %w", errTPMNotFound, device, err)
		}
		return nodeAttestor{}, fail(ExitAttestation, "create the DevID in the TPM at %s: %w", device, err)
	}
	run.log.Info("TPM DevID key created; enrolling it", "tpm", device)

	hc, err := brokerHTTPClient(s.BrokerCA, nil, b.Proxy)
	if err != nil {
		return nodeAttestor{}, err
	}
	c := &tpmClient{http: hc, base: s.BrokerURL, proof: proof, userAgent: b.UserAgent, log: run.log}
	var ch agentconfig.TPMChallenge
	if err := c.post(ctx, attestCtx, agentconfig.TPMEnrollPath, agentconfig.TPMEnrollRequest{SPIFFEID: s.SPIFFEID, Enrollment: *enrollment}, &ch); err != nil {
		return nodeAttestor{}, err
	}
	answer, err := guest.Activate(ch.Challenge)
	if err != nil {
		return nodeAttestor{}, fail(ExitAttestation, "%w (TPM2_ActivateCredential in %s): %w", errTPMActivationFailed, device, err)
	}
	defer clear(answer)
	var resp agentconfig.TPMActivateResponse
	if err := c.post(ctx, attestCtx, agentconfig.TPMActivatePath, agentconfig.TPMActivateRequest{SPIFFEID: s.SPIFFEID, Enrollment: *enrollment, Answer: answer}, &resp); err != nil {
		return nodeAttestor{}, err
	}
	cert, err := x509.ParseCertificate(resp.DevIDCertificate)
	if err != nil {
		return nodeAttestor{}, fail(ExitAttestation, "the operator's DevID certificate (%s) does not parse: %w", safeURL(c.url(agentconfig.TPMActivatePath)), err)
	}

	pub, priv := guest.DevIDBlobs()
	files := &devIDFiles{
		cert: filepath.Join(run.dir, devIDCertFile),
		pub:  filepath.Join(run.dir, devIDPubFile),
		priv: filepath.Join(run.dir, devIDPrivFile),
	}
	for path, data := range map[string][]byte{
		files.cert: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: cert.Raw}),
		files.pub:  pub,
		files.priv: priv,
	} {
		if err := os.WriteFile(path, data, 0o600); err != nil {
			return nodeAttestor{}, fail(ExitAttestation, "write the TPM DevID for spire-agent: %w", err)
		}
	}
	run.log.Info("TPM DevID certified by the operator", "subject", cert.Subject.String(), "issuer", cert.Issuer.String(),
		"notAfter", cert.NotAfter.UTC().Format(time.RFC3339))
	return nodeAttestor{devID: files, tpmDevice: device}, nil
}

// tpmClient calls the operator's TPM enrollment endpoints: on the broker
// URL's host, with the broker's TLS trust (spiffe.brokerCA) and no client
// certificate (the VM has no identity yet: the enrollment proof in
// agentconfig.EnrollmentProofHeader says which VM it is).
type tpmClient struct {
	http      *http.Client
	base      string // spiffe.brokerURL
	proof     string
	userAgent string
	log       *slog.Logger
}

// url is the endpoint at path on the broker URL's host: its path
// replaced, its query and fragment dropped (they are the broker's).
func (c *tpmClient) url(path string) string {
	u, err := url.Parse(c.base)
	if err != nil {
		return c.base
	}
	u.Path, u.RawPath, u.RawQuery, u.Fragment, u.RawFragment = path, "", "", "", ""
	return u.String()
}

// post sends in as JSON to path and decodes the 200 answer into out,
// asking again after 429 and 503 (after Retry-After when given, else with
// the broker's backoff) and after network errors, until attestCtx ends
// (ExitBrokerUnavailable: the operator's server was unreachable or busy).
// Any other error status is a refusal (errTPMEnrollmentRefused, with the
// operator's reason). ctx is the agent's own: its end is a stop, not a
// failure.
func (c *tpmClient) post(ctx, attestCtx context.Context, path string, in, out any) error {
	endpoint := c.url(path)
	body, err := json.Marshal(in)
	if err != nil {
		return fmt.Errorf("encode the request to %s: %w", path, err)
	}
	backoff := brokerFirstBackoff
	for attempt := 1; ; attempt++ {
		retry, err := c.try(attestCtx, endpoint, body, out)
		if err != nil {
			if ctx.Err() != nil {
				return fmt.Errorf("TPM enrollment stopped: %w", ctx.Err())
			}
			return err
		}
		if retry == nil {
			c.log.Info("TPM enrollment step done", "url", safeURL(endpoint), "attempts", attempt)
			return nil
		}
		wait := retry.retryAfter
		if wait <= 0 {
			wait = backoff
			backoff = min(2*backoff, brokerMaxBackoff)
		}
		if dl, ok := attestCtx.Deadline(); ok && time.Now().Add(wait).After(dl) {
			return fail(ExitBrokerUnavailable, "no answer from the TPM enrollment endpoint %s before the attestation deadline (--attest-timeout, secretsDeadline, expiresAt) after %d attempts; last: %s",
				safeURL(endpoint), attempt, retry.why)
		}
		c.log.Warn("TPM enrollment endpoint not available; trying again", "url", safeURL(endpoint), "attempt", attempt, "retryIn", wait, "reason", retry.why)
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("TPM enrollment stopped: %w", ctx.Err())
		case <-attestCtx.Done():
			t.Stop()
			return fail(ExitBrokerUnavailable, "no answer from the TPM enrollment endpoint %s: %v after %d attempts; last: %s", safeURL(endpoint), attestCtx.Err(), attempt, retry.why)
		case <-t.C:
		}
	}
}

// try makes one request: a final error, a reason to try again, or nil
// with out filled in.
func (c *tpmClient) try(ctx context.Context, endpoint string, body []byte, out any) (*brokerAnswer, error) {
	actx, cancel := context.WithTimeout(ctx, brokerAttemptTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(actx, http.MethodPost, endpoint, bytes.NewReader(body))
	if err != nil {
		return nil, fail(ExitBadConfig, "spiffe.brokerURL: %v", err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json")
	req.Header.Set(agentconfig.EnrollmentProofHeader, c.proof)
	if c.userAgent != "" {
		req.Header.Set("User-Agent", c.userAgent)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return nil, fail(ExitBrokerUnavailable, "no answer from the TPM enrollment endpoint %s: %v", safeURL(endpoint), ctx.Err())
		}
		var verr *tls.CertificateVerificationError
		if errors.As(err, &verr) {
			return nil, fail(ExitBrokerUnavailable, "the TPM enrollment endpoint %s's certificate is not trusted (spiffe.brokerCA, or the system roots when empty): %w", safeURL(endpoint), err)
		}
		var uerr *url.Error
		if errors.As(err, &uerr) {
			err = uerr.Err
		}
		return &brokerAnswer{why: err.Error()}, nil
	}
	defer resp.Body.Close()
	answer, err := io.ReadAll(io.LimitReader(resp.Body, maxTPMResponse+1))
	if err != nil {
		return &brokerAnswer{why: fmt.Sprintf("reading the %s response: %v", resp.Status, err)}, nil
	}
	if len(answer) > maxTPMResponse {
		return nil, fail(ExitAttestation, "the TPM enrollment endpoint %s's %s response is larger than %d KiB", safeURL(endpoint), resp.Status, maxTPMResponse>>10)
	}
	switch resp.StatusCode {
	case http.StatusOK:
		if err := json.Unmarshal(answer, out); err != nil {
			return nil, fail(ExitAttestation, "the TPM enrollment endpoint %s's 200 response is not its JSON answer: %w", safeURL(endpoint), err)
		}
		return nil, nil
	case http.StatusTooManyRequests, http.StatusServiceUnavailable:
		return &brokerAnswer{retryAfter: retryAfter(resp.Header.Get("Retry-After")), why: resp.Status + refusalText(answer)}, nil
	default:
		return nil, fail(ExitAttestation, "%w: %s answered %s%s", errTPMEnrollmentRefused, safeURL(endpoint), resp.Status, refusalText(answer))
	}
}

//go:build e2e && spire

package e2e

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"fmt"
	"io"
	"math/big"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/agentconfig"
	"github.com/hyperfleet/hyperfleet/internal/broker"
	"github.com/hyperfleet/hyperfleet/internal/identity"
	"github.com/hyperfleet/hyperfleet/internal/metrics"
	"github.com/hyperfleet/hyperfleet/internal/spire"
	"github.com/hyperfleet/hyperfleet/internal/testworld/devenv"
	"github.com/hyperfleet/hyperfleet/test/spiretest"
)

// callBroker asks the broker for a credential with cert as the client
// certificate and proof in the proof header ("": none), as a VM (or a
// thief) does; it returns the status and the body.
func callBroker(t *testing.T, brokerURL, ca string, cert tls.Certificate, proof string) (int, []byte) {
	t.Helper()
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM([]byte(ca)) {
		t.Fatal("the agent server's CA holds no certificate")
	}
	hc := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}}}
	req, err := http.NewRequest(http.MethodPost, brokerURL, http.NoBody)
	if err != nil {
		t.Fatal(err)
	}
	if proof != "" {
		req.Header.Set(agentconfig.BrokerProofHeader, proof)
	}
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatalf("call the broker: %v", err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	return resp.StatusCode, body
}

// tlsOf turns an X509-SVID into a client certificate.
func tlsOf(t *testing.T, svid *x509svid.SVID) tls.Certificate {
	t.Helper()
	certPEM, keyPEM, err := svid.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	return cert
}

// TestSPIFFENothingUsableOnTheSeed: whoever reads the hypervisor's ISO
// storage finds nothing to attest with: the seed of a VM whose template
// attests holds no join token (no field, and the token the VM received
// appears nowhere in the ISO's bytes); the token reaches the running VM
// only, through its guest agent. And a token that leaks anyway (here taken
// from where it arrives, before the VM's agent, held back, uses it) yields
// nothing: a real spire-agent attests with it and gets the VM's X509-SVID,
// but the broker refuses that SVID without the VM's broker proof, mints
// no credential (no runner on the GitHub simulator), the claim reports it
// (IdentityStolen), the thief's agent is evicted, the claim fails, its VM
// is destroyed, and the pool's next VM runs the job.
func TestSPIFFENothingUsableOnTheSeed(t *testing.T) {
	w, watch, _ := startSPIFFEWorld(t)
	ctx := context.Background()
	misused := func() float64 {
		return testutil.ToFloat64(metrics.IdentityMisuse.WithLabelValues(string(hfv1.MisuseBrokerProofInvalid)))
	}
	misuseBefore := misused()
	// The VM's own agent is held back until its VM is destroyed.
	isos := watchISOs(t, w)
	if _, err := w.EnqueueJobs(1, jobDuration); err != nil {
		t.Fatal(err)
	}
	g := holdAgent(t, w, nil)
	claim := claimOfVM(t, w, g.VMID)

	// The join token arrives in the running VM, and only there.
	var secrets agentconfig.GuestSecrets
	eventually(t, time.Minute, "the join token placed in the running VM", func() error {
		b, _, err := w.Proxmox.GuestFile(ctx, g.VMID, agentconfig.SecretsFile)
		if err != nil {
			return err
		}
		secrets, err = agentconfig.ParseGuestSecrets(b)
		return err
	})
	iso, ok := isos.of(g.VMID)
	if !ok {
		t.Fatalf("the seed ISO of VM %d was never seen on the storage", g.VMID)
	}
	cfg := seedAgentConfig(t, iso)
	sp, _ := cfg["spiffe"].(map[string]any)
	if sp == nil || sp["joinToken"] != nil || cfg["secretsFile"] != agentconfig.SecretsFile {
		t.Fatalf("the seed's spiffe settings: %v; want no joinToken, secretsFile %s", cfg, agentconfig.SecretsFile)
	}
	for _, secret := range []string{secrets.JoinToken, secrets.BrokerProof} {
		if bytes.Contains(iso.Data, []byte(secret)) {
			t.Fatalf("a secret the VM received (%.8s…) is in the bytes of its seed ISO %s", secret, iso.VolID)
		}
		for name, content := range iso.Files {
			if strings.Contains(content, secret) {
				t.Fatalf("a secret the VM received (%.8s…) is in %s on its seed ISO", secret, name)
			}
		}
	}

	// The leaked token, used first: a real spire-agent attests with it
	// and gets the VM's SVID.
	thief := spiretest.StartAgent(t, &spiretest.Server{Server: w.SPIRE}, secrets.JoinToken)
	waitCtx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	svid, err := thief.WaitX509SVID(waitCtx)
	if err != nil {
		t.Fatalf("the thief's agent did not attest with the VM's token: %v", err)
	}
	if svid.ID.String() != claim.Status.Identity.SPIFFEID {
		t.Fatalf("the thief holds %s, want the VM's %s", svid.ID, claim.Status.Identity.SPIFFEID)
	}
	brokerURL, ca, err := w.Broker()
	if err != nil {
		t.Fatal(err)
	}
	status, body := callBroker(t, brokerURL, ca, tlsOf(t, svid), "")
	var ref broker.Refusal
	if err := json.Unmarshal(body, &ref); err != nil || status != http.StatusForbidden || ref.Reason != broker.ReasonBrokerProofInvalid {
		t.Fatalf("the thief's SVID at the broker: %d %s, want 403 %s", status, body, broker.ReasonBrokerProofInvalid)
	}

	// The claim reports it, its identity is evicted, it fails, its VM goes.
	eventually(t, 3*time.Minute, "the stolen claim reported, evicted, failed and its VM destroyed", func() error {
		reasons := claimEvents(t, w)[claim.Name]
		for _, r := range []string{string(hfv1.IdentityStolenReason), "IdentityEvicted", "VMDeleted", "IdentityReleased"} {
			if reasons[r] == "" {
				return fmt.Errorf("no %s event yet (have %v)", r, reasons)
			}
		}
		if d, ok := reasons["CredentialDelivered"]; ok {
			t.Fatalf("the stolen claim got a credential: %s", d)
		}
		return nil
	})
	if got := misused() - misuseBefore; got != 1 {
		t.Errorf("hyperfleet_identity_misuse_total{reason=BrokerProofInvalid} grew by %v, want 1", got)
	}
	select {
	case <-thief.Exited():
	case <-time.After(2 * time.Minute):
		t.Errorf("the thief's agent still runs two minutes after its eviction")
	}
	// No credential was minted for the claim: GitHub knows no runner of it.
	uid8 := strings.ReplaceAll(string(claim.UID), "-", "")[:8]
	st := w.GitHub.State()
	for _, r := range append(st.Runners, st.RemovedRunners...) {
		if strings.Contains(r.Name, uid8) {
			t.Errorf("GitHub has runner %s of the stolen claim (JIT %v)", r.Name, r.JIT)
		}
	}
	// The pool replaces the claim; its VM runs the job.
	waitDone(t, w, 5*time.Minute)
	watch.stop()
	waitNothingOnSPIRE(t, w)
}

// countingServer counts the operator's reads of the trust bundle.
type countingServer struct {
	identity.ServerAPI
	reads *atomic.Int64
}

func (c countingServer) X509Bundle(ctx context.Context) (*x509bundle.Bundle, error) {
	c.reads.Add(1)
	return c.ServerAPI.X509Bundle(ctx)
}

// floodCertificate is a certificate anyone can make: self-signed, with a
// VM's SPIFFE ID of the world's trust domain as its URI SAN.
func floodCertificate(t *testing.T, i int) tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	u, _ := url.Parse(fmt.Sprintf("spiffe://%s/vm/%s/flood-%d/00000000-0000-4000-8000-%012d", devenv.TrustDomain, devenv.Namespace, i, i))
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(int64(i) + 1), Subject: pkix.Name{CommonName: "flood"}, URIs: []*url.URL{u},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

// TestSPIFFEBrokerFlood: 64 clients presenting self-signed certificates
// with a SPIFFE ID of the trust domain (anyone can make them) for a
// minute, while 20 SPIFFE claims go through, make the operator read the
// SPIRE server's trust bundle fewer than 10 times in all, and the 20
// claims get their identity and credential as usual.
func TestSPIFFEBrokerFlood(t *testing.T) {
	const (
		clients = 64
		flood   = time.Minute
		n       = 20
	)
	var reads atomic.Int64
	dial := func(ctx context.Context, c spire.Config) (identity.ServerAPI, error) {
		api, err := spire.Dial(ctx, c)
		if err != nil {
			return nil, err
		}
		return countingServer{ServerAPI: api, reads: &reads}, nil
	}
	delivered := testutil.ToFloat64(metrics.BrokerRequests.WithLabelValues(broker.ReasonDelivered))
	w, watch, _ := startSPIFFEWorld(t, func(o *devenv.Options) { o.SPIREDial = dial })
	brokerURL, ca, err := w.Broker()
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM([]byte(ca))
	readsBefore := reads.Load()
	ctx, stop := context.WithTimeout(context.Background(), flood)
	defer stop()
	var (
		wg                sync.WaitGroup
		answered, refused atomic.Int64
	)
	for i := range clients {
		cert := floodCertificate(t, i)
		wg.Add(1)
		go func() {
			defer wg.Done()
			hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
				TLSClientConfig: &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}}}
			defer hc.CloseIdleConnections()
			for ctx.Err() == nil {
				req, _ := http.NewRequestWithContext(ctx, http.MethodPost, brokerURL, http.NoBody)
				resp, err := hc.Do(req)
				if err != nil {
					continue
				}
				_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
				_ = resp.Body.Close()
				answered.Add(1)
				if resp.StatusCode == http.StatusForbidden {
					refused.Add(1)
				}
			}
		}()
	}
	start := time.Now()
	if _, err := w.EnqueueJobs(n, jobDuration); err != nil {
		t.Fatal(err)
	}
	waitDone(t, w, 10*time.Minute)
	took := time.Since(start)
	wg.Wait()
	watch.stop()
	checkJobs(t, w, watch, n)
	got := reads.Load() - readsBefore
	t.Logf("%d flood requests answered (%d refused 403) in %s; %d jobs done in %s; SPIRE bundle reads: %d",
		answered.Load(), refused.Load(), flood, n, took.Round(time.Second), got)
	if answered.Load() < clients {
		t.Errorf("only %d flood requests were answered: the flood did not happen", answered.Load())
	}
	if got >= 10 {
		t.Errorf("the operator read the SPIRE server's bundle %d times during the flood, want fewer than 10", got)
	}
	if d := testutil.ToFloat64(metrics.BrokerRequests.WithLabelValues(broker.ReasonDelivered)) - delivered; d != n {
		t.Errorf("the broker delivered %v credentials for %d jobs", d, n)
	}
}

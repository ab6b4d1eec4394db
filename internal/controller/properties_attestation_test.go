package controller_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/agentconfig"
	"github.com/hyperfleet/hyperfleet/internal/broker"
	"github.com/hyperfleet/hyperfleet/internal/identity"
	"github.com/hyperfleet/hyperfleet/internal/manager"
	"github.com/hyperfleet/hyperfleet/internal/selfsigned"
	"github.com/hyperfleet/hyperfleet/internal/spire"
	"github.com/hyperfleet/hyperfleet/internal/testworld/identitytest"
	githubsim "github.com/hyperfleet/hyperfleet/internal/testworld/simulator/github"
	"github.com/hyperfleet/hyperfleet/internal/testworld/simulator/github/githubsimtest"
	proxmoxsim "github.com/hyperfleet/hyperfleet/internal/testworld/simulator/proxmox"
)

// attestationWorld is property 14's one world: the operator with its agent
// server (where the credential broker is served), the Proxmox simulator at
// the property tests' latencies, the GitHub simulator that mints the
// runner credentials, the in-memory SPIRE server of example.org that the
// fixture's cluster names (spec.spire), and two SPIRE servers no cluster
// trusts: another CA of example.org (a forger) and one of other.org.
type attestationWorld struct {
	f      *fixture
	sim    *simulator
	gs     *githubsimtest.Server
	spire  *identitytest.Server
	forger *identitytest.Server
	other  *identitytest.Server
	// brokerURL is the broker on the operator's agent server; roots
	// trusts the agent server's certificate.
	brokerURL string
	roots     *x509.CertPool
	// proofs derives broker proofs as the operator does (the same
	// ownership key), for the proofs of other VMs.
	proofs *identity.Issuer
}

func newAttestationWorld(t *testing.T) *attestationWorld {
	t.Helper()
	sim := startSimCapturingSeeds(t, t.TempDir(), func(c *proxmoxsim.Config) {
		c.Latency = propertyLatency()
		c.RefreshInterval = proxmoxsim.Duration(100 * time.Millisecond)
	})
	gs := startGitHub(t)
	w := &attestationWorld{sim: sim, gs: gs, spire: identitytest.NewServer(t, "example.org"),
		forger: identitytest.NewServer(t, "example.org"), other: identitytest.NewServer(t, "other.org"),
		proofs: &identity.Issuer{Keys: testSigner}}
	cert, err := selfsigned.New("127.0.0.1", "localhost")
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile, _, err := cert.WriteDir(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	w.roots = cert.Pool()
	agents := t.TempDir()
	if err := os.WriteFile(filepath.Join(agents, "hyperfleet-agent-linux-amd64"), []byte("\x7fELF stand-in for the agent"), 0o755); err != nil {
		t.Fatal(err)
	}
	op := startOperator(t, operatorOptions{github: gs.Transport, spireDial: identitytest.Dialer(w.spire), maxRetryDelay: time.Second,
		agentServer: &manager.AgentServerOptions{Addr: "127.0.0.1:0", CertFile: certFile, KeyFile: keyFile, Dir: agents, URL: "https://hyperfleet-agent.test:9443"}})
	w.f = newFixture(t, sim, func(c *hfv1.HypervisorCluster) {
		c.Spec.SPIRE = &hfv1.SPIREConfig{
			TrustDomain: "example.org", ServerAddress: "spire.example.org:8081",
			ServerAPI:           hfv1.SPIREServerAPI{AdminSocket: "/run/spire/server/api.sock"},
			JoinTokenTTL:        &hfv1.DurationBounds{Min: &metav1.Duration{Duration: time.Minute}, Max: &metav1.Duration{Duration: 30 * time.Minute}},
			AttestationDeadline: &metav1.Duration{Duration: 10 * time.Minute},
		}
	})
	w.f.useGitHub(gs, nil)
	updateTemplate(t, w.f.template, func(tm *hfv1.HypervisorMachineTemplate) {
		tm.Spec.Attestation = hfv1.Attestation{Method: hfv1.AttestationJoinToken}
	})
	waitTemplate(t, w.f.template, metav1.ConditionTrue, "")
	eventually(t, 30*time.Second, "the agent server listening", func() error {
		if op.components.AgentServer.Addr() == nil {
			return errors.New("not yet")
		}
		return nil
	})
	w.brokerURL = "https://" + op.components.AgentServer.Addr().String() + broker.Path
	return w
}

// answer is what the broker answered one request.
type answer struct {
	status int
	reason string
	resp   broker.Response
}

// ask sends one credential request as a VM's agent does: cert as its TLS
// client certificate (nil: none) and proof in the broker proof header
// ("": none), each over a connection of its own.
func (w *attestationWorld) ask(t failer, cert *tls.Certificate, proof string) answer {
	t.Helper()
	cfg := &tls.Config{RootCAs: w.roots, MinVersion: tls.VersionTLS12}
	if cert != nil {
		cfg.Certificates = []tls.Certificate{*cert}
	}
	hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: cfg, DisableKeepAlives: true}}
	req, err := http.NewRequestWithContext(context.Background(), http.MethodPost, w.brokerURL, nil)
	if err != nil {
		t.Fatalf("broker request: %v", err)
	}
	if proof != "" {
		req.Header.Set(agentconfig.BrokerProofHeader, proof)
	}
	res, err := hc.Do(req)
	if err != nil {
		t.Fatalf("ask the broker: %v", err)
	}
	defer func() { _ = res.Body.Close() }()
	a := answer{status: res.StatusCode}
	if res.StatusCode == http.StatusOK {
		if err := json.NewDecoder(res.Body).Decode(&a.resp); err != nil {
			t.Fatalf("the broker's credential: %v", err)
		}
		return a
	}
	var ref broker.Refusal
	if err := json.NewDecoder(res.Body).Decode(&ref); err != nil || ref.Reason == "" || ref.Message == "" {
		t.Fatalf("a %d without a reason and a message: %+v, %v", res.StatusCode, ref, err)
	}
	a.reason = ref.Reason
	return a
}

// runnersMinted is how many runners the GitHub simulator ever registered
// (removed ones included).
func (w *attestationWorld) runnersMinted() int {
	st := w.gs.Sim.State()
	return len(st.Runners) + len(st.RemovedRunners)
}

// TestAttestationScenario: property 14 against the real API server and
// the running operator, in fixed cases (the property itself, generated
// over both attestation methods and every kind of caller, is
// TestAttestationBrokerProperty in cheapworld_identity_test.go, with the
// broker built directly; the VM's side is internal/agent's
// TestBootstrapServiceProperty and TestBootstrapServiceWithTPM). A claim
// of a template that attests with a join token gets its identity from the
// SPIRE server (its SPIFFE ID recorded) and its join token and broker
// proof in its running VM; the VM attests with the token, obtains its
// X509-SVID and, over mTLS at the operator's agent server, gets exactly
// its claim's runner (the JIT configuration of the runner recorded in the
// claim, registered once on the GitHub simulator); asking again is
// refused (AlreadyIssued), and so is a thief's self-signed certificate of
// the VM's id (InvalidSVID), minting nothing. A template attesting with
// the TPM on a cluster that trusts no TPMs is not Ready
// (TPMNotConfigured, naming spec.spire.tpm) and its claim gets no
// identity.
func TestAttestationScenario(t *testing.T) {
	longScenario(t)
	w := newAttestationWorld(t)
	t.Run("join token", w.joinTokenScenario)
	t.Run("TPM not configured", w.tpmNotConfiguredScenario)
}

func (w *attestationWorld) joinTokenScenario(t *testing.T) {
	ctx := context.Background()
	claim := &hfv1.MachineClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: w.f.namespace, Name: "p14-join-token"},
		Spec:       hfv1.MachineClaimSpec{TemplateRef: hfv1.ObjectName{Name: w.f.template.Name}},
	}
	if err := env.Client.Create(ctx, claim); err != nil {
		t.Fatal(err)
	}
	defer w.removeClaim(t, claim)
	minted := w.runnersMinted()

	var got *hfv1.MachineClaim
	var secrets agentconfig.GuestSecrets
	within(t, 60*time.Second, "the join token of "+claim.Name+" in its running VM", func() error {
		c, err := getClaim(t, claim)
		if err != nil {
			return err
		}
		got = c
		if id := c.Status.Identity; id == nil || id.JoinTokenDeliveredAt == nil || c.Status.VMRef == nil {
			return fmt.Errorf("identity %+v", id)
		}
		b, _, err := w.sim.GuestFile(ctx, int(c.Status.VMRef.VMID), agentconfig.SecretsFile)
		if err != nil {
			return err
		}
		secrets, err = agentconfig.ParseGuestSecrets(b)
		return err
	})
	id, err := spire.VMID(w.spire.TD, got.Namespace, got.Name, string(got.UID))
	if err != nil || got.Status.Identity.SPIFFEID != id.String() {
		t.Fatalf("claim records identity %q, want %s (%v)", got.Status.Identity.SPIFFEID, id, err)
	}
	if want, err := w.proofs.BrokerProof(got); err != nil || secrets.BrokerProof != want {
		t.Fatalf("the VM did not receive its claim's broker proof (%v)", err)
	}
	if !w.spire.Attest(secrets.JoinToken) {
		t.Fatal("the VM could not attest with the join token it received")
	}
	svid, err := w.spire.X509SVID(secrets.JoinToken, id, time.Hour)
	if err != nil {
		t.Fatalf("the VM attested but gets no SVID of %s: %v", id, err)
	}

	// The broker records the request under an optimistic lock and answers
	// 503 Busy when the claim controller wrote the claim in between (its
	// Attested status, say): the agent asks again (broker.deliver), and so
	// does this VM. Asking once failed under make test-stress's contention.
	var a answer
	within(t, 30*time.Second, "the broker's answer to the attested VM", func() error {
		a = w.ask(t, &svid, secrets.BrokerProof)
		if a.status == http.StatusServiceUnavailable && a.reason == broker.ReasonBusy {
			return fmt.Errorf("the VM asked for its credential: %d %s", a.status, a.reason)
		}
		return nil
	})
	if a.status != http.StatusOK {
		t.Fatalf("the VM asked for its credential: %d %s", a.status, a.reason)
	}
	issued, err := getClaim(t, claim)
	if err != nil {
		t.Fatal(err)
	}
	rc, err := githubsim.DecodeJITConfig(a.resp.JITConfig)
	b := issued.Status.Bootstrap
	if err != nil || a.resp.Method != string(hfv1.BootstrapJITConfig) || b == nil || rc.ID != b.RunnerID || rc.Name != b.RunnerName ||
		issued.Status.Identity.CredentialRequestedAt == nil {
		t.Fatalf("the credential (%s, runner %d %q, %v) is not the runner recorded in the claim (%+v)", a.resp.Method, rc.ID, rc.Name, err, b)
	}
	if again := w.ask(t, &svid, secrets.BrokerProof); again.status != http.StatusConflict || again.reason != broker.ReasonAlreadyIssued {
		t.Fatalf("the VM asked again: %d %s, want 409 %s", again.status, again.reason, broker.ReasonAlreadyIssued)
	}
	forged, err := identitytest.SelfSigned(id)
	if err != nil {
		t.Fatal(err)
	}
	if thief := w.ask(t, &forged, ""); thief.status != http.StatusForbidden || thief.reason != broker.ReasonInvalidSVID {
		t.Fatalf("a thief's self-signed certificate of %s: %d %s, want 403 %s", id, thief.status, thief.reason, broker.ReasonInvalidSVID)
	}
	if n := w.runnersMinted() - minted; n != 1 {
		t.Fatalf("%d runners registered on GitHub, want the claim's one", n)
	}
}

// removeClaim deletes the case's claim and waits until it is gone, with
// its identity released on the SPIRE server (no entry, alias or agent
// left), so that the next case starts from nothing.
func (w *attestationWorld) removeClaim(rt failer, claim *hfv1.MachineClaim) {
	if err := env.Client.Delete(context.Background(), claim); err != nil && !apierrors.IsNotFound(err) {
		rt.Fatalf("delete claim %s: %v", claim.Name, err)
	}
	within(rt, 60*time.Second, "claim "+claim.Name+" gone with its identity", func() error {
		if _, err := getClaim(w.f.t, claim); !apierrors.IsNotFound(err) {
			return fmt.Errorf("still there (%w)", err)
		}
		if st := w.spire.State(); len(st.Entries) != 0 || len(st.Aliases) != 0 || len(st.Agents) != 0 {
			return fmt.Errorf("left on the SPIRE server: entries %v aliases %v agents %v", st.Entries, st.Aliases, st.Agents)
		}
		return nil
	})
}

// tpmNotConfiguredScenario: a template attesting with the TPM on a
// cluster without spec.spire.tpm is refused by the operator, naming the
// field, and a claim of it is issued no identity.
func (w *attestationWorld) tpmNotConfiguredScenario(t *testing.T) {
	ctx := context.Background()
	name := "p14-tpm-not-configured"
	tmpl := w.f.template.DeepCopy()
	tmpl.ObjectMeta = metav1.ObjectMeta{Namespace: w.f.namespace, Name: name}
	tmpl.Status = hfv1.HypervisorMachineTemplateStatus{}
	tmpl.Spec.Attestation = hfv1.Attestation{Method: hfv1.AttestationTPM, TPM: &hfv1.TPMAttestation{DevicePath: "/dev/tpmrm0", AddVirtualTPM: true}}
	if err := env.Client.Create(ctx, tmpl); err != nil {
		t.Fatalf("template attesting with the TPM refused by the API: %v", err)
	}
	defer func() { _ = env.Client.Delete(ctx, tmpl) }()
	within(t, 30*time.Second, "template "+name+" not Ready with TPMNotConfigured", func() error {
		got := &hfv1.HypervisorMachineTemplate{}
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(tmpl), got); err != nil {
			return err
		}
		c := hfv1.FindCondition(got.Status.Conditions, hfv1.ReadyCondition)
		if c == nil || c.Status != metav1.ConditionFalse || c.Reason != string(hfv1.TPMNotConfiguredReason) || !strings.Contains(c.Message, "spec.spire.tpm") {
			return fmt.Errorf("Ready = %+v, want False TPMNotConfigured naming spec.spire.tpm", c)
		}
		return nil
	})
	claim := &hfv1.MachineClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: w.f.namespace, Name: name},
		Spec:       hfv1.MachineClaimSpec{TemplateRef: hfv1.ObjectName{Name: name}},
	}
	if err := env.Client.Create(ctx, claim); err != nil {
		t.Fatal(err)
	}
	defer w.removeClaim(t, claim)
	tokens := len(w.spire.State().Created)
	within(t, 30*time.Second, "claim "+name+" refused", func() error {
		c, err := getClaim(t, claim)
		if err != nil {
			return err
		}
		if p := hfv1.FindCondition(c.Status.Conditions, hfv1.MachineClaimProvisionedCondition); p == nil || p.Status != metav1.ConditionFalse {
			return fmt.Errorf("Provisioned = %+v", p)
		}
		if c.Status.Identity != nil && c.Status.Identity.JoinTokenCreatedAt != nil || c.Status.VMRef != nil {
			t.Fatalf("claim %s of a template the operator refuses got identity %+v, VM %+v", name, c.Status.Identity, c.Status.VMRef)
		}
		return nil
	})
	if n := len(w.spire.State().Created); n != tokens {
		t.Fatalf("claim %s of a template the operator refuses: %d join tokens created", name, n-tokens)
	}
}

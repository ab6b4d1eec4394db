package controller_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/agentconfig"
	"github.com/hyperfleet/hyperfleet/internal/manager"
	"github.com/hyperfleet/hyperfleet/internal/testworld/identitytest"
	proxmoxsim "github.com/hyperfleet/hyperfleet/internal/testworld/simulator/proxmox"
)

// spiffeOperator runs the operator with its agent server (where the
// credential broker lives) and an in-memory SPIRE server of trust domain
// example.org; the fixture's cluster names it in spec.spire.
func spiffeOperator(t *testing.T, deadline time.Duration, simConfig ...func(*proxmoxsim.Config)) (*fixture, *identitytest.Server, *operator, *simulator, string) {
	t.Helper()
	seeds := t.TempDir()
	sim := startSimCapturingSeeds(t, seeds, simConfig...)
	gs := startGitHub(t)
	spire := identitytest.NewServer(t, "example.org")
	certFile, keyFile, _ := webhookCertificate(t)
	agents := t.TempDir()
	if err := os.WriteFile(filepath.Join(agents, "hyperfleet-agent-linux-amd64"), []byte("\x7fELF stand-in for the agent"), 0o755); err != nil {
		t.Fatal(err)
	}
	op := startOperator(t, operatorOptions{github: gs.Transport, spireDial: identitytest.Dialer(spire), agentServer: &manager.AgentServerOptions{
		Addr: "127.0.0.1:0", CertFile: certFile, KeyFile: keyFile, Dir: agents, URL: "https://hyperfleet-agent.test:9443",
	}})
	f := newFixture(t, sim, func(c *hfv1.HypervisorCluster) {
		c.Spec.SPIRE = &hfv1.SPIREConfig{
			TrustDomain: "example.org", ServerAddress: "spire.example.org:8081",
			ServerAPI:           hfv1.SPIREServerAPI{AdminSocket: "/run/spire/server/api.sock"},
			JoinTokenTTL:        &hfv1.DurationBounds{Min: &metav1.Duration{Duration: time.Minute}, Max: &metav1.Duration{Duration: 30 * time.Minute}},
			AttestationDeadline: &metav1.Duration{Duration: deadline},
		}
	})
	f.useGitHub(gs, nil)
	return f, spire, op, sim, seeds
}

// TestSPIFFEClaimIdentity: a template that attests is checked against its
// cluster's spec.spire; a claim's identity is issued before its VM is
// built, its VM's cloud-init holds neither the join token nor a runner
// credential, the token and the broker proof reach the running VM through
// its guest agent, the claim is Attested once the token's agent is, and
// deleting the claim removes its entries and agent from the SPIRE server.
// The join token appears nowhere but in the running VM.
func TestSPIFFEClaimIdentity(t *testing.T) {
	f, spire, op, sim, seeds := spiffeOperator(t, 10*time.Minute)
	attest := func(ttl time.Duration) func(*hfv1.HypervisorMachineTemplate) {
		return func(tm *hfv1.HypervisorMachineTemplate) {
			tm.Spec.Attestation = hfv1.Attestation{Method: hfv1.AttestationJoinToken, JoinToken: &hfv1.JoinTokenAttestation{TTL: &metav1.Duration{Duration: ttl}}}
		}
	}
	updateTemplate(t, f.template, attest(2*time.Hour))
	tmpl := waitTemplate(t, f.template, metav1.ConditionFalse, string(hfv1.JoinTokenTTLNotAllowedReason))
	if c := hfv1.FindCondition(tmpl.Status.Conditions, hfv1.ReadyCondition); !strings.Contains(c.Message, "spec.attestation.joinToken.ttl 2h0m0s") || !strings.Contains(c.Message, "1m0s to 30m0s") {
		t.Errorf("the refusal does not name the field and the bounds: %q", c.Message)
	}
	updateTemplate(t, f.template, attest(10*time.Minute))
	waitTemplate(t, f.template, metav1.ConditionTrue, "")
	cluster := &hfv1.HypervisorCluster{}
	if err := env.Client.Get(context.Background(), client.ObjectKeyFromObject(f.cluster), cluster); err != nil {
		t.Fatal(err)
	}
	if c := hfv1.FindCondition(cluster.Status.Conditions, hfv1.HypervisorClusterSPIREConnectedCondition); c == nil || c.Status != metav1.ConditionTrue {
		t.Errorf("SPIREConnected = %+v", c)
	}

	claim := &hfv1.MachineClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: f.namespace, Name: "attested"},
		Spec:       hfv1.MachineClaimSpec{TemplateRef: hfv1.ObjectName{Name: f.template.Name}},
	}
	f.create(claim)
	got := &hfv1.MachineClaim{}
	eventually(t, 60*time.Second, "the claim's join token issued", func() error {
		if err := env.Client.Get(context.Background(), client.ObjectKeyFromObject(claim), got); err != nil {
			return err
		}
		if id := got.Status.Identity; id == nil || id.JoinTokenCreatedAt == nil {
			return fmt.Errorf("status.identity = %+v", id)
		}
		return nil
	})
	id := got.Status.Identity
	if id == nil || id.JoinTokenCreatedAt == nil || id.SPIFFEID != fmt.Sprintf("spiffe://example.org/vm/%s/attested/%s", f.namespace, got.UID) {
		t.Fatalf("status.identity = %+v", id)
	}
	waitClaimProvisioned(t, claim, metav1.ConditionTrue, string(hfv1.ReadyReason))
	eventually(t, 10*time.Second, "Ready says the VM waits for its attestation", func() error {
		c := &hfv1.MachineClaim{}
		if err := env.Client.Get(context.Background(), client.ObjectKeyFromObject(claim), c); err != nil {
			return err
		}
		if r := hfv1.FindCondition(c.Status.Conditions, hfv1.ReadyCondition); !hfv1.HasReason(r, hfv1.AttestationPendingReason) {
			return fmt.Errorf("Ready = %+v", r)
		}
		return nil
	})
	st := spire.State()
	if len(st.Tokens) != 1 || len(st.Entries) != 1 {
		t.Fatalf("SPIRE server holds tokens %v and entries %v, want one of each", st.Tokens, st.Entries)
	}
	var token string
	for tok, alias := range st.Tokens {
		token = tok
		if alias.String() != id.NodeID || st.Created[tok] != 1 {
			t.Errorf("token for %s created %d times, want once for %s", alias, st.Created[tok], id.NodeID)
		}
	}
	if e := st.Entries[id.EntryID]; e.SPIFFEID.String() != id.SPIFFEID || e.ParentID.String() != id.NodeID {
		t.Errorf("entry %+v does not match the claim's identity %+v", e, id)
	}

	// What the VM's seed holds: where its join token will arrive, and
	// neither the token nor a runner credential.
	if err := env.Client.Get(context.Background(), client.ObjectKeyFromObject(claim), got); err != nil {
		t.Fatal(err)
	}
	vmid := got.Status.VMRef.VMID
	cfg := seedAgentConfig(t, seeds, vmid)
	sp, _ := cfg["spiffe"].(map[string]any)
	if cfg["workloadMethod"] != "broker" || cfg["jitConfig"] != nil || cfg["registrationToken"] != nil || sp == nil {
		t.Fatalf("the VM's agent config is not broker mode without a credential: %v", cfg)
	}
	if sp["joinToken"] != nil || cfg["secretsFile"] != agentconfig.SecretsFile || sp["spiffeID"] != id.SPIFFEID || sp["serverAddress"] != "spire.example.org:8081" ||
		sp["brokerURL"] != "https://hyperfleet-agent.test:9443/broker/v1/credential" || !strings.Contains(fmt.Sprint(sp["trustBundle"]), "BEGIN CERTIFICATE") {
		t.Errorf("the VM's SPIFFE settings: %v", sp)
	}
	if seed := seedFiles(t, seeds, vmid); strings.Contains(seed, token) {
		t.Error("the join token is on the VM's seed")
	}
	// The token reaches the running VM only, through its guest agent, with
	// the broker proof.
	var secrets agentconfig.GuestSecrets
	eventually(t, 30*time.Second, "the join token placed in the running VM", func() error {
		b, _, err := sim.GuestFile(context.Background(), int(vmid), agentconfig.SecretsFile)
		if err != nil {
			return err
		}
		secrets, err = agentconfig.ParseGuestSecrets(b)
		return err
	})
	if secrets.JoinToken != token || len(secrets.BrokerProof) != 43 {
		t.Errorf("the VM received token %.8s… and a proof of %d characters, want the created token and a 43-character proof", secrets.JoinToken, len(secrets.BrokerProof))
	}
	eventually(t, 10*time.Second, "the delivery recorded", func() error {
		if err := env.Client.Get(context.Background(), client.ObjectKeyFromObject(claim), got); err != nil {
			return err
		}
		if got.Status.Identity.JoinTokenDeliveredAt == nil {
			return errors.New("status.identity.joinTokenDeliveredAt is not set")
		}
		return nil
	})

	if !spire.Attest(token) {
		t.Fatal("the token the VM received is not the one created")
	}
	got = waitClaimAttested(t, claim, metav1.ConditionTrue, hfv1.AttestedReason)
	if got.Status.Identity.AttestedAt == nil || got.Status.Bootstrap != nil && got.Status.Bootstrap.RunnerName != "" {
		t.Errorf("attested claim: identity %+v bootstrap %+v (no credential before the broker is asked)", got.Status.Identity, got.Status.Bootstrap)
	}
	assertNoCanaries(t, canaryWorld{sim: sim, op: op, seeds: seeds}, token, secrets.BrokerProof)

	if err := env.Client.Delete(context.Background(), claim); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "the claim gone and nothing left on the SPIRE server", func() error {
		if err := env.Client.Get(context.Background(), client.ObjectKeyFromObject(claim), &hfv1.MachineClaim{}); err == nil {
			return errors.New("the claim still exists")
		}
		if st := spire.State(); len(st.Entries) != 0 || len(st.Aliases) != 0 || len(st.Agents) != 0 {
			return fmt.Errorf("left: entries %v aliases %v agents %v", st.Entries, st.Aliases, st.Agents)
		}
		return nil
	})
}

// TestSPIFFEAttestationDeadline: a VM whose agent never attests fails its
// claim at the cluster's deadline, and its VM and SPIRE entries go; while
// the SPIRE server is down new VMs wait (SPIREUnavailable) and nothing is
// built.
func TestSPIFFEAttestationDeadline(t *testing.T) {
	f, spire, _, sim, _ := spiffeOperator(t, 10*time.Second)
	updateTemplate(t, f.template, func(tm *hfv1.HypervisorMachineTemplate) {
		tm.Spec.Attestation = hfv1.Attestation{Method: hfv1.AttestationJoinToken}
	})
	waitTemplate(t, f.template, metav1.ConditionTrue, "")

	claim := &hfv1.MachineClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: f.namespace, Name: "never-attests"},
		Spec:       hfv1.MachineClaimSpec{TemplateRef: hfv1.ObjectName{Name: f.template.Name}},
	}
	f.create(claim)
	waitClaimAttested(t, claim, metav1.ConditionFalse, hfv1.AttestationPendingReason)
	got := waitClaimAttested(t, claim, metav1.ConditionFalse, hfv1.AttestationFailedReason)
	if got.Status.End == nil || !got.Status.End.Failed || !strings.Contains(got.Status.End.Message, "spec.spire.attestationDeadline (10s)") {
		t.Fatalf("end %+v", got.Status.End)
	}
	eventually(t, 30*time.Second, "the VM destroyed and the identity released", func() error {
		c := &hfv1.MachineClaim{}
		if err := env.Client.Get(context.Background(), client.ObjectKeyFromObject(claim), c); err != nil {
			return err
		}
		if c.Status.Identity.ReleasedAt == nil {
			return errors.New("identity not released")
		}
		if st := spire.State(); len(st.Entries) != 0 || len(st.Aliases) != 0 {
			return fmt.Errorf("left: entries %v aliases %v", st.Entries, st.Aliases)
		}
		for _, vm := range sim.VMs() {
			if !vm.Template {
				return fmt.Errorf("VM %d still exists", vm.VMID)
			}
		}
		return nil
	})

	// The server down: a new claim waits, with nothing built.
	spire.Fail(errors.New("connection refused"))
	down := &hfv1.MachineClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: f.namespace, Name: "server-down"},
		Spec:       hfv1.MachineClaimSpec{TemplateRef: hfv1.ObjectName{Name: f.template.Name}},
	}
	f.create(down)
	waitClaimProvisioned(t, down, metav1.ConditionFalse, string(hfv1.SPIREUnavailableReason))
	wantNothingBuilt(t, sim, down)
	if err := env.Client.Delete(context.Background(), down); err != nil {
		t.Fatal(err)
	}
	spire.Fail(nil)

	// A join token that expires before the VM's agent used it (the server
	// says it expired an hour early): the claim fails as soon as its VM is
	// up, not at the deadline, and says why.
	spire.SetClock(func() time.Time { return time.Now().Add(-time.Hour) })
	expired := &hfv1.MachineClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: f.namespace, Name: "expired-token"},
		Spec:       hfv1.MachineClaimSpec{TemplateRef: hfv1.ObjectName{Name: f.template.Name}},
	}
	f.create(expired)
	got = waitClaimAttested(t, expired, metav1.ConditionFalse, hfv1.AttestationFailedReason)
	if c := hfv1.FindCondition(got.Status.Conditions, hfv1.MachineClaimAttestedCondition); !strings.Contains(c.Message, "join token expired") {
		t.Errorf("Attested message %q does not say the token expired", c.Message)
	}
}

// TestSPIFFETemplateNeedsGuestAgent: the join token reaches a VM through
// its guest agent only, as does every VM's runner credential, so a
// template on a hypervisor template without one is refused, naming the
// fix, and nothing is built from it, with attestation or without.
func TestSPIFFETemplateNeedsGuestAgent(t *testing.T) {
	f, spire, _, sim, _ := spiffeOperator(t, 10*time.Minute, func(c *proxmoxsim.Config) {
		for i := range c.Templates {
			c.Templates[i].Agent = false
		}
	})
	tmpl := waitTemplate(t, f.template, metav1.ConditionFalse, string(hfv1.GuestAgentRequiredReason))
	if c := hfv1.FindCondition(tmpl.Status.Conditions, hfv1.ReadyCondition); !strings.Contains(c.Message, "the runner credential reaches only the running VM") {
		t.Errorf("the refusal without attestation does not say why: %q", c.Message)
	}
	updateTemplate(t, f.template, func(tm *hfv1.HypervisorMachineTemplate) {
		tm.Spec.Attestation = hfv1.Attestation{Method: hfv1.AttestationJoinToken}
	})
	eventually(t, 30*time.Second, "the refusal names the attestation", func() error {
		tmpl = waitTemplate(t, f.template, metav1.ConditionFalse, string(hfv1.GuestAgentRequiredReason))
		if c := hfv1.FindCondition(tmpl.Status.Conditions, hfv1.ReadyCondition); !strings.Contains(c.Message, "spec.attestation.method is join-token") {
			return fmt.Errorf("message %q", c.Message)
		}
		return nil
	})
	if c := hfv1.FindCondition(tmpl.Status.Conditions, hfv1.ReadyCondition); !strings.Contains(c.Message, "spec.attestation.method is join-token") ||
		!strings.Contains(c.Message, "--agent enabled=1") {
		t.Errorf("the refusal does not name the field and the fix: %q", c.Message)
	}
	claim := &hfv1.MachineClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: f.namespace, Name: "no-guest-agent"},
		Spec:       hfv1.MachineClaimSpec{TemplateRef: hfv1.ObjectName{Name: f.template.Name}},
	}
	f.create(claim)
	waitClaimProvisioned(t, claim, metav1.ConditionFalse, string(hfv1.TemplateNotReadyReason))
	wantNothingBuilt(t, sim, claim)
	if st := spire.State(); len(st.Tokens) != 0 {
		t.Errorf("join tokens issued for a template that cannot deliver them: %v", st.Tokens)
	}
}

// waitClaimAttested waits for the claim's Attested condition.
func waitClaimAttested(t *testing.T, claim *hfv1.MachineClaim, status metav1.ConditionStatus, reason hfv1.ConditionReason) *hfv1.MachineClaim {
	t.Helper()
	got := &hfv1.MachineClaim{}
	eventually(t, 60*time.Second, fmt.Sprintf("claim %s Attested %s %s", claim.Name, status, reason), func() error {
		if err := env.Client.Get(context.Background(), client.ObjectKeyFromObject(claim), got); err != nil {
			return err
		}
		if c := hfv1.FindCondition(got.Status.Conditions, hfv1.MachineClaimAttestedCondition); c == nil || c.Status != status || c.Reason != string(reason) {
			return fmt.Errorf("Attested = %+v", c)
		}
		return nil
	})
	return got
}

// seedFiles is everything the VM's guest found on its seed (its
// cloud-init ISO), concatenated.
func seedFiles(t *testing.T, seeds string, vmid int32) string {
	t.Helper()
	var all strings.Builder
	entries, err := os.ReadDir(filepath.Join(seeds, strconv.Itoa(int(vmid))))
	if err != nil || len(entries) == 0 {
		t.Fatalf("the seed of VM %d: %v, %d files", vmid, err, len(entries))
	}
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join(seeds, strconv.Itoa(int(vmid)), e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		all.Write(b)
	}
	return all.String()
}

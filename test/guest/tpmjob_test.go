//go:build guest

package guest

import (
	"context"
	"crypto/sha256"
	"crypto/x509"
	"encoding/asn1"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-tpm/legacy/tpm2"
	"github.com/google/go-tpm/tpmutil"
	"github.com/spiffe/go-spiffe/v2/spiffeid"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/spire"
	"github.com/hyperfleet/hyperfleet/internal/testworld/devenv"
	"github.com/hyperfleet/hyperfleet/internal/testworld/swtpm"
)

// TestTPMAndStaticAddressOnRealGuest: one job on one real guest that
// carries two scenarios, because each needs a cold boot (a TPM's state is
// the VM's identity, so a TPM guest cannot resume a shared saved state;
// the static network-config the operator renders is tested only if real
// cloud-init applies it) and a boot under TCG costs a core for one to
// three minutes (docs/guest-snapshots.md): the two checks do not touch
// each other, the TPM's being the guest's identity and the static
// addresses its network.
//
// TPM: the template attests with its TPM (attestation.method tpm,
// addVirtualTPM), the TPM twin of TestSPIFFEOnRealGuest. The VM's virtual
// TPM is a swtpm the Proxmox simulator manufactured with an EK
// certificate from its local CA (the EK CA the world gives the cluster
// and spire-server). The operator places the enrollment and broker proofs
// through the guest agent; the guest's agent creates a DevID in
// /dev/tpmrm0, enrolls it at the operator's /tpm/v1/enroll and
// /tpm/v1/activate (docs/identity.md, "TPM"), and runs the image's
// spire-agent with tpm_devid against the world's spire-server; the broker
// then hands out the runner credential. Checked: the claim recorded the
// TPM (ekFingerprint, devIDFingerprint) and is Attested while the SPIRE
// server lists the agent spiffe://<td>/spire/agent/tpm_devid/<devIDFingerprint>,
// attested with tpm_devid; the recorded EK is the one in the VM's own
// swtpm state (read on the host from its tpmstate0 volume just before the
// operator destroys the VM: the guest image has no tpm2-tools); the
// TPMEnrolled and CredentialDelivered events; no join token was placed
// (nor its delivery recorded in the claim's status); and afterwards the
// SPIRE server holds no entry and, of agents, only that one, banned (a
// tpm_devid agent could attest again with its certificate until it
// expires: the operator bans it, internal/identity).
//
// It is also the simulator's virtual TPM on a real guest (the VM's
// tpmstate0 of version v2.0, as addVirtualTPM writes it): the guest sees a
// TPM 2.0 (tpm_version_major 2 and /dev/tpmrm0, asked through its guest
// agent), the EK certificate in the state is signed by the CA
// TPMEndorsementCA returns, and the state goes with the VM.
// TestRealTPMState in internal/testworld/simulator/proxmox checks the
// state's chain and that it survives restarts without a guest.
//
// Static addresses: the template is dual-stack in network mode static,
// with an IPv4 and an IPv6 IPPool, its guest on a bridge with both
// prefixes (no DHCP server), booted by cloud-init from the operator's
// NoCloud ISO. The guest's own network configuration, read through its
// guest agent (the agent's interface list, ip's addresses and routes,
// resolv.conf) and on its console (cloud-init's network table), is
// exactly the two addresses, prefixes, gateways and the DNS the operator
// allocated (probeDualStack); the claim records both allocations and
// reports both addresses; the IPv6 address carries traffic (the guest
// connects from it to a server on the bridge); the job, the enrollment
// and the attestation run over IPv4. Once the VM is gone both addresses
// are released.
func TestTPMAndStaticAddressOnRealGuest(t *testing.T) {
	img := spireImage(t)
	td := spiffeid.RequireTrustDomainFromString(devenv.TrustDomain)
	opts := devenv.Options{GuestImage: &img, SPIFFE: true, TPM: true}
	dualStack := staticDualStack(t, fmt.Sprintf("hf-tpmstatic-%d", os.Getpid()), &opts)

	var mu sync.Mutex
	// seen is each claim's TPM as the probe saw it while the guest ran
	// (the claim is gone afterwards), with the VM's id.
	type seenTPM struct {
		vmid int
		tpm  hfv1.TPMIdentityStatus
		// joinToken: the status recorded a join token's delivery.
		joinToken bool
	}
	seen := map[string]seenTPM{}
	probe := func(ctx context.Context, w *devenv.World, vmid int, claim hfv1.MachineClaim) error {
		if err := dualStack(ctx, w, vmid, claim); err != nil {
			return err
		}
		if err := guestSeesTPM2(ctx, w, vmid); err != nil {
			return err
		}
		id := claim.Status.Identity
		if id == nil || id.TPM == nil || id.TPM.EKFingerprint == "" || id.TPM.DevIDFingerprint == "" {
			return fmt.Errorf("claim %s has not recorded its TPM: %+v", claim.Name, id)
		}
		if !attested(claim) {
			return fmt.Errorf("claim %s is not Attested: %+v", claim.Name, claim.Status.Conditions)
		}
		agentID := tpmAgentID(td, id.TPM.DevIDFingerprint)
		c, err := spire.Dial(ctx, spire.Config{TrustDomain: td, AdminSocket: w.SPIRE.SocketPath})
		if err != nil {
			return err
		}
		defer func() { _ = c.Close() }()
		a, found, err := c.Agent(ctx, agentID)
		switch {
		case err != nil:
			return err
		case !found:
			return fmt.Errorf("claim %s is Attested but the SPIRE server has no agent %s", claim.Name, agentID)
		case a.AttestationType != "tpm_devid" || a.Banned:
			return fmt.Errorf("agent %s: attestation type %q, banned %t; want tpm_devid, not banned, while the VM runs", agentID, a.AttestationType, a.Banned)
		}
		mu.Lock()
		defer mu.Unlock()
		seen[claim.Name] = seenTPM{vmid: vmid, tpm: *id.TPM.DeepCopy(), joinToken: id.JoinTokenDeliveredAt != nil}
		return nil
	}
	states := &tpmStates{byVM: map[int][]byte{}}
	start := time.Now()
	w, last, tl := runJobs(t, scenario{jobs: 1, opts: opts, probe: probe, onProxmoxRequest: states.observe})
	t.Logf("TPM and static address scenario (world start to the job done) in %s", time.Since(start).Round(time.Second))
	poolsReleased(t, w)

	evs, err := w.ClaimEvents(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	endorsementCA := simulatorEKCA(t, w)
	var agents []spiffeid.ID
	for _, j := range last.Jobs {
		claim := vmOfRunner(j.RunnerName)
		s, ok := seen[claim]
		if !ok {
			t.Errorf("claim %s: never seen Attested with its TPM recorded and its tpm_devid agent on the SPIRE server", claim)
			continue
		}
		agents = append(agents, tpmAgentID(td, s.tpm.DevIDFingerprint))
		if msg, ok := evs[claim]["TPMEnrolled"]; !ok || !strings.Contains(msg, s.tpm.EKFingerprint[:16]) || !strings.Contains(msg, s.tpm.DevIDFingerprint[:16]) {
			t.Errorf("claim %s: TPMEnrolled event %q, want one naming EK %s and DevID %s (events %v)", claim, msg, s.tpm.EKFingerprint, s.tpm.DevIDFingerprint, evs[claim])
		}
		if msg, ok := evs[claim]["CredentialDelivered"]; !ok || !strings.Contains(msg, j.RunnerName) {
			t.Errorf("claim %s: CredentialDelivered event %q, want one naming runner %s (events %v)", claim, msg, j.RunnerName, evs[claim])
		}
		if s.joinToken {
			t.Errorf("claim %s: status.identity.joinTokenDeliveredAt set for a VM that attests with its TPM", claim)
		}
		for value, what := range tl.placed.of(s.vmid) {
			if what == "joinToken" {
				t.Errorf("claim %s: a join token was placed in the VM (%.8s...)", claim, value)
			}
		}
		if _, ok := tl.placed.of(s.vmid)[enrollmentProofOf(tl, claim)]; !ok {
			t.Errorf("claim %s: its enrollment proof was never placed in VM %d (placed: %v)", claim, s.vmid, valuesOf(tl.placed.of(s.vmid)))
		}
		// The EK the operator recorded is the VM's own: the one in the
		// swtpm state its tpmstate0 volume held when it was destroyed.
		state, ok := states.of(s.vmid)
		if !ok {
			t.Errorf("claim %s: VM %d's TPM state was not seen before its destroy", claim, s.vmid)
			continue
		}
		ek, err := ekCertificateOf(state, t.TempDir())
		if err != nil {
			t.Errorf("claim %s: %v", claim, err)
			continue
		}
		if !signedByOneOf(ek, endorsementCA) {
			t.Errorf("claim %s: VM %d's EK certificate (issuer %s) is signed by no certificate of the simulator's TPMEndorsementCA", claim, s.vmid, ek.Issuer)
		}
		if _, ok := w.Proxmox.TPMState(s.vmid); ok {
			t.Errorf("claim %s: VM %d's TPM state outlived the VM", claim, s.vmid)
		}
		sum := sha256.Sum256(ek.Raw)
		if got := hex.EncodeToString(sum[:]); got != s.tpm.EKFingerprint {
			t.Errorf("claim %s: ekFingerprint %s, but VM %d's swtpm holds the EK certificate %s (%s)", claim, s.tpm.EKFingerprint, s.vmid, got, ek.Subject)
		} else {
			t.Logf("claim %s: ekFingerprint %s is VM %d's swtpm EK certificate (issuer %s); agent %s", claim, got, s.vmid, ek.Issuer, tpmAgentID(td, s.tpm.DevIDFingerprint))
		}
	}
	if len(agents) == 0 {
		t.Fatal("no claim attested with its TPM")
	}

	// Afterwards: no entry, and of agents only the VM's, banned.
	eventually(t, time.Minute, "no entry and only the VM's tpm_devid agent, banned, on the SPIRE server", func() error {
		ctx := context.Background()
		left, err := w.SPIRELeftovers(ctx)
		if err != nil {
			return err
		}
		// SPIRELeftovers counts entries and every agent but the banned
		// tpm_devid agents of ended claims: it must be empty, and the
		// server's own list must hold exactly this VM's agent, banned.
		if len(left) > 0 {
			return fmt.Errorf("left: %s", strings.Join(left, "; "))
		}
		c, err := spire.Dial(ctx, spire.Config{TrustDomain: td, AdminSocket: w.SPIRE.SocketPath})
		if err != nil {
			return err
		}
		defer func() { _ = c.Close() }()
		list, err := c.ListAgents(ctx)
		if err != nil {
			return err
		}
		if len(list) != len(agents) {
			return fmt.Errorf("agents %+v, want exactly %v, banned", list, agents)
		}
		for _, a := range list {
			if !containsID(agents, a.ID) || !a.Banned {
				return fmt.Errorf("agent %s (banned %t): want exactly %v, banned", a.ID, a.Banned, agents)
			}
		}
		return nil
	})
}

// guestSeesTPM2: the guest's kernel found a TPM 2.0, asked through its
// guest agent.
func guestSeesTPM2(ctx context.Context, w *devenv.World, vmid int) error {
	res, err := w.Proxmox.GuestExec(ctx, vmid, "cat", "/sys/class/tpm/tpm0/tpm_version_major")
	if err != nil {
		return err
	}
	if res.ExitCode != 0 || strings.TrimSpace(res.Stdout) != "2" {
		return fmt.Errorf("the guest sees no TPM 2.0: tpm_version_major: exit %d, %q %q", res.ExitCode, res.Stdout, res.Stderr)
	}
	res, err = w.Proxmox.GuestExec(ctx, vmid, "test", "-c", "/dev/tpmrm0")
	if err != nil {
		return err
	}
	if res.ExitCode != 0 {
		return fmt.Errorf("/dev/tpmrm0 is not a character device in the guest: %+v", res)
	}
	return nil
}

// simulatorEKCA is the bundle (root and issuing certificate) of the CA
// the Proxmox simulator manufactures its virtual TPMs' EK certificates
// with.
func simulatorEKCA(t *testing.T, w *devenv.World) []*x509.Certificate {
	t.Helper()
	bundle, err := w.Proxmox.TPMEndorsementCA()
	if err != nil {
		t.Fatal(err)
	}
	var certs []*x509.Certificate
	for block, rest := pem.Decode(bundle); block != nil; block, rest = pem.Decode(rest) {
		cert, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			t.Fatalf("TPMEndorsementCA: %v", err)
		}
		certs = append(certs, cert)
	}
	if len(certs) == 0 {
		t.Fatalf("TPMEndorsementCA holds no PEM certificate: %q", bundle)
	}
	return certs
}

// signedByOneOf: cert's signature verifies with the key of one of cas.
func signedByOneOf(cert *x509.Certificate, cas []*x509.Certificate) bool {
	for _, ca := range cas {
		if cert.CheckSignatureFrom(ca) == nil {
			return true
		}
	}
	return false
}

// tpmAgentID is the SPIFFE ID spire-server gives an agent that attested
// with tpm_devid: its DevID certificate's SHA-1 (api/v1alpha1's
// devIDFingerprint) under /spire/agent/tpm_devid.
func tpmAgentID(td spiffeid.TrustDomain, devIDFingerprint string) spiffeid.ID {
	id, err := spiffeid.FromSegments(td, "spire", "agent", "tpm_devid", devIDFingerprint)
	if err != nil {
		panic(err)
	}
	return id
}

func containsID(ids []spiffeid.ID, id spiffeid.ID) bool {
	for _, x := range ids {
		if x == id {
			return true
		}
	}
	return false
}

// enrollmentProofOf is the enrollment proof the timeline derived for
// claim (none when its status never named a TPM).
func enrollmentProofOf(tl *timeline, claim string) string {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	for value, what := range tl.secrets[claim] {
		if what == "enrollmentProof" {
			return value
		}
	}
	return ""
}

// valuesOf names what was placed, without the values.
func valuesOf(m map[string]string) []string {
	var out []string
	for _, what := range m {
		out = append(out, what)
	}
	return out
}

// tpmStates keeps each VM's TPM state as its tpmstate0 volume holds it
// when the operator asks to destroy the VM: the simulator writes the
// swtpm state back into the volume when the VM stops and frees the volume
// with the VM (internal/testworld/simulator/proxmox/realtpm.go).
type tpmStates struct {
	mu   sync.Mutex
	byVM map[int][]byte
}

// destroyPath is a VM's destroy request (DELETE /nodes/<node>/qemu/<vmid>).
var destroyPath = regexp.MustCompile(`/nodes/[^/]+/qemu/([0-9]+)/?$`)

// observe is scenario.onProxmoxRequest: it runs before the simulator
// handles the request, the VM still there.
func (s *tpmStates) observe(w *devenv.World, r *http.Request) {
	m := destroyPath.FindStringSubmatch(r.URL.Path)
	if r.Method != http.MethodDelete || m == nil {
		return
	}
	vmid, _ := strconv.Atoi(m[1])
	state, ok := w.Proxmox.TPMState(vmid)
	if !ok || len(state) == 0 {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.byVM[vmid] = state
}

func (s *tpmStates) of(vmid int) ([]byte, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	state, ok := s.byVM[vmid]
	return state, ok
}

// ekCertificateOf reads the RSA EK certificate (NV index 0x01c00002, as
// internal/tpmdevid reads it in the guest) of a swtpm state: on a copy of
// it, in a swtpm of its own.
func ekCertificateOf(state []byte, dir string) (*x509.Certificate, error) {
	file := filepath.Join(dir, "tpmstate0.raw")
	if err := os.WriteFile(file, state, 0o600); err != nil {
		return nil, err
	}
	tpm, err := swtpm.Start(swtpm.FileScheme+file, dir)
	if err != nil {
		return nil, err
	}
	defer func() { _ = tpm.Stop() }()
	rwc, err := tpm2.OpenTPM(tpm.Socket)
	if err != nil {
		return nil, err
	}
	defer func() { _ = rwc.Close() }()
	raw, err := tpm2.NVRead(rwc, tpmutil.Handle(0x01c00002))
	if err != nil {
		return nil, fmt.Errorf("read the EK certificate of the VM's TPM state: %w", err)
	}
	// The NV index is padded past the DER.
	var der asn1.RawValue
	if _, err := asn1.Unmarshal(raw, &der); err != nil {
		return nil, fmt.Errorf("the EK certificate NV index holds no DER: %w", err)
	}
	return x509.ParseCertificate(der.FullBytes)
}

//go:build e2e && spire

package e2e

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime/multipart"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/agentconfig"
	"github.com/hyperfleet/hyperfleet/internal/broker"
	"github.com/hyperfleet/hyperfleet/internal/identity"
	"github.com/hyperfleet/hyperfleet/internal/manager"
	"github.com/hyperfleet/hyperfleet/internal/metrics"
	"github.com/hyperfleet/hyperfleet/internal/spire"
	"github.com/hyperfleet/hyperfleet/internal/testworld/devenv"
	proxmoxsim "github.com/hyperfleet/hyperfleet/internal/testworld/simulator/proxmox"
	"github.com/hyperfleet/hyperfleet/internal/testworld/swtpm"
	"github.com/hyperfleet/hyperfleet/internal/tpmdevid"
	"github.com/hyperfleet/hyperfleet/internal/tpmenroll"
)

// These scenarios run the loop with TPM attestation (docs/identity.md,
// "TPM"; devenv Options.TPM): every simulated VM has a swtpm virtual TPM
// whose EK certificate the Proxmox simulator's swtpm local CA signed; the
// real hyperfleet-agent in it receives the enrollment proof through the
// guest agent, has the operator certify a DevID key in that TPM, and
// starts a real spire-agent that attests with tpm_devid to a real
// spire-server trusting the same EK CA and DevID CA.

var tpmTD = spiffeid.RequireTrustDomainFromString(devenv.TrustDomain)

// tpmRecord is what a TPM claim showed while it ran.
type tpmRecord struct {
	claim *hfv1.MachineClaim // the latest copy seen
}

// tpmWatch records, while the world runs, every claim's latest state and
// every agent the SPIRE server listed.
type tpmWatch struct {
	mu     sync.Mutex
	claims map[string]*tpmRecord // by UID
	agents map[spiffeid.ID]spire.Agent
}

func watchTPM(t *testing.T, w *devenv.World) *tpmWatch {
	t.Helper()
	ctx := context.Background()
	c, err := spire.Dial(ctx, spire.Config{TrustDomain: tpmTD, AdminSocket: w.SPIRE.SocketPath})
	if err != nil {
		t.Fatal(err)
	}
	tw := &tpmWatch{claims: map[string]*tpmRecord{}, agents: map[spiffeid.ID]spire.Agent{}}
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			tw.sample(ctx, w, c)
			select {
			case <-done:
				return
			case <-time.After(100 * time.Millisecond):
			}
		}
	}()
	t.Cleanup(func() { close(done); wg.Wait(); _ = c.Close() })
	return tw
}

func (tw *tpmWatch) sample(ctx context.Context, w *devenv.World, c *spire.Client) {
	var list hfv1.MachineClaimList
	err := w.API.Client.List(ctx, &list, client.InNamespace(devenv.Namespace))
	agents, aerr := c.ListAgents(ctx)
	tw.mu.Lock()
	defer tw.mu.Unlock()
	if err == nil {
		for i := range list.Items {
			tw.claims[string(list.Items[i].UID)] = &tpmRecord{claim: list.Items[i].DeepCopy()}
		}
	}
	if aerr == nil {
		for _, a := range agents {
			tw.agents[a.ID] = a
		}
	}
}

// TestSPIFFETPMPoolRunsJobs: a pool whose template attests with the VMs'
// TPMs runs its jobs: each claim's VM enrolled its own TPM (the claim
// records its EK and DevID fingerprints), the SPIRE server listed its
// spire-agent as spiffe://<td>/spire/agent/tpm_devid/<DevID fingerprint>,
// the credential came from the broker, and the job completed. The seeds
// held no enrollment proof, broker proof or token. Afterwards nothing is
// left on the SPIRE server but the claims' agents, banned.
func TestSPIFFETPMPoolRunsJobs(t *testing.T) {
	const n = 3
	delivered := testutil.ToFloat64(metrics.BrokerRequests.WithLabelValues(broker.ReasonDelivered))
	enrolled := testutil.ToFloat64(metrics.TPMEnrollmentRequests.WithLabelValues("activate", tpmenroll.ReasonEnrolled))
	w, watch, seeds := startSPIFFEWorld(t, func(o *devenv.Options) { o.TPM = true })
	tw := watchTPM(t, w)
	if _, err := w.EnqueueJobs(n, jobDuration); err != nil {
		t.Fatal(err)
	}
	waitDone(t, w, 10*time.Minute)
	watch.stop()
	checkJobs(t, w, watch, n)

	if got := testutil.ToFloat64(metrics.BrokerRequests.WithLabelValues(broker.ReasonDelivered)) - delivered; got != n {
		t.Errorf("the broker delivered %v credentials for %d jobs", got, n)
	}
	if got := testutil.ToFloat64(metrics.TPMEnrollmentRequests.WithLabelValues("activate", tpmenroll.ReasonEnrolled)) - enrolled; got < n {
		t.Errorf("%v TPM enrollments for %d jobs", got, n)
	}
	waitNothingOnSPIRE(t, w)

	// Every claim that got a credential enrolled its TPM and attested
	// with it.
	evs := claimEvents(t, w)
	ctx := context.Background()
	c, err := spire.Dial(ctx, spire.Config{TrustDomain: tpmTD, AdminSocket: w.SPIRE.SocketPath})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = c.Close() }()
	final, err := c.ListAgents(ctx)
	if err != nil {
		t.Fatal(err)
	}
	banned := map[spiffeid.ID]bool{}
	for _, a := range final {
		banned[a.ID] = a.Banned
	}
	signer, err := manager.LoadOrCreateSigner(ctx, w.API.Client, manager.SignerOptions{Namespace: devenv.SystemNamespace, Name: "hyperfleet-ownership"})
	if err != nil {
		t.Fatal(err)
	}
	issuer := &identity.Issuer{Keys: signer}
	tw.mu.Lock()
	defer tw.mu.Unlock()
	credentials := 0
	for _, rec := range tw.claims {
		claim := rec.claim
		if _, ok := evs[claim.Name]["CredentialDelivered"]; !ok {
			continue
		}
		credentials++
		st := claim.Status.Identity
		if st == nil || st.TPM == nil || st.TPM.EKFingerprint == "" || st.TPM.DevIDFingerprint == "" {
			t.Errorf("claim %s got a credential without a recorded TPM enrollment: %+v", claim.Name, st)
			continue
		}
		id := spire.DevIDAgentID(tpmTD, st.TPM.DevIDFingerprint)
		if a, ok := tw.agents[id]; !ok || a.AttestationType != spire.TPMDevIDAttestor {
			t.Errorf("claim %s: the SPIRE server never listed agent %s attested with tpm_devid (%+v)", claim.Name, id, a)
		}
		t.Logf("claim %s: EK %.16s…, agent %s (banned %v)", claim.Name, st.TPM.EKFingerprint, id, banned[id])
		if !banned[id] {
			t.Errorf("claim %s ended but its agent %s is not banned on the SPIRE server (present: %v)", claim.Name, id, len(final))
		}
		proof, err := issuer.EnrollmentProof(claim)
		if err != nil {
			t.Fatal(err)
		}
		mac := proof[strings.LastIndex(proof, "/")+1:]
		seeds.mu.Lock()
		for path, text := range seeds.texts {
			if strings.Contains(text, mac) {
				t.Errorf("the seed %s holds claim %s's enrollment proof", path, claim.Name)
			}
		}
		seeds.mu.Unlock()
	}
	if credentials < n {
		t.Errorf("saw %d claims with a credential for %d jobs", credentials, n)
	}
	for id, a := range tw.agents {
		if a.AttestationType != spire.TPMDevIDAttestor {
			t.Errorf("agent %s attested with %s, want tpm_devid only", id, a.AttestationType)
		}
	}
	seeds.mu.Lock()
	defer seeds.mu.Unlock()
	if len(seeds.seeds) < n {
		t.Errorf("saw the cloud-init of %d VMs, want at least %d", len(seeds.seeds), n)
	}
	for _, b := range seeds.bad {
		t.Error(b)
	}
}

// TestSPIFFETPMStolenEnrollmentProof: the enrollment proof, computed with
// the operator's key as a thief who took it from the claim's VM would
// hold it, enrolls no other TPM. Presented from a TPM whose EK certificate
// no EK CA of the cluster vouches for, before the claim's own TPM
// enrolled, it is refused (403 EKUntrusted, a TPMEnrollmentRefused event on
// the claim) and changes nothing: the claim's VM then enrolls and attests.
// Presented from a TPM of the cluster's own local CA (another VM's, say)
// after the claim's TPM enrolled, it is refused as TPMMismatch and the
// claim fails with IdentityStolen, getting no credential. The pool's next
// claim runs the job, while a copy of its seed ISO runs on another
// simulated VM with a TPM of the cluster's own CA: that VM's agent waits
// for an enrollment proof that never comes, and enrolls nothing. Every
// agent the SPIRE server listed was a claim's, and nothing is left.
func TestSPIFFETPMStolenEnrollmentProof(t *testing.T) {
	w, watch, _ := startSPIFFEWorld(t, func(o *devenv.Options) { o.TPM = true })
	isos := watchISOs(t, w)
	tw := watchTPM(t, w)
	ctx := context.Background()
	signer, err := manager.LoadOrCreateSigner(ctx, w.API.Client, manager.SignerOptions{Namespace: devenv.SystemNamespace, Name: "hyperfleet-ownership"})
	if err != nil {
		t.Fatal(err)
	}
	issuer := &identity.Issuer{Keys: signer}
	brokerURL, brokerCA, err := w.Broker()
	if err != nil {
		t.Fatal(err)
	}

	// The thieves' TPMs, their DevIDs created before the claim exists so
	// that the second one answers within the window between the claim's
	// enrollment and its attestation.
	untrusted := swtpm.StartForTest(t, swtpm.NewLocalCAForTest(t))
	ca, err := w.Proxmox.TPMLocalCA()
	if err != nil {
		t.Fatal(err)
	}
	trusted := swtpm.StartForTest(t, ca)
	_, untrustedEnrollment, err := tpmdevid.Enroll(untrusted.Socket)
	if err != nil {
		t.Fatal(err)
	}
	_, trustedEnrollment, err := tpmdevid.Enroll(trusted.Socket)
	if err != nil {
		t.Fatal(err)
	}

	// A slow clone: the claim's identity is issued and its VM is being
	// cloned while the untrusted TPM presents the proof.
	w.Proxmox.SetLatency(slowClone())
	if _, err := w.EnqueueJobs(1, jobDuration); err != nil {
		t.Fatal(err)
	}
	var claim *hfv1.MachineClaim
	eventually(t, 2*time.Minute, "a claim with its TPM identity issued and its VM being cloned", func() error {
		var list hfv1.MachineClaimList
		if err := w.API.Client.List(ctx, &list, client.InNamespace(devenv.Namespace)); err != nil {
			return err
		}
		for i, c := range list.Items {
			if id := c.Status.Identity; id != nil && id.TPM != nil && id.TPM.EntriesCreatedAt != nil && id.TPM.EKFingerprint == "" &&
				c.Status.VMRef != nil && !hfv1.IsConditionTrue(c.Status.Conditions, hfv1.MachineClaimProvisionedCondition) {
				claim = list.Items[i].DeepCopy()
				return nil
			}
		}
		return fmt.Errorf("none yet among %d claims", len(list.Items))
	})
	proof, err := issuer.EnrollmentProof(claim)
	if err != nil {
		t.Fatal(err)
	}
	status, refusal := enrollTPM(t, brokerURL, brokerCA, proof, claim.Status.Identity.SPIFFEID, untrustedEnrollment)
	if status != http.StatusForbidden || refusal.Reason != tpmenroll.ReasonEKUntrusted {
		t.Fatalf("an untrusted TPM presenting the claim's proof: HTTP %d %+v, want 403 %s", status, refusal, tpmenroll.ReasonEKUntrusted)
	}
	eventually(t, 30*time.Second, "a TPMEnrollmentRefused event on the claim", func() error {
		if msg := claimEvents(t, w)[claim.Name]["TPMEnrollmentRefused"]; !strings.Contains(msg, tpmenroll.ReasonEKUntrusted) {
			return fmt.Errorf("events: %v", claimEvents(t, w)[claim.Name])
		}
		return nil
	})
	w.Proxmox.SetLatency(quick())

	// The claim's own TPM enrolls (the refusal recorded nothing); the
	// moment it is recorded, the trusted thief presents the proof.
	key := client.ObjectKeyFromObject(claim)
	// Polled fast (eventually polls every 500 ms): the window is the
	// VM's spire-agent start and attestation.
	for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(20 * time.Millisecond) {
		c := &hfv1.MachineClaim{}
		if err := w.API.Client.Get(ctx, key, c); err != nil {
			t.Fatal(err)
		}
		if id := c.Status.Identity; id != nil && id.TPM != nil && id.TPM.EKFingerprint != "" {
			if id.AttestedAt != nil {
				t.Fatal("the claim's VM attested before the thief could present the proof: no window to test")
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the claim's own TPM did not enroll within 2m: %+v", c.Status.Identity)
		}
	}
	status, refusal = enrollTPM(t, brokerURL, brokerCA, proof, claim.Status.Identity.SPIFFEID, trustedEnrollment)
	if status != http.StatusForbidden || refusal.Reason != tpmenroll.ReasonTPMMismatch {
		t.Fatalf("another trusted TPM presenting the claim's proof after its enrollment: HTTP %d %+v, want 403 %s", status, refusal, tpmenroll.ReasonTPMMismatch)
	}
	eventually(t, 3*time.Minute, "the claim failed with IdentityStolen (TPMMismatch) and released its identity", func() error {
		reasons := claimEvents(t, w)[claim.Name]
		if reasons[string(hfv1.IdentityStolenReason)] == "" || reasons["IdentityReleased"] == "" {
			return fmt.Errorf("events: %v", reasons)
		}
		return nil
	})
	if msg, ok := claimEvents(t, w)[claim.Name]["CredentialDelivered"]; ok {
		t.Errorf("claim %s, whose enrollment proof was stolen, got a credential: %s", claim.Name, msg)
	}
	c := &hfv1.MachineClaim{}
	if err := w.API.Client.Get(ctx, key, c); err == nil {
		if m := c.Status.Identity.Misuse; m == nil || m.Reason != hfv1.MisuseTPMMismatch {
			t.Errorf("claim %s records misuse %+v, want %s", claim.Name, m, hfv1.MisuseTPMMismatch)
		}
	}
	// The pool's next claim runs the job. Whoever can read the hypervisor's
	// storage copies its seed onto a VM of their own, with a TPM of the
	// cluster's: that VM's agent waits for an enrollment proof that never
	// comes (the operator places it in the claim's own VM alone, through
	// its guest agent), so it enrolls nothing and attests nowhere.
	next := claimWithVM(t, w, claim.UID)
	var iso proxmoxsim.VolumeState
	eventually(t, time.Minute, fmt.Sprintf("the seed ISO of VM %d", next.Status.VMRef.VMID), func() error {
		var ok bool
		if iso, ok = isos.of(int(next.Status.VMRef.VMID)); !ok {
			return errors.New("not seen")
		}
		return nil
	})
	copyVM := startSeedCopy(t, w, iso)
	eventually(t, 5*time.Minute, "the job completed", func() error {
		snap, err := w.Snapshot(ctx)
		if err != nil {
			return err
		}
		for _, j := range snap.Jobs {
			if j.Status != "completed" {
				return fmt.Errorf("%s", summary(snap))
			}
		}
		return nil
	})
	console, _ := w.Proxmox.Console(copyVM)
	if _, _, err := w.Proxmox.GuestFile(ctx, copyVM, secretsFileOf(t, iso)); err == nil {
		t.Errorf("VM %d, running a copy of claim %s's seed, received the guest secrets; console:\n%s", copyVM, next.Name, console)
	}
	if strings.Contains(string(console), "TPM DevID") {
		t.Errorf("VM %d, running a copy of claim %s's seed, enrolled its TPM; console:\n%s", copyVM, next.Name, console)
	}
	if !strings.Contains(string(console), "hyperfleet-agent") && len(console) == 0 {
		t.Errorf("VM %d, running a copy of claim %s's seed, shows no agent at all", copyVM, next.Name)
	}
	// The copy had a TPM to enroll (the simulator's guests find theirs at
	// <root>/dev/tpmrm0, under the world's guests directory): it lacked
	// the proof, not the TPM.
	if _, err := os.Stat(filepath.Join(w.Dir(), "guests", fmt.Sprintf("vm-%d", copyVM), "root", "dev", "tpmrm0")); err != nil {
		t.Errorf("VM %d has no TPM: %v", copyVM, err)
	}
	t.Logf("VM %d with claim %s's seed copied, console:\n%s", copyVM, next.Name, console)
	waitTask(t, w, w.Proxmox.State().Nodes[0].Name, pveCall(t, w, http.MethodPost, fmt.Sprintf("/nodes/%s/qemu/%d/status/stop", w.Proxmox.State().Nodes[0].Name, copyVM), nil))
	eventually(t, time.Minute, "the seed copy's VM stopped", func() error {
		for _, v := range w.Proxmox.VMs() {
			if v.VMID == copyVM && v.Status != "stopped" {
				return fmt.Errorf("VM %d is %s", copyVM, v.Status)
			}
		}
		return nil
	})
	node := w.Proxmox.State().Nodes[0].Name
	waitTask(t, w, node, pveCall(t, w, http.MethodDelete, fmt.Sprintf("/nodes/%s/qemu/%d", node, copyVM), nil))
	waitTask(t, w, node, pveCall(t, w, http.MethodDelete, fmt.Sprintf("/nodes/%s/storage/local/content/local:iso/seed-copy.iso", node), nil))

	// The failed claim may be kept for inspection; deleting it leaves
	// nothing.
	var list hfv1.MachineClaimList
	if err := w.API.Client.List(ctx, &list, client.InNamespace(devenv.Namespace)); err != nil {
		t.Fatal(err)
	}
	for i := range list.Items {
		if list.Items[i].Status.End != nil && list.Items[i].Status.End.Failed {
			_ = w.API.Client.Delete(ctx, &list.Items[i])
		}
	}
	waitDone(t, w, 5*time.Minute)
	watch.stop()
	waitNothingOnSPIRE(t, w)
	for id, a := range tw.snapshotAgents() {
		if !tw.isClaimAgent(id) {
			t.Errorf("the SPIRE server listed agent %s (%s), which is no claim's TPM", id, a.AttestationType)
		}
	}
	if len(watch.leaks) > 0 {
		t.Errorf("the GitHub PAT appeared in: %v", watch.leaks)
	}
}

// enrollTPM presents an enrollment to the operator's enroll endpoint with
// proof, as a VM's agent does (internal/agent/tpm.go: on the broker URL's
// host, with the broker's CA); it returns the status and the refusal.
func enrollTPM(t *testing.T, brokerURL, ca, proof, spiffeID string, e *tpmdevid.Enrollment) (int, tpmenroll.Refusal) {
	t.Helper()
	u, err := url.Parse(brokerURL)
	if err != nil {
		t.Fatal(err)
	}
	u.Path, u.RawQuery = agentconfig.TPMEnrollPath, ""
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM([]byte(ca)) {
		t.Fatal("the agent server's CA holds no certificate")
	}
	hc := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}}}
	body, err := json.Marshal(agentconfig.TPMEnrollRequest{SPIFFEID: spiffeID, Enrollment: *e})
	if err != nil {
		t.Fatal(err)
	}
	req, err := http.NewRequest(http.MethodPost, u.String(), bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(agentconfig.EnrollmentProofHeader, proof)
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatalf("call %s: %v", u, err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	var r tpmenroll.Refusal
	if resp.StatusCode != http.StatusOK {
		if err := json.Unmarshal(raw, &r); err != nil {
			t.Fatalf("HTTP %d with a body that is no refusal: %q", resp.StatusCode, raw)
		}
	}
	t.Logf("%s: HTTP %d %s %s", filepath.Base(u.Path), resp.StatusCode, r.Reason, r.Message)
	return resp.StatusCode, r
}

func (tw *tpmWatch) snapshotAgents() map[spiffeid.ID]spire.Agent {
	tw.mu.Lock()
	defer tw.mu.Unlock()
	out := map[spiffeid.ID]spire.Agent{}
	for k, v := range tw.agents {
		out[k] = v
	}
	return out
}

// isClaimAgent reports whether id is the tpm_devid agent of a claim seen.
func (tw *tpmWatch) isClaimAgent(id spiffeid.ID) bool {
	tw.mu.Lock()
	defer tw.mu.Unlock()
	for _, rec := range tw.claims {
		if st := rec.claim.Status.Identity; st != nil && st.TPM != nil && st.TPM.DevIDFingerprint != "" &&
			spire.DevIDAgentID(tpmTD, st.TPM.DevIDFingerprint) == id {
			return true
		}
	}
	return false
}

// claimWithVM waits for a claim other than not with a VM, and returns it.
func claimWithVM(t *testing.T, w *devenv.World, not types.UID) *hfv1.MachineClaim {
	t.Helper()
	var found *hfv1.MachineClaim
	eventually(t, 2*time.Minute, "another claim with a VM", func() error {
		var list hfv1.MachineClaimList
		if err := w.API.Client.List(context.Background(), &list, client.InNamespace(devenv.Namespace)); err != nil {
			return err
		}
		for i := range list.Items {
			if c := list.Items[i]; c.UID != not && c.Status.VMRef != nil && c.Status.VMRef.VMID != 0 && c.Status.End == nil {
				found = c.DeepCopy()
				return nil
			}
		}
		return errors.New("none yet")
	})
	return found
}

// secretsFileOf is where the seed's agent waits for its guest secrets.
func secretsFileOf(t *testing.T, iso proxmoxsim.VolumeState) string {
	t.Helper()
	cfg := seedAgentConfig(t, iso)
	f, _ := cfg["secretsFile"].(string)
	if f == "" {
		t.Fatalf("the seed's agent.json names no secretsFile: %v", cfg)
	}
	return f
}

// seedCopyVMID is the VM the seed's copy runs in: outside the cluster's
// spec.proxmox.vmidRange (1000-1999), so that the operator owns nothing
// of it.
const seedCopyVMID = 2900

// startSeedCopy starts, as someone with the hypervisor's API and storage
// access could, a VM of its own cloned from the world's template, with a
// fresh virtual TPM 2.0 (whose EK the cluster's local CA certifies, as
// every VM's on the cluster) and a copy of iso as its seed, and returns
// its VMID.
func startSeedCopy(t *testing.T, w *devenv.World, iso proxmoxsim.VolumeState) int {
	t.Helper()
	node := w.Proxmox.State().Nodes[0].Name
	waitTask(t, w, node, pveCall(t, w, http.MethodPost, fmt.Sprintf("/nodes/%s/qemu/9000/clone", node),
		url.Values{"newid": {fmt.Sprint(seedCopyVMID)}, "name": {"seed-copy"}}))
	var b bytes.Buffer
	mw := multipart.NewWriter(&b)
	_ = mw.WriteField("content", "iso")
	fw, _ := mw.CreateFormFile("filename", "seed-copy.iso")
	_, _ = fw.Write(iso.Data)
	_ = mw.Close()
	waitTask(t, w, node, pveRequest(t, w, http.MethodPost, fmt.Sprintf("/nodes/%s/storage/local/upload", node), mw.FormDataContentType(), &b))
	waitTask(t, w, node, pveCall(t, w, http.MethodPost, fmt.Sprintf("/nodes/%s/qemu/%d/config", node, seedCopyVMID),
		url.Values{"ide3": {"local:iso/seed-copy.iso,media=cdrom"}, "tpmstate0": {"local-lvm:1,version=v2.0"}}))
	waitTask(t, w, node, pveCall(t, w, http.MethodPost, fmt.Sprintf("/nodes/%s/qemu/%d/status/start", node, seedCopyVMID), nil))
	return seedCopyVMID
}

// pveCall calls the Proxmox simulator's API with the world's token and
// returns the answer's data (a task's UPID for asynchronous calls).
func pveCall(t *testing.T, w *devenv.World, method, path string, form url.Values) any {
	t.Helper()
	var body io.Reader
	ctype := ""
	if form != nil {
		body, ctype = strings.NewReader(form.Encode()), "application/x-www-form-urlencoded"
	}
	return pveRequest(t, w, method, path, ctype, body)
}

func pveRequest(t *testing.T, w *devenv.World, method, path, ctype string, body io.Reader) any {
	t.Helper()
	req, err := http.NewRequest(method, w.ProxmoxURL+path, body)
	if err != nil {
		t.Fatal(err)
	}
	if ctype != "" {
		req.Header.Set("Content-Type", ctype)
	}
	id, secret := w.ProxmoxToken()
	req.Header.Set("Authorization", "PVEAPIToken="+id+"="+secret)
	// The simulator's certificate is self-signed on loopback; the
	// operator pins it, this test's caller need not.
	hc := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}} //nolint:gosec // loopback simulator
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("%s %s: HTTP %d %s", method, path, resp.StatusCode, raw)
	}
	var out struct {
		Data any `json:"data"`
	}
	if err := json.Unmarshal(raw, &out); err != nil {
		t.Fatalf("%s %s: %v: %s", method, path, err, raw)
	}
	return out.Data
}

// waitTask waits for the task whose UPID data is, if it is one.
func waitTask(t *testing.T, w *devenv.World, node string, data any) {
	t.Helper()
	upid, ok := data.(string)
	if !ok || !strings.HasPrefix(upid, "UPID:") {
		return
	}
	eventually(t, time.Minute, "task "+upid, func() error {
		st, ok := pveCall(t, w, http.MethodGet, fmt.Sprintf("/nodes/%s/tasks/%s/status", node, url.PathEscape(upid)), nil).(map[string]any)
		if !ok || st["status"] != "stopped" {
			return fmt.Errorf("task %s: %v", upid, st)
		}
		if st["exitstatus"] != "OK" {
			t.Fatalf("task %s ended %v", upid, st["exitstatus"])
		}
		return nil
	})
}

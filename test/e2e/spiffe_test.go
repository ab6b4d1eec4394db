//go:build e2e && spire

package e2e

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/broker"
	"github.com/hyperfleet/hyperfleet/internal/manager"
	"github.com/hyperfleet/hyperfleet/internal/metrics"
	"github.com/hyperfleet/hyperfleet/internal/spire"
	"github.com/hyperfleet/hyperfleet/internal/testworld/devenv"
	proxmoxsim "github.com/hyperfleet/hyperfleet/internal/testworld/simulator/proxmox"
	"github.com/hyperfleet/hyperfleet/internal/testworld/spireworld"
	"github.com/hyperfleet/hyperfleet/test/spiretest"
)

// These scenarios run the loop with SPIFFE identities (make test-spire):
// a real spire-server, and in every simulated VM the real hyperfleet-agent
// starting a real spire-agent with the join token the operator placed in
// the running VM through its guest agent, then fetching its runner
// credential from the operator's broker with its X509-SVID and broker
// proof (docs/identity.md).

// seedWatch records what the VMs' cloud-init gave them: every user-data
// seen, and any that carried a runner credential or lacked the way to
// fetch one (want: the broker's URL, or the secrets store).
type seedWatch struct {
	mu    sync.Mutex
	seeds map[string]bool
	bad   []string
	want  string
	// tpm: the VMs attest with their TPMs, so their agent.json names the
	// TPM device; texts keeps every user-data seen, for the TPM scenario
	// to look for the claims' enrollment proofs in.
	tpm   bool
	texts map[string]string
}

// Where the VMs fetch their credential from, as their agent.json says.
const (
	viaBroker = `"brokerURL"`
	viaStore  = `"secretStore"`
)

// sample reads every guest's seed user-data: it must be broker mode, with
// where the join token will arrive but no join token, the one way to fetch
// the credential that s.want names, and no runner credential of any kind.
func (s *seedWatch) sample(dir string) {
	_ = filepath.WalkDir(filepath.Join(dir, "guests"), func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || d.Name() != "user-data" || !strings.Contains(path, "seed") {
			return nil //nolint:nilerr // guests vanish mid-walk
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return nil //nolint:nilerr // deleted with its VM
		}
		text := string(data)
		s.mu.Lock()
		defer s.mu.Unlock()
		s.seeds[path] = true
		s.texts[path] = text
		forbidden := []string{`"jitConfig"`, `"registrationToken"`, `"joinToken"`, `"enrollmentProof"`, `"brokerProof"`, devenv.PAT}
		if s.want == viaStore {
			forbidden = append(forbidden, viaBroker)
		}
		for _, bad := range forbidden {
			if strings.Contains(text, bad) {
				s.bad = append(s.bad, path+" holds "+bad)
			}
		}
		wants := []string{`"workloadMethod": "broker"`, `"secretsFile"`, `"trustBundle"`, s.want}
		if s.tpm {
			wants = append(wants, `"tpmDevicePath"`)
		}
		for _, want := range wants {
			if !strings.Contains(text, want) {
				s.bad = append(s.bad, path+" lacks "+want)
			}
		}
		return nil
	})
}

func watchSeeds(t *testing.T, dir, want string, tpm bool) *seedWatch {
	s := &seedWatch{seeds: map[string]bool{}, want: want, tpm: tpm, texts: map[string]string{}}
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			s.sample(dir)
			select {
			case <-done:
				return
			case <-time.After(200 * time.Millisecond):
			}
		}
	}()
	t.Cleanup(func() { close(done); wg.Wait() })
	return s
}

// spireLeftovers lists what HyperFleet left on the SPIRE server.
func spireLeftovers(t *testing.T, w *devenv.World) []string {
	t.Helper()
	left, err := w.SPIRELeftovers(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return left
}

// waitNothingOnSPIRE waits until HyperFleet has left nothing on the SPIRE
// server.
func waitNothingOnSPIRE(t *testing.T, w *devenv.World) {
	t.Helper()
	eventually(t, time.Minute, "nothing left on the SPIRE server", func() error {
		if left := spireLeftovers(t, w); len(left) > 0 {
			return fmt.Errorf("%s", strings.Join(left, "; "))
		}
		return nil
	})
}

func startSPIFFEWorld(t *testing.T, options ...func(*devenv.Options)) (*devenv.World, *watcher, *seedWatch) {
	t.Helper()
	// A short directory: each guest's spire-agent socket lives under it,
	// and a unix socket's path is limited to 107 bytes (t.TempDir() is
	// named after the test).
	dir, err := os.MkdirTemp("", "hfe2e")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	opts := devenv.Options{}
	for _, o := range options {
		o(&opts)
	}
	want := viaBroker
	if opts.SecretStore {
		want = viaStore
	}
	w, watch := startWorld(t, append(options, func(o *devenv.Options) { o.SPIFFE = true; o.Dir = dir })...)
	return w, watch, watchSeeds(t, dir, want, opts.TPM)
}

// TestSPIFFEPoolRunsJobs: a pool whose template attests with join tokens
// runs its jobs, each on a fresh VM whose cloud-init holds only the trust
// bundle and the addresses (the join token reaches the running VM); every credential comes from
// the broker, once per VM; afterwards nothing is left, on the SPIRE server
// either.
func TestSPIFFEPoolRunsJobs(t *testing.T) {
	const n = 4
	delivered, already := testutil.ToFloat64(metrics.BrokerRequests.WithLabelValues(broker.ReasonDelivered)),
		testutil.ToFloat64(metrics.BrokerRequests.WithLabelValues(broker.ReasonAlreadyIssued))
	w, watch, seeds := startSPIFFEWorld(t)
	if _, err := w.EnqueueJobs(n, jobDuration); err != nil {
		t.Fatal(err)
	}
	waitDone(t, w, 10*time.Minute)
	watch.stop()
	checkJobs(t, w, watch, n)

	if got := testutil.ToFloat64(metrics.BrokerRequests.WithLabelValues(broker.ReasonDelivered)) - delivered; got != n {
		t.Errorf("the broker delivered %v credentials for %d jobs", got, n)
	}
	if got := testutil.ToFloat64(metrics.BrokerRequests.WithLabelValues(broker.ReasonAlreadyIssued)) - already; got != 0 {
		t.Errorf("%v second requests", got)
	}
	seeds.mu.Lock()
	defer seeds.mu.Unlock()
	if len(seeds.seeds) < n {
		t.Errorf("saw the cloud-init of %d VMs, want at least %d", len(seeds.seeds), n)
	}
	for _, b := range seeds.bad {
		t.Error(b)
	}
	waitNothingOnSPIRE(t, w)
}

// TestSPIFFEAttestationFailuresAndRestart: a VM whose spire-agent cannot
// reach the SPIRE server never attests, and its claim fails at the
// cluster's attestation deadline with AttestationFailed, its VM and
// entries gone; once the server is reachable again the pool's job runs,
// through an operator restart between the join token's creation and the
// VM's start, with no second token and nothing left.
func TestSPIFFEAttestationFailuresAndRestart(t *testing.T) {
	w, watch, _ := startSPIFFEWorld(t)
	ctx := context.Background()
	cluster := &hfv1.HypervisorCluster{}
	if err := w.API.Client.Get(ctx, client.ObjectKey{Name: devenv.ClusterName}, cluster); err != nil {
		t.Fatal(err)
	}
	closed, err := spireworld.FreeLoopbackAddress()
	if err != nil {
		t.Fatal(err)
	}
	good := cluster.Spec.SPIRE.DeepCopy()
	broken := good.DeepCopy()
	broken.ServerAddress = closed.String()
	broken.AttestationDeadline = &metav1.Duration{Duration: 15 * time.Second}
	setSPIRE(t, w, broken)

	if _, err := w.EnqueueJobs(1, jobDuration); err != nil {
		t.Fatal(err)
	}
	// The pool deletes failed claims (it keeps no history here): what
	// happened to them is in their events.
	var failed string
	eventually(t, 3*time.Minute, "a claim failed with AttestationFailed and released its identity", func() error {
		evs := claimEvents(t, w)
		for name, reasons := range evs {
			if strings.Contains(reasons[string(hfv1.AttestationFailedReason)], "did not attest within spec.spire.attestationDeadline") &&
				reasons["IdentityReleased"] != "" && reasons["VMDeleted"] != "" {
				failed = name
				return nil
			}
		}
		return fmt.Errorf("no claim yet among %d with AttestationFailed, VMDeleted and IdentityReleased events", len(evs))
	})
	if msg, ok := claimEvents(t, w)[failed]["CredentialDelivered"]; ok {
		t.Errorf("claim %s, whose VM never attested, got a credential: %s", failed, msg)
	}

	// The server reachable again, with a slow clone: the next claim's
	// token is issued, then the operator restarts before its VM starts.
	w.Proxmox.SetLatency(slowClone())
	setSPIRE(t, w, good)
	eventually(t, 3*time.Minute, "a claim with its join token issued and no VM started", func() error {
		var list hfv1.MachineClaimList
		if err := w.API.Client.List(ctx, &list, client.InNamespace(devenv.Namespace)); err != nil {
			return err
		}
		for _, c := range list.Items {
			if id := c.Status.Identity; id != nil && id.JoinTokenCreatedAt != nil && id.AttestedAt == nil && c.Status.End == nil &&
				!hfv1.IsConditionTrue(c.Status.Conditions, hfv1.MachineClaimProvisionedCondition) {
				return nil
			}
		}
		return fmt.Errorf("none yet among %d claims", len(list.Items))
	})
	t.Log("restarting the operator between token creation and VM start")
	if err := w.StopOperator(); err != nil {
		t.Fatal(err)
	}
	if err := w.StartOperator(ctx); err != nil {
		t.Fatal(err)
	}
	w.Proxmox.SetLatency(quick())
	eventually(t, 5*time.Minute, "the job completed", func() error {
		snap, err := w.Snapshot(ctx)
		if err != nil {
			return err
		}
		for _, j := range snap.Jobs {
			if j.Status == "completed" && j.Conclusion == "success" {
				return nil
			}
		}
		return fmt.Errorf("%s", summary(snap))
	})
	// The failed claim is kept for inspection; deleting it leaves nothing.
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
	if len(watch.leaks) > 0 {
		t.Errorf("the GitHub PAT appeared in: %v", watch.leaks)
	}
}

// setSPIRE replaces the cluster's spec.spire.
func setSPIRE(t *testing.T, w *devenv.World, cfg *hfv1.SPIREConfig) {
	t.Helper()
	ctx := context.Background()
	eventually(t, 30*time.Second, "spec.spire updated", func() error {
		c := &hfv1.HypervisorCluster{}
		if err := w.API.Client.Get(ctx, client.ObjectKey{Name: devenv.ClusterName}, c); err != nil {
			return err
		}
		c.Spec.SPIRE = cfg.DeepCopy()
		return w.API.Client.Update(ctx, c)
	})
}

// quick is the world's own latency model (internal/testworld/devenv); slowClone
// stretches the clone so that a restart fits between the join token's
// creation and the VM's start.
func quick() proxmoxsim.Latency {
	ms := func(n int) proxmoxsim.Duration { return proxmoxsim.Duration(time.Duration(n) * time.Millisecond) }
	return proxmoxsim.Latency{CloneBase: ms(1000), Config: ms(20), Resize: ms(50), Start: ms(200), Boot: ms(2000),
		Stop: ms(100), Shutdown: ms(300), Destroy: ms(300), Upload: ms(50)}
}

func slowClone() proxmoxsim.Latency {
	l := quick()
	l.CloneBase = proxmoxsim.Duration(10 * time.Second)
	return l
}

// claimEvents are the events of the world's claims: by claim name, the
// message of the latest event of each reason.
func claimEvents(t *testing.T, w *devenv.World) map[string]map[string]string {
	t.Helper()
	evs, err := w.ClaimEvents(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return evs
}

// TestSPIFFEReusedJoinToken: a VM whose join token was used before it
// started (here by another agent while the VM was cloned, which the test
// then deletes) is refused
// by SPIRE; its agent gives up and powers the VM off, and the claim ends
// with AttestationFailed, its entries released, no credential issued. The
// pool's next VM runs the job.
func TestSPIFFEReusedJoinToken(t *testing.T) {
	w, watch, _ := startSPIFFEWorld(t)
	ctx := context.Background()
	w.Proxmox.SetLatency(slowClone())
	if _, err := w.EnqueueJobs(1, jobDuration); err != nil {
		t.Fatal(err)
	}
	// The token is derived from the claim's UID and the install's key,
	// as the operator derives it: read the key as the operator does.
	signer, err := manager.LoadOrCreateSigner(ctx, w.API.Client, manager.SignerOptions{Namespace: devenv.SystemNamespace, Name: "hyperfleet-ownership"})
	if err != nil {
		t.Fatal(err)
	}
	var token string
	eventually(t, 2*time.Minute, "a claim's join token issued while its VM is cloned", func() error {
		var list hfv1.MachineClaimList
		if err := w.API.Client.List(ctx, &list, client.InNamespace(devenv.Namespace)); err != nil {
			return err
		}
		for _, c := range list.Items {
			if id := c.Status.Identity; id != nil && id.JoinTokenCreatedAt != nil && !hfv1.IsConditionTrue(c.Status.Conditions, hfv1.MachineClaimProvisionedCondition) {
				token = spire.DeriveJoinToken(signer.DerivedKey("spire join token"), string(c.UID), 1)
				return nil
			}
		}
		return errors.New("none yet")
	})
	// Another agent spends the token before the VM boots; deleting it
	// afterwards leaves the server with no agent for the VM.
	thief := spiretest.StartAgent(t, &spiretest.Server{Server: w.SPIRE}, token)
	waitCtx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if _, err := thief.WaitX509SVID(waitCtx); err != nil {
		t.Fatalf("the test's agent did not attest with the VM's token: %v", err)
	}
	c, err := spire.Dial(ctx, spire.Config{TrustDomain: spiffeid.RequireTrustDomainFromString(devenv.TrustDomain), AdminSocket: w.SPIRE.SocketPath})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = c.Close() }()
	if err := c.DeleteAgent(ctx, spire.JoinTokenAgentID(spiffeid.RequireTrustDomainFromString(devenv.TrustDomain), token)); err != nil {
		t.Fatal(err)
	}
	thief.Stop()
	w.Proxmox.SetLatency(quick())

	eventually(t, 3*time.Minute, "the claim of the reused token ended with AttestationFailed and released its identity", func() error {
		for name, reasons := range claimEvents(t, w) {
			if strings.Contains(reasons[string(hfv1.AttestationFailedReason)], "before its spire-agent attested") && reasons["IdentityReleased"] != "" {
				if d, ok := reasons["CredentialDelivered"]; ok {
					return fmt.Errorf("claim %s got a credential: %s", name, d)
				}
				return nil
			}
		}
		return errors.New("not yet")
	})
	waitDone(t, w, 5*time.Minute)
	watch.stop()
	waitNothingOnSPIRE(t, w)
}

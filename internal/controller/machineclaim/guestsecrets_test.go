package machineclaim

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/record"
	clocktesting "k8s.io/utils/clock/testing"
	ctrl "sigs.k8s.io/controller-runtime"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/agentconfig"
	"github.com/hyperfleet/hyperfleet/internal/testworld/credmethods"
	"github.com/hyperfleet/hyperfleet/pkg/provider"
	"github.com/hyperfleet/hyperfleet/pkg/workload"
)

// guest is a provider whose only method in use is PlaceGuestFile: it
// answers with the next of errs (nil when they ran out) and keeps what it
// wrote.
type guest struct {
	provider.Provider
	errs    []error
	written []provider.GuestFile
}

func (g *guest) PlaceGuestFile(_ context.Context, _ provider.Owner, _ provider.VMRef, f provider.GuestFile) error {
	var err error
	if len(g.errs) > 0 {
		err, g.errs = g.errs[0], g.errs[1:]
	}
	if err == nil {
		// A copy, as a hypervisor's channel takes it: the caller clears
		// the content once the write returns.
		f.Content = slices.Clone(f.Content)
		g.written = append(g.written, f)
	}
	return err
}

// minter issues JIT configurations jit-1, jit-2, ... for runners 1, 2, ...
// and records them as workloads.Platforms does.
type minter struct {
	issued int
	// method is the credential's method; jit-config when empty.
	method workload.Method
}

func (m *minter) RunnerCredential(_ context.Context, claim *hfv1.MachineClaim) (workload.Credential, error) {
	m.issued++
	st := &hfv1.BootstrapStatus{RunnerName: "runner-a", RunnerID: int64(m.issued), CredentialIssuedAt: &metav1.Time{Time: time.Now()}}
	if old := claim.Status.Bootstrap; old != nil {
		st.CredentialRequestedAt = old.CredentialRequestedAt
	}
	claim.Status.Bootstrap = st
	method, prefix := cmp.Or(m.method, credmethods.MethodJIT), "jit"
	if m.method != "" {
		prefix = string(m.method)
	}
	return workload.Credential{Method: method, Secret: workload.NewSecret(fmt.Sprintf("%s-%d", prefix, m.issued)), RunnerName: "runner-a", RunnerID: int64(m.issued)}, nil
}

type fakeIdentity struct{}

func (fakeIdentity) GuestSecrets(*hfv1.MachineClaim) (agentconfig.GuestSecrets, error) {
	return agentconfig.GuestSecrets{JoinToken: "join-token", BrokerProof: "proof"}, nil
}

func runningClaim() *hfv1.MachineClaim {
	c := &hfv1.MachineClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "ci", Name: "runner-a", UID: "uid-a"}}
	c.Status.VMRef = hfv1.NewVMReference("pve", "proxmox://1000", "pve1")
	c.Status.Conditions = []metav1.Condition{{Type: string(hfv1.MachineClaimProvisionedCondition), Status: metav1.ConditionTrue, Reason: "Ready"}}
	return c
}

func service(m Minter, minted *claimMemory) (*secretsService, *record.FakeRecorder) {
	rec := record.NewFakeRecorder(16)
	return &secretsService{Minter: m, Identity: fakeIdentity{}, Memory: minted, Recorder: rec, Clock: clocktesting.NewFakeClock(time.Now()),
		Backoff: func(*hfv1.MachineClaim) time.Duration { return time.Minute }}, rec
}

func placed(t *testing.T, g *guest) agentconfig.GuestSecrets {
	t.Helper()
	if len(g.written) != 1 || g.written[0].Path != agentconfig.SecretsFile {
		t.Fatalf("written %d files (%+v), want one at %s", len(g.written), g.written, agentconfig.SecretsFile)
	}
	doc, err := agentconfig.ParseGuestSecrets(g.written[0].Content)
	if err != nil {
		t.Fatal(err)
	}
	return doc
}

// TestDeliverRunnerCredential: one pass records the request and issues
// the credential (persisted together with the delivery, by the pass's one
// status write); a guest not ready yet is offered the same credential
// again (no second registration); the write is recorded; nothing happens
// after.
func TestDeliverRunnerCredential(t *testing.T) {
	var logged strings.Builder
	ctx := ctrl.LoggerInto(context.Background(), funcr.New(func(prefix, args string) { logged.WriteString(prefix + args + "\n") }, funcr.Options{}))
	claim, m, g := runningClaim(), &minter{}, &guest{errs: []error{fmt.Errorf("not yet: %w", provider.ErrGuestNotReady)}}
	s, rec := service(m, &claimMemory{})

	retry, failure, err := deliver(ctx, s, claim, g)
	if err != nil || failure != "" || retry != guestRetry || m.issued != 1 || len(g.written) != 0 || claim.Status.Bootstrap == nil || claim.Status.Bootstrap.CredentialRequestedAt == nil {
		t.Fatalf("a guest not ready: retry %v, %q, %v, issued %d, written %d, bootstrap %+v; want the request recorded, one credential issued and kept", retry, failure, err, m.issued, len(g.written), claim.Status.Bootstrap)
	}
	if c := hfv1.FindCondition(claim.Status.Conditions, hfv1.MachineClaimBootstrappedCondition); c == nil || c.Reason != string(hfv1.CredentialNotDeliveredReason) {
		t.Errorf("Bootstrapped = %+v, want CredentialNotDelivered", c)
	}
	if retry, failure, err = deliver(ctx, s, claim, g); retry != 0 || failure != "" || err != nil || m.issued != 1 {
		t.Fatalf("delivery: %v %q %v, issued %d; want the first credential placed", retry, failure, err, m.issued)
	}
	if doc := placed(t, g); doc.JITConfig != "jit-1" || doc.JoinToken != "" {
		t.Errorf("placed %+v, want jit-1 alone", doc)
	}
	b := claim.Status.Bootstrap
	if b.CredentialDeliveredAt == nil || b.CredentialRequestedAt == nil || b.RunnerID != 1 {
		t.Errorf("status.bootstrap %+v, want requested, delivered, runner 1", b)
	}
	if c := hfv1.FindCondition(claim.Status.Conditions, hfv1.MachineClaimBootstrappedCondition); c == nil || c.Reason != string(hfv1.CredentialDeliveredReason) {
		t.Errorf("Bootstrapped = %+v, want CredentialDelivered", c)
	}
	// The delivery is a log line for the audit trail, not an event
	// (events.go), and neither carries the secret.
	if len(rec.Events) != 0 {
		t.Errorf("event %q for a routine delivery, want none", <-rec.Events)
	}
	if line := logged.String(); !strings.Contains(line, `"reason"="CredentialDelivered"`) || strings.Contains(line, "jit-1") {
		t.Errorf("log %q, want a CredentialDelivered line without the secret", line)
	}
	if _, ok := s.Memory.mintedFor(claim); ok {
		t.Error("the placed credential is still kept in memory")
	}
	if retry, _, _ = deliver(ctx, s, claim, g); retry != 0 || m.issued != 1 || len(g.written) != 1 {
		t.Errorf("after the delivery: retry %v, issued %d, written %d; want nothing", retry, m.issued, len(g.written))
	}
}

// TestDeliverAfterRestart: an operator that lost the credential it issued
// (a new process: nothing in its memory) issues a new one and places that.
func TestDeliverAfterRestart(t *testing.T) {
	ctx := context.Background()
	claim, m := runningClaim(), &minter{}
	s, _ := service(m, &claimMemory{})
	if _, _, err := deliver(ctx, s, claim, &guest{errs: []error{fmt.Errorf("cut: %w", provider.ErrGuestNotReady)}}); err != nil || m.issued != 1 {
		t.Fatalf("before the restart: %v, issued %d; want one credential, not placed", err, m.issued)
	}
	restarted, _ := service(m, &claimMemory{})
	g := &guest{}
	if _, _, err := deliver(ctx, restarted, claim, g); err != nil || m.issued != 2 {
		t.Fatalf("after the restart: %v, issued %d; want a second credential", err, m.issued)
	}
	if doc := placed(t, g); doc.JITConfig != "jit-2" {
		t.Errorf("placed %q, want the new jit-2", doc.JITConfig)
	}
	// A status write that was lost leaves another runner in the status
	// than the one kept: the kept credential is not used.
	kept := &claimMemory{}
	kept.putMinted(claim.UID, workload.Credential{RunnerName: "runner-a", RunnerID: 99, Secret: workload.NewSecret("stale")})
	if _, ok := kept.mintedFor(claim); ok {
		t.Error("a credential of another runner than the status records was reused")
	}
}

// TestDeliverWhatEachVMNeeds: a claim whose VM got its credential on its
// seed from an operator before the guest channel gets none; a claim that
// attests gets its join token and proof, never a runner credential; a VM
// not running, or a claim ending, gets nothing yet.
func TestDeliverWhatEachVMNeeds(t *testing.T) {
	ctx := context.Background()
	m := &minter{}
	s, _ := service(m, &claimMemory{})

	seeded := runningClaim()
	seeded.Status.Bootstrap = &hfv1.BootstrapStatus{RunnerName: "runner-a", CredentialIssuedAt: &metav1.Time{Time: time.Now()}}
	g := &guest{}
	if retry, _, _ := deliver(ctx, s, seeded, g); retry != 0 || m.issued != 0 || len(g.written) != 0 || seeded.Status.Bootstrap.CredentialRequestedAt != nil {
		t.Errorf("a VM seeded before the guest channel: retry %v, issued %d, written %d", retry, m.issued, len(g.written))
	}

	attests := runningClaim()
	attests.Status.Identity = &hfv1.IdentityStatus{SPIFFEID: "spiffe://example.org/vm/ci/runner-a/uid-a", JoinTokenCreatedAt: &metav1.Time{Time: time.Now()}}
	g = &guest{}
	if _, _, err := deliver(ctx, s, attests, g); err != nil || m.issued != 0 {
		t.Fatalf("a claim that attests: %v, issued %d", err, m.issued)
	}
	if doc := placed(t, g); doc.JoinToken != "join-token" || doc.BrokerProof != "proof" || doc.JITConfig != "" {
		t.Errorf("placed %+v, want the join token and the proof alone", doc)
	}
	if attests.Status.Identity.JoinTokenDeliveredAt == nil || attests.Status.Bootstrap != nil {
		t.Errorf("identity %+v, bootstrap %+v", attests.Status.Identity, attests.Status.Bootstrap)
	}

	booting := runningClaim()
	booting.Status.Conditions = nil
	ending := runningClaim()
	ending.Status.End = &hfv1.MachineClaimEnd{}
	for name, c := range map[string]*hfv1.MachineClaim{"booting": booting, "ending": ending} {
		g := &guest{}
		if retry, _, _ := deliver(ctx, s, c, g); retry != 0 || len(g.written) != 0 || c.Status.Bootstrap != nil {
			t.Errorf("%s: retry %v, written %d, bootstrap %+v; want nothing", name, retry, len(g.written), c.Status.Bootstrap)
		}
	}
}

// TestDeliverRefusals: a VM whose marker does not verify gets nothing and
// the error goes up; one without a guest agent fails the claim; a
// transient failure retries with backoff.
func TestDeliverRefusals(t *testing.T) {
	ctx := context.Background()
	for name, tc := range map[string]struct {
		err         error
		wantErr     bool
		wantFailure string
		wantRetry   time.Duration
	}{
		"not owned":      {err: fmt.Errorf("VM 1000: %w", provider.ErrNotOwned), wantErr: true},
		"no guest agent": {err: provider.Errorf(provider.ClassConfiguration, "NoGuestAgent", "no agent"), wantFailure: "cannot be placed in VM proxmox://1000"},
		"transient":      {err: errors.New("connection reset"), wantRetry: time.Minute},
	} {
		t.Run(name, func(t *testing.T) {
			claim := runningClaim()
			s, _ := service(&minter{}, &claimMemory{})
			retry, failure, err := deliver(ctx, s, claim, &guest{errs: []error{tc.err}})
			if (err != nil) != tc.wantErr || !strings.Contains(failure, tc.wantFailure) || (tc.wantFailure == "") != (failure == "") || retry != tc.wantRetry {
				t.Fatalf("Deliver = %v, %q, %v", retry, failure, err)
			}
			if _, kept := s.Memory.mintedFor(claim); kept != (tc.wantRetry > 0) {
				t.Errorf("credential kept in memory: %v", kept)
			}
			if claim.Status.Bootstrap.CredentialDeliveredAt != nil {
				t.Error("recorded as delivered")
			}
		})
	}
}

// TestDeliverAgentConfig: under delivery proxmox the agent's configuration
// goes through the guest channel too, before the secrets; while the
// guest cannot take it (its directory not made yet) nothing is placed
// and the claim says why; a configuration that cannot be built fails
// the claim when no retry helps.
func TestDeliverAgentConfig(t *testing.T) {
	ctx := context.Background()
	claim, m := runningClaim(), &minter{}
	g := &guest{errs: []error{fmt.Errorf("no directory: %w", provider.ErrGuestNotReady)}}
	s, _ := service(m, &claimMemory{})
	s.AgentConfig = func(context.Context) ([]byte, error) { return []byte(`{"version":1}`), nil }

	retry, failure, err := deliver(ctx, s, claim, g)
	if retry != guestRetry || failure != "" || err != nil || len(g.written) != 0 || m.issued != 0 {
		t.Fatalf("a guest without its directory: retry %v %q %v, written %d, issued %d; want a retry and nothing issued", retry, failure, err, len(g.written), m.issued)
	}
	if c := hfv1.FindCondition(claim.Status.Conditions, hfv1.MachineClaimBootstrappedCondition); c == nil || !strings.Contains(c.Message, "agent configuration") {
		t.Errorf("Bootstrapped = %+v, want it to say the agent configuration waits", c)
	}
	if retry, failure, err = deliver(ctx, s, claim, g); retry != 0 || failure != "" || err != nil {
		t.Fatalf("delivery: %v %q %v", retry, failure, err)
	}
	if len(g.written) != 2 || g.written[0].Path != "/run/hyperfleet/agent.json" || string(g.written[0].Content) != `{"version":1}` || g.written[1].Path != agentconfig.SecretsFile {
		t.Fatalf("written %+v, want the agent configuration, then the secrets", g.written)
	}

	broken, _ := service(m, &claimMemory{})
	broken.AgentConfig = func(context.Context) ([]byte, error) {
		return nil, provider.Errorf(provider.ClassConfiguration, "AgentUnavailable", "no agent served")
	}
	claim2 := runningClaim()
	_, _, _ = deliver(ctx, broken, claim2, &guest{})
	if _, failure, _ := deliver(ctx, broken, claim2, &guest{}); !strings.Contains(failure, "agent configuration") {
		t.Errorf("a configuration that cannot be built: failure %q, want the claim failed naming it", failure)
	}
}

// TestDeliverEachMethod: every credential method a back-end issues reaches
// the VM in the field the agent reads it from (internal/agent's sources):
// GitHub's JIT configuration in jitConfig, a registration token, a
// Buildkite agent token and a GitLab runner authentication token in
// registrationToken.
func TestDeliverEachMethod(t *testing.T) {
	ctx := context.Background()
	for _, method := range []workload.Method{credmethods.MethodJIT, credmethods.MethodRegistrationToken, credmethods.MethodAgentToken, credmethods.MethodRunnerAuthToken} {
		claim, m, g := runningClaim(), &minter{method: method}, &guest{}
		if method == credmethods.MethodJIT {
			m.method = ""
		}
		s, _ := service(m, &claimMemory{})
		for range 3 {
			if _, _, err := deliver(ctx, s, claim, g); err != nil {
				t.Fatalf("%s: %v", method, err)
			}
		}
		doc, secret := placed(t, g), string(method)+"-1"
		if method == credmethods.MethodJIT {
			secret = "jit-1"
		}
		got := doc.RegistrationToken
		if method == credmethods.MethodJIT {
			got = doc.JITConfig
		}
		if got != secret || doc.JITConfig != "" && doc.RegistrationToken != "" {
			t.Errorf("%s: placed %+v, want %s in its field alone", method, doc, secret)
		}
		if st := storedCredential(workload.Credential{Method: method, Secret: workload.NewSecret(secret)}); string(st.Method) != string(method) || st.JITConfig+st.RegistrationToken != secret || st.Validate() != nil && method != credmethods.MethodRegistrationToken {
			t.Errorf("%s: the secret store keeps %#v (%v)", method, st, st.Validate())
		}
	}
}

package machineclaim

import (
	"cmp"
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"
	clocktesting "k8s.io/utils/clock/testing"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/agentconfig"
	"github.com/hyperfleet/hyperfleet/internal/identity"
	"github.com/hyperfleet/hyperfleet/internal/metrics"
	"github.com/hyperfleet/hyperfleet/internal/spire"
	"github.com/hyperfleet/hyperfleet/internal/testworld/identitytest"
)

// identityWorld is serviceWorld with SPIRE: the cluster's spec.spire names
// the in-memory SPIRE server fs, whose clock is the reconciler's.
func identityWorld(t *testing.T) (*Reconciler, *identitytest.Server, *hfv1.HypervisorCluster, *clocktesting.FakeClock, *record.FakeRecorder) {
	t.Helper()
	r, _, clk, rec := serviceWorld(t)
	fs := identitytest.NewServer(t, "example.org")
	fs.SetClock(clk.Now)
	r.Identity.Servers = identity.NewRegistry()
	r.Identity.Servers.Dial = identitytest.Dialer(fs)
	r.Identity.Issuer = &identity.Issuer{Keys: reservationSigner(t, 1)}
	cluster := &hfv1.HypervisorCluster{ObjectMeta: metav1.ObjectMeta{Name: unitCluster}}
	cluster.Spec.SPIRE = &hfv1.SPIREConfig{TrustDomain: "example.org", ServerAddress: "spire.example.org:8081",
		ServerAPI:           hfv1.SPIREServerAPI{AdminSocket: "/run/spire/api.sock"},
		AttestationDeadline: &metav1.Duration{Duration: 10 * time.Minute}}
	return r, fs, cluster, clk, rec
}

// attestingTemplate is a template whose VMs attest with join tokens.
func attestingTemplate() *hfv1.HypervisorMachineTemplate {
	tmpl := &hfv1.HypervisorMachineTemplate{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "debian"}}
	tmpl.Spec.Attestation.Method = hfv1.AttestationJoinToken
	return tmpl
}

// TestIssueIdentity runs the identity service's issue (issueIdentity) for
// a claim still to be built, pass after pass: the ids are planned and
// recorded first, the join token and entry issued in the next pass, then
// the claim goes on to its VM; without SPIRE, or with the server failing,
// it waits with Provisioned saying why.
func TestIssueIdentity(t *testing.T) {
	for name, tc := range map[string]struct {
		tmpl func() *hfv1.HypervisorMachineTemplate
		// noIssuer starts the operator without SPIRE support; fail makes
		// the server fail.
		noIssuer bool
		fail     error
		passes   int
		wantDone bool
		// wantRequeue is the last pass's.
		wantRequeue time.Duration
		// wantProvisioned is the Provisioned reason, "" for none.
		wantProvisioned hfv1.ConditionReason
		wantPlanned     bool
		wantIssued      bool
		wantEvent       string
	}{
		"a template that does not attest": {
			tmpl: func() *hfv1.HypervisorMachineTemplate {
				t := attestingTemplate()
				t.Spec.Attestation.Method = ""
				return t
			},
			passes: 1, wantDone: true,
		},
		"no SPIRE support": {
			tmpl: attestingTemplate, noIssuer: true,
			passes: 1, wantRequeue: 2 * time.Second, wantProvisioned: hfv1.SPIREUnavailableReason,
		},
		"the ids are recorded first": {
			tmpl:   attestingTemplate,
			passes: 1, wantRequeue: time.Millisecond, wantPlanned: true,
		},
		"then the token is issued": {
			tmpl:   attestingTemplate,
			passes: 2, wantRequeue: time.Millisecond, wantPlanned: true, wantIssued: true, wantEvent: "Normal IdentityIssued",
		},
		"then the claim goes on": {
			tmpl:   attestingTemplate,
			passes: 3, wantDone: true, wantPlanned: true, wantIssued: true,
		},
		"the SPIRE server fails": {
			tmpl: attestingTemplate, fail: errors.New("connection refused"),
			passes: 1, wantRequeue: 2 * time.Second, wantProvisioned: hfv1.SPIREUnavailableReason,
		},
	} {
		t.Run(name, func(t *testing.T) {
			r, fs, cluster, _, rec := identityWorld(t)
			if tc.noIssuer {
				r.Identity.Issuer = nil
			}
			if tc.fail != nil {
				fs.Fail(tc.fail)
			}
			c := unitClaim("runner-1", 0)
			tmpl := tc.tmpl()
			var done bool
			var requeue time.Duration
			for i := range tc.passes {
				var err error
				inScope(r, &c, func(s *claimScope) { done, requeue, err = r.Identity.issue(context.Background(), s, tmpl, cluster) })
				if err != nil {
					t.Fatalf("pass %d: %v", i, err)
				}
			}
			if done != tc.wantDone || requeue != tc.wantRequeue {
				t.Errorf("issueIdentity = %v, %s; want %v, %s", done, requeue, tc.wantDone, tc.wantRequeue)
			}
			prov := hfv1.FindCondition(c.Status.Conditions, hfv1.MachineClaimProvisionedCondition)
			switch {
			case tc.wantProvisioned == "" && prov != nil:
				t.Errorf("Provisioned = %+v, want none", prov)
			case tc.wantProvisioned != "" && (prov == nil || prov.Reason != string(tc.wantProvisioned)):
				t.Errorf("Provisioned = %+v, want reason %s", prov, tc.wantProvisioned)
			}
			st := c.Status.Identity
			if planned := st != nil && strings.HasPrefix(st.SPIFFEID, "spiffe://example.org/"); planned != tc.wantPlanned {
				t.Errorf("status.identity = %+v, want the ids planned: %v", st, tc.wantPlanned)
			}
			issued := st != nil && st.JoinTokenCreatedAt != nil
			if issued != tc.wantIssued || len(fs.State().Tokens) != map[bool]int{true: 1}[tc.wantIssued] {
				t.Errorf("token recorded %v, server tokens %d; want issued %v", issued, len(fs.State().Tokens), tc.wantIssued)
			}
			if events := drainEvents(rec); tc.wantEvent != "" && !hasEvent(events, tc.wantEvent) {
				t.Errorf("events %q, want one %q", events, tc.wantEvent)
			}
			if issued && !st.JoinTokenExpiresAt.Time.Equal(unitEpoch.Add(defaultJoinTokenTTL)) {
				t.Errorf("token expires at %s, want %s", st.JoinTokenExpiresAt, unitEpoch.Add(defaultJoinTokenTTL))
			}
		})
	}
}

// TestAwaitAttestation runs the identity service's attestation check
// (awaitAttestation) on a running claim whose token was issued: it waits
// for the agent (rechecking within 3 s) until the cluster's deadline, or
// until the token expires if that comes first, and then fails the claim;
// an agent that attested with the token makes the claim Attested.
func TestAwaitAttestation(t *testing.T) {
	for name, tc := range map[string]struct {
		// after is how long after the VM became Provisioned the check runs.
		after time.Duration
		// ttl is the join token's lifetime.
		ttl          time.Duration
		attest       bool
		wantRecheck  time.Duration
		wantFailure  string
		wantAttested metav1.ConditionStatus
		wantReason   hfv1.ConditionReason
		wantEvent    string
	}{
		"waiting for the agent": {
			after: time.Minute, ttl: 15 * time.Minute,
			wantRecheck: attestationRecheck, wantAttested: metav1.ConditionFalse, wantReason: hfv1.AttestationPendingReason,
		},
		"the agent attested": {
			after: time.Minute, ttl: 15 * time.Minute, attest: true,
			wantAttested: metav1.ConditionTrue, wantReason: hfv1.AttestedReason, wantEvent: "Normal Attested",
		},
		"past the cluster's deadline": {
			after: 11 * time.Minute, ttl: 15 * time.Minute,
			wantFailure: "did not attest within spec.spire.attestationDeadline", wantAttested: metav1.ConditionFalse,
			wantReason: hfv1.AttestationFailedReason, wantEvent: "Warning AttestationFailed",
		},
		"the token expired first": {
			after: 6 * time.Minute, ttl: 5 * time.Minute,
			wantFailure: "join token expired", wantAttested: metav1.ConditionFalse,
			wantReason: hfv1.AttestationFailedReason, wantEvent: "Warning AttestationFailed",
		},
	} {
		t.Run(name, func(t *testing.T) {
			r, fs, cluster, clk, rec := identityWorld(t)
			c := unitClaim("runner-1", 0)
			tmpl := attestingTemplate()
			tmpl.Spec.Attestation.JoinToken = &hfv1.JoinTokenAttestation{TTL: &metav1.Duration{Duration: tc.ttl}}
			for range 2 {
				var err error
				inScope(r, &c, func(s *claimScope) { _, _, err = r.Identity.issue(context.Background(), s, tmpl, cluster) })
				if err != nil {
					t.Fatal(err)
				}
			}
			c.Status.Conditions = append(c.Status.Conditions, metav1.Condition{Type: string(hfv1.MachineClaimProvisionedCondition),
				Status: metav1.ConditionTrue, Reason: string(hfv1.ReadyReason), LastTransitionTime: metav1.NewTime(unitEpoch)})
			if tc.attest {
				token, err := r.Identity.Issuer.Token(&c)
				if err != nil || !fs.Attest(token) {
					t.Fatalf("the agent cannot attest with the claim's token (%v)", err)
				}
			}
			drainEvents(rec)
			clk.Step(tc.after)
			var recheck time.Duration
			var failure string
			inScope(r, &c, func(s *claimScope) { recheck, failure = r.Identity.awaitAttestation(context.Background(), s, cluster) })
			if recheck != tc.wantRecheck || !strings.Contains(failure, tc.wantFailure) || (tc.wantFailure == "") != (failure == "") {
				t.Errorf("awaitAttestation = %s, %q; want %s, %q", recheck, failure, tc.wantRecheck, tc.wantFailure)
			}
			att := hfv1.FindCondition(c.Status.Conditions, hfv1.MachineClaimAttestedCondition)
			if att == nil || att.Status != tc.wantAttested || att.Reason != string(tc.wantReason) {
				t.Errorf("Attested = %+v, want %s %s", att, tc.wantAttested, tc.wantReason)
			}
			if events := drainEvents(rec); tc.wantEvent != "" && !hasEvent(events, tc.wantEvent) {
				t.Errorf("events %q, want one %q", events, tc.wantEvent)
			}
		})
	}
}

// tpmTemplate is a template whose VMs attest with their TPM.
func tpmTemplate() *hfv1.HypervisorMachineTemplate {
	tmpl := &hfv1.HypervisorMachineTemplate{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "debian-tpm"}}
	tmpl.Spec.Attestation = hfv1.Attestation{Method: hfv1.AttestationTPM, TPM: &hfv1.TPMAttestation{AddVirtualTPM: true}}
	return tmpl
}

// TestIssueTPMIdentity: a TPM claim plans its identity with a TPM record,
// then gets its alias entry (parent the server, selecting its DevID's
// common name) and its registration entry under the alias, both with the
// install's hint; no join token is created. Its guest secrets are the
// enrollment proof and the broker proof.
func TestIssueTPMIdentity(t *testing.T) {
	r, fs, cluster, _, rec := identityWorld(t)
	r.Identity.Issuer = &identity.Issuer{Keys: reservationSigner(t, 1), Install: "hf1"}
	c := unitClaim("runner-1", 0)
	for pass := range 3 {
		var done bool
		var err error
		inScope(r, &c, func(s *claimScope) { done, _, err = r.Identity.issue(context.Background(), s, tpmTemplate(), cluster) })
		if err != nil || done != (pass == 2) {
			t.Fatalf("pass %d: done %v, err %v", pass, done, err)
		}
	}
	st := c.Status.Identity
	if st == nil || st.TPM == nil || st.TPM.EntriesCreatedAt == nil || !st.Issued() || st.JoinTokenCreatedAt != nil {
		t.Fatalf("status.identity = %+v", st)
	}
	// The ownership key its secrets are derived from is recorded with
	// the plan, so that a key rotation changes none of them.
	if st.KeyID == nil || int(*st.KeyID) != r.Identity.Issuer.Keys.SigningKeyID() {
		t.Errorf("status.identity.keyID = %v, want the signing key %d", st.KeyID, r.Identity.Issuer.Keys.SigningKeyID())
	}
	state := fs.State()
	if len(state.Tokens) != 0 {
		t.Errorf("join tokens created for a TPM claim: %v", state.Tokens)
	}
	entries, _ := fs.ListEntries(context.Background())
	byID := map[string]spire.Entry{}
	for _, e := range entries {
		byID[e.ID] = e
	}
	uid := string(c.UID)
	alias, vm := byID[spire.AliasEntryIDFor(uid)], byID[spire.EntryIDFor(uid)]
	if alias.SPIFFEID.String() != st.NodeID || alias.ParentID.String() != "spiffe://example.org/spire/server" ||
		len(alias.Selectors) != 1 || alias.Selectors[0] != spire.DevIDSelector(uid) || alias.Hint != spire.InstallHint("hf1") {
		t.Errorf("alias entry %+v", alias)
	}
	if vm.SPIFFEID.String() != st.SPIFFEID || vm.ParentID.String() != st.NodeID || vm.Hint != spire.InstallHint("hf1") {
		t.Errorf("registration entry %+v", vm)
	}
	if events := drainEvents(rec); !hasEvent(events, "Normal IdentityIssued") {
		t.Errorf("events %q", events)
	}
	doc, err := r.Identity.Issuer.GuestSecrets(&c)
	if err != nil || doc.JoinToken != "" || doc.EnrollmentProof == "" || doc.BrokerProof == "" {
		t.Errorf("guest secrets %+v, %v; want an enrollment proof and a broker proof, no token", doc, err)
	}
}

// attestationErrors is what VMs reported, by claim UID.
type attestationErrors map[types.UID]string

func (a attestationErrors) Error(uid types.UID, _ time.Time) string { return a[uid] }

// TestTPMGaveUp: a TPM claim's VM that powered off before attesting ends
// with the reason its power-off notice gave: TPMNotFound for a VM without
// a TPM, TPMEnrollmentRefused for one the operator refused,
// AttestationFailed otherwise; each is counted.
func TestTPMGaveUp(t *testing.T) {
	for said, want := range map[string]hfv1.ConditionReason{
		agentconfig.AttestationTPMNotFound:          hfv1.TPMNotFoundReason,
		agentconfig.AttestationTPMEnrollmentRefused: hfv1.TPMEnrollmentRefusedReason,
		"": hfv1.AttestationFailedReason,
	} {
		t.Run(cmp.Or(said, "nothing said"), func(t *testing.T) {
			r, _, cluster, _, rec := identityWorld(t)
			r.Identity.Issuer = &identity.Issuer{Keys: reservationSigner(t, 1)}
			c := unitClaim("runner-1", 0)
			for range 2 {
				inScope(r, &c, func(s *claimScope) { _, _, _ = r.Identity.issue(context.Background(), s, tpmTemplate(), cluster) })
			}
			r.Identity.AttestationErrors = attestationErrors{c.UID: said}
			before := testutil.ToFloat64(metrics.AttestationFailures.WithLabelValues("tpm", string(want)))
			drainEvents(rec)
			var reason hfv1.ConditionReason
			var msg string
			inScope(r, &c, func(s *claimScope) {
				msg, reason = r.Identity.joinTokenGaveUp(context.Background(), s, cluster, "VM powered off")
			})
			if reason != want {
				t.Errorf("reason %s (%q), want %s", reason, msg, want)
			}
			att := hfv1.FindCondition(c.Status.Conditions, hfv1.MachineClaimAttestedCondition)
			if att == nil || att.Reason != string(want) {
				t.Errorf("Attested = %+v, want reason %s", att, want)
			}
			if events := drainEvents(rec); !hasEvent(events, "Warning "+string(want)) {
				t.Errorf("events %q", events)
			}
			if got := testutil.ToFloat64(metrics.AttestationFailures.WithLabelValues("tpm", string(want))); got != before+1 {
				t.Errorf("attestation_failures_total{tpm,%s} = %v, want %v", want, got, before+1)
			}
		})
	}
}

// TestGenericIdentitySelectsTheScriptUser: a generic claim's registration
// entry selects its script's user by name, the same value the claim's
// agent config carries (scriptUser), the operator's default when none is
// configured; a GitHub claim's entry keeps the agent's uid.
func TestGenericIdentitySelectsTheScriptUser(t *testing.T) {
	for name, tc := range map[string]struct {
		generic    bool
		scriptUser string
		want       string
	}{
		"generic":               {generic: true, scriptUser: "batch", want: "unix:user:batch"},
		"generic, default user": {generic: true, want: "unix:user:" + agentconfig.DefaultRunnerUser},
		"github keeps the uid":  {scriptUser: "batch", want: "unix:uid:0"},
	} {
		t.Run(name, func(t *testing.T) {
			r, fs, cluster, _, _ := identityWorld(t)
			r.CI, r.Identity.ScriptUser = &ciDouble{}, tc.scriptUser
			tmpl := attestingTemplate()
			if tc.generic {
				tmpl.Spec.Bootstrap.Generic = &hfv1.GenericBootstrap{Script: "echo hello"}
			} else {
				tmpl.Spec.Bootstrap.GitHub = &hfv1.GitHubBootstrap{}
			}
			c := unitClaim("runner-1", 0)
			for range 2 {
				inScope(r, &c, func(s *claimScope) { _, _, _ = r.Identity.issue(context.Background(), s, tmpl, cluster) })
			}
			entries, _ := fs.ListEntries(context.Background())
			var got []string
			for _, e := range entries {
				if e.ID == spire.EntryIDFor(string(c.UID)) {
					for _, s := range e.Selectors {
						got = append(got, s.String())
					}
				}
			}
			if len(got) != 1 || got[0] != tc.want {
				t.Errorf("entry selectors %v, want [%s]", got, tc.want)
			}
			// The agent config's user is the same value.
			if want, _ := strings.CutPrefix(tc.want, "unix:user:"); tc.generic && r.Identity.scriptUser(r.workloads(), tmpl) != want {
				t.Errorf("scriptUser = %q, want %q", r.Identity.scriptUser(r.workloads(), tmpl), want)
			} else if !tc.generic && r.Identity.scriptUser(r.workloads(), tmpl) != "" {
				t.Errorf("scriptUser of a GitHub template = %q, want none", r.Identity.scriptUser(r.workloads(), tmpl))
			}
		})
	}
}

package controller_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/agentconfig"
	"github.com/hyperfleet/hyperfleet/internal/testworld/identitytest"
)

// attestingClaim creates a claim of f's attesting template and waits until
// its join token is in its running VM; it returns the claim and the token.
func attestingClaim(t *testing.T, f *fixture, sim *simulator, name string) (*hfv1.MachineClaim, string) {
	t.Helper()
	claim := &hfv1.MachineClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: f.namespace, Name: name},
		Spec:       hfv1.MachineClaimSpec{TemplateRef: hfv1.ObjectName{Name: f.template.Name}},
	}
	f.create(claim)
	got := &hfv1.MachineClaim{}
	var token string
	eventually(t, 60*time.Second, "the join token of "+name+" in its running VM", func() error {
		if err := env.Client.Get(context.Background(), client.ObjectKeyFromObject(claim), got); err != nil {
			return err
		}
		if got.Status.Identity == nil || got.Status.Identity.JoinTokenDeliveredAt == nil || got.Status.VMRef == nil {
			return fmt.Errorf("identity %+v", got.Status.Identity)
		}
		b, _, err := sim.GuestFile(context.Background(), int(got.Status.VMRef.VMID), agentconfig.SecretsFile)
		if err != nil {
			return err
		}
		s, err := agentconfig.ParseGuestSecrets(b)
		token = s.JoinToken
		return err
	})
	return got, token
}

// waitStolen waits until the claim failed with IdentityStolen, its VM is
// destroyed and its identity released, and checks that the thief's agent
// was evicted (banned, the entries deleted) before the release.
func waitStolen(t *testing.T, claim *hfv1.MachineClaim, spire *identitytest.Server, sim *simulator, reason hfv1.IdentityMisuseReason) *hfv1.MachineClaim {
	t.Helper()
	got := waitClaimAttested(t, claim, metav1.ConditionFalse, hfv1.IdentityStolenReason)
	m := got.Status.Identity.Misuse
	if m == nil || m.Reason != reason || got.Status.End == nil || !got.Status.End.Failed || !strings.Contains(got.Status.End.Message, "used by someone other than the VM") {
		t.Fatalf("misuse %+v, end %+v; want a %s misuse and a failed claim saying why", m, got.Status.End, reason)
	}
	eventually(t, 30*time.Second, "the stolen identity evicted, the VM destroyed, the identity released", func() error {
		c := &hfv1.MachineClaim{}
		if err := env.Client.Get(context.Background(), client.ObjectKeyFromObject(claim), c); err != nil {
			return err
		}
		if c.Status.Identity.Misuse.EvictedAt == nil || c.Status.Identity.ReleasedAt == nil {
			return fmt.Errorf("misuse %+v, released %v", c.Status.Identity.Misuse, c.Status.Identity.ReleasedAt)
		}
		if st := spire.State(); len(st.Entries) != 0 || len(st.Aliases) != 0 || len(st.Agents) != 0 {
			return fmt.Errorf("left on the SPIRE server: entries %v aliases %v agents %v", st.Entries, st.Aliases, st.Agents)
		}
		for _, vm := range sim.VMs() {
			if !vm.Template {
				return fmt.Errorf("VM %d still exists", vm.VMID)
			}
		}
		return nil
	})
	if c := hfv1.FindCondition(got.Status.Conditions, hfv1.ReadyCondition); c == nil || c.Status != metav1.ConditionFalse {
		t.Errorf("Ready = %+v", c)
	}
	return got
}

// TestSPIFFEStolenIdentityFailsTheClaim: a misuse of a claim's identity
// (here recorded as the credential broker records a valid SVID presented
// without the VM's broker proof) bans the agent that attested with the
// claim's join token and deletes its entries before anything else, fails
// the claim with IdentityStolen (Attested False, a Warning event from the
// broker) and destroys its VM; the claim, Attested by the thief's agent,
// never got a credential.
func TestSPIFFEStolenIdentityFailsTheClaim(t *testing.T) {
	f, spire, _, sim, _ := spiffeOperator(t, 10*time.Minute)
	updateTemplate(t, f.template, func(tm *hfv1.HypervisorMachineTemplate) {
		tm.Spec.Attestation = hfv1.Attestation{Method: hfv1.AttestationJoinToken}
	})
	waitTemplate(t, f.template, metav1.ConditionTrue, "")
	claim, token := attestingClaim(t, f, sim, "stolen-at-broker")
	// The thief attests first with the token it stole elsewhere; the
	// claim looks Attested, as it did before.
	if !spire.Attest(token) {
		t.Fatal("the thief could not attest with the claim's token")
	}
	waitClaimAttested(t, claim, metav1.ConditionTrue, hfv1.AttestedReason)
	// The broker finds the thief's SVID without the proof and records it.
	if err := retry.RetryOnConflict(conflictRetry, func() error {
		c := &hfv1.MachineClaim{}
		if err := env.Client.Get(context.Background(), client.ObjectKeyFromObject(claim), c); err != nil {
			return err
		}
		c.Status.Identity.Misuse = &hfv1.IdentityMisuse{Reason: hfv1.MisuseBrokerProofInvalid, DetectedAt: metav1.Now(),
			Message: "a valid X509-SVID was presented to the credential broker from 192.0.2.66:4444 without a broker proof"}
		return env.Client.Status().Update(context.Background(), c)
	}); err != nil {
		t.Fatal(err)
	}
	got := waitStolen(t, claim, spire, sim, hfv1.MisuseBrokerProofInvalid)
	if got.Status.Identity.CredentialRequestedAt != nil || got.Status.Bootstrap != nil && got.Status.Bootstrap.RunnerName != "" {
		t.Errorf("a credential was issued for a stolen identity: identity %+v bootstrap %+v", got.Status.Identity, got.Status.Bootstrap)
	}
	if st := spire.State(); len(st.Banned) != 0 {
		t.Errorf("banned agents left after the release: %v", st.Banned)
	}
}

// TestSPIFFEReusedTokenReported: a VM that powers off saying, in its
// power-off notice, that the SPIRE server refused its join token had its
// identity stolen when the server lists an agent of that token (someone
// attested first): the claim reports it (IdentityStolen, JoinTokenReused)
// and evicts that agent. Without such an agent it is an ordinary
// AttestationFailed.
func TestSPIFFEReusedTokenReported(t *testing.T) {
	f, spire, op, sim, _ := spiffeOperator(t, 10*time.Minute)
	updateTemplate(t, f.template, func(tm *hfv1.HypervisorMachineTemplate) {
		tm.Spec.Attestation = hfv1.Attestation{Method: hfv1.AttestationJoinToken}
	})
	waitTemplate(t, f.template, metav1.ConditionTrue, "")
	refused := func(c *hfv1.MachineClaim) {
		t.Helper()
		notice := agentconfig.PowerOffNotice{ClaimRef: agentconfig.ClaimRef{Namespace: c.Namespace, Name: c.Name, UID: string(c.UID)},
			PowerOffNoticeBody: agentconfig.PowerOffNoticeBody{AttestationError: agentconfig.AttestationJoinTokenRefused}}
		if err := op.components.PowerOffNotices.AuthorizePowerOff(notice.ClaimRef, testSigner.PowerOffToken(c.Namespace, c.Name, string(c.UID))); err != nil {
			t.Fatal(err)
		}
		if err := op.components.PowerOffNotices.PowerOffNotice(context.Background(), notice); err != nil {
			t.Fatal(err)
		}
		if err := sim.GuestPowerOff(int(c.Status.VMRef.VMID)); err != nil {
			t.Fatal(err)
		}
	}

	stolen, token := attestingClaim(t, f, sim, "token-reused")
	if !spire.Attest(token) {
		t.Fatal("the thief could not attest with the claim's token")
	}
	refused(stolen)
	got := waitStolen(t, stolen, spire, sim, hfv1.MisuseJoinTokenReused)
	if !strings.Contains(got.Status.Identity.Misuse.Message, "found its join token already used") {
		t.Errorf("misuse message %q", got.Status.Identity.Misuse.Message)
	}

	// Nobody used it (it expired, say): no theft to report.
	expired, _ := attestingClaim(t, f, sim, "token-refused")
	refused(expired)
	got = waitClaimAttested(t, expired, metav1.ConditionFalse, hfv1.AttestationFailedReason)
	if got.Status.Identity.Misuse != nil {
		t.Errorf("a refused token nobody used was reported stolen: %+v", got.Status.Identity.Misuse)
	}
	wantEvents(t, stolen, string(hfv1.IdentityStolenReason), "IdentityEvicted")
	var list corev1.EventList
	if err := env.Client.List(context.Background(), &list, client.InNamespace(f.namespace)); err != nil {
		t.Fatal(err)
	}
	for _, e := range list.Items {
		if e.InvolvedObject.UID == expired.UID && (e.Reason == string(hfv1.IdentityStolenReason) || e.Reason == "IdentityEvicted") {
			t.Errorf("the claim whose refused token nobody used has a %s event: %s", e.Reason, e.Message)
		}
	}
}

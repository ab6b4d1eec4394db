package controller_test

import (
	"context"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/agent"
	"github.com/hyperfleet/hyperfleet/internal/agentconfig"
	vaultsim "github.com/hyperfleet/hyperfleet/internal/testworld/simulator/vault"
)

// TestSPIFFESecretStoreClaim: on a cluster with spec.spire.secretStore, a
// claim's VM gets the store's settings and no broker in its cloud-init;
// nothing is written before its agent attested; then the operator writes
// its credential (through the official client, to the fake Vault), the VM
// reads it once with a JWT-SVID, and deleting the claim leaves nothing in
// the store or on the SPIRE server.
func TestSPIFFESecretStoreClaim(t *testing.T) {
	ctx := context.Background()
	fake := vaultsim.New()
	fake.EnableKV("secret")
	issuer := vaultsim.NewIssuer()
	keys := httptest.NewServer(issuer)
	t.Cleanup(keys.Close)
	accessor := fake.EnableJWT("jwt", vaultsim.JWTConfig{JWKSURL: keys.URL + "/keys"})
	fake.SetPolicy("hyperfleet-operator", vaultsim.OperatorPolicy("secret", "hyperfleet", "jwt", "hyperfleet-secret-store", "hyperfleet-vm")...)
	fake.SetPolicy("hyperfleet-vm", vaultsim.VMPolicy("secret", "hyperfleet", accessor)...)
	fake.AddToken("s.operator", "hyperfleet-operator")
	store := httptest.NewTLSServer(fake.Handler())
	t.Cleanup(store.Close)
	ca := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: store.Certificate().Raw})

	f, spire, _, _, seeds := spiffeOperator(t, 10*time.Minute)
	secret := "vault-" + f.namespace
	f.create(&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: secretNamespace, Name: secret}, StringData: map[string]string{"token": "s.operator", "ca.crt": string(ca)}})
	eventually(t, 10*time.Second, "spec.spire.secretStore set", func() error {
		c := &hfv1.HypervisorCluster{}
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(f.cluster), c); err != nil {
			return err
		}
		c.Spec.SPIRE.SecretStore = &hfv1.SecretStoreConfig{
			Address:     store.URL,
			CABundleRef: &hfv1.SecretKeySelector{Namespace: secretNamespace, Name: secret, Key: "ca.crt"},
			TokenRef:    hfv1.SecretKeySelector{Namespace: secretNamespace, Name: secret, Key: "token"},
		}
		return env.Client.Update(ctx, c)
	})
	updateTemplate(t, f.template, func(tm *hfv1.HypervisorMachineTemplate) {
		tm.Spec.Attestation = hfv1.Attestation{Method: hfv1.AttestationJoinToken}
	})
	waitTemplate(t, f.template, metav1.ConditionTrue, "")

	claim := &hfv1.MachineClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: f.namespace, Name: "via-store"},
		Spec:       hfv1.MachineClaimSpec{TemplateRef: hfv1.ObjectName{Name: f.template.Name}},
	}
	f.create(claim)
	waitClaimProvisioned(t, claim, metav1.ConditionTrue, string(hfv1.ReadyReason))
	got := waitClaimAttested(t, claim, metav1.ConditionFalse, hfv1.AttestationPendingReason)
	id := got.Status.Identity

	// What the VM received: the store, its own role and path, no broker.
	cfg := seedAgentConfig(t, seeds, got.Status.VMRef.VMID)
	sp, _ := cfg["spiffe"].(map[string]any)
	if sp == nil || sp["brokerURL"] != nil || cfg["jitConfig"] != nil {
		t.Fatalf("the VM's agent config is not store mode without a credential: %v", cfg)
	}
	raw, _ := json.Marshal(sp["secretStore"])
	var vmStore agentconfig.SecretStore
	if err := json.Unmarshal(raw, &vmStore); err != nil {
		t.Fatal(err)
	}
	wantPath := fmt.Sprintf("hyperfleet/example.org/vm/%s/via-store/%s", f.namespace, got.UID)
	if vmStore.Address != store.URL || vmStore.Role != string(got.UID) || vmStore.Path != wantPath || vmStore.CABundle != string(ca) ||
		vmStore.Audience != "hyperfleet-secret-store" || vmStore.KVMount != "secret" || vmStore.AuthMount != "jwt" {
		t.Fatalf("spiffe.secretStore = %+v", vmStore)
	}
	if paths := fake.SecretPaths("secret"); len(paths) != 0 {
		t.Fatalf("written before the VM attested: %v", paths)
	}

	var token string
	for tok := range spire.State().Tokens {
		token = tok
	}
	if !spire.Attest(token) {
		t.Fatal("no join token to attest with")
	}
	eventually(t, 30*time.Second, "the credential stored", func() error {
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(claim), got); err != nil {
			return err
		}
		b := hfv1.FindCondition(got.Status.Conditions, hfv1.MachineClaimBootstrappedCondition)
		if got.Status.Identity.CredentialStoredAt == nil || got.Status.Identity.CredentialRequestedAt == nil || !hfv1.HasReason(b, hfv1.CredentialStoredReason) {
			return fmt.Errorf("identity %+v, Bootstrapped %+v", got.Status.Identity, b)
		}
		return nil
	})
	if got.Status.Identity.CredentialRequestedAt.After(got.Status.Identity.CredentialStoredAt.Time) || got.Status.Bootstrap == nil || got.Status.Bootstrap.RunnerName == "" {
		t.Errorf("identity %+v bootstrap %+v: the request is recorded first, the runner with the write", got.Status.Identity, got.Status.Bootstrap)
	}
	if paths := fake.SecretPaths("secret"); !slices.Equal(paths, []string{wantPath}) {
		t.Fatalf("stored at %v, want %s", paths, wantPath)
	}

	// The VM reads it once with its JWT-SVID.
	vm := &agent.VaultSource{Store: vmStore, FetchJWTSVID: func(_ context.Context, audience string) (string, error) {
		return issuer.Mint(id.SPIFFEID, []string{audience}, time.Minute), nil
	}}
	cred, err := vm.Credential(ctx)
	if err != nil || cred.Method != agentconfig.BootstrapJITConfig || cred.JITConfig == "" {
		t.Fatalf("the VM's read: %v, %v", cred, err)
	}
	if _, err := vm.Credential(ctx); !errors.Is(err, agent.ErrCredentialGone) {
		t.Fatalf("a second read: %v", err)
	}

	if err := env.Client.Delete(ctx, claim); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "the claim gone, nothing left in the store or on the SPIRE server", func() error {
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(claim), &hfv1.MachineClaim{}); err == nil {
			return errors.New("the claim still exists")
		}
		if roles := fake.RoleNames("jwt"); len(roles) != 0 {
			return fmt.Errorf("login roles left: %v", roles)
		}
		if st := spire.State(); len(st.Entries) != 0 || len(st.Agents) != 0 {
			return fmt.Errorf("left: entries %v agents %v", st.Entries, st.Agents)
		}
		return nil
	})
	if n := fake.RequestsUnder("DELETE", "auth/jwt/role/"); n < 2 {
		t.Errorf("the role was deleted %d times; want the write's clearing and the claim's end", n)
	}
	if strings.Contains(fmt.Sprint(fake.SecretPaths("secret")), string(got.UID)) {
		t.Error("the credential is still stored")
	}
}

package vmspec

import (
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/testworld/simulator/github/githubsimtest"
)

// TestCheckTemplateRenderWithSecretStore: a template that attests on a
// cluster whose VMs read their credential from a secrets store passes the
// check, which renders the store (with a placeholder role and path) and no
// broker into the agent's configuration.
func TestCheckTemplateRenderWithSecretStore(t *testing.T) {
	ws := githubsimtest.Backends(t, nil)
	cluster := &hfv1.HypervisorCluster{Spec: hfv1.HypervisorClusterSpec{SPIRE: &hfv1.SPIREConfig{
		TrustDomain: "example.org", ServerAddress: "spire.example.org:8081",
		SecretStore: &hfv1.SecretStoreConfig{Address: "https://vault.example.com:8200"},
	}}}
	tmpl := &hfv1.HypervisorMachineTemplate{ObjectMeta: metav1.ObjectMeta{Namespace: "ci", Name: "debian"}}
	tmpl.Spec.Bootstrap.GitHub = &hfv1.GitHubBootstrap{Owner: "octo-org", Organization: "octo-org"}
	tmpl.Spec.Attestation = hfv1.Attestation{Method: hfv1.AttestationJoinToken}
	if err := CheckTemplate(ws, tmpl, cluster, nil, nil); err != nil {
		t.Fatalf("CheckTemplate: %v", err)
	}
	claim := &hfv1.MachineClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "ci", Name: "placeholder", UID: placeholderClaimUID}}
	v := withPlaceholderCredentials(ws, ClaimVars(ws, claim, tmpl, cluster, nil), tmpl)
	if v.SecretStore == nil || v.SecretStore.Address != "https://vault.example.com:8200" || v.SecretStore.KVMount != "secret" || v.SecretStoreRole == "" || v.BrokerURL != "" {
		t.Fatalf("check vars: store %+v role %q brokerURL %q", v.SecretStore, v.SecretStoreRole, v.BrokerURL)
	}
}

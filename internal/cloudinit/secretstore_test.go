package cloudinit

import (
	"strings"
	"testing"

	yaml "go.yaml.in/yaml/v3"

	"github.com/hyperfleet/hyperfleet/internal/agentconfig"
)

// storeVars are spiffeVars for a cluster whose VMs read their credential
// from a secrets store instead of the broker.
func storeVars(v Vars) Vars {
	v = spiffeVars(v)
	v.BrokerURL = ""
	v.SecretStore = &agentconfig.SecretStore{Address: "https://vault.example.com:8200", AuthMount: "jwt", Audience: "hyperfleet-secret-store", KVMount: "secret"}
	v.SecretStoreRole = "3f0c1a52-6d0e-4e55-9b1c-0d6c2f5b7a10"
	v.SecretStorePath = "hyperfleet/hyperfleet.io/vm/ci/runner-abc12/3f0c1a52-6d0e-4e55-9b1c-0d6c2f5b7a10"
	v.SecretStoreCA = testCA
	return v
}

// TestSecretStoreAgentConfig: the VM's agent.json names the store with the
// VM's own role and path and no broker; a VM whose vars name both is not
// rendered.
func TestSecretStoreAgentConfig(t *testing.T) {
	v := storeVars(baseVars())
	out, err := Render(Input{Vars: v})
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		WriteFiles []struct {
			Path    string `yaml:"path"`
			Content string `yaml:"content"`
		} `yaml:"write_files"`
	}
	if err := yaml.Unmarshal(out.UserData, &doc); err != nil {
		t.Fatal(err)
	}
	var cfg *agentconfig.Config
	for _, f := range doc.WriteFiles {
		if f.Path == AgentConfigPath {
			if cfg, err = agentconfig.Parse([]byte(f.Content)); err != nil {
				t.Fatalf("the agent cannot read its config: %v", err)
			}
		}
	}
	if cfg == nil || cfg.SPIFFE == nil || cfg.SPIFFE.SecretStore == nil {
		t.Fatalf("agent.json has no spiffe.secretStore: %+v", cfg)
	}
	want := agentconfig.SecretStore{Address: "https://vault.example.com:8200", CABundle: testCA, AuthMount: "jwt", Role: v.SecretStoreRole,
		Audience: "hyperfleet-secret-store", KVMount: "secret", Path: v.SecretStorePath}
	if got := *cfg.SPIFFE.SecretStore; got != want || cfg.SPIFFE.BrokerURL != "" || cfg.JITConfig != "" {
		t.Fatalf("spiffe.secretStore = %+v, brokerURL %q; want %+v and no broker", got, cfg.SPIFFE.BrokerURL, want)
	}

	v.BrokerURL = "https://broker.hyperfleet.example.com:8443"
	if _, err := Render(Input{Vars: v}); err == nil || !strings.Contains(err.Error(), "brokerURL") {
		t.Fatalf("a store and a broker rendered: %v", err)
	}
	// The template's canonical form holds the store but none of the VM's.
	c := storeVars(baseVars()).Canonical()
	if c.SecretStore == nil || c.SecretStoreRole != "" || c.SecretStorePath != "" || c.SecretStoreCA != "" {
		t.Fatalf("Canonical: %+v role %q path %q", c.SecretStore, c.SecretStoreRole, c.SecretStorePath)
	}
	if _, err := Render(Input{Vars: c}); err != nil {
		t.Fatalf("canonical render: %v", err)
	}
}

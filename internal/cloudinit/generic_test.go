package cloudinit

import (
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/hyperfleet/hyperfleet/internal/agentconfig"
)

func genericVars(v Vars) Vars {
	v.Platform, v.BootstrapMethod, v.RegistrationURL = PlatformGeneric, "", ""
	v.GenericScript = "echo hello\n"
	v.Claim = agentconfig.ClaimRef{Namespace: "ci", Name: "batch-1", UID: "uid-1"}
	v.Deadline = Time{time.Date(2025, 6, 1, 13, 0, 0, 0, time.UTC)}
	return v
}

// renderedAgentConfig renders v and parses the agent.json it writes.
func renderedAgentConfig(t *testing.T, v Vars) *agentconfig.Config {
	t.Helper()
	out, err := Render(Input{Vars: v})
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		WriteFiles []struct {
			Path    string `json:"path"`
			Content string `json:"content"`
		} `json:"write_files"`
	}
	if err := yaml.Unmarshal(out.UserData, &doc); err != nil {
		t.Fatal(err)
	}
	for _, f := range doc.WriteFiles {
		if f.Path == AgentConfigPath {
			cfg, err := agentconfig.Parse([]byte(f.Content))
			if err != nil {
				t.Fatalf("the agent cannot read its config: %v", err)
			}
			return cfg
		}
	}
	t.Fatal("no agent.json rendered")
	return nil
}

func TestGenericAgentConfig(t *testing.T) {
	v := genericVars(baseVars())
	cfg := renderedAgentConfig(t, v)
	if cfg.Platform != agentconfig.PlatformGeneric || cfg.Generic == nil || cfg.Generic.Script != v.GenericScript ||
		cfg.Generic.Claim != v.Claim || !cfg.Generic.Deadline.Equal(v.Deadline.Time) {
		t.Fatalf("agent.json: %+v generic %+v", cfg, cfg.Generic)
	}
	// No credential and no identity: nothing arrives in the running VM.
	if cfg.SecretsFile != "" || cfg.BootstrapMethod != "" || cfg.Runner.Software.WorkDir != v.RunnerConfig.WorkDir || cfg.Runner.Software.InstallPath != "" {
		t.Fatalf("agent.json of a generic VM without SPIFFE: secretsFile %q bootstrapMethod %q software %+v", cfg.SecretsFile, cfg.BootstrapMethod, cfg.Runner.Software)
	}
	// With SPIFFE the join token arrives as for GitHub; no broker is needed.
	s := genericVars(spiffeVars(baseVars()))
	s.BootstrapMethod, s.BrokerURL = "", ""
	cfg = renderedAgentConfig(t, s)
	if cfg.SPIFFE == nil || cfg.SecretsFile != agentconfig.SecretsFile || cfg.WorkloadMethod != agentconfig.WorkloadBroker {
		t.Fatalf("generic with SPIFFE: spiffe %+v secretsFile %q", cfg.SPIFFE, cfg.SecretsFile)
	}

	bad := genericVars(baseVars())
	bad.Deadline = Time{}
	if _, err := Render(Input{Vars: bad}); err == nil || !strings.Contains(err.Error(), "Deadline") {
		t.Errorf("a generic VM without a deadline rendered: %v", err)
	}
	bad = genericVars(baseVars())
	bad.GenericScript = ""
	if _, err := Render(Input{Vars: bad}); err == nil || !strings.Contains(err.Error(), "GenericScript") {
		t.Errorf("a generic VM without a script rendered: %v", err)
	}
	if _, err := Render(Input{Vars: genericVars(baseVars()).Canonical()}); err != nil {
		t.Errorf("canonical render: %v", err)
	}
}

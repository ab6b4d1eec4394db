package main

import (
	"slices"
	"strings"
	"testing"

	yaml "go.yaml.in/yaml/v3"

	"github.com/hyperfleet/hyperfleet/internal/agent"
)

// TestRecipeIsTheDocumentedOne reads the recipe the builder runs from
// docs/templates.md and checks what it keeps and drops: the image is built
// by the page's own steps.
func TestRecipeIsTheDocumentedOne(t *testing.T) {
	r, err := readRecipe("../../docs/templates.md")
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"qemu-guest-agent", "curl", "ca-certificates", "git", "resolvconf"}; !slices.Equal(r.packages, want) {
		t.Errorf("packages %q, want %q (docker.io is optional)", r.packages, want)
	}
	var cc struct {
		PackageUpdate bool  `yaml:"package_update"`
		Users         []any `yaml:"users"`
		Runcmd        []any `yaml:"runcmd"`
	}
	if err := yaml.Unmarshal(r.cloudConfig, &cc); err != nil {
		t.Fatalf("the built cloud-config is not YAML: %v\n%s", err, r.cloudConfig)
	}
	if !strings.HasPrefix(string(r.cloudConfig), "#cloud-config\n") || !cc.PackageUpdate {
		t.Errorf("cloud-config lost its header or package_update:\n%s", r.cloudConfig)
	}
	var runner map[string]any
	for _, u := range cc.Users {
		if m, ok := u.(map[string]any); ok && m["name"] == "runner" {
			runner = m
		}
	}
	switch {
	case runner == nil || runner["shell"] != "/bin/bash":
		t.Errorf("the user runner (with its shell) is missing: %v", cc.Users)
	case runner["sudo"] != nil || runner["groups"] != nil || runner["primary_group"] != nil:
		// The job runs as runner: a sudo rule or a root-equivalent group
		// lets it read the runner's credential (internal/agent/harden.go
		// refuses a multi-job credential on such an image).
		t.Errorf("the user runner may escalate (sudo %v, groups %v, primary_group %v); the recipe's job user must not", runner["sudo"], runner["groups"], runner["primary_group"])
	}
	cmds := string(mustYAML(t, cc.Runcmd))
	for _, gone := range []string{"docker", "usermod", "gpasswd", "sudoers", "install-agent", "install-runner"} {
		if strings.Contains(cmds, gone) {
			t.Errorf("runcmd still has %s:\n%s", gone, cmds)
		}
	}
	for _, kept := range []string{"qemu-guest-agent", "apt-daily.timer"} {
		if !strings.Contains(cmds, kept) {
			t.Errorf("runcmd lost %s:\n%s", kept, cmds)
		}
	}
	if !strings.Contains(string(r.cloudConfig), "ssh_genkeytypes: [ed25519, ecdsa]") {
		t.Errorf("the clones' SSH host key types are gone from the cloud-config:\n%s", r.cloudConfig)
	}
	if r.spireAgent != agent.DefaultSPIREAgent {
		t.Errorf("the SPIFFE section installs spire-agent at %s, where the agent's --spire-agent default is %s", r.spireAgent, agent.DefaultSPIREAgent)
	}
	for _, step := range []string{"cloud-init clean --logs --machine-id", "truncate -s 0 /etc/machine-id", "rm -f /etc/ssh/ssh_host_*"} {
		if !strings.Contains(r.seal, step) {
			t.Errorf("the seal program lacks %q: %s", step, r.seal)
		}
	}
}

func mustYAML(t *testing.T, v any) []byte {
	t.Helper()
	b, err := yaml.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

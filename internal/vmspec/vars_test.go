package vmspec

import (
	"strings"
	"testing"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/cloudinit"
	"github.com/hyperfleet/hyperfleet/internal/testworld/simulator/github/githubsimtest"
)

// fakeAgents serves a fixed set of platforms (GitHub naming, "linux/x64").
type fakeAgents map[string]string

func (f fakeAgents) Lookup(os, arch string) (string, string, bool) {
	sum, ok := f[os+"/"+arch]
	if !ok {
		return "", "", false
	}
	return "https://agents.example.com:9443/hf/agent/v1/hyperfleet-agent-" + os + "-" + arch + "?sha256=" + sum, sum, true
}

func (fakeAgents) CA() string     { return "-----BEGIN CERTIFICATE-----\n..." }
func (fakeAgents) CAError() error { return nil }

func TestSetAgentVars(t *testing.T) {
	ciPlatforms := githubsimtest.Backends(t, nil)
	sum := strings.Repeat("ab", 32)
	agents := fakeAgents{"linux/x64": sum}
	tmpl := func(source hfv1.AgentSource, arch hfv1.RunnerArch) *hfv1.HypervisorMachineTemplate {
		tm := &hfv1.HypervisorMachineTemplate{}
		tm.Spec.Bootstrap.AgentSource = source
		tm.Spec.Bootstrap.GitHub.Runner = &hfv1.RunnerSoftware{Arch: arch}
		return tm
	}
	vars := func(tm *hfv1.HypervisorMachineTemplate) cloudinit.Vars {
		return TemplateVars(ciPlatforms, tm, &hfv1.HypervisorCluster{}, nil)
	}

	// Image (and unset, created before the field existed): nothing changes.
	for _, source := range []hfv1.AgentSource{"", hfv1.AgentSourceImage} {
		tm := tmpl(source, "")
		v := vars(tm)
		if err := SetAgentVars(ciPlatforms, tm, agents, &v); err != nil || v.AgentDownloadURL != "" || v.BootstrapServiceURL != "" {
			t.Errorf("agentSource %q: %v, %+v", source, err, v)
		}
	}

	tm := tmpl(hfv1.AgentSourceOperator, "")
	v := vars(tm)
	if err := SetAgentVars(ciPlatforms, tm, agents, &v); err != nil {
		t.Fatal(err)
	}
	if !strings.HasSuffix(v.AgentDownloadURL, "/hyperfleet-agent-linux-x64?sha256="+sum) || v.AgentSHA256 != sum || v.AgentCA == "" {
		t.Errorf("agent vars = %q %q %q", v.AgentDownloadURL, v.AgentSHA256, v.AgentCA)
	}
	if v.BootstrapServiceURL != "https://agents.example.com:9443/hf/agent/v1" {
		t.Errorf("BootstrapServiceURL = %q, want the directory of the binaries", v.BootstrapServiceURL)
	}

	for _, tc := range []struct {
		name   string
		tm     *hfv1.HypervisorMachineTemplate
		agents AgentLocator
		want   []string
	}{
		{"no server", tmpl(hfv1.AgentSourceOperator, ""), nil, []string{"--agent-server-addr", "--agent-binaries-dir", "hyperfleet-agent-linux-amd64", "agentSource Image"}},
		{"no arm64 build", tmpl(hfv1.AgentSourceOperator, "arm64"), agents, []string{"no hyperfleet-agent-linux-arm64", "arch arm64", "--agent-binaries-dir"}},
		{"32-bit arm", tmpl(hfv1.AgentSourceOperator, "arm"), agents, []string{"linux/x64 and linux/arm64 runners only, not linux/arm", "spec.bootstrap.github.runner"}},
	} {
		v := vars(tc.tm)
		err := SetAgentVars(ciPlatforms, tc.tm, tc.agents, &v)
		for _, want := range tc.want {
			if err == nil || !strings.Contains(err.Error(), want) {
				t.Errorf("%s: error %v does not mention %q", tc.name, err, want)
			}
		}
		if v.AgentDownloadURL != "" {
			t.Errorf("%s: a download URL despite the error", tc.name)
		}
	}
}

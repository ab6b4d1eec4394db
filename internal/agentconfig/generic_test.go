package agentconfig

import (
	"strings"
	"testing"
	"time"
)

func generic() Config {
	return Config{
		Version:        CurrentVersion,
		Platform:       PlatformGeneric,
		WorkloadMethod: WorkloadDirect,
		Generic: &Generic{
			Script:   "echo hello\n",
			Claim:    ClaimRef{Namespace: "ci", Name: "batch-1", UID: "uid-1"},
			Deadline: time.Date(2025, 6, 1, 13, 0, 0, 0, time.UTC),
		},
		Runner:           Runner{Software: Software{WorkDir: "/var/lib/hyperfleet/work"}},
		PowerOffOnFinish: true,
	}
}

func TestGenericConfigs(t *testing.T) {
	withSPIFFE := generic()
	withSPIFFE.WorkloadMethod = WorkloadBroker
	withSPIFFE.SecretsFile, withSPIFFE.SecretsDeadline = SecretsFile, time.Date(2025, 6, 1, 12, 30, 0, 0, time.UTC)
	withSPIFFE.SPIFFE = &SPIFFE{AttestationMethod: AttestationJoinToken, TrustDomain: "hyperfleet.io", TrustBundle: testCA,
		ServerAddress: "spire-server:8081"}
	for name, c := range map[string]Config{"plain": generic(), "spiffe without a broker": withSPIFFE} {
		if err := c.Validate(); err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		data, err := c.Marshal()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := Parse(data); err != nil {
			t.Errorf("%s: does not parse back: %v", name, err)
		}
		if strings.Contains(string(data), "bootstrapMethod") {
			t.Errorf("%s: a generic config names a bootstrapMethod:\n%s", name, data)
		}
	}

	cases := map[string]struct {
		mutate func(*Config)
		want   string
	}{
		"no section":          {func(c *Config) { c.Generic = nil }, "generic: is missing"},
		"empty script":        {func(c *Config) { c.Generic.Script = " \n" }, "generic.script: is empty"},
		"huge script":         {func(c *Config) { c.Generic.Script = strings.Repeat("x", MaxGenericScript+1) }, "generic.script: is 65537 bytes"},
		"no deadline":         {func(c *Config) { c.Generic.Deadline = time.Time{} }, "generic.deadline: is empty"},
		"no claim":            {func(c *Config) { c.Generic.Claim = ClaimRef{} }, "generic.claim: needs namespace, name and uid"},
		"bootstrap method":    {func(c *Config) { c.BootstrapMethod = BootstrapJITConfig }, "bootstrapMethod: is \"jit-config\" but platform is generic"},
		"system work dir":     {func(c *Config) { c.Runner.Software.WorkDir = "/etc" }, "runner.software.workDir"},
		"relative work dir":   {func(c *Config) { c.Runner.Software.WorkDir = "work" }, "runner.software.workDir"},
		"section on github":   {func(c *Config) { c.Platform = PlatformGitHubActions; c.BootstrapMethod = BootstrapJITConfig }, "generic: is set but platform is \"github-actions\""},
		"unknown platform":    {func(c *Config) { c.Platform = "jenkins" }, "platform: is \"jenkins\""},
		"spiffe with direct":  {func(c *Config) { c.SPIFFE = &SPIFFE{} }, "spiffe: is set but workloadMethod is direct"},
		"broker without spif": {func(c *Config) { c.WorkloadMethod = WorkloadBroker }, "spiffe: is missing"},
	}
	for name, tc := range cases {
		c := generic()
		tc.mutate(&c)
		err := c.Validate()
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %v, want one containing %q", name, err, tc.want)
		}
	}
}

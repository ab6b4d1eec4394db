package agentconfig

import (
	"strings"
	"testing"
)

// windowsJIT is directJIT in a Windows VM (docs/windows.md).
func windowsJIT() Config {
	c := directJIT()
	c.SecretsFile = WindowsSecretsFile
	c.Runner.Software.OS = "win"
	c.Runner.Software.InstallPath = `C:\actions-runner`
	c.Runner.Software.WorkDir = `C:\hyperfleet\work`
	c.Runner.Software.ConfigScript, c.Runner.Software.RunScript = "config.cmd", "run.cmd"
	return c
}

// TestWindowsRunnerPaths: a Windows VM's config takes Windows paths, and
// refuses its system directories (which the agent would empty as SYSTEM)
// and Linux paths; a Linux VM's still refuses Windows paths.
func TestWindowsRunnerPaths(t *testing.T) {
	if c := windowsJIT(); c.Validate() != nil {
		err := c.Validate()
		t.Fatalf("a Windows config is refused: %v", err)
	}
	for _, tc := range []struct {
		name   string
		mutate func(*Config)
		want   string
	}{
		{"Windows directory", func(c *Config) { c.Runner.Software.WorkDir = `C:\Windows\Temp` }, `is inside the system directory C:\Windows`},
		{"Program Files, other case", func(c *Config) { c.Runner.Software.InstallPath = `C:\program files` }, `is the system directory C:\Program Files`},
		{"the agent's own directory", func(c *Config) { c.Runner.Software.WorkDir = `C:\ProgramData\HyperFleet\work` }, `inside the system directory C:\ProgramData\HyperFleet`},
		{"Users", func(c *Config) { c.Runner.Software.WorkDir = `C:\Users` }, `is or contains the system directory C:\Users`},
		{"drive root", func(c *Config) { c.Runner.Software.WorkDir = `C:\` }, "is the root of a drive"},
		{"dot-dot", func(c *Config) { c.Runner.Software.WorkDir = `C:\work\..\Windows` }, "must be an absolute Windows path written plainly"},
		{"Linux path", func(c *Config) { c.Runner.Software.InstallPath = "/opt/actions-runner" }, "must be an absolute Windows path"},
		{"Linux secrets file", func(c *Config) { c.SecretsFile = SecretsFile }, "must be the absolute Windows path the operator places the VM's secrets at"},
		{"broker", func(c *Config) { c.WorkloadMethod = WorkloadBroker }, "runner.software.os: is win, which the agent runs only for platform github-actions with workloadMethod direct"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := windowsJIT()
			tc.mutate(&c)
			err := c.Validate()
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want an error with %q", err, tc.want)
			}
		})
	}
	c := directJIT()
	c.Runner.Software.WorkDir = `C:\hyperfleet\work`
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "must be an absolute path such as /opt/actions-runner") {
		t.Errorf("a Linux config with a Windows path: %v", err)
	}
	for p, want := range map[string]string{"/opt/actions-runner": `C:\opt\actions-runner`, "/actions-runner": `C:\actions-runner`} {
		if got := WindowsPathOf(p); got != want {
			t.Errorf("WindowsPathOf(%q) = %q, want %q", p, got, want)
		}
	}
}

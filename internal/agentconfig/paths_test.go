package agentconfig

import (
	"strings"
	"testing"
)

// runnerPathCases are candidate installPath/workDir values and whether
// they are allowed; the API tests (api/v1alpha1) check the CRD's CEL rules
// against CheckRunnerPath over the same kinds of paths.
var runnerPathCases = map[string]bool{
	"/opt/actions-runner":        true,
	"/var/lib/hyperfleet/work":   true,
	"/home/runner/_work":         true,
	"/usr/local/actions-runner":  true,
	"/srv/ci/work":               true,
	"/tmp/runner":                true,
	"/":                          false,
	"/etc":                       false,
	"/etc/actions-runner":        false,
	"/usr":                       false,
	"/usr/lib/runner":            false,
	"/usr/local":                 false,
	"/usr/local/bin":             false,
	"/usr/local/bin/runner":      false,
	"/bin":                       false,
	"/boot":                      false,
	"/root":                      false,
	"/root/work":                 false,
	"/var":                       false,
	"/var/lib":                   false,
	"/var/lib/cloud":             false,
	"/var/log":                   false,
	"/home":                      false,
	"/opt":                       false,
	"/tmp":                       false,
	"/run/user/1000":             false,
	"/opt//actions-runner":       false,
	"/opt/actions-runner/":       false,
	"/opt/x/../../etc":           false,
	"/var/lib/hyperfleet/./work": false,
}

func TestCheckRunnerPath(t *testing.T) {
	for p, ok := range runnerPathCases {
		if why := CheckRunnerPath(p); (why == "") != ok {
			t.Errorf("CheckRunnerPath(%q) = %q, want allowed %v", p, why, ok)
		}
	}
}

// TestValidateRefusesSystemPaths: where the agent reads its config, a
// system directory as installPath or workDir is refused with the field,
// the reason and the fix.
func TestValidateRefusesSystemPaths(t *testing.T) {
	c := directJIT()
	c.Runner.Software.InstallPath, c.Runner.Software.WorkDir = "/usr", "/var"
	err := c.Validate()
	if err == nil {
		t.Fatal("Validate accepted /usr and /var")
	}
	for _, want := range []string{
		`runner.software.installPath: "/usr" is the system directory /usr`,
		`runner.software.workDir: "/var" is the system directory /var`,
		"use a directory of its own such as /opt/actions-runner",
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q lacks %q", err, want)
		}
	}
}

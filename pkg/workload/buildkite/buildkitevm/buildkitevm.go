// Package buildkitevm is Buildkite's side of a VM: the names the operator
// and the in-VM agent share (the platform the agent config carries, the
// agent credentials), and the platform's part of the agent config
// (agentconfig.PlatformSpec), registered when the package is loaded. It
// links nothing but the agent config's format, so the agent binary imports
// it as the operator's back-end (pkg/workload/buildkite) does.
package buildkitevm

import (
	"fmt"
	"regexp"
	"strings"

	"github.com/hyperfleet/hyperfleet/internal/agentconfig"
)

// Platform is Buildkite in the agent config, its workload type
// (hfv1.WorkloadBuildkite): the agent runs runner.software.installPath/
// runScript (buildkite-agent) as `buildkite-agent start
// --disconnect-after-job` with the agent token in BUILDKITE_AGENT_TOKEN,
// registrationURL as its --endpoint, runner.name as --name, runner.labels
// as --tags and runner.software.workDir as --build-path.
const Platform agentconfig.Platform = "buildkite"

// Buildkite's agent credentials. Both travel in the registrationToken
// fields of the guest secrets, the broker's answer and the stored
// credential.
const (
	// MethodAgentToken is a cluster agent token made for this VM alone:
	// buildkite-agent registers with it.
	MethodAgentToken agentconfig.BootstrapMethod = "agent-token"
	// MethodJobToken is a job acquisition token (bkjat_): buildkite-agent
	// registers with it and acquires the one job it is good for, which
	// the credential names (GuestSecrets.job).
	MethodJobToken agentconfig.BootstrapMethod = "job-token"
)

// Spec is Buildkite's part of the agent config.
var Spec = agentconfig.PlatformSpec{
	Platform: Platform,
	Methods: []agentconfig.MethodSpec{
		// The agent takes jobs until the operator deletes its token.
		{Method: MethodAgentToken, Reusable: true, Secret: "the Buildkite token"},
		{Method: MethodJobToken, Secret: "the Buildkite token"},
	},
	BindsJob: true,
	Shape:    shape,
	Validate: validate,
}

func init() { agentconfig.RegisterPlatform(Spec) }

// JobUUID is a Buildkite job id: a UUID, lower-case hex.
var JobUUID = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`)

// shape: RegistrationURL is the agent API endpoint, Labels the agent's
// tags, RunScript the agent binary in InstallPath. A VM made for one job
// gets a job acquisition token for it. The agent's tags are the key=value
// labels; the others (self-hosted, hyperfleet, queue:default) are the
// operator's routing marks, which Buildkite does not know.
func shape(c *agentconfig.Config) {
	c.Runner.Group = ""
	if c.Runner.AcquireJob != "" {
		c.BootstrapMethod = MethodJobToken
	}
	var tags []string
	for _, l := range c.Runner.Labels {
		if strings.Contains(l, "=") {
			tags = append(tags, l)
		}
	}
	c.Runner.Labels = tags
}

// validate checks a Buildkite config: the job a job token acquires, the
// agent API endpoint, the agent binary, its name and its tags (key=value).
func validate(c *agentconfig.Config, bad agentconfig.Reporter) {
	switch c.BootstrapMethod {
	case MethodAgentToken:
		if c.Runner.AcquireJob != "" {
			bad("runner.acquireJob", "is set but bootstrapMethod is %q; a job to acquire comes with a %q credential", MethodAgentToken, MethodJobToken)
		}
	case MethodJobToken:
		// The job comes with the credential (a warm VM's pool binds it one
		// after it booted); a config that names one must name a UUID, which
		// the credential's job must then be.
		if c.Runner.AcquireJob != "" && !JobUUID.MatchString(c.Runner.AcquireJob) {
			bad("runner.acquireJob", "%q is not a Buildkite job UUID; bootstrapMethod %q takes the job its token is for, or none (the credential names it)", c.Runner.AcquireJob, MethodJobToken)
		}
	}
	if c.RegistrationURL == "" {
		bad("registrationURL", "is empty; platform %s needs the agent API endpoint, such as https://agent.buildkite.com/v3", Platform)
	}
	agentconfig.ValidateBinaryRunner(c, agentconfig.BinaryRunner{Name: "buildkite-agent", Checksum: "the archive's"}, bad)
	sw := c.Runner.Software
	if sw.OS != "linux" {
		bad("runner.software.os", "is %q; the Buildkite agent runs on linux here", sw.OS)
	}
	if sw.Arch != "amd64" && sw.Arch != "arm64" {
		bad("runner.software.arch", "is %q; must be amd64 or arm64 (Buildkite's release names)", sw.Arch)
	}
	if !agentconfig.ValidRunnerName(c.Runner.Name) {
		bad("runner.name", "%q is not a valid agent name: use at most 64 letters, digits, '.', '_' or '-'", c.Runner.Name)
	}
	for i, l := range c.Runner.Labels {
		if k, _, ok := strings.Cut(l, "="); !ok || k == "" || strings.ContainsAny(l, ", \t\r\n") {
			bad(fmt.Sprintf("runner.labels[%d]", i), "%q is not a Buildkite agent tag: use key=value", l)
		}
	}
}

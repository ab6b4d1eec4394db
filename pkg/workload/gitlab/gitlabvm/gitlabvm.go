// Package gitlabvm is GitLab CI's side of a VM: the names the operator and
// the in-VM agent share (the platform the agent config carries, the runner
// credential), and the platform's part of the agent config
// (agentconfig.PlatformSpec), registered when the package is loaded. It
// links nothing but the agent config's format, so the agent binary imports
// it as the operator's back-end (pkg/workload/gitlab) does.
package gitlabvm

import "github.com/hyperfleet/hyperfleet/internal/agentconfig"

// Platform is GitLab CI in the agent config, its workload type
// (hfv1.WorkloadGitLabCI): the agent runs runner.software.installPath/
// runScript (gitlab-runner) as `gitlab-runner run-single --max-builds 1`
// with the runner authentication token in CI_SERVER_TOKEN, registrationURL
// (the GitLab instance) as its --url and runner.software.workDir as
// --builds-dir.
const Platform agentconfig.Platform = "gitlab-ci"

// MethodRunnerAuthToken is a GitLab runner authentication token
// (glrt-...): the operator created the runner for this VM alone, and the
// agent runs gitlab-runner run-single with it for one job; the operator
// deletes the runner when the claim ends.
const MethodRunnerAuthToken agentconfig.BootstrapMethod = "runner-auth-token"

// Spec is GitLab CI's part of the agent config.
var Spec = agentconfig.PlatformSpec{
	Platform: Platform,
	Methods: []agentconfig.MethodSpec{
		// The runner takes jobs until the operator deletes it.
		{Method: MethodRunnerAuthToken, Reusable: true, Secret: "the GitLab runner authentication token"},
	},
	Shape:    shape,
	Validate: validate,
}

func init() { agentconfig.RegisterPlatform(Spec) }

// shape: RegistrationURL is the GitLab instance, RunScript gitlab-runner
// in InstallPath. The runner's tags live on the runner the operator
// created at GitLab, and run-single takes none; nor has GitLab runner
// groups.
func shape(c *agentconfig.Config) { c.Runner.Group, c.Runner.Labels = "", nil }

// validate checks a GitLab CI config: the GitLab instance's https URL (the
// token travels to it; its https:// form is checked with every
// platform's), the runner binary, and no tags in the VM.
func validate(c *agentconfig.Config, bad agentconfig.Reporter) {
	if c.RegistrationURL == "" {
		bad("registrationURL", "is empty; platform %s needs the GitLab instance's URL, such as https://gitlab.com", Platform)
	}
	agentconfig.ValidateBinaryRunner(c, agentconfig.BinaryRunner{Name: "gitlab-runner", Checksum: "the binary's (GitLab's release.sha256)"}, bad)
	if len(c.Runner.Labels) > 0 {
		bad("runner.labels", "is set but platform is %s, whose runner's tags are set at GitLab when the operator creates it; remove it", Platform)
	}
}

package agentconfig

// SingleJob reports whether a credential of method serves one job only on
// its platform's side, so that whoever copies it out of the VM during the
// job can run nothing else with it: a JIT configuration (a runner
// registered for one job) and a Buildkite job acquisition token are; a
// registration token (any number of runners for an hour), a GitLab runner
// authentication token and a Buildkite agent token (a runner or agent
// that takes jobs until the operator deletes it) are not (each platform's
// MethodSpec.Reusable says so). Empty (platform generic, no runner
// credential) is single-job: there is nothing to copy. The agent refuses a
// job user that can become root only for a credential that is not
// (docs/templates.md, "The job user").
func (m BootstrapMethod) SingleJob() bool {
	spec, _ := LookupMethod(m)
	return !spec.Reusable
}

// PowerOffNotice.GuestRefusal values.
const (
	// GuestRefusalJobUserEscalates: the job user could become root in the
	// VM (a sudo rule, a root-equivalent group such as docker, or root
	// itself) and the VM's credential serves more than one job, which the
	// template did not accept (spec.guest.jobMayEscalate): the agent ran
	// no job.
	GuestRefusalJobUserEscalates = "JobUserCanEscalate"
)

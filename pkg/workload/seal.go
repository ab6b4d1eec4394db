package workload

import "context"

// Sealer is implemented by a Provider whose runner credential is multi-job
// on the platform's side: any process that holds it may ask the platform
// for jobs, for as long as the runner exists (a GitLab runner
// authentication token; Template.CredentialReuse says so). The one-job
// limit of such a runner is the VM's runner software's own (gitlab-runner
// run-single --max-builds 1), which a job that copied the credential does
// not keep: it polls from elsewhere and receives other jobs of the runner's
// scope and tags. So the operator seals the runner as soon as it sees the
// runner take its first job (a webhook or resync says the job runs on it,
// or the runner list shows it busy): the platform then gives it no other
// job, while the one it took runs on to its end (docs/security.md, "One job
// per credential").
type Sealer interface {
	// SealRunner stops the platform giving the runner (by id, or with id
	// 0 by name, as DeregisterRunner takes it) any job it has not given it
	// yet; a job it runs continues. Sealing a sealed runner is success, so
	// the caller may repeat it after a restart; a runner that is gone
	// returns ErrNotFound.
	SealRunner(ctx context.Context, id int64, name string) error
}

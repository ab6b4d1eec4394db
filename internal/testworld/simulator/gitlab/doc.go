// Package gitlabsim is an in-memory GitLab for HyperFleet's tests and
// cmd/gitlab-sim, served under /api/v4 as GitLab.com and self-managed
// instances serve it: the REST endpoints the operator calls with
// gitlab.com/gitlab-org/api/client-go (runners per scope, projects, groups,
// pending jobs, token introspection) with GitLab's credentials, roles,
// scopes, pagination, error bodies and rate limits; the runner API that
// gitlab-runner speaks (verify, job request, job update, trace, unregister);
// a job model (created, pending, running, success, failed, canceled) over
// pipelines with stages; Job Hook webhooks; and a stand-in for
// `gitlab-runner run-single` (POSIX sh and curl) that runs a real shell job
// against it. Its README.md says what it models, where each fact comes
// from, and what was checked against what.
//
// Everything that takes time runs on an injectable clock (simclock).
package gitlabsim

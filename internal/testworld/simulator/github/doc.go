// Package githubsim is an in-memory GitHub for HyperFleet's tests, the
// local world (`make dev`, cmd/hyperfleet-dev) and cmd/github-sim: the REST endpoints the
// operator calls for self-hosted runners, workflow runs and jobs and App
// installation tokens, a job model that runs queued jobs on runners that
// really connect, signed workflow_job webhooks, and a runner package (POSIX
// sh and curl) that behaves like actions/runner in ephemeral mode; its
// README.md says what it models, and its contract test checks it against
// GitHub's REST description and webhook examples.
//
// Everything that takes time runs on an injectable clock (simclock), so
// tests advance time instead of sleeping.
package githubsim

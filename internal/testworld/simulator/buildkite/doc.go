// Package buildkitesim is an in-memory Buildkite for HyperFleet's tests and
// cmd/buildkite-sim: the agent API that the real buildkite-agent speaks
// (register, connect, ping, job acquire/accept/start, log chunks, finish,
// disconnect), the REST subset that github.com/buildkite/go-buildkite/v4
// calls for an autoscaler (organization, clusters, queues, cluster agent
// tokens, agents, builds and jobs, with API-token scopes and rate limits),
// job webhooks signed as Buildkite signs them, an admin API for tests, and
// a release-like tarball of an agent binary for VMs. README.md says what it
// models and where each fact comes from.
//
// Everything that takes time runs on an injectable clock (simclock), so
// tests advance time instead of sleeping.
package buildkitesim

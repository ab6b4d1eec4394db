package agentconfig

// GitHub Actions' credential methods under the names packages outside the
// CI platforms' (the secrets-store tests, the local world) still use. They
// are the API's spec.bootstrap.method values (hfv1.BootstrapJITConfig,
// hfv1.BootstrapRunnerToken), which this package cannot import without
// linking the Kubernetes API into the agent; GitHub's own package
// (pkg/workload/github/githubvm) declares them for its platform.
//
// Deprecated: use githubvm.MethodJIT and githubvm.MethodRegistrationToken.
const (
	BootstrapJITConfig   BootstrapMethod = "jit-config"
	BootstrapRunnerToken BootstrapMethod = "runner-token"
)

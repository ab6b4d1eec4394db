package agentconfig

// GitHub Actions' credential methods under the names packages outside the
// CI platforms' (the secrets-store tests, the local world) still use: the
// API's spec.bootstrap.method values (hfv1.BootstrapJITConfig,
// hfv1.BootstrapRunnerToken), which this package cannot import without
// linking the Kubernetes API into the agent. GitHub's own package declares
// them for its platform (githubvm.MethodJIT,
// githubvm.MethodRegistrationToken); new code uses those, and a test
// (registered_test.go) keeps these equal to them. test/repo's
// TestPlatformNamesStayInTheirPackages allows this file alone.
const (
	BootstrapJITConfig   BootstrapMethod = "jit-config"
	BootstrapRunnerToken BootstrapMethod = "runner-token"
)

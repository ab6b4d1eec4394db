package agentconfig

// The runner credentials of the API's spec.bootstrap.method
// (hfv1.BootstrapJITConfig, hfv1.BootstrapRunnerToken), which this package
// cannot import without linking the Kubernetes API into the agent. They
// are known wherever this package is linked, with or without the platform
// that issues them (GitHub Actions, pkg/workload/github/githubvm, whose
// spec takes them): the secrets store and the credential broker check and
// carry them in processes that link no platform. test/repo's
// TestPlatformNamesStayInTheirPackages allows this file alone.
const (
	BootstrapJITConfig   BootstrapMethod = "jit-config"
	BootstrapRunnerToken BootstrapMethod = "runner-token"
)

// The specs of BootstrapJITConfig and BootstrapRunnerToken.
var (
	// JITConfigMethod is a just-in-time runner configuration: the runner
	// is already registered, for one job, and is started with it.
	JITConfigMethod = MethodSpec{Method: BootstrapJITConfig, JITConfig: true, Secret: "GitHub's encoded JIT configuration"}
	// RegistrationTokenMethod is a registration token (valid one hour) the
	// runner registers itself with at the URL it comes with; it registers
	// any number of runners meanwhile.
	RegistrationTokenMethod = MethodSpec{Method: BootstrapRunnerToken, CarriesURL: true, Reusable: true, Secret: "a registration token"}
)

func init() {
	methods[JITConfigMethod.Method] = JITConfigMethod
	methods[RegistrationTokenMethod.Method] = RegistrationTokenMethod
}

package agentconfig

import (
	"fmt"
	"maps"
	"path"
	"slices"
	"strings"
	"sync"
)

// PlatformSpec is one CI platform's part of the agent config: its name
// (the config's platform), the runner credentials its runner takes, what a
// config of it must hold beyond what every config holds, and how the
// operator shapes the config it writes for one of its VMs. Each platform
// declares it in its own package (pkg/workload/<platform>/<platform>vm) and
// registers it with RegisterPlatform, so that this package, the operator's
// cloud-init (internal/cloudinit) and the agent (internal/agent) check and
// shape a config of any platform without knowing one by name.
type PlatformSpec struct {
	// Platform is the config's platform value of the platform, the same as
	// its workload type (spec.workload.type).
	Platform Platform
	// Methods are the runner credentials the platform's runner takes; the
	// first is the one a VM gets when nothing else says (Shape may choose
	// another).
	Methods []MethodSpec
	// BindsJob is true when a VM of the platform may be made for one job
	// (runner.acquireJob): its credential acquires that job only.
	BindsJob bool
	// Default is true for the platform of a VM whose template names none
	// (the operator's cloud-init Vars.Platform empty): GitHub Actions, the
	// API's first. At most one registered platform is.
	Default bool
	// Windows is true when the agent runs the platform's runner on Windows
	// guests (runner.software.os win, docs/windows.md).
	Windows bool
	// Shape turns the config the operator fills from a template (every
	// platform's fields, labels as routing marks included) into the
	// platform's: what its runner does not take is cleared. Nil keeps it.
	Shape func(c *Config)
	// Validate reports, through bad, what makes c (a config of the
	// platform, whose bootstrapMethod is one of Methods) unusable: its
	// registration URL, runner and runner software. The checks every
	// config gets (version, workload method, secrets file, SPIFFE, proxy)
	// are this package's.
	Validate func(c *Config, bad Reporter)
}

// MethodSpec is one kind of runner credential: how it travels to the VM
// (GuestSecrets, the broker's answer, the stored credential) and what it
// is good for on its platform's side.
type MethodSpec struct {
	// Method is its name (bootstrapMethod).
	Method BootstrapMethod
	// JITConfig is true when the credential is a just-in-time runner
	// configuration, which travels in the jitConfig fields; every other
	// credential is a token and travels in the registrationToken fields.
	JITConfig bool
	// CarriesURL is true when the credential comes with the URL its runner
	// registers to (registrationURL); otherwise the config names it.
	CarriesURL bool
	// Reusable is true when the credential serves more than one job on the
	// platform's side, so that whoever copies it out of the VM during the
	// job could run other jobs with it (see SingleJob).
	Reusable bool
	// Secret says what the secret is, for messages, such as "the GitLab
	// runner authentication token".
	Secret string
}

// Reporter reports one problem with the config's field; Validate joins them.
type Reporter func(field, format string, args ...any)

// The platforms registered with RegisterPlatform, and their methods.
var (
	platformsMu sync.RWMutex
	platforms   = map[Platform]PlatformSpec{}
	methods     = map[BootstrapMethod]MethodSpec{}
	// defaultPlatform is the one whose spec is Default.
	defaultPlatform Platform
)

// RegisterPlatform makes a CI platform's configs known to this package
// (Validate, SingleJob, StoredCredential.Validate) and to those that build
// and read them. A platform package registers its spec when it is loaded,
// so that a binary that links the platform knows it. Registering a
// platform or a method twice, or a spec without a name, methods or
// Validate, is a programming error and panics.
func RegisterPlatform(spec PlatformSpec) {
	platformsMu.Lock()
	defer platformsMu.Unlock()
	switch {
	case spec.Platform == "" || spec.Platform == PlatformGeneric || len(spec.Methods) == 0 || spec.Validate == nil:
		panic("agentconfig: RegisterPlatform needs a platform name other than generic, its methods and Validate")
	case platforms[spec.Platform].Platform != "":
		panic(fmt.Sprintf("agentconfig: platform %s is registered twice", spec.Platform))
	case spec.Default && defaultPlatform != "":
		panic(fmt.Sprintf("agentconfig: platforms %s and %s are both the default", defaultPlatform, spec.Platform))
	}
	for _, m := range spec.Methods {
		// A method may be the API's (compat.go), which every platform that
		// takes it shares; another platform's it may not be.
		if old, taken := methods[m.Method]; m.Method == "" || taken && old != m {
			panic(fmt.Sprintf("agentconfig: platform %s registers method %q, which is empty or already registered otherwise", spec.Platform, m.Method))
		}
	}
	for _, m := range spec.Methods {
		methods[m.Method] = m
	}
	platforms[spec.Platform] = spec
	if spec.Default {
		defaultPlatform = spec.Platform
	}
}

// DefaultPlatform is the registered platform whose Default is set; empty
// when none is.
func DefaultPlatform() Platform {
	platformsMu.RLock()
	defer platformsMu.RUnlock()
	return defaultPlatform
}

// LookupPlatform returns the spec of platform p; false when no platform of
// that name is registered (generic, which has no runner, never is).
func LookupPlatform(p Platform) (PlatformSpec, bool) {
	platformsMu.RLock()
	defer platformsMu.RUnlock()
	spec, ok := platforms[p]
	return spec, ok
}

// LookupMethod returns the spec of credential method m; false when no
// registered platform takes it.
func LookupMethod(m BootstrapMethod) (MethodSpec, bool) {
	platformsMu.RLock()
	defer platformsMu.RUnlock()
	spec, ok := methods[m]
	return spec, ok
}

// RegisteredPlatforms are the names of the registered platforms and
// generic, sorted, for messages that list what a field may be.
func RegisteredPlatforms() []Platform {
	platformsMu.RLock()
	defer platformsMu.RUnlock()
	return slices.Sorted(func(yield func(Platform) bool) {
		for p := range platforms {
			if !yield(p) {
				return
			}
		}
		yield(PlatformGeneric)
	})
}

// registeredMethods are the names of the registered credential methods,
// sorted, for messages.
func registeredMethods() []BootstrapMethod {
	platformsMu.RLock()
	defer platformsMu.RUnlock()
	return slices.Sorted(maps.Keys(methods))
}

// Takes reports whether the platform's runner takes credential method m.
func (s PlatformSpec) Takes(m BootstrapMethod) bool {
	return slices.ContainsFunc(s.Methods, func(ms MethodSpec) bool { return ms.Method == m })
}

// MethodNames are the platform's credential methods, quoted and joined
// for a message ("a" or "b").
func (s PlatformSpec) MethodNames() string {
	names := make([]string, len(s.Methods))
	for i, m := range s.Methods {
		names[i] = fmt.Sprintf("%q", m.Method)
	}
	return strings.Join(names, " or ")
}

// ValidateMethod reports a bootstrapMethod the platform does not take.
func (s PlatformSpec) ValidateMethod(c *Config, bad Reporter) {
	if !s.Takes(c.BootstrapMethod) {
		bad("bootstrapMethod", "is %q; platform %s takes %s", c.BootstrapMethod, s.Platform, s.MethodNames())
	}
}

// BinaryRunner describes a runner that is one binary (gitlab-runner,
// buildkite-agent), for ValidateBinaryRunner's messages.
type BinaryRunner struct {
	// Name is the binary's usual name, such as gitlab-runner.
	Name string
	// Checksum says what downloadSHA256 is the SHA-256 of, such as "the
	// archive's" or "the binary's".
	Checksum string
}

// ValidateBinaryRunner checks the runner software of a platform whose
// runner is one binary, downloaded or baked into the image, and runs no
// config script: installPath is emptied after the job only when the binary
// is downloaded into it, so only then must it be a directory of its own
// (an image's binary may sit in a system directory).
func ValidateBinaryRunner(c *Config, b BinaryRunner, bad Reporter) {
	sw := c.Runner.Software
	if sw.DownloadURL != "" {
		if err := checkHTTPSURL(sw.DownloadURL); err != nil {
			bad("runner.software.downloadURL", "%v", err)
		}
		if !sha256RE.MatchString(sw.DownloadSHA256) {
			bad("runner.software.downloadSHA256", "must be %s SHA-256, 64 lower-case hex digits", b.Checksum)
		}
		checkRunnerDir(bad, "runner.software.installPath", sw.InstallPath, sw.OS)
	} else if p := sw.InstallPath; p == "" || !path.IsAbs(p) || strings.ContainsRune(p, 0) {
		bad("runner.software.installPath", "%q must be the absolute directory of %s, such as /usr/local/bin", p, b.Name)
	}
	checkRunnerDir(bad, "runner.software.workDir", sw.WorkDir, sw.OS)
	if !scriptNameRE.MatchString(sw.RunScript) {
		bad("runner.software.runScript", "%q must be the runner's file name in installPath, such as %s", sw.RunScript, b.Name)
	}
}

// ValidateActionsRunner checks runner the way a runner with a config
// script and a run script (GitHub's actions/runner) needs it.
func ValidateActionsRunner(r *Runner, bad Reporter) { r.validate(bad) }

// ValidRunnerName reports whether name is a runner name the agent passes
// on (at most 64 letters, digits, '.', '_' or '-').
func ValidRunnerName(name string) bool { return runnerNameRE.MatchString(name) }

// Package agent is HyperFleet's in-VM agent: the program a HyperFleet VM
// runs once at boot (from the hyperfleet-agent systemd unit that cloud-init
// installs) to run exactly one CI job and then power the VM off.
//
// Run goes through these steps, logging each with log/slog and never
// logging a secret:
//
//  1. Read the config file (agentconfig.Path), remove it at once with
//     cloud-init's copies of the user-data it came in (CloudInitCopies,
//     CloudInitScanned), then parse and validate it with agentconfig.Parse.
//     A join token whose expiresAt has passed is not tried.
//  2. When the config names a secretsFile, make its directory root's alone
//     and tell the operator the VM waits for its secrets (a ready hint to
//     powerOffNotify.readyURL, best effort), so that it places them now.
//  3. Obtain the runner credential from a CredentialSource: with
//     workloadMethod direct (GuestSource), wait until secretsDeadline for
//     the operator to place it at secretsFile through the hypervisor's
//     guest channel; with workloadMethod broker (BrokerSource), wait there
//     for the join token, attest with SPIRE (spire-agent and the join
//     token, or a pre-installed spire-agent's Workload API) and fetch the
//     credential from the operator's credential broker over mTLS with the
//     X509-SVID; nothing of the identity stays on the disk or running
//     afterwards.
//  4. Install the runner: download runner.software.downloadURL, check it
//     against downloadSHA256 and unpack it (.tar.gz, .tgz or .zip) into
//     installPath; without a downloadURL the runner must already be there.
//  5. With bootstrapMethod runner-token, register an ephemeral runner with
//     the runner's config script; the token goes in the environment
//     variable ACTIONS_RUNNER_INPUT_TOKEN, never on the command line.
//  6. Run the runner's run script (with jit-config, the JIT configuration
//     in ACTIONS_RUNNER_INPUT_JITCONFIG), copy its output into the log,
//     watch for "Listening for Jobs" and "Running job:", stop it when the
//     agent is asked to stop or when no job started within the idle
//     timeout.
//  7. Clean up whatever happened: the runner's credential files, the work
//     directory's contents, a downloaded runner, temporary files.
//  8. Power the VM off when powerOffOnFinish is set, whatever the outcome.
//
// Run returns the process exit code:
//
//	 0 ExitOK                the runner ran its job and exited 0
//	 1 ExitInternal          agent error, or the agent was stopped (SIGTERM)
//	 2 ExitBadConfig         the config file is missing, unreadable or invalid
//	 3 ExitRunnerSoftware    download, checksum, unpacking, or runner missing
//	 4 ExitRegistration      the runner's config script failed (runner-token)
//	 5 ExitRunnerFailed      the runner exited non-zero
//	 6 ExitIdle              no job started within the idle timeout
//	 7 ExitExpired           the credential's (or join token's) expiry has
//	                         passed
//	 8 ExitUnsupported       a mode this agent version does not implement
//	 9 ExitAttestation       broker mode got no X509-SVID: spire-agent
//	                         missing or exited, join token refused, wrong
//	                         SPIFFE ID, attestation deadline; with
//	                         attestationMethod tpm also no TPM at
//	                         tpmDevicePath, enrollment refused by the
//	                         operator, challenge not activated by the TPM
//	10 ExitBrokerRefused     the credential broker refused (an error status
//	                         but 429 and 503, or a TLS alert) or answered no
//	                         valid credential; or the secrets store refused
//	                         the login or the read
//	11 ExitBrokerUnavailable the broker (or secrets store) was unreachable
//	                         or busy (429, 503), or held no credential,
//	                         until the deadline, or its certificate is not
//	                         trusted
//	12 ExitNoSecrets         workloadMethod direct: the operator placed no
//	                         runner credential at secretsFile before
//	                         secretsDeadline
//	13 ExitDeadline          platform generic: the script was still running
//	                         at generic.deadline and was stopped
//	14 ExitJobUserEscalates  the job user can become root in the VM and the
//	                         credential serves more than one job, which the
//	                         template did not accept (jobMayEscalate)
//
// Steps 3 to 6 are the platform's (runnerKind, platform.go), chosen by the
// config's platform: GitHub Actions as above (github.go); generic
// (generic.go) obtains no runner credential, attests when the config has
// spiffe and keeps spire-agent running for the script, runs
// generic.script once by /bin/sh as the runner user in workDir with
// HYPERFLEET_CLAIM, HYPERFLEET_CLAIM_UID, HYPERFLEET_DEADLINE and (with
// SPIFFE) SPIFFE_ENDPOINT_SOCKET, and stops it at generic.deadline. The
// script's exit status is ExitOK (0) or ExitRunnerFailed, and goes into
// the power-off notice (scriptExitStatus).
package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"strings"
	"sync/atomic"
	"time"

	"github.com/hyperfleet/hyperfleet/internal/agentconfig"
)

// Exit codes of Run (and of the hyperfleet-agent process).
const (
	// ExitOK: the runner ran its job and exited 0.
	ExitOK = 0
	// ExitInternal: an error of the agent itself (or of the VM image, such
	// as a missing --run-as user), or the agent was stopped by a signal
	// before the runner finished.
	ExitInternal = 1
	// ExitBadConfig: the config file is missing, unreadable or invalid
	// (also bad command-line flags).
	ExitBadConfig = 2
	// ExitRunnerSoftware: the runner package could not be downloaded, did
	// not match its SHA-256, could not be unpacked, or the runner is not
	// at installPath.
	ExitRunnerSoftware = 3
	// ExitRegistration: the runner's config script failed (runner-token).
	ExitRegistration = 4
	// ExitRunnerFailed: the runner exited with a non-zero status.
	ExitRunnerFailed = 5
	// ExitIdle: the runner took no job within the idle timeout.
	ExitIdle = 6
	// ExitExpired: the credential's expiresAt has passed.
	ExitExpired = 7
	// ExitUnsupported: the config asks for a mode this agent version does
	// not implement.
	ExitUnsupported = 8
	// ExitAttestation: broker mode got no X509-SVID: spire-agent is
	// missing or exited, the SPIRE server refused the join token (used or
	// expired), the SVID is not the expected SPIFFE ID, or the attestation
	// deadline passed (Options.AttestTimeout, the config's expiresAt).
	// With attestationMethod tpm also: no TPM at spiffe.tpmDevicePath, the
	// operator refused the enrollment (an error status other than 429 and
	// 503), or the TPM could not activate the challenge; the power-off
	// notice's attestationError says which (attestationErrorOf).
	ExitAttestation = 9
	// ExitBrokerRefused: the credential broker refused (an error status
	// other than 429 and 503, its reason and message logged; or a TLS
	// alert: it did not accept the X509-SVID), or its answer was not a
	// valid credential of the config's bootstrapMethod. With
	// spiffe.secretStore: the store refused the JWT-SVID's login or the
	// read, or held no valid credential (VaultSource).
	ExitBrokerRefused = 10
	// ExitBrokerUnavailable: the broker (or, with attestationMethod tpm,
	// its host's TPM enrollment endpoints) could not be reached, or stayed
	// busy (429, 503), until the deadline; or its certificate is not
	// trusted (spiffe.brokerCA). Kept apart from ExitBrokerRefused because
	// it points at the network or the operator rather than at the VM. With
	// spiffe.secretStore: the store was unreachable or failing, or the
	// operator had not written the credential, until the deadline.
	ExitBrokerUnavailable = 11
	// ExitNoSecrets: workloadMethod direct, and the operator placed no
	// runner credential of the config's bootstrapMethod at secretsFile
	// before secretsDeadline (the VM's guest agent not running, the
	// operator unable to reach the hypervisor, or the claim ended).
	ExitNoSecrets = 12
	// ExitDeadline: platform generic, and the script was still running at
	// the config's generic.deadline (the template's ttl): it was stopped.
	ExitDeadline = 13
	// ExitJobUserEscalates: the job user can become root in the VM (a
	// sudo rule, a root-equivalent group, root itself), the config's
	// credential serves more than one job, and the template did not accept
	// it (jobMayEscalate): no credential was obtained, no job ran
	// (harden.go; the power-off notice's guestRefusal says so).
	ExitJobUserEscalates = 14
)

// Defaults of the hyperfleet-agent flags.
const (
	DefaultIdleTimeout     = 2 * time.Hour
	DefaultDownloadTimeout = 10 * time.Minute
	// DefaultStopGracePeriod is how long a runner has to exit after SIGINT
	// before it is killed.
	DefaultStopGracePeriod = 30 * time.Second
)

// Default bounds of the runner package: GitHub's runner is about 200 MB
// packed, 600 MB and 5,000 files unpacked; the bounds leave room for
// growth while keeping a hostile or broken package (a decompression bomb,
// an endless response) from filling the VM's disk before the checksum or
// the unpacking fails.
const (
	DefaultMaxDownloadBytes = 1 << 30
	DefaultMaxUnpackedBytes = 4 << 30
	DefaultMaxUnpackedFiles = 100_000
)

// Options configure Run.
type Options struct {
	// ConfigPath is the agent config file (agentconfig.Path). It is read
	// as is: Root does not apply to it.
	ConfigPath string

	// Root, when set, is a directory prefixed to every absolute path taken
	// from the config file (runner.software.installPath and workDir) and
	// to the cloud-init copies the agent removes (CloudInitCopies). It
	// lets tests, and the Proxmox simulator's guests (many "VMs" sharing
	// one host), run agents side by side without touching the host's
	// /opt or /home. Empty in a real VM.
	Root string

	// System is what the agent makes fresh in the guest before it uses
	// a secret (its clock, its random number generator: freshen). Nil:
	// the host's own in a real VM, nothing when Root is set (a guest
	// sharing its host with others must not step the host's clock).
	System GuestSystem

	// RunAs is the user the runner runs as; its install and work
	// directories are handed to it. Empty: the agent's own user (when that
	// is root, RUNNER_ALLOW_RUNASROOT=1 is set, as the real runner refuses
	// to run as root otherwise).
	RunAs string

	// PowerOffCommand powers the VM off when the config's powerOffOnFinish
	// is true, whatever the outcome. Empty: never power off.
	PowerOffCommand []string

	// IdleTimeout: a runner that has not started a job ("Running job:")
	// this long after it started is stopped and Run returns ExitIdle.
	// Zero disables it.
	IdleTimeout time.Duration

	// DownloadTimeout bounds the runner package download. Zero: no bound
	// besides ctx.
	DownloadTimeout time.Duration

	// MaxDownloadBytes bounds the runner package download
	// (DefaultMaxDownloadBytes when zero).
	MaxDownloadBytes int64
	// MaxUnpackedBytes bounds the bytes of all files unpacked from the
	// package, MaxUnpackedFiles their number (entries of any kind)
	// (DefaultMaxUnpackedBytes, DefaultMaxUnpackedFiles when zero).
	MaxUnpackedBytes int64
	MaxUnpackedFiles int

	// TempDir holds the runner package while it is downloaded and
	// unpacked (os.TempDir() when empty).
	TempDir string

	// StopGracePeriod is how long the runner has to exit after SIGINT
	// before it is killed (DefaultStopGracePeriod when zero).
	StopGracePeriod time.Duration

	// Version is logged at start.
	Version string

	// Logger receives the agent's log and the runner's output (a text
	// handler on stderr when nil).
	Logger *slog.Logger

	// HTTPClient downloads the runner package. Nil: a client trusting the
	// system roots plus the PEM file named by SSL_CERT_FILE, read at each
	// Run.
	HTTPClient *http.Client

	// SPIREAgent is the spire-agent binary broker mode runs
	// (DefaultSPIREAgent when empty): `spire-agent run` with the join
	// token, and `spire-agent api fetch x509` for the X509-SVID.
	SPIREAgent string
	// SPIRESocket, when set, is the Workload API socket of a spire-agent
	// already running in the VM (installed and attested by the image's own
	// means): broker mode fetches its X509-SVID there and starts no
	// spire-agent, so attestationMethod and the join token are not used.
	SPIRESocket string
	// AttestTimeout bounds broker mode's attestation and credential fetch
	// together (DefaultAttestTimeout when zero); the attestation also ends
	// at the config's expiresAt.
	AttestTimeout time.Duration

	// Shell runs a generic VM's script (DefaultShell when empty).
	Shell string

	// NewCredentialSource picks the credential source for a config
	// (NewCredentialSource when nil). A seam for tests and for the broker.
	NewCredentialSource func(*agentconfig.Config) (CredentialSource, error)

	// hardening is the VM's hardening for the job (harden.go); nil: the
	// system's in a real VM, none otherwise. A seam for tests.
	hardening *hardening
}

// exitError is an error that ends Run with a specific exit code.
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string { return e.err.Error() }
func (e *exitError) Unwrap() error { return e.err }

// fail returns an error that makes Run exit with code.
func fail(code int, format string, args ...any) error {
	return &exitError{code: code, err: fmt.Errorf(format, args...)}
}

// attestationErrorOf is the power-off notice's attestationError for the
// credential source's err: why the VM got no identity, when the operator
// has something to check or fix ("" otherwise).
func attestationErrorOf(err error) string {
	switch {
	case err == nil:
		return ""
	case errors.Is(err, errJoinTokenRefused):
		// Used by someone else, unless it expired: the operator checks.
		return agentconfig.AttestationJoinTokenRefused
	case errors.Is(err, errTPMNotFound):
		return agentconfig.AttestationTPMNotFound
	case errors.Is(err, errTPMEnrollmentRefused):
		return agentconfig.AttestationTPMEnrollmentRefused
	case errors.Is(err, errTPMActivationFailed):
		return agentconfig.AttestationTPMActivationFailed
	}
	return ""
}

// exitCode maps an error of a step to Run's exit code.
func exitCode(err error) int {
	if err == nil {
		return ExitOK
	}
	var ee *exitError
	if errors.As(err, &ee) {
		return ee.code
	}
	var ue *UnsupportedError
	if errors.As(err, &ue) {
		return ExitUnsupported
	}
	return ExitInternal
}

// agent is the state of one Run.
type agent struct {
	opts    Options
	log     *slog.Logger
	secrets []string // redacted from the runner's output

	powerOff bool // set as soon as the config says so
	// notify, when set, is where the power-off is announced first.
	notify *agentconfig.PowerOffNotify
	// proxy is the config's HTTP proxy; nil: the environment's.
	proxy *agentconfig.Proxy
	// runnerOnline and jobStarted are what the runner printed, for the
	// power-off notice; attestationError why the VM got no identity.
	runnerOnline, jobStarted atomic.Bool
	attestationError         string
	// guestRefusal is why the agent refused to run the job, for the
	// power-off notice (agentconfig.GuestRefusal*).
	guestRefusal string

	// kind is the config's platform's part of the run; nil until the
	// config is read.
	kind RunnerKind
	// scriptExit is a generic VM's script's exit status, for the
	// power-off notice; nil when none ran.
	scriptExit *int

	// cleanup state
	installDir      string
	workDir         string
	removeInstall   bool // the runner was (being) downloaded into installDir
	cleanupPrepared bool
}

// Run runs the agent once and returns the process exit code (see the
// package documentation). Cancelling ctx (SIGTERM) stops the runner and
// still cleans up and powers off.
func Run(ctx context.Context, opts Options) int {
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.NewTextHandler(os.Stderr, nil))
	}
	if opts.StopGracePeriod <= 0 {
		opts.StopGracePeriod = DefaultStopGracePeriod
	}
	if opts.MaxDownloadBytes <= 0 {
		opts.MaxDownloadBytes = DefaultMaxDownloadBytes
	}
	if opts.MaxUnpackedBytes <= 0 {
		opts.MaxUnpackedBytes = DefaultMaxUnpackedBytes
	}
	if opts.MaxUnpackedFiles <= 0 {
		opts.MaxUnpackedFiles = DefaultMaxUnpackedFiles
	}
	if opts.NewCredentialSource == nil {
		opts.NewCredentialSource = NewCredentialSource
	}
	if opts.ConfigPath == "" {
		opts.ConfigPath = agentconfig.Path
	}
	a := &agent{opts: opts, log: opts.Logger}
	a.log.Info("hyperfleet-agent starting", "version", opts.Version, "config", opts.ConfigPath, "root", opts.Root,
		"runAs", opts.RunAs, "idleTimeout", opts.IdleTimeout, "pid", os.Getpid())

	err := a.safeRun(ctx)
	a.cleanup()
	code := exitCode(err)
	if err != nil {
		a.log.Error("agent finished with an error", "exitCode", code, "error", err)
	} else {
		a.log.Info("agent finished: the runner ran its job", "exitCode", code)
	}
	if a.powerOff {
		a.notifyPowerOff()
		a.runPowerOff()
	}
	return code
}

// safeRun is run with a panic turned into an error, so that cleanup and
// power-off still happen.
func (a *agent) safeRun(ctx context.Context) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fail(ExitInternal, "internal error: %v\n%s", r, debug.Stack())
		}
	}()
	return a.run(ctx)
}

func (a *agent) run(ctx context.Context) error {
	cfg, err := a.readConfig()
	if err != nil {
		return err
	}
	a.powerOff = cfg.PowerOffOnFinish
	a.notify = cfg.PowerOffNotify
	a.proxy = cfg.Proxy
	if a.notify != nil {
		a.secrets = append(a.secrets, a.notify.Token)
	}
	sw := cfg.Runner.Software
	a.log.Info("config read", "workloadMethod", cfg.WorkloadMethod, "bootstrapMethod", cfg.BootstrapMethod,
		"runnerName", cfg.Runner.Name, "labels", strings.Join(cfg.Runner.Labels, ","), "group", cfg.Runner.Group,
		"registrationURL", cfg.RegistrationURL, "downloadURL", safeURL(sw.DownloadURL), "installPath", sw.InstallPath,
		"workDir", sw.WorkDir, "expiresAt", cfg.ExpiresAt, "secretsFile", cfg.SecretsFile, "secretsDeadline", cfg.SecretsDeadline,
		"powerOffOnFinish", cfg.PowerOffOnFinish, "proxy", cfg.Proxy != nil)

	if !cfg.ExpiresAt.IsZero() && !time.Now().Before(cfg.ExpiresAt) {
		return fail(ExitExpired, "the join token expired at %s; not trying it", cfg.ExpiresAt.UTC().Format(time.RFC3339))
	}

	kind, err := runnerKindFor(cfg.Platform)
	if err != nil {
		return err
	}
	a.kind = kind
	install := ""
	if sw.InstallPath != "" {
		if install, err = a.rooted("runner.software.installPath", sw.InstallPath); err != nil {
			return err
		}
	}
	work, err := a.rooted("runner.software.workDir", sw.WorkDir)
	if err != nil {
		return err
	}
	a.installDir, a.workDir, a.cleanupPrepared = install, work, true

	// A generic VM's script runs as the user its config names, the one
	// its SPIRE entry selects (agentconfig.Generic.User): --run-as is a
	// default of the image, which cannot know that entry.
	runAsName, runAsFrom := a.opts.RunAs, "--run-as"
	if g := cfg.Generic; cfg.Platform == agentconfig.PlatformGeneric && g != nil {
		runAsName, runAsFrom = g.User, "generic.user"
	}
	user, err := lookupRunAs(runAsName, runAsFrom)
	if err != nil {
		return err
	}
	user.proxyEnv = cfg.Proxy.Env()
	a.log.Info("runner user", "user", user.describe(), "uid", user.uid, "gid", user.gid)
	// Before any credential exists: neither the secrets nor the runner
	// may be reachable by the job.
	if err := a.hardenForJob(ctx, cfg, user); err != nil {
		return err
	}

	if cfg.SecretsFile != "" {
		// Made before the hint: the operator may write as soon as it hears.
		code := ExitNoSecrets
		if cfg.WorkloadMethod == agentconfig.WorkloadBroker {
			code = ExitAttestation
		}
		if err := prepareSecretsDir(filepath.Join(a.opts.Root, filepath.FromSlash(cfg.SecretsFile)), code); err != nil {
			return err
		}
		hintCtx, stop := context.WithTimeout(ctx, readyHintBudget)
		defer stop()
		go a.announceReady(hintCtx)
	}
	return kind.run(ctx, a, &place{cfg: cfg, install: install, work: work, user: user})
}

// credentialSource is the config's CredentialSource, with the agent's
// Options handed to it.
func (a *agent) credentialSource(cfg *agentconfig.Config) (CredentialSource, error) {
	src, err := a.opts.NewCredentialSource(cfg)
	if err != nil {
		return nil, err
	}
	if o, ok := src.(optionsUser); ok {
		o.useOptions(&a.opts)
	}
	return src, nil
}

// prepareWorkDir makes the work directory and hands it (and install,
// when set) to the runner user.
func (a *agent) prepareWorkDir(install, work string, user *runAs) error {
	if err := os.MkdirAll(work, 0o755); err != nil {
		return fail(ExitInternal, "create workDir: %v", err)
	}
	if user.cred != nil {
		for _, dir := range []string{install, work} {
			if dir == "" {
				continue
			}
			if err := chownTree(dir, user.uid, user.gid); err != nil {
				return fail(ExitInternal, "hand %s to the runner user: %v", dir, err)
			}
		}
	}
	return nil
}

// readConfig reads the config file, removes it before anything else
// happens, then parses it.
func (a *agent) readConfig() (*agentconfig.Config, error) {
	path := a.opts.ConfigPath
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fail(ExitBadConfig, "read config file: %v", err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		// Go on: stopping would not remove it either, and the VM is
		// single-use. The file is root's, mode 0600.
		a.log.Error("cannot remove the config file, which holds the runner credential", "path", path, "error", err)
	} else {
		a.log.Info("config file removed", "path", path, "bytes", len(data))
	}
	a.scrubCloudInitCopies(data)
	cfg, err := agentconfig.Parse(data)
	if err != nil {
		// Still honour powerOffOnFinish if the document says so at all:
		// a VM whose config is broken must not linger.
		var loose struct {
			PowerOffOnFinish bool `json:"powerOffOnFinish"`
		}
		if json.Unmarshal(data, &loose) == nil {
			a.powerOff = loose.PowerOffOnFinish
		}
		return nil, fail(ExitBadConfig, "%v", err)
	}
	return cfg, nil
}

// rooted prefixes an absolute path of the config with Options.Root and
// refuses paths whose removal would be a disaster.
func (a *agent) rooted(field, p string) (string, error) {
	clean := filepath.Clean(p)
	if clean == "/" || clean == "." {
		return "", fail(ExitBadConfig, "%s: %q cannot be used: the agent empties it", field, p)
	}
	if a.opts.Root == "" {
		return clean, nil
	}
	return filepath.Join(a.opts.Root, clean), nil
}

// cleanup runs whatever happened: the runner's credential files go, the
// work directory is emptied, a downloaded runner is removed.
func (a *agent) cleanup() {
	if !a.cleanupPrepared {
		return
	}
	a.removeCredentialFiles()
	if err := emptyDir(a.workDir); err != nil {
		a.log.Error("cannot empty the work directory", "path", a.workDir, "error", err)
	} else {
		a.log.Info("work directory emptied", "path", a.workDir)
	}
	if a.removeInstall {
		if err := os.RemoveAll(a.installDir); err != nil {
			a.log.Error("cannot remove the downloaded runner", "path", a.installDir, "error", err)
		} else {
			a.log.Info("downloaded runner removed", "path", a.installDir)
		}
	}
}

// removeCredentialFiles removes the files of installPath that let the
// platform's runner talk to its platform (runnerKind.credentialFiles).
func (a *agent) removeCredentialFiles() {
	if a.installDir == "" || a.kind == nil {
		return
	}
	for _, f := range a.kind.credentialFiles() {
		p := filepath.Join(a.installDir, f)
		switch err := os.Remove(p); {
		case err == nil:
			a.log.Info("runner credential file removed", "path", p)
		case !errors.Is(err, os.ErrNotExist):
			a.log.Error("cannot remove a runner credential file", "path", p, "error", err)
		}
	}
}

// emptyDir removes everything in dir but dir itself; a missing dir is
// fine.
func emptyDir(dir string) error {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	var errs []error
	for _, e := range entries {
		if err := os.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// chownTree hands dir and everything in it to uid:gid (symbolic links
// themselves, not their targets).
func chownTree(dir string, uid, gid int) error {
	return filepath.WalkDir(dir, func(p string, _ os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(p, uid, gid)
	})
}

// powerOffTimeout bounds the power-off command (systemctl poweroff returns
// at once; the shutdown then stops the agent).
const powerOffTimeout = 2 * time.Minute

// runPowerOff runs the power-off command, logging its failure: the VM must
// not outlive its job.
func (a *agent) runPowerOff() {
	argv := a.opts.PowerOffCommand
	if len(argv) == 0 {
		a.log.Warn("powerOffOnFinish is set but the power-off command is empty; not powering off")
		return
	}
	a.log.Info("powering the VM off", "command", strings.Join(argv, " "))
	ctx, cancel := context.WithTimeout(context.Background(), powerOffTimeout)
	defer cancel()
	out, err := exec.CommandContext(ctx, argv[0], argv[1:]...).CombinedOutput()
	if err != nil {
		a.log.Error("power-off command failed", "command", strings.Join(argv, " "), "error", err, "output", strings.TrimSpace(tailString(string(out), 2048)))
	}
}

func tailString(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[len(s)-n:]
}

// Command hyperfleet-agent is HyperFleet's in-VM agent: the hyperfleet-agent
// systemd unit that cloud-init installs runs it once per VM
// (`hyperfleet-agent --config /etc/hyperfleet/agent.json`), and it runs
// package internal/agent with the configuration file of package
// internal/agentconfig. It links only the standard library and this module,
// and go-tpm for attestationMethod tpm, and on Windows golang.org/x/sys's
// windows packages (deps_test.go).
//
// It reads (and at once removes) the config file, waits for the operator to
// place the single-use runner credential in the running VM (at the
// config's secretsFile, through the hypervisor's guest channel; never on
// the seed), installs the GitHub Actions runner, registers it if needed,
// runs exactly one job, cleans up and powers the VM off. The exit codes
// are those of package internal/agent (0 job done, 1 agent error, 2 bad
// config, 3 runner software, 4 registration failed, 5 runner failed,
// 6 idle deadline, 7 credential expired, 8 unsupported mode, 9 SPIRE
// attestation failed, 10 credential broker refused, 11 credential broker
// unavailable, 12 no credential placed before secretsDeadline).
//
// In broker mode (workloadMethod broker) it attests with SPIRE by running
// spire-agent with the join token the operator places at secretsFile, fetches its X509-SVID from
// spire-agent's Workload API, asks the operator's credential broker for
// the runner credential over mTLS, then stops spire-agent and removes
// everything of the identity before the job runs. With
// spiffe.attestationMethod tpm the operator places an enrollment proof
// instead of the join token: the agent creates a DevID key in the VM's TPM
// (spiffe.tpmDevicePath), has the operator certify it at the enrollment
// endpoints on the broker's host (/tpm/v1/enroll, a credential activation
// challenge only that TPM answers, /tpm/v1/activate), and runs spire-agent
// with SPIRE's tpm_devid node attestor.
//
// Exit code 9 comes with an attestationError in the power-off notice when
// the operator has something to look at: JoinTokenRefused (SPIRE refused
// the join token as used or expired), TPMNotFound (no TPM at
// spiffe.tpmDevicePath), TPMEnrollmentRefused (the operator's enrollment
// endpoints refused the enrollment or the challenge's answer; the agent
// logs their reason) or TPMActivationFailed (the TPM could not recover the
// operator's challenge).
//
// Flags:
//
//	--config FILE            the agent config (default /etc/hyperfleet/agent.json)
//	--root DIR               prefix every absolute path from the config
//	                         (runner.software.installPath, workDir) with DIR;
//	                         for tests and for the Proxmox simulator's guests,
//	                         where many "VMs" share one host. Not applied to
//	                         --config. Empty in a real VM.
//	--run-as USER            the user the runner runs as (default runner);
//	                         "" runs it as the agent's own user (as root, with
//	                         RUNNER_ALLOW_RUNASROOT=1). A generic VM's script
//	                         runs as its config's generic.user instead
//	--poweroff-command CMD   powers the VM off when the config's
//	                         powerOffOnFinish is true, whatever the outcome
//	                         (split at white space; default
//	                         "systemctl poweroff"; empty disables)
//	--idle-timeout D         stop the runner if it has started no job after D
//	                         (default 2h; 0 disables)
//	--download-timeout D     bound the runner package download (default 10m)
//	--max-download-bytes N   refuse a larger runner package (default 1 GiB)
//	--max-unpacked-bytes N   refuse a package whose files unpack to more
//	                         (default 4 GiB)
//	--max-unpacked-files N   refuse a package with more entries (default 100000)
//	--spire-agent PATH       spire-agent binary of broker mode (default
//	                         /opt/spire/bin/spire-agent)
//	--spire-socket PATH      the Workload API socket of a spire-agent the
//	                         image runs itself: broker mode fetches its
//	                         X509-SVID there, starts no spire-agent, uses
//	                         no join token and enrolls no TPM
//	                         (--spire-agent is still run, for
//	                         `spire-agent api fetch x509`)
//	--attest-timeout D       bound on broker mode's attestation and
//	                         credential fetch (default 5m; the attestation
//	                         also ends at the config's expiresAt)
//	--log FILE               append the log to FILE instead of stderr
//	--version                print the version and exit
//
// On Windows (docs/windows.md) the defaults are --config
// C:\ProgramData\HyperFleet\agent.json, --run-as "" (the service's own
// account) and --poweroff-command "shutdown.exe /s /t 0 /f /d p:4:1"; the
// agent runs as the Windows service hyperfleet-agent, which
//
//	hyperfleet-agent service install --config FILE --log FILE [flags]
//	hyperfleet-agent service uninstall
//
// create (manual start, LocalSystem, no restart) and delete.
//
// On Linux, `hyperfleet-agent buildkite-bootstrap --user USER -- BOOTSTRAP
// ARGS...` is not for people: it is the bootstrap-script the agent gives
// buildkite-agent, which runs as root, so that each Buildkite job runs as
// USER (internal/agent/buildkite_bootstrap.go).
//
// The binary uses the standard library (and go-tpm, pure Go) only and is
// built static:
//
//	CGO_ENABLED=0 go build -ldflags "-X main.version=$VERSION" ./cmd/hyperfleet-agent
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/hyperfleet/hyperfleet/internal/agent"
	"github.com/hyperfleet/hyperfleet/internal/agentconfig"
	"github.com/hyperfleet/hyperfleet/pkg/workload/buildkite/buildkitevm"
	"github.com/hyperfleet/hyperfleet/pkg/workload/github/githubvm"
	"github.com/hyperfleet/hyperfleet/pkg/workload/gitlab/gitlabvm"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

func main() {
	registerRunners()
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// registerRunners registers the runner kind of every platform this agent
// runs, under the name the platform's package gives it, as the operator's
// main registers the platforms' back-ends (workload.Register). Importing a
// platform's package also registers its part of the agent config
// (agentconfig.RegisterPlatform).
func registerRunners() {
	agent.RegisterRunner(githubvm.Platform, agent.GitHubActionsRunner)
	agent.RegisterRunner(gitlabvm.Platform, agent.GitLabRunner)
	agent.RegisterRunner(buildkitevm.Platform, agent.BuildkiteRunner)
	agent.RegisterRunner(agentconfig.PlatformGeneric, agent.GenericRunner)
}

func run(args []string, stdout, stderr io.Writer) int {
	if code, ok := platformCommand(args, stdout, stderr); ok {
		return code
	}
	if len(args) > 0 && args[0] == agent.BuildkiteBootstrapCommand {
		// Hidden: buildkite-agent's bootstrap-script, which the agent
		// sets (internal/agent/buildkite.go); it runs each job as the
		// runner user.
		return agent.BuildkiteBootstrap(args[1:], stderr)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	return runAgent(ctx, args, stdout, stderr)
}

// runAgent parses the agent's flags and runs it until ctx ends.
func runAgent(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("hyperfleet-agent", flag.ContinueOnError)
	fs.SetOutput(stderr)
	configPath := fs.String("config", defaultConfigPath, "the agent config file, removed as soon as it is read")
	root := fs.String("root", "", "directory prefixed to every absolute path from the config (installPath, workDir); for tests and simulated VMs sharing one host, empty in a real VM")
	runAs := fs.String("run-as", defaultRunAs, `user the runner runs as; "" for the agent's own user (a generic VM's config names its script's user, which wins)`)
	powerOff := fs.String("poweroff-command", defaultPowerOff, "command that powers the VM off when the config's powerOffOnFinish is true (split at white space; empty disables)")
	idle := fs.Duration("idle-timeout", agent.DefaultIdleTimeout, "stop the runner when it has started no job this long after it started (0 disables)")
	download := fs.Duration("download-timeout", agent.DefaultDownloadTimeout, "bound on the runner package download (0: none)")
	maxDownload := fs.Int64("max-download-bytes", agent.DefaultMaxDownloadBytes, "largest runner package downloaded")
	maxUnpacked := fs.Int64("max-unpacked-bytes", agent.DefaultMaxUnpackedBytes, "most bytes of files unpacked from the runner package")
	maxFiles := fs.Int("max-unpacked-files", agent.DefaultMaxUnpackedFiles, "most entries unpacked from the runner package")
	spireAgent := fs.String("spire-agent", agent.DefaultSPIREAgent, "spire-agent binary run in broker mode")
	spireSocket := fs.String("spire-socket", "", "Workload API socket of a spire-agent the image runs itself; broker mode then starts none and uses no join token")
	attest := fs.Duration("attest-timeout", agent.DefaultAttestTimeout, "bound on broker mode's attestation and credential fetch (the attestation also ends at the config's expiresAt)")
	logFile := fs.String("log", "", "append the log to this file instead of stderr (a Windows service has no console)")
	showVersion := fs.Bool("version", false, "print the version and exit")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return agent.ExitOK
		}
		return agent.ExitBadConfig
	}
	if *showVersion {
		fmt.Fprintln(stdout, "hyperfleet-agent", version)
		return agent.ExitOK
	}
	switch {
	case fs.NArg() > 0:
		fmt.Fprintf(stderr, "hyperfleet-agent: unexpected arguments %q\n", fs.Args())
		return agent.ExitBadConfig
	case *idle < 0 || *download < 0:
		fmt.Fprintln(stderr, "hyperfleet-agent: --idle-timeout and --download-timeout must not be negative")
		return agent.ExitBadConfig
	case *attest <= 0:
		fmt.Fprintln(stderr, "hyperfleet-agent: --attest-timeout must be positive")
		return agent.ExitBadConfig
	case *spireAgent == "":
		fmt.Fprintln(stderr, "hyperfleet-agent: --spire-agent must not be empty")
		return agent.ExitBadConfig
	case *maxDownload <= 0 || *maxUnpacked <= 0 || *maxFiles <= 0:
		fmt.Fprintln(stderr, "hyperfleet-agent: --max-download-bytes, --max-unpacked-bytes and --max-unpacked-files must be positive")
		return agent.ExitBadConfig
	}

	logOut := stderr
	if *logFile != "" {
		f, err := os.OpenFile(*logFile, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
		if err != nil {
			fmt.Fprintf(stderr, "hyperfleet-agent: --log: %v\n", err)
			return agent.ExitBadConfig
		}
		defer f.Close()
		logOut = f
	}
	return agent.Run(ctx, agent.Options{
		ConfigPath:       *configPath,
		Root:             *root,
		RunAs:            *runAs,
		PowerOffCommand:  strings.Fields(*powerOff),
		IdleTimeout:      *idle,
		DownloadTimeout:  *download,
		MaxDownloadBytes: *maxDownload,
		MaxUnpackedBytes: *maxUnpacked,
		MaxUnpackedFiles: *maxFiles,
		SPIREAgent:       *spireAgent,
		SPIRESocket:      *spireSocket,
		AttestTimeout:    *attest,
		Version:          version,
		Logger:           slog.New(slog.NewTextHandler(logOut, nil)),
	})
}

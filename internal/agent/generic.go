package agent

import (
	"context"
	"errors"
	"time"
)

// Environment of a generic VM's script.
const (
	// EnvClaim is the VM's MachineClaim as namespace/name.
	EnvClaim = "HYPERFLEET_CLAIM"
	// EnvClaimUID is the claim's uid.
	EnvClaimUID = "HYPERFLEET_CLAIM_UID"
	// EnvDeadline is when the VM's ttl ends, RFC 3339: the agent stops
	// the script then and powers the VM off.
	EnvDeadline = "HYPERFLEET_DEADLINE"
	// EnvSPIFFESocket is the Workload API of the VM's attested
	// spire-agent, unix://<path> (go-spiffe's variable); set only when
	// the template attests.
	EnvSPIFFESocket = "SPIFFE_ENDPOINT_SOCKET"
)

// DefaultShell runs a generic VM's script.
const DefaultShell = "/bin/sh"

// errDeadline: a generic VM's script was still running at its deadline.
var errDeadline = errors.New("the VM reached its deadline (spec.bootstrap.generic.ttl)")

// genericRunner is platform generic's runner kind: no CI platform and no
// runner credential. With SPIFFE the VM attests and keeps its spire-agent
// running while the script runs, so that the script fetches its own SVIDs
// through SPIFFE_ENDPOINT_SOCKET; without, the script gets no credential
// at all. The script runs once, by /bin/sh as the runner user in the work
// directory; its exit, whatever its status, ends the run, and so does the
// deadline (the script is stopped). Cleanup and power-off are the
// agent's, as for every platform.
type genericRunner struct{}

// GenericRunner is platform generic's runner kind
// (agentconfig.PlatformGeneric).
var GenericRunner RunnerKind = genericRunner{}

func (genericRunner) credentialFiles() []string { return nil }

func (genericRunner) run(ctx context.Context, a *agent, p *place) error {
	g := p.cfg.Generic
	if !time.Now().Before(g.Deadline) {
		return fail(ExitExpired, "the VM's deadline %s has passed; not running the script", g.Deadline.UTC().Format(time.RFC3339))
	}
	// Everything below, attestation included, ends at the deadline.
	runCtx, cancel := context.WithDeadline(ctx, g.Deadline)
	defer cancel()

	env := []string{
		EnvClaim + "=" + g.Claim.Namespace + "/" + g.Claim.Name,
		EnvClaimUID + "=" + g.Claim.UID,
		EnvDeadline + "=" + g.Deadline.UTC().Format(time.RFC3339),
	}
	if p.cfg.SPIFFE != nil {
		src, err := a.credentialSource(p.cfg)
		if err != nil {
			return err
		}
		holder, ok := src.(IdentityHolder)
		if !ok {
			return fail(ExitInternal, "the credential source %T cannot hold the VM's identity for a generic VM", src)
		}
		id, err := holder.HoldIdentity(runCtx, p.user.cred)
		a.attestationError = attestationErrorOf(err)
		if err != nil {
			if ctx.Err() == nil && runCtx.Err() != nil {
				return fail(ExitExpired, "%v while attesting: %v", errDeadline, err)
			}
			return err
		}
		// Until the script ends, not longer: an identity left running is
		// one nothing needs.
		defer id.Release()
		a.log.Info("SPIFFE identity held for the script", "spiffeID", id.SPIFFEID, "socket", id.Socket)
		env = append(env, EnvSPIFFESocket+"=unix://"+id.Socket)
	}
	if err := a.prepareWorkDir("", p.work, p.user); err != nil {
		return err
	}
	shell := a.opts.Shell
	if shell == "" {
		shell = DefaultShell
	}
	a.log.Info("running the generic script", "shell", shell, "bytes", len(g.Script), "workDir", p.work,
		"deadline", g.Deadline.UTC().Format(time.RFC3339))
	proc, err := a.start(shell, []string{"-c", g.Script, "hyperfleet-script"}, p.work, p.user.env(env...), p.user, "script", nil)
	if err != nil {
		return fail(ExitRunnerSoftware, "start %s: %v", shell, err)
	}
	var result error
	select {
	case <-proc.done:
	case <-runCtx.Done():
		if ctx.Err() != nil {
			a.log.Warn("stopping the script: the agent was asked to stop")
			result = fail(ExitInternal, "stopped before the script finished: %v", ctx.Err())
		} else {
			a.log.Warn("stopping the script: the VM reached its deadline", "deadline", g.Deadline.UTC().Format(time.RFC3339))
			result = fail(ExitDeadline, "%v at %s; the script was stopped", errDeadline, g.Deadline.UTC().Format(time.RFC3339))
		}
		proc.stop(a.opts.StopGracePeriod)
	}
	code := proc.exitCode()
	a.scriptExit = &code
	a.log.Info("script exited", "status", proc.describeExit())
	if result != nil {
		return result
	}
	if code != 0 {
		return fail(ExitRunnerFailed, "the script failed (%s)", proc.describeExit())
	}
	return nil
}

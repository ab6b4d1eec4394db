package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"time"

	"github.com/hyperfleet/hyperfleet/internal/agentconfig"
)

// guestSecretsPoll is how often the agent looks for the secrets the
// operator places in the running VM: a stat of a tmpfs file, cheap enough
// to keep the operator's delivery, not the agent, the wait a job sees.
const guestSecretsPoll = 50 * time.Millisecond

// prepareSecretsDir makes the directory of path (the config's
// secretsFile, under Options.Root) root's alone (0700) before anything can
// arrive in it: the guest channel creates the file readable by every user
// of the VM (QEMU's guest agent makes new files 0666). cloud-init's bootcmd
// made it at boot; the agent makes sure, and that it is root's: an image
// that made it another user's (or a link to elsewhere) would hand that
// user every file placed in it.
func prepareSecretsDir(path string, code int) error {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fail(code, "create %s for the secrets the operator places in the VM: %v", dir, err)
	}
	fi, err := os.Lstat(dir)
	if err != nil {
		return fail(code, "make %s private to root: %v", dir, err)
	}
	if !fi.IsDir() {
		return fail(code, "%s, where the operator places the VM's secrets, is not a directory (%s): remove it from the image", dir, fi.Mode().Type())
	}
	if runtime.GOOS != "windows" && os.Geteuid() == 0 {
		if err := os.Lchown(dir, 0, 0); err != nil {
			return fail(code, "make %s root's: %v", dir, err)
		}
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		return fail(code, "make %s private to root: %v", dir, err)
	}
	return nil
}

// waitGuestSecrets waits until the operator has placed the VM's
// GuestSecrets at path through the hypervisor's guest channel
// (the config's secretsFile, under Options.Root), reads them and removes
// the file. parent is the agent's own context, whose end (a signal) is not
// a failure; ctx ends at the deadline, which fails with code (ExitNoSecrets,
// or ExitAttestation when the join token was waited for). A document read
// while it is being written is incomplete and read again.
func waitGuestSecrets(parent, ctx context.Context, log *slog.Logger, sys GuestSystem, path string, code int) (agentconfig.GuestSecrets, error) {
	if err := prepareSecretsDir(path, code); err != nil {
		return agentconfig.GuestSecrets{}, err
	}
	log.Info("waiting for the operator to place the VM's secrets in it", "path", path)
	started := time.Now()
	tick := time.NewTicker(guestSecretsPoll)
	defer tick.Stop()
	last := "no file yet"
	for {
		// The file's modification time is the guest's clock at the
		// write: freshen counts the time since then (the clock, however
		// far off, is the same clock now).
		var sinceWritten time.Duration
		if info, err := os.Stat(path); err == nil {
			sinceWritten = time.Since(info.ModTime())
		}
		data, err := os.ReadFile(path)
		switch {
		case err == nil:
			g, perr := agentconfig.ParseGuestSecrets(data)
			clear(data)
			if perr == nil {
				if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
					log.Error("cannot remove the secrets file", "path", path, "error", err)
				}
				log.Info("secrets received from the operator; their file removed", "path", path, "waited", time.Since(started).Round(time.Millisecond))
				if err := freshen(ctx, log, sys, g.Fresh, sinceWritten, code); err != nil {
					return agentconfig.GuestSecrets{}, err
				}
				return g, nil
			}
			last = perr.Error()
		case !errors.Is(err, os.ErrNotExist):
			return agentconfig.GuestSecrets{}, fail(code, "read the secrets at %s: %v", path, err)
		}
		select {
		case <-parent.Done():
			return agentconfig.GuestSecrets{}, fmt.Errorf("waiting for the VM's secrets stopped: %w", parent.Err())
		case <-ctx.Done():
			return agentconfig.GuestSecrets{}, fail(code,
				"the operator placed no secrets at %s before the deadline (secretsDeadline, and in broker mode --attest-timeout and expiresAt); it writes them through the VM's guest agent once the VM runs, which must be installed and running (qemu-guest-agent, agent: 1 on the template; docs/templates.md); last: %s", path, last)
		case <-tick.C:
		}
	}
}

// GuestSource is workloadMethod direct: the operator places the runner
// credential in the running VM, at the config's secretsFile, through the
// hypervisor's guest channel (never in the config, whose seed can be read
// off the hypervisor's storage). Credential waits for it until Deadline,
// reads and removes the file, and returns the credential of Method.
//
// Exit codes: ExitNoSecrets when nothing usable arrived before Deadline (or
// the document holds another kind of credential than the config's
// bootstrapMethod), ExitExpired when the credential arrived expired.
type GuestSource struct {
	// Method is the config's bootstrapMethod.
	Method agentconfig.BootstrapMethod
	// File is the config's secretsFile and Deadline its secretsDeadline.
	File     string
	Deadline time.Time
	// RegistrationURL is the config's registrationURL, used when the
	// document names none.
	RegistrationURL string

	// The agent's settings (Options), filled in by Run.

	// Root prefixes File (Options.Root).
	Root string
	// Logger receives progress (never a secret); slog.Default when nil.
	Logger *slog.Logger
	// System is made fresh before the credential is used
	// (Options.System); nil changes nothing.
	System GuestSystem
}

// useOptions fills in the agent's settings.
func (g *GuestSource) useOptions(o *Options) {
	g.Root, g.Logger, g.System = o.Root, o.Logger, guestSystem(o)
}

// Prepare makes the directory the credential arrives in root's alone, as
// Run does before its ready hint (a guest that sends the hint itself calls
// it first).
func (g *GuestSource) Prepare() error {
	return prepareSecretsDir(filepath.Join(g.Root, filepath.FromSlash(g.File)), ExitNoSecrets)
}

// Credential waits for the runner credential (see GuestSource).
func (g *GuestSource) Credential(ctx context.Context) (Credential, error) {
	log := g.Logger
	if log == nil {
		log = slog.Default()
	}
	waitCtx, cancel := context.WithDeadline(ctx, g.Deadline)
	defer cancel()
	doc, err := waitGuestSecrets(ctx, waitCtx, log, systemOr(g.System, log), filepath.Join(g.Root, filepath.FromSlash(g.File)), ExitNoSecrets)
	if err != nil {
		return Credential{}, err
	}
	cred := Credential{Method: g.Method, JITConfig: doc.JITConfig, RegistrationToken: doc.RegistrationToken, RegistrationURL: doc.RegistrationURL, Job: doc.Job}
	if cred.RegistrationURL == "" {
		cred.RegistrationURL = g.RegistrationURL
	}
	if spec, _ := agentconfig.LookupMethod(g.Method); spec.JITConfig != (doc.JITConfig != "") || doc.JITConfig == "" && doc.RegistrationToken == "" {
		return Credential{}, fail(ExitNoSecrets, "the secrets the operator placed at %s hold no %s credential, which the config's bootstrapMethod names", g.File, g.Method)
	}
	if !doc.ExpiresAt.IsZero() && !time.Now().Before(doc.ExpiresAt) {
		return Credential{}, fail(ExitExpired, "the runner credential expired at %s; not trying it", doc.ExpiresAt.UTC().Format(time.RFC3339))
	}
	return cred, nil
}

// String describes the source; it holds no secret.
func (g *GuestSource) String() string {
	return fmt.Sprintf("%s credential from %s (until %s)", g.Method, g.File, g.Deadline.UTC().Format(time.RFC3339))
}

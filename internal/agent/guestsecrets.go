package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/hyperfleet/hyperfleet/internal/agentconfig"
)

// guestSecretsPoll is how often the agent looks for the join token the
// operator places in the running VM.
const guestSecretsPoll = 250 * time.Millisecond

// waitGuestSecrets waits until the operator has placed the VM's
// GuestSecrets (join token and broker proof) at path through the
// hypervisor's guest channel (spiffe.joinTokenFile, under Options.Root),
// reads them and removes the file. parent is the agent's own context,
// whose end (a signal) is not an attestation failure; ctx ends at the
// attestation deadline.
//
// The guest channel creates the file readable by every user of the VM
// (QEMU's guest agent makes new files 0666), so its directory is made, and
// kept, root's alone (0700) before anything can arrive in it: cloud-init's
// bootcmd made it at boot, and the agent makes sure. A document read while
// it is being written is incomplete and read again.
func waitGuestSecrets(parent, ctx context.Context, log *slog.Logger, path string) (agentconfig.GuestSecrets, error) {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return agentconfig.GuestSecrets{}, fail(ExitAttestation, "create %s for the join token: %v", dir, err)
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		return agentconfig.GuestSecrets{}, fail(ExitAttestation, "make %s private to root: %v", dir, err)
	}
	log.Info("waiting for the operator to place the join token in the VM", "path", path)
	started := time.Now()
	tick := time.NewTicker(guestSecretsPoll)
	defer tick.Stop()
	last := "no file yet"
	for {
		data, err := os.ReadFile(path)
		switch {
		case err == nil:
			g, perr := agentconfig.ParseGuestSecrets(data)
			clear(data)
			if perr == nil {
				if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
					log.Error("cannot remove the join token file", "path", path, "error", err)
				}
				log.Info("join token received from the operator; its file removed", "path", path, "waited", time.Since(started).Round(time.Millisecond))
				return g, nil
			}
			last = perr.Error()
		case !errors.Is(err, os.ErrNotExist):
			return agentconfig.GuestSecrets{}, fail(ExitAttestation, "read the join token at %s: %v", path, err)
		}
		select {
		case <-parent.Done():
			return agentconfig.GuestSecrets{}, fmt.Errorf("attestation stopped: %w", parent.Err())
		case <-ctx.Done():
			return agentconfig.GuestSecrets{}, fail(ExitAttestation,
				"the operator placed no join token at %s before the attestation deadline (--attest-timeout, expiresAt); it writes it through the VM's guest agent, which must run (qemu-guest-agent, agent: 1 on the template; docs/templates.md); last: %s", path, last)
		case <-tick.C:
		}
	}
}

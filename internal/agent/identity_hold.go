package agent

import (
	"cmp"
	"context"
	"log/slog"
	"os"
	"path/filepath"

	"github.com/hyperfleet/hyperfleet/internal/agentconfig"
)

// HeldIdentity is the VM's SPIFFE identity kept running for a workload
// that fetches its SVIDs itself (platform generic): the Workload API
// socket of the attested spire-agent, its SPIFFE ID, and Release, which
// stops spire-agent and removes everything of the identity.
type HeldIdentity struct {
	Socket   string
	SPIFFEID string
	Release  func()
}

// IdentityHolder is a source that attests and keeps the identity running
// instead of fetching a runner credential with it (BrokerSource).
type IdentityHolder interface {
	// HoldIdentity attests and returns the running identity;
	// openToOthers lets a user other than the agent's reach its socket.
	HoldIdentity(ctx context.Context, openToOthers bool) (*HeldIdentity, error)
}

// HoldIdentity attests as Credential does (join token or TPM, or a
// pre-installed spire-agent's socket), but fetches no credential and
// leaves spire-agent running: a generic VM's script fetches its own
// SVIDs through the Workload API until it ends, and the caller then calls
// Release. openToOthers opens the run directory (traverse only: the
// config with the join token is already removed) so that a runner user
// other than the agent's reaches the socket.
func (b *BrokerSource) HoldIdentity(ctx context.Context, openToOthers bool) (*HeldIdentity, error) {
	s := b.SPIFFE
	if s == nil {
		return nil, fail(ExitBadConfig, "spiffe: is missing; workloadMethod broker needs SPIFFE attestation settings")
	}
	switch s.AttestationMethod {
	case agentconfig.AttestationJoinToken, agentconfig.AttestationTPM:
	default:
		return nil, fail(ExitUnsupported, "spiffe.attestationMethod %q is not one this agent implements (join-token, tpm)", s.AttestationMethod)
	}
	log := cmp.Or(b.Logger, slog.Default())
	fetchCtx, cancel := context.WithTimeout(ctx, cmp.Or(b.AttestTimeout, DefaultAttestTimeout))
	defer cancel()
	base := filepath.Join(b.Root, filepath.FromSlash(SPIREDir))
	run, err := newSPIRERun(log, cmp.Or(b.SPIREAgent, DefaultSPIREAgent), base)
	if err != nil {
		return nil, err
	}
	cert, err := b.attest(ctx, fetchCtx, run)
	if err != nil {
		run.stop()
		return nil, err
	}
	id := ""
	if leaf := cert.Leaf; leaf != nil && len(leaf.URIs) == 1 {
		id = leaf.URIs[0].String()
	}
	if openToOthers && b.SPIRESocket == "" {
		// spire-agent's own files stay its own (its data directory is
		// 0700); the socket is for every local process, which the
		// unix workload attestor tells apart by uid.
		for _, dir := range []string{base, run.dir} {
			if err := os.Chmod(dir, 0o711); err != nil {
				run.stop()
				return nil, fail(ExitInternal, "open %s to the runner user: %v", dir, err)
			}
		}
	}
	return &HeldIdentity{Socket: run.socket, SPIFFEID: id, Release: run.stop}, nil
}

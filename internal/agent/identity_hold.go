package agent

import (
	"cmp"
	"context"
	"log/slog"
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
	// HoldIdentity attests and returns the running identity; as, when
	// set, is the user the VM's entry selects (the script's, another than
	// the agent's): it fetches the SVID that shows the attestation worked
	// and reaches the socket.
	HoldIdentity(ctx context.Context, as *credential) (*HeldIdentity, error)
}

// HoldIdentity attests as Credential does (join token or TPM, or a
// pre-installed spire-agent's socket), but fetches no credential and
// leaves spire-agent running: a generic VM's script fetches its own
// SVIDs through the Workload API until it ends, and the caller then calls
// Release. With as (the script's user, which the VM's entry selects by
// name instead of the agent's uid), the SVID that proves the attestation
// is fetched as that user, and the run directory is opened to it
// (traverse only, once the config with the join token is removed:
// spireRun.openToFetcher) so that it reaches the socket.
func (b *BrokerSource) HoldIdentity(ctx context.Context, as *credential) (*HeldIdentity, error) {
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
	run.fetchAs = as
	cert, err := b.attest(ctx, fetchCtx, run)
	if err != nil {
		run.stop()
		return nil, err
	}
	id := ""
	if leaf := cert.Leaf; leaf != nil && len(leaf.URIs) == 1 {
		id = leaf.URIs[0].String()
	}
	return &HeldIdentity{Socket: run.socket, SPIFFEID: id, Release: run.stop}, nil
}

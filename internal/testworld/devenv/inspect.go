package devenv

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/spire"
)

// SPIRELeftovers lists what HyperFleet left on the world's SPIRE server
// (Options.SPIFFE): entries with its id prefix, alias entries of its VMs'
// agents, and agents. After the VMs are gone it must be empty. One kind of
// agent is not a leftover: a banned tpm_devid agent whose DevID is no
// running claim's. Releasing a TPM claim bans its agent rather than
// deleting it (internal/identity/tpm.go): a deleted agent could attest
// again with its DevID certificate until that expires, a banned one
// cannot, and SPIRE keeps the ban only as long as it keeps the agent.
func (w *World) SPIRELeftovers(ctx context.Context) ([]string, error) {
	if w.SPIRE == nil {
		return nil, errors.New("devenv: the world runs no SPIRE server (Options.SPIFFE)")
	}
	td := spiffeid.RequireTrustDomainFromString(TrustDomain)
	c, err := spire.Dial(ctx, spire.Config{TrustDomain: td, AdminSocket: w.SPIRE.SocketPath})
	if err != nil {
		return nil, fmt.Errorf("devenv: %w", err)
	}
	defer func() { _ = c.Close() }()
	var left []string
	entries, err := c.ListEntries(ctx)
	if err != nil {
		return nil, fmt.Errorf("devenv: %w", err)
	}
	for _, e := range entries {
		if strings.HasPrefix(e.ID, spire.EntryIDPrefix) || strings.Contains(e.SPIFFEID.Path(), "/hyperfleet/node/") || strings.HasPrefix(e.SPIFFEID.Path(), "/vm/") {
			left = append(left, "entry "+e.ID+" "+e.SPIFFEID.String())
		}
	}
	agents, err := c.ListAgents(ctx)
	if err != nil {
		return nil, fmt.Errorf("devenv: %w", err)
	}
	running, err := w.runningDevIDAgents(ctx, td)
	if err != nil {
		return nil, err
	}
	for _, a := range agents {
		if a.Banned && a.AttestationType == spire.TPMDevIDAttestor && !running[a.ID] {
			continue
		}
		state := ""
		if a.Banned {
			state = " (banned)"
		}
		left = append(left, "agent "+a.ID.String()+state)
	}
	return left, nil
}

// runningDevIDAgents are the tpm_devid agent ids of the world's claims
// that have not ended.
func (w *World) runningDevIDAgents(ctx context.Context, td spiffeid.TrustDomain) (map[spiffeid.ID]bool, error) {
	var claims hfv1.MachineClaimList
	if err := w.API.Client.List(ctx, &claims); err != nil {
		return nil, fmt.Errorf("devenv: list claims: %w", err)
	}
	running := map[spiffeid.ID]bool{}
	for _, c := range claims.Items {
		if id := c.Status.Identity; c.Status.End == nil && id != nil && id.TPM != nil && id.TPM.DevIDFingerprint != "" {
			running[spire.DevIDAgentID(td, id.TPM.DevIDFingerprint)] = true
		}
	}
	return running, nil
}

// ClaimEvents are the events of the world's claims: by claim name, the
// message of the latest event of each reason.
func (w *World) ClaimEvents(ctx context.Context) (map[string]map[string]string, error) {
	var list corev1.EventList
	if err := w.API.Client.List(ctx, &list, client.InNamespace(Namespace)); err != nil {
		return nil, fmt.Errorf("devenv: list events: %w", err)
	}
	out := map[string]map[string]string{}
	for _, e := range list.Items {
		if e.InvolvedObject.Kind != "MachineClaim" {
			continue
		}
		if out[e.InvolvedObject.Name] == nil {
			out[e.InvolvedObject.Name] = map[string]string{}
		}
		out[e.InvolvedObject.Name][e.Reason] = e.Message
	}
	return out, nil
}

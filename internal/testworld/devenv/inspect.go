package devenv

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hyperfleet/hyperfleet/internal/spire"
)

// SPIRELeftovers lists what HyperFleet left on the world's SPIRE server
// (Options.SPIFFE): entries with its id prefix, alias entries of its VMs'
// agents, and agents. After the VMs are gone it must be empty.
func (w *World) SPIRELeftovers(ctx context.Context) ([]string, error) {
	if w.SPIRE == nil {
		return nil, errors.New("devenv: the world runs no SPIRE server (Options.SPIFFE)")
	}
	c, err := spire.Dial(ctx, spire.Config{TrustDomain: spiffeid.RequireTrustDomainFromString(TrustDomain), AdminSocket: w.SPIRE.SocketPath})
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
	for _, a := range agents {
		left = append(left, "agent "+a.ID.String())
	}
	return left, nil
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

package spire

import (
	"context"
	"fmt"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	agentv1 "github.com/spiffe/spire-api-sdk/proto/spire/api/server/agent/v1"
	"github.com/spiffe/spire-api-sdk/proto/spire/api/types"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Agent is an agent that attested to the server.
type Agent struct {
	// ID is the agent's own id, for a join token JoinTokenAgentID.
	ID spiffeid.ID
	// AttestationType is the node attestor it used, e.g. "join_token".
	AttestationType string
	// Banned agents may not attest again, nor renew their SVID.
	Banned bool
	// X509SVIDExpiresAt is when the agent's current SVID expires.
	X509SVIDExpiresAt time.Time
	// Selectors are what its node attestor said of it (for tpm_devid:
	// subject:cn:<the DevID certificate's common name>, ...).
	Selectors []Selector
}

// Agent returns the attested agent with id; found is false when the server
// has none (not attested yet, or deleted).
func (c *Client) Agent(ctx context.Context, id spiffeid.ID) (a Agent, found bool, err error) {
	pa, err := c.agents.GetAgent(ctx, &agentv1.GetAgentRequest{Id: protoID(id)})
	if status.Code(err) == codes.NotFound {
		return Agent{}, false, nil
	}
	if err != nil {
		return Agent{}, false, c.wrap(fmt.Sprintf("getting agent %s", id), err)
	}
	a, err = fromProtoAgent(pa)
	if err != nil {
		return Agent{}, false, fmt.Errorf("getting agent %s: %w", id, err)
	}
	return a, true, nil
}

// DeleteAgent deletes the agent with id; one the server does not have is
// success. An agent attested with a join token cannot attest again: at its
// next sync the server refuses it and it shuts down, and its workloads'
// SVIDs are no longer renewed.
func (c *Client) DeleteAgent(ctx context.Context, id spiffeid.ID) error {
	_, err := c.agents.DeleteAgent(ctx, &agentv1.DeleteAgentRequest{Id: protoID(id)})
	if err != nil && status.Code(err) != codes.NotFound {
		return c.wrap(fmt.Sprintf("deleting agent %s", id), err)
	}
	return nil
}

// BanAgent bans the agent with id: the server refuses to renew its SVID
// and to let it attest again, and the agent stays listed as banned (what
// happened shows in the server's agent list) until it is deleted. An
// agent the server does not have is success: there is nothing to evict.
func (c *Client) BanAgent(ctx context.Context, id spiffeid.ID) error {
	_, err := c.agents.BanAgent(ctx, &agentv1.BanAgentRequest{Id: protoID(id)})
	if err != nil && status.Code(err) != codes.NotFound {
		return c.wrap(fmt.Sprintf("banning agent %s", id), err)
	}
	return nil
}

// ListAgents returns every attested agent; for leak checks.
func (c *Client) ListAgents(ctx context.Context) ([]Agent, error) {
	const op = "listing the attested agents"
	return listPages(op, func(token string) ([]*types.Agent, string, error) {
		resp, err := c.agents.ListAgents(ctx, &agentv1.ListAgentsRequest{PageSize: listPageSize, PageToken: token})
		if err != nil {
			return nil, "", c.wrap(op, err)
		}
		return resp.GetAgents(), resp.GetNextPageToken(), nil
	}, fromProtoAgent)
}

func fromProtoAgent(pa *types.Agent) (Agent, error) {
	id, err := fromProtoID(pa.GetId())
	if err != nil {
		return Agent{}, err
	}
	a := Agent{ID: id, AttestationType: pa.GetAttestationType(), Banned: pa.GetBanned()}
	for _, s := range pa.GetSelectors() {
		a.Selectors = append(a.Selectors, Selector{Type: s.GetType(), Value: s.GetValue()})
	}
	if t := pa.GetX509SvidExpiresAt(); t != 0 {
		a.X509SVIDExpiresAt = time.Unix(t, 0)
	}
	return a, nil
}

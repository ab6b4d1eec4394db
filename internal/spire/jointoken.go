package spire

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"math"
	"strconv"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	agentv1 "github.com/spiffe/spire-api-sdk/proto/spire/api/server/agent/v1"
	"github.com/spiffe/spire-api-sdk/proto/spire/api/types"
	"google.golang.org/grpc/codes"
)

// MinJoinTokenKeyLen is the shortest key DeriveJoinToken accepts: a join
// token is a node's credential, so it must not be guessable from the
// claim's uid, which is no secret.
const MinJoinTokenKeyLen = 32

// DeriveJoinToken derives the join token of one attempt of one claim from
// key: HMAC-SHA256(key, "hyperfleet join token\x00"+claimUID+"\x00"+attempt),
// its first 16 bytes formatted as a UUID (version 8, the RFC 9562 version
// for custom UUIDs; 122 bits of the MAC), in lower case. SPIRE takes any
// token, but the agent's id embeds it as a path segment, and the UUID shape
// is what SPIRE's own tokens have, so nothing downstream meets a surprise.
//
// Tokens are never stored: the operator derives them again to render them
// into the VM. Each attempt has a token of its own, since a token is spent
// by its first use. key must be at least MinJoinTokenKeyLen bytes (callers
// check it where they load it); a shorter one is a bug and panics.
func DeriveJoinToken(key []byte, claimUID string, attempt int) string {
	if len(key) < MinJoinTokenKeyLen {
		panic(fmt.Sprintf("spire: a join token key of %d bytes, want at least %d", len(key), MinJoinTokenKeyLen))
	}
	mac := hmac.New(sha256.New, key)
	mac.Write([]byte("hyperfleet join token\x00" + claimUID + "\x00" + strconv.Itoa(attempt)))
	var u [16]byte
	copy(u[:], mac.Sum(nil))
	u[6] = u[6]&0x0f | 0x80 // version 8
	u[8] = u[8]&0x3f | 0x80 // variant 10 (RFC 9562)
	h := hex.EncodeToString(u[:])
	return h[0:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:32]
}

// JoinTokenAgentID is spiffe://<td>/spire/agent/join_token/<token>, the id
// the server gives an agent that attested with token.
func JoinTokenAgentID(td spiffeid.TrustDomain, token string) spiffeid.ID {
	id, err := spiffeid.FromSegments(td, "spire", "agent", "join_token", token)
	if err != nil {
		// Only a token that is no path segment gets here; the server
		// would refuse it too (CreateJoinToken checks).
		return spiffeid.ID{}
	}
	return id
}

// CreateJoinToken creates exactly token, valid for ttl (whole seconds, at
// least one), for an agent whose alias is agentID: the server also creates
// the entry that makes agentID an alias of JoinTokenAgentID(token), and
// entries of the VM's workloads name agentID as their parent.
//
// A token that exists already is success: the caller may have created it
// and restarted before recording that. The server then does not tell the
// token's expiry; CreateJoinToken returns now+ttl, the latest it can be for
// a caller that always asks with the same ttl, and makes sure the alias
// entry exists (a server that stopped between storing the token and
// creating the entry leaves none).
//
// A token that was used is gone from the server (a token is deleted at its
// first use, even an expired one), so creating it again creates it anew:
// it would let a second agent attest with it. The caller therefore never
// creates a token again once it recorded that it created it.
func (c *Client) CreateJoinToken(ctx context.Context, token string, ttl time.Duration, agentID spiffeid.ID) (expiresAt time.Time, err error) {
	op := fmt.Sprintf("creating the join token for %s", agentID)
	agentOfToken := JoinTokenAgentID(c.td, token)
	switch {
	case agentOfToken.IsZero():
		return time.Time{}, fmt.Errorf("%s: %w: the token %q is no SPIFFE ID path segment", op, ErrInvalidArgument, token)
	case !agentID.MemberOf(c.td):
		return time.Time{}, fmt.Errorf("%s: %w: the agent id is not in the trust domain %s", op, ErrInvalidArgument, c.td)
	case ttl < time.Second || ttl/time.Second > math.MaxInt32:
		return time.Time{}, fmt.Errorf("%s: %w: ttl %s is not between 1s and %d seconds", op, ErrInvalidArgument, ttl, math.MaxInt32)
	}
	started := time.Now()
	tok, err := c.agents.CreateJoinToken(ctx, &agentv1.CreateJoinTokenRequest{
		Ttl:     int32(ttl / time.Second),
		Token:   token,
		AgentId: protoID(agentID),
	})
	if err == nil {
		return time.Unix(tok.GetExpiresAt(), 0), nil
	}
	if !isDuplicateJoinToken(err) {
		return time.Time{}, c.wrap(op, err)
	}
	alias := Entry{
		SPIFFEID:  agentID,
		ParentID:  agentOfToken,
		Selectors: []Selector{{Type: "spiffe_id", Value: agentOfToken.String()}},
	}
	if err := c.createEntry(ctx, alias); err != nil {
		return time.Time{}, fmt.Errorf("%s: the token exists; ensuring its alias entry: %w", op, err)
	}
	return started.Add(ttl).Truncate(time.Second), nil
}

func protoID(id spiffeid.ID) *types.SPIFFEID {
	return &types.SPIFFEID{TrustDomain: id.TrustDomain().Name(), Path: id.Path()}
}

func fromProtoID(id *types.SPIFFEID) (spiffeid.ID, error) {
	td, err := spiffeid.TrustDomainFromString(id.GetTrustDomain())
	if err != nil {
		return spiffeid.ID{}, fmt.Errorf("the server answered an invalid SPIFFE ID: %w", err)
	}
	return spiffeid.FromPath(td, id.GetPath())
}

// codeOf is a batch result's status code.
func codeOf(s *types.Status) codes.Code { return codes.Code(s.GetCode()) }

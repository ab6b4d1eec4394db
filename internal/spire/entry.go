package spire

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	entryv1 "github.com/spiffe/spire-api-sdk/proto/spire/api/server/entry/v1"
	"github.com/spiffe/spire-api-sdk/proto/spire/api/types"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// EntryIDPrefix starts the id of every registration entry HyperFleet
// creates, so that spire-controller-manager, which owns the entries with
// its own prefix, leaves them alone, and a leak check finds them.
const EntryIDPrefix = "hyperfleet."

// Entry is a registration entry: the server issues SPIFFEID to workloads
// that match all Selectors on the agent whose id (or alias) is ParentID.
type Entry struct {
	// ID is the entry's id, chosen by the caller (EntryIDFor); it starts
	// with EntryIDPrefix.
	ID       string
	SPIFFEID spiffeid.ID
	ParentID spiffeid.ID
	// Selectors, at least one, e.g. {unix, uid:1000}.
	Selectors []Selector
	// X509SVIDTTL and JWTSVIDTTL are the SVIDs' lifetimes (whole
	// seconds); zero takes the server's default.
	X509SVIDTTL, JWTSVIDTTL time.Duration
	DNSNames                []string
	// Hint is SPIRE's entry hint; HyperFleet writes its install's there
	// (InstallHint), so that its sweep removes only entries of its own
	// install from a server other installs may share.
	Hint string
}

// InstallHint is the hint of the entries the install with operatorID
// creates.
func InstallHint(operatorID string) string { return "hyperfleet:" + operatorID }

// Selector is a workload or node property, e.g. Type "unix", Value
// "uid:1000".
type Selector struct{ Type, Value string }

// String is the selector as SPIRE writes it, type:value.
func (s Selector) String() string { return s.Type + ":" + s.Value }

// EnsureEntry creates e. An entry with e's id, or a similar one (same
// SPIFFE ID, parent and selectors) under another id, is success: the
// identity is issued either way. (A similar entry under another id is not
// one DeleteEntries(e.ID) removes; DeleteEntriesBySPIFFEID does.) An entry
// with e's id but another SPIFFE ID or parent is ErrEntryConflict.
func (c *Client) EnsureEntry(ctx context.Context, e Entry) error {
	if !strings.HasPrefix(e.ID, EntryIDPrefix) {
		return fmt.Errorf("creating registration entry %q for %s: %w: its id does not start with %q", e.ID, e.SPIFFEID, ErrInvalidArgument, EntryIDPrefix)
	}
	return c.createEntry(ctx, e)
}

func (c *Client) createEntry(ctx context.Context, e Entry) error {
	op := fmt.Sprintf("creating registration entry %q for %s", e.ID, e.SPIFFEID)
	pe, err := c.toProto(e)
	if err != nil {
		return fmt.Errorf("%s: %w: %w", op, ErrInvalidArgument, err)
	}
	resp, err := c.entries.BatchCreateEntry(ctx, &entryv1.BatchCreateEntryRequest{Entries: []*types.Entry{pe}})
	if err != nil {
		return c.wrap(op, err)
	}
	if n := len(resp.GetResults()); n != 1 {
		return fmt.Errorf("%s: the server answered %d results for one entry", op, n)
	}
	r := resp.GetResults()[0]
	switch codeOf(r.GetStatus()) {
	case codes.OK:
		return nil
	case codes.AlreadyExists:
		// A similar entry comes back with the answer; an entry with the
		// same id but other content does not (the datastore refuses the
		// id as a duplicate), and is looked at.
		if r.GetEntry() != nil || e.ID == "" {
			return nil
		}
		return c.checkSameEntry(ctx, op, pe)
	}
	return c.wrap(op, status.Error(codeOf(r.GetStatus()), r.GetStatus().GetMessage()))
}

// checkSameEntry compares the entry the server has under want's id with
// want.
func (c *Client) checkSameEntry(ctx context.Context, op string, want *types.Entry) error {
	got, err := c.entries.GetEntry(ctx, &entryv1.GetEntryRequest{Id: want.GetId()})
	if err != nil {
		return c.wrap(op+": reading the existing entry", err)
	}
	if sameID(got.GetSpiffeId(), want.GetSpiffeId()) && sameID(got.GetParentId(), want.GetParentId()) {
		return nil
	}
	return fmt.Errorf("%s: %w: the server has it for %s, parent %s", op, ErrEntryConflict, idString(got.GetSpiffeId()), idString(got.GetParentId()))
}

// idString renders an id of the server's as a SPIFFE ID, for messages.
func idString(id *types.SPIFFEID) string {
	return "spiffe://" + id.GetTrustDomain() + id.GetPath()
}

func sameID(a, b *types.SPIFFEID) bool {
	return a.GetTrustDomain() == b.GetTrustDomain() && a.GetPath() == b.GetPath()
}

func (c *Client) toProto(e Entry) (*types.Entry, error) {
	switch {
	case !e.SPIFFEID.MemberOf(c.td):
		return nil, fmt.Errorf("the SPIFFE ID %q is not in the trust domain %s", e.SPIFFEID, c.td)
	case !e.ParentID.MemberOf(c.td):
		return nil, fmt.Errorf("the parent id %q is not in the trust domain %s", e.ParentID, c.td)
	case len(e.Selectors) == 0:
		return nil, fmt.Errorf("no selectors")
	}
	pe := &types.Entry{
		Id:          e.ID,
		SpiffeId:    protoID(e.SPIFFEID),
		ParentId:    protoID(e.ParentID),
		X509SvidTtl: int32(e.X509SVIDTTL / time.Second),
		JwtSvidTtl:  int32(e.JWTSVIDTTL / time.Second),
		DnsNames:    e.DNSNames,
		Hint:        e.Hint,
	}
	for _, s := range e.Selectors {
		pe.Selectors = append(pe.Selectors, &types.Selector{Type: s.Type, Value: s.Value})
	}
	return pe, nil
}

// DeleteEntries deletes the entries with these ids; an id the server does
// not have is success.
func (c *Client) DeleteEntries(ctx context.Context, ids ...string) error {
	if len(ids) == 0 {
		return nil
	}
	op := fmt.Sprintf("deleting registration entries %q", ids)
	resp, err := c.entries.BatchDeleteEntry(ctx, &entryv1.BatchDeleteEntryRequest{Ids: ids})
	if err != nil {
		return c.wrap(op, err)
	}
	for _, r := range resp.GetResults() {
		switch codeOf(r.GetStatus()) {
		case codes.OK, codes.NotFound:
		default:
			return c.wrap(fmt.Sprintf("deleting registration entry %q", r.GetId()), status.Error(codeOf(r.GetStatus()), r.GetStatus().GetMessage()))
		}
	}
	return nil
}

// DeleteEntriesBySPIFFEID deletes every entry that issues id, whoever
// created it and whatever its id (the server chose the id of the alias
// entry of a join token), and returns how many it deleted.
func (c *Client) DeleteEntriesBySPIFFEID(ctx context.Context, id spiffeid.ID) (int, error) {
	entries, err := c.ListEntriesBySPIFFEID(ctx, id)
	if err != nil {
		return 0, err
	}
	ids := make([]string, 0, len(entries))
	for _, e := range entries {
		ids = append(ids, e.ID)
	}
	if err := c.DeleteEntries(ctx, ids...); err != nil {
		return 0, err
	}
	return len(ids), nil
}

// ListEntriesBySPIFFEID returns the entries that issue id.
func (c *Client) ListEntriesBySPIFFEID(ctx context.Context, id spiffeid.ID) ([]Entry, error) {
	return c.listEntries(ctx, fmt.Sprintf("listing the registration entries of %s", id),
		&entryv1.ListEntriesRequest_Filter{BySpiffeId: protoID(id)})
}

// ListEntriesByParent returns the entries whose parent is id: what is
// left on an agent, for leak checks.
func (c *Client) ListEntriesByParent(ctx context.Context, id spiffeid.ID) ([]Entry, error) {
	return c.listEntries(ctx, fmt.Sprintf("listing the registration entries with parent %s", id),
		&entryv1.ListEntriesRequest_Filter{ByParentId: protoID(id)})
}

// ListEntries returns every entry the server has; for leak checks (a test
// filters by EntryIDPrefix).
func (c *Client) ListEntries(ctx context.Context) ([]Entry, error) {
	return c.listEntries(ctx, "listing the registration entries", nil)
}

// listPageSize bounds one page of a list call.
const listPageSize = 500

func (c *Client) listEntries(ctx context.Context, op string, filter *entryv1.ListEntriesRequest_Filter) ([]Entry, error) {
	return listPages(op, func(token string) ([]*types.Entry, string, error) {
		resp, err := c.entries.ListEntries(ctx, &entryv1.ListEntriesRequest{Filter: filter, PageSize: listPageSize, PageToken: token})
		if err != nil {
			return nil, "", c.wrap(op, err)
		}
		return resp.GetEntries(), resp.GetNextPageToken(), nil
	}, fromProtoEntry)
}

// listPages reads every page of a list call and converts its items: page
// returns the items after token ("" for the first page) and the next
// page's token, "" after the last page.
func listPages[P, T any](op string, page func(token string) ([]P, string, error), convert func(P) (T, error)) ([]T, error) {
	var out []T
	token := ""
	for {
		items, next, err := page(token)
		if err != nil {
			return nil, err
		}
		for _, p := range items {
			t, err := convert(p)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", op, err)
			}
			out = append(out, t)
		}
		if next == "" {
			return out, nil
		}
		token = next
	}
}

func fromProtoEntry(pe *types.Entry) (Entry, error) {
	id, err := fromProtoID(pe.GetSpiffeId())
	if err != nil {
		return Entry{}, fmt.Errorf("entry %q: %w", pe.GetId(), err)
	}
	parent, err := fromProtoID(pe.GetParentId())
	if err != nil {
		return Entry{}, fmt.Errorf("entry %q: %w", pe.GetId(), err)
	}
	e := Entry{
		ID:          pe.GetId(),
		SPIFFEID:    id,
		ParentID:    parent,
		X509SVIDTTL: time.Duration(pe.GetX509SvidTtl()) * time.Second,
		JWTSVIDTTL:  time.Duration(pe.GetJwtSvidTtl()) * time.Second,
		DNSNames:    slices.Clone(pe.GetDnsNames()),
		Hint:        pe.GetHint(),
	}
	for _, s := range pe.GetSelectors() {
		e.Selectors = append(e.Selectors, Selector{Type: s.GetType(), Value: s.GetValue()})
	}
	return e, nil
}

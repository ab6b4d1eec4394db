package github

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"slices"
	"sync"
	"time"
)

// pageTTL is how long a listing page read with a conditional request is
// kept after its last use: a repository the resync stopped scanning is
// forgotten, and read afresh should it come back.
const pageTTL = 15 * time.Minute

// pageCache keeps the listing pages read with conditional requests: each
// page's ETag and what was kept of its body (ids and times, never whole
// API objects). GitHub answers a request whose If-None-Match names the
// current ETag with 304 Not Modified, which does not count against the
// rate limit when the request is authorized, so an unchanged listing costs
// a call but no budget. Safe for concurrent use.
type pageCache struct {
	mu    sync.Mutex
	pages map[string]cachedPage
}

// cachedPage is one page as last read.
type cachedPage struct {
	etag string
	// next is the page after it (0: the last).
	next  int
	items any
	used  time.Time
}

func (c *pageCache) get(u string) (cachedPage, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	pg, ok := c.pages[u]
	return pg, ok
}

func (c *pageCache) put(u string, pg cachedPage) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.pages == nil {
		c.pages = map[string]cachedPage{}
	}
	c.pages[u] = pg
}

func (c *pageCache) drop(u string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.pages, u)
}

// sweep forgets the pages not used within pageTTL of now.
func (c *pageCache) sweep(now time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for u, pg := range c.pages {
		if now.Sub(pg.used) > pageTTL {
			delete(c.pages, u)
		}
	}
}

// conditionalPages reads every page of a listing with conditional requests
// (conditionalPage), at most maxPages of them (0: no limit); pageURL is
// the URL of a page, relative to the API root.
func conditionalPages[T any](ctx context.Context, p *Provider, what string, maxPages int, pageURL func(page int) string, decode func([]byte) ([]T, error)) ([]T, error) {
	var out []T
	for page := 1; page > 0 && (maxPages == 0 || page <= maxPages); {
		items, next, err := conditionalPage(ctx, p, what, pageURL(page), decode)
		if err != nil {
			return nil, err
		}
		out = append(out, items...)
		page = next
	}
	return out, nil
}

// conditionalPage reads one page of a listing (u, relative to the API
// root) with a conditional request, keeping what decode takes from its
// body, and returns it and the number of the next page (0: none). A 304
// answer returns what the same page held last time.
func conditionalPage[T any](ctx context.Context, p *Provider, what, u string, decode func([]byte) ([]T, error)) ([]T, int, error) {
	req, err := p.client.NewRequest(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, 0, fmt.Errorf("github: %s: %w", what, err)
	}
	cached, ok := p.pages.get(u)
	if ok {
		req.Header.Set("If-None-Match", cached.etag)
	}
	var body bytes.Buffer
	resp, err := p.client.Do(req, &body)
	now := p.clock.Now()
	if ok && resp != nil && resp.StatusCode == http.StatusNotModified {
		cached.used = now
		p.pages.put(u, cached)
		items, _ := cached.items.([]T)
		return slices.Clone(items), cached.next, nil
	}
	if err != nil {
		return nil, 0, p.mapErr(what, resp, err)
	}
	items, err := decode(body.Bytes())
	if err != nil {
		return nil, 0, fmt.Errorf("github: %s: decoding the answer: %w", what, err)
	}
	if etag := resp.Header.Get("ETag"); etag != "" {
		p.pages.put(u, cachedPage{etag: etag, next: resp.NextPage, items: slices.Clone(items), used: now})
	} else {
		p.pages.drop(u)
	}
	return items, resp.NextPage, nil
}

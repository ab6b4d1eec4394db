package scaleset

import "time"

// SetNow replaces a client's clock (the token expiry tests).
func SetNow(c *Client, now func() time.Time) { c.cfg.Now = now }

// AdminToken is the admin token the client holds now.
func AdminToken(c *Client) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.adminToken
}

// AdminTokenExpiry is when the client's admin token expires.
func AdminTokenExpiry(c *Client) time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.expires
}

// SessionOf is a handle on an existing session of a scale set (a test
// deletes a listener's session as the service would drop it).
func SessionOf(c *Client, scaleSetID int, sessionID string) *Session {
	return &Session{c: c, scaleSetID: scaleSetID, info: SessionInfo{SessionID: sessionID}}
}

// AllowedHost is the client's check of a URL an answer names.
func AllowedHost(c *Client, raw string) error { return c.allowedHost("the URL", raw) }

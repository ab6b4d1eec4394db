// Package vault is a faithful fake of the parts of a Vault or OpenBao server
// that HyperFleet's secret-store delivery path uses: the JWT auth method
// (login with a JWT-SVID against keys from a jwks_url or static PEM keys;
// roles), token authentication with ACL policies (path globs, "+" segments
// and identity templates), and the KV version 2 secrets engine (data read
// and write with check-and-set, metadata delete). Status codes and error
// bodies are Vault's, so a client reacts to the fake as to the real server.
// It is a test double: production packages never import it.
//
// Neither Vault nor OpenBao builds from the Go module proxy, so the tests
// drive this fake with the official API client instead.
package vault

import (
	"crypto/rand"
	"encoding/json"
	"fmt"
	"math/big"
	"net/http"
	"strings"
	"sync"
	"time"
)

// permissionDenied is the body of Vault's 403: the core wraps
// logical.ErrPermissionDenied in a multierror.
const permissionDenied = "1 error occurred:\n\t* permission denied\n\n"

// Server is the fake. Its zero value is not usable; call New.
type Server struct {
	mu       sync.Mutex
	now      func() time.Time
	tokens   map[string]*token
	policies map[string]*Policy
	kv       map[string]*kvMount  // by mount path
	jwt      map[string]*jwtMount // by mount path
	entities map[string]string    // entity ID by "<accessor>/<alias name>"

	// Requests counts the requests served, by "METHOD path".
	requests map[string]int
}

// New returns a fake with no mounts, policies or tokens; the clock is
// time.Now until SetClock.
func New() *Server {
	return &Server{
		now:      time.Now,
		tokens:   map[string]*token{},
		policies: map[string]*Policy{},
		kv:       map[string]*kvMount{},
		jwt:      map[string]*jwtMount{},
		entities: map[string]string{},
		requests: map[string]int{},
	}
}

// SetClock replaces the clock that token expiry and JWT validation use.
func (s *Server) SetClock(now func() time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.now = now
}

// Handler serves the HTTP API under /v1/ through an http.ServeMux, as Vault
// does, so paths are cleaned (and redirected) the same way.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/v1/", s.serve)
	return mux
}

// Requests returns how many requests "METHOD path" (path without /v1/) the
// fake served.
func (s *Server) Requests(method, path string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.requests[method+" "+path]
}

// RequestsUnder returns how many requests with method the fake served for
// paths (without /v1/) under prefix.
func (s *Server) RequestsUnder(method, prefix string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for k, c := range s.requests {
		if p, ok := strings.CutPrefix(k, method+" "); ok && strings.HasPrefix(p, prefix) {
			n += c
		}
	}
	return n
}

// token is an issued token and the identity it carries.
type token struct {
	id, accessor string
	policies     []string
	expires      time.Time // zero: never
	// alias is the entity alias a login created; nil for tokens the test
	// created with AddToken.
	alias    *alias
	entityID string
	// usesLeft counts down the requests a token with num_uses may still
	// make; 0 is unlimited.
	usesLeft int
}

type alias struct {
	mountAccessor, name string
	metadata            map[string]string
}

// AddToken creates a token with policies that never expires, as an
// administrator would for the operator.
func (s *Server) AddToken(id string, policies ...string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.tokens[id] = &token{id: id, accessor: randomID("", 24), policies: policies}
}

// RevokeToken revokes a token.
func (s *Server) RevokeToken(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.tokens, id)
}

func (s *Server) serve(w http.ResponseWriter, r *http.Request) {
	path := strings.TrimPrefix(r.URL.Path, "/v1/")
	s.mu.Lock()
	defer s.mu.Unlock()
	s.requests[r.Method+" "+path]++

	if mount, rest, ok := s.jwtMountFor(path); ok {
		if rest == "login" {
			s.login(w, r, mount)
			return
		}
		if name, ok := strings.CutPrefix(rest, "role/"); ok && name != "" {
			s.role(w, r, path, mount, name)
			return
		}
	}
	if mount, rest, ok := s.kvMountFor(path); ok {
		if p, ok := strings.CutPrefix(rest, "data/"); ok && p != "" {
			s.kvData(w, r, path, mount, p)
			return
		}
		if p, ok := strings.CutPrefix(rest, "metadata/"); ok && p != "" {
			s.kvMetadata(w, r, path, mount, p)
			return
		}
	}
	// Vault's router, for a path no mount or backend path claims.
	if _, ok := s.authorize(w, r, path, "read", nil); !ok {
		return
	}
	respondError(w, http.StatusNotFound, fmt.Sprintf("no handler for route %q. route entry not found.", path))
}

// authorize resolves the request's token and checks that its policies grant
// capability on path, and allow the parameters in data (a write's body; nil
// otherwise); it writes Vault's 403 and returns false otherwise. Vault
// checks the ACL after parsing the body and before the backend sees the
// request.
func (s *Server) authorize(w http.ResponseWriter, r *http.Request, path, capability string, data map[string]any) (*token, bool) {
	t := s.tokens[r.Header.Get("X-Vault-Token")]
	if t != nil && !t.expires.IsZero() && !s.now().Before(t.expires) {
		delete(s.tokens, t.id)
		t = nil
	}
	// A token with a use count spends a use on every request it makes,
	// allowed or not; the last use revokes it.
	if t != nil && t.usesLeft > 0 {
		if t.usesLeft--; t.usesLeft == 0 {
			delete(s.tokens, t.id)
		}
	}
	if t == nil || !s.allowed(t, path, capability, data) {
		respondError(w, http.StatusForbidden, permissionDenied)
		return nil, false
	}
	return t, true
}

// readBody decodes a JSON request body into a map; an empty body is an
// empty map, as in Vault.
func readBody(w http.ResponseWriter, r *http.Request) (map[string]any, bool) {
	body := map[string]any{}
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, 32<<20))
	dec.UseNumber()
	if err := dec.Decode(&body); err != nil && err.Error() != "EOF" {
		respondError(w, http.StatusBadRequest, "error parsing JSON")
		return nil, false
	}
	return body, true
}

// respondError writes Vault's error body: {"errors":[msg]}, or
// {"errors":[]} for an empty msg (a plain 404).
func respondError(w http.ResponseWriter, status int, msg string) {
	errs := []string{}
	if msg != "" {
		errs = append(errs, msg)
	}
	respondJSON(w, status, map[string]any{"errors": errs})
}

// respondData writes Vault's response envelope around data or auth.
func respondData(w http.ResponseWriter, data, auth any) {
	respondJSON(w, http.StatusOK, map[string]any{
		"request_id":     randomUUID(),
		"lease_id":       "",
		"renewable":      false,
		"lease_duration": 0,
		"data":           data,
		"wrap_info":      nil,
		"warnings":       nil,
		"auth":           auth,
	})
}

func respondJSON(w http.ResponseWriter, status int, body any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(body)
}

const alphanumeric = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"

// randomID is prefix and n random letters and digits, the form of Vault's
// tokens ("s." in OpenBao) and accessors.
func randomID(prefix string, n int) string {
	b := []byte(prefix)
	for range n {
		i, err := rand.Int(rand.Reader, big.NewInt(int64(len(alphanumeric))))
		if err != nil {
			panic(err)
		}
		b = append(b, alphanumeric[i.Int64()])
	}
	return string(b)
}

func randomUUID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:])
}

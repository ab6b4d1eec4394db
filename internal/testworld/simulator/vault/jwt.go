package vault

import (
	"context"
	"crypto"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/go-jose/go-jose/v4"
)

// JWTConfig is a JWT auth mount's config: exactly one of JWKSURL (fetched
// with HTTPClient, keys cached by key ID and fetched again when a token's
// key ID is not cached, as Vault's key set does) or PublicKeys
// (jwt_validation_pubkeys).
type JWTConfig struct {
	JWKSURL    string
	HTTPClient *http.Client
	PublicKeys []crypto.PublicKey
}

// jwtMount is a JWT auth method.
type jwtMount struct {
	accessor string
	config   JWTConfig
	roles    map[string]*Role
	// cached is the last key set fetched from config.JWKSURL.
	cached *jose.JSONWebKeySet
	// fetches counts the fetches of JWKSURL.
	fetches int
}

// Role is a JWT auth role (role_type jwt).
type Role struct {
	UserClaim      string
	BoundSubject   string
	BoundAudiences []string
	TokenPolicies  []string
	// TokenTTL is the token's lease; zero is the mount's default, 768h.
	TokenTTL time.Duration
	// TokenNoDefaultPolicy leaves the default policy off the token.
	TokenNoDefaultPolicy bool
	// TokenNumUses is how many requests the token may make; zero is
	// unlimited.
	TokenNumUses int
	// ClockSkewLeeway applies to exp, nbf and iat; zero is Vault's default
	// of 60 seconds, negative is none.
	ClockSkewLeeway time.Duration
}

// supportedAlgs are the signing algorithms Vault accepts when the mount
// names none (jwt_supported_algs empty).
var supportedAlgs = []jose.SignatureAlgorithm{
	jose.RS256, jose.RS384, jose.RS512, jose.ES256, jose.ES384, jose.ES512,
	jose.PS256, jose.PS384, jose.PS512, jose.EdDSA,
}

// defaultTokenTTL is the lease of a login token whose role sets none (the
// system's default lease TTL).
const defaultTokenTTL = 768 * time.Hour

// EnableJWT mounts a JWT auth method at mount (such as jwt) and returns its
// accessor, which identity templates in policies name.
func (s *Server) EnableJWT(mount string, cfg JWTConfig) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	m := &jwtMount{accessor: randomID("auth_jwt_", 8), config: cfg, roles: map[string]*Role{}}
	s.jwt[mount] = m
	return m.accessor
}

// SetRole creates or replaces a role on a JWT auth mount, as an
// administrator would.
func (s *Server) SetRole(mount, name string, r Role) {
	s.mu.Lock()
	defer s.mu.Unlock()
	rc := r
	s.jwt[mount].roles[strings.ToLower(name)] = &rc
}

// Role returns a role of a JWT auth mount, or nil.
func (s *Server) Role(mount, name string) *Role {
	s.mu.Lock()
	defer s.mu.Unlock()
	if r := s.jwt[mount].roles[strings.ToLower(name)]; r != nil {
		rc := *r
		return &rc
	}
	return nil
}

// RoleNames lists the roles of a JWT auth mount, sorted.
func (s *Server) RoleNames(mount string) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for name := range s.jwt[mount].roles {
		out = append(out, name)
	}
	slices.Sort(out)
	return out
}

// JWKSFetches is how often the mount fetched its jwks_url.
func (s *Server) JWKSFetches(mount string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.jwt[mount].fetches
}

func (s *Server) jwtMountFor(path string) (*jwtMount, string, bool) {
	for name, m := range s.jwt {
		if rest, ok := strings.CutPrefix(path, "auth/"+name+"/"); ok {
			return m, rest, true
		}
	}
	return nil, "", false
}

// login is POST auth/<mount>/login {role, jwt}. Failures are Vault's 400s
// with the JWT auth method's messages.
func (s *Server) login(w http.ResponseWriter, r *http.Request, m *jwtMount) {
	if r.Method != http.MethodPut && r.Method != http.MethodPost {
		respondError(w, http.StatusMethodNotAllowed, "unsupported operation")
		return
	}
	body, ok := readBody(w, r)
	if !ok {
		return
	}
	roleName, _ := body["role"].(string)
	roleName = strings.ToLower(roleName)
	if roleName == "" {
		respondError(w, http.StatusBadRequest, "missing role")
		return
	}
	role := m.roles[roleName]
	if role == nil {
		respondError(w, http.StatusBadRequest, fmt.Sprintf("role %q could not be found", roleName))
		return
	}
	raw, _ := body["jwt"].(string)
	if raw == "" {
		respondError(w, http.StatusBadRequest, "missing token")
		return
	}
	claims, err := s.validate(r.Context(), m, role, raw)
	if err != nil {
		respondError(w, http.StatusBadRequest, "error validating token: "+err.Error())
		return
	}
	user, ok := claims[role.UserClaim].(string)
	if !ok {
		msg := fmt.Sprintf("claim %q could not be converted to string", role.UserClaim)
		if claims[role.UserClaim] == nil {
			msg = fmt.Sprintf("claim %q not found in token", role.UserClaim)
		}
		respondError(w, http.StatusBadRequest, msg)
		return
	}
	respondData(w, nil, s.issue(m, role, roleName, user))
}

// issue creates the login token: policies default plus the role's, an
// entity alias named after the user claim with the role in its metadata,
// and the auth block Vault returns.
func (s *Server) issue(m *jwtMount, role *Role, roleName, user string) map[string]any {
	entityKey := m.accessor + "/" + user
	if s.entities[entityKey] == "" {
		s.entities[entityKey] = randomUUID()
	}
	ttl := role.TokenTTL
	if ttl == 0 {
		ttl = defaultTokenTTL
	}
	policies := slices.Clone(role.TokenPolicies)
	if !role.TokenNoDefaultPolicy {
		policies = append(policies, "default")
	}
	slices.Sort(policies)
	policies = slices.Compact(policies)
	t := &token{
		id:       randomID("s.", 24),
		accessor: randomID("", 24),
		policies: policies,
		expires:  s.now().Add(ttl),
		alias:    &alias{mountAccessor: m.accessor, name: user, metadata: map[string]string{"role": roleName}},
		entityID: s.entities[entityKey],
		usesLeft: role.TokenNumUses,
	}
	s.tokens[t.id] = t
	return map[string]any{
		"client_token":    t.id,
		"accessor":        t.accessor,
		"policies":        policies,
		"token_policies":  policies,
		"metadata":        map[string]string{"role": roleName},
		"lease_duration":  int(ttl / time.Second),
		"renewable":       true,
		"entity_id":       t.entityID,
		"token_type":      "service",
		"orphan":          true,
		"mfa_requirement": nil,
		"num_uses":        role.TokenNumUses,
	}
}

// validate checks raw as Vault's JWT auth does: the signature against the
// mount's keys and the algorithm, then sub, aud and the times with the
// role's clock skew leeway. Errors carry Vault's messages.
func (s *Server) validate(ctx context.Context, m *jwtMount, role *Role, raw string) (map[string]any, error) {
	jws, err := jose.ParseSigned(raw, supportedAlgs)
	if err != nil {
		return nil, fmt.Errorf("error verifying token signature: oidc: malformed jwt: %w", err)
	}
	if len(jws.Signatures) != 1 {
		return nil, errors.New("error verifying token signature: token with multiple signatures not supported")
	}
	payload, err := s.verify(ctx, m, jws)
	if err != nil {
		return nil, fmt.Errorf("error verifying token signature: %w", err)
	}
	claims := map[string]any{}
	if err := json.Unmarshal(payload, &claims); err != nil {
		return nil, err
	}
	if role.BoundSubject != "" && claims["sub"] != role.BoundSubject {
		return nil, errors.New("invalid subject (sub) claim")
	}
	if len(role.BoundAudiences) > 0 && !audienceMatches(role.BoundAudiences, claims["aud"]) {
		return nil, errors.New("invalid audience (aud) claim: audience claim does not match any expected audience")
	}
	return claims, checkTimes(claims, role.ClockSkewLeeway, s.now())
}

func audienceMatches(bound []string, aud any) bool {
	switch aud := aud.(type) {
	case string:
		return slices.Contains(bound, aud)
	case []any:
		for _, a := range aud {
			if s, ok := a.(string); ok && slices.Contains(bound, s) {
				return true
			}
		}
	}
	return false
}

// checkTimes checks exp, nbf and iat; at least one must be present.
func checkTimes(claims map[string]any, leeway time.Duration, now time.Time) error {
	switch {
	case leeway == 0:
		leeway = 60 * time.Second
	case leeway < 0:
		leeway = 0
	}
	at := func(name string) (time.Time, bool) {
		f, ok := claims[name].(float64)
		return time.Unix(int64(f), 0), ok
	}
	exp, hasExp := at("exp")
	nbf, hasNbf := at("nbf")
	iat, hasIat := at("iat")
	switch {
	case !hasExp && !hasNbf && !hasIat:
		return errors.New("no issued at (iat), not before (nbf), or expiration time (exp) claims in token")
	case !hasNbf && hasIat:
		nbf, hasNbf = iat, true
	}
	if hasNbf && now.Add(leeway).Before(nbf) {
		return errors.New("invalid not before (nbf) claim: token not yet valid")
	}
	if hasExp && now.Add(-leeway).After(exp) {
		return errors.New("invalid expiration time (exp) claim: token is expired")
	}
	if hasIat && now.Add(leeway).Before(iat) {
		return errors.New("invalid issued at (iat) claim: token issued in the future")
	}
	return nil
}

// verify checks the signature with static keys, or with the cached key set
// and, when no cached key verifies it, with a freshly fetched one (how a
// jwks_url follows key rotation).
func (s *Server) verify(ctx context.Context, m *jwtMount, jws *jose.JSONWebSignature) ([]byte, error) {
	if m.config.JWKSURL == "" {
		for _, k := range m.config.PublicKeys {
			if payload, err := jws.Verify(k); err == nil {
				return payload, nil
			}
		}
		return nil, errors.New("no known key successfully validated the token signature")
	}
	kid := jws.Signatures[0].Header.KeyID
	if payload, ok := verifyWithSet(jws, kid, m.cached); ok {
		return payload, nil
	}
	set, err := s.fetchKeys(ctx, m)
	if err != nil {
		return nil, fmt.Errorf("fetching keys oidc: get keys failed: %w", err)
	}
	m.cached = set
	if payload, ok := verifyWithSet(jws, kid, set); ok {
		return payload, nil
	}
	return nil, errors.New("failed to verify id token signature")
}

func verifyWithSet(jws *jose.JSONWebSignature, kid string, set *jose.JSONWebKeySet) ([]byte, bool) {
	if set == nil {
		return nil, false
	}
	for _, k := range set.Keys {
		if kid == "" || k.KeyID == kid {
			if payload, err := jws.Verify(&k); err == nil {
				return payload, true
			}
		}
	}
	return nil, false
}

// fetchKeys gets the JWKS. It is called with s.mu held: a JWKS served by
// the same fake would deadlock, so tests serve keys from elsewhere.
func (s *Server) fetchKeys(ctx context.Context, m *jwtMount) (*jose.JSONWebKeySet, error) {
	m.fetches++
	client := m.config.HTTPClient
	if client == nil {
		client = http.DefaultClient
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, m.config.JWKSURL, nil)
	if err != nil {
		return nil, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, err
	}
	defer func() { _ = resp.Body.Close() }()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s: %s", resp.Status, body)
	}
	var set jose.JSONWebKeySet
	if err := json.Unmarshal(body, &set); err != nil {
		return nil, fmt.Errorf("failed to decode keys: %w", err)
	}
	return &set, nil
}

// roleNameRE is Vault's role name pattern (framework.GenericNameRegex).
var roleNameRE = regexp.MustCompile(`^\w(([\w.-]+)?\w)?$`)

// role serves auth/<mount>/role/<name>: write (create or update), read and
// delete, each needing its capability.
func (s *Server) role(w http.ResponseWriter, r *http.Request, full string, m *jwtMount, name string) {
	name = strings.ToLower(name)
	if !roleNameRE.MatchString(name) {
		s.authorize(w, r, full, "read", nil)
		respondError(w, http.StatusNotFound, fmt.Sprintf("no handler for route %q. route entry not found.", full))
		return
	}
	switch r.Method {
	case http.MethodPut, http.MethodPost:
		capability := "update"
		if m.roles[name] == nil {
			capability = "create"
		}
		body, ok := readBody(w, r)
		if !ok {
			return
		}
		if _, ok := s.authorize(w, r, full, capability, body); !ok {
			return
		}
		role, msg := roleFromBody(body, m.roles[name])
		if msg != "" {
			respondError(w, http.StatusBadRequest, msg)
			return
		}
		m.roles[name] = role
		w.WriteHeader(http.StatusNoContent)
	case http.MethodDelete:
		if _, ok := s.authorize(w, r, full, "delete", nil); !ok {
			return
		}
		delete(m.roles, name)
		w.WriteHeader(http.StatusNoContent)
	default:
		respondError(w, http.StatusMethodNotAllowed, "unsupported operation")
	}
}

// roleFromBody applies a role write's parameters to the existing role (or
// a new one) and checks it as Vault does; msg is Vault's error.
func roleFromBody(body map[string]any, existing *Role) (*Role, string) {
	role := &Role{}
	if existing != nil {
		*role = *existing
	}
	if rt, ok := body["role_type"].(string); ok && rt != "jwt" {
		return nil, fmt.Sprintf("invalid 'role_type': %s", rt)
	}
	if v, ok := body["user_claim"].(string); ok {
		role.UserClaim = v
	}
	if v, ok := body["bound_subject"].(string); ok {
		role.BoundSubject = v
	}
	if v, ok := body["bound_audiences"]; ok {
		role.BoundAudiences = stringList(v)
	}
	if v, ok := body["token_policies"]; ok {
		role.TokenPolicies = stringList(v)
	}
	if v, ok := body["token_no_default_policy"]; ok {
		b, err := strconv.ParseBool(jsonString(v))
		if err != nil {
			return nil, fmt.Sprintf("error converting input %v for field %q", v, "token_no_default_policy")
		}
		role.TokenNoDefaultPolicy = b
	}
	if v, ok := body["token_num_uses"]; ok {
		n, err := strconv.Atoi(jsonString(v))
		if err != nil || n < 0 {
			return nil, "token_num_uses cannot be negative"
		}
		role.TokenNumUses = n
	}
	if v, ok := body["token_ttl"]; ok {
		d, err := parseTTL(v)
		if err != nil {
			return nil, err.Error()
		}
		role.TokenTTL = d
	}
	if role.UserClaim == "" {
		return nil, "a user claim must be defined on the role"
	}
	if role.BoundSubject == "" && len(role.BoundAudiences) == 0 {
		return nil, "must have at least one bound constraint when creating/updating a role"
	}
	return role, ""
}

// stringList is a list parameter: a JSON list, or a comma-separated string.
func stringList(v any) []string {
	var out []string
	switch v := v.(type) {
	case string:
		for s := range strings.SplitSeq(v, ",") {
			if s = strings.TrimSpace(s); s != "" {
				out = append(out, s)
			}
		}
	case []any:
		for _, e := range v {
			if s, ok := e.(string); ok {
				out = append(out, s)
			}
		}
	}
	return out
}

// parseTTL is a duration parameter: seconds, or a Go duration string.
func parseTTL(v any) (time.Duration, error) {
	s := jsonString(v)
	if d, err := time.ParseDuration(s); err == nil {
		return d, nil
	}
	var secs int64
	if _, err := fmt.Sscan(s, &secs); err != nil {
		return 0, fmt.Errorf("error converting input %s for field %q: %w", s, "token_ttl", err)
	}
	return time.Duration(secs) * time.Second, nil
}

package githubsim

import (
	"crypto"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/subtle"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// identity is who a request authenticated as.
type identity struct {
	// kind is pat, installation, app or anonymous.
	kind  string
	pat   *PATConfig
	token *accessToken
	app   *app
	// userID is the PAT owner's account id.
	userID int64
}

// canSee reports whether the identity may use an account (and repository).
func (id *identity) canSee(o *owner, rp *repo) bool {
	switch id.kind {
	case "pat":
		if len(id.pat.Owners) == 0 {
			return true
		}
		for _, ow := range id.pat.Owners {
			if strings.EqualFold(ow, o.login) {
				return true
			}
		}
		return false
	case "installation":
		in := id.token.inst
		if in.account != o {
			return false
		}
		if rp == nil {
			return true
		}
		if id.token.repos != nil {
			return id.token.repos[strings.ToLower(rp.name)]
		}
		return in.selection == "all" || in.repos[strings.ToLower(rp.name)]
	}
	return false
}

// rateSubject names the identity in the rate-limit message.
func (id *identity) rateSubject(r *http.Request) string {
	switch id.kind {
	case "installation":
		return fmt.Sprintf("installation ID %d", id.token.inst.id)
	case "app":
		return fmt.Sprintf("integration ID %d", id.app.id)
	case "pat":
		return "user ID " + strconv.FormatInt(id.userID, 10)
	}
	return clientIP(r)
}

// accessToken is an installation access token (ghs_...).
type accessToken struct {
	token       string
	inst        *installation
	expires     time.Time
	permissions map[string]string
	// repos restricts the token to some repositories (lower-case names);
	// nil means the installation's selection.
	repos map[string]bool
}

// regToken is a runner registration token.
type regToken struct {
	token   string
	owner   *owner
	repo    *repo
	expires time.Time
}

// bucket is one hourly rate-limit budget.
type bucket struct {
	limit int
	used  int
	reset time.Time
}

// authenticateLocked checks the Authorization header for the route's
// kind. Token routes accept "token X" and "Bearer X"; a request without
// credentials is anonymous (and answered 401 once the route is known).
func (s *Simulator) authenticateLocked(q *request, kind authKind) (*identity, *apiError) {
	h := q.r.Header.Get("Authorization")
	if h == "" {
		return &identity{kind: "anonymous"}, nil
	}
	scheme, cred, _ := strings.Cut(strings.TrimSpace(h), " ")
	cred = strings.TrimSpace(cred)
	bad := &apiError{code: http.StatusUnauthorized, msg: "Bad credentials", doc: "https://docs.github.com/rest"}
	if kind == authJWT {
		if !strings.EqualFold(scheme, "bearer") {
			return nil, &apiError{code: http.StatusUnauthorized, msg: "A JSON web token could not be decoded", doc: "https://docs.github.com/rest"}
		}
		a, err := s.verifyAppJWTLocked(cred, q.now)
		if err != nil {
			return nil, &apiError{code: http.StatusUnauthorized, msg: err.Error(), doc: "https://docs.github.com/rest"}
		}
		return &identity{kind: "app", app: a}, nil
	}
	if !strings.EqualFold(scheme, "token") && !strings.EqualFold(scheme, "bearer") {
		return nil, bad
	}
	if p := s.pats[cred]; p != nil {
		return &identity{kind: "pat", pat: p, userID: s.owners[strings.ToLower(p.Login)].id}, nil
	}
	if t := s.tokens[cred]; t != nil && q.now.Before(t.expires) {
		return &identity{kind: "installation", token: t}, nil
	}
	return nil, bad
}

// bucketLocked returns the identity's current hourly budget.
func (s *Simulator) bucketLocked(id *identity, now time.Time) *bucket {
	key, limit := "", s.cfg.RateLimit
	switch id.kind {
	case "pat":
		key = "user:" + strings.ToLower(id.pat.Login)
		if id.pat.RateLimit > 0 {
			limit = id.pat.RateLimit
		}
	case "installation":
		key = "installation:" + strconv.FormatInt(id.token.inst.id, 10)
		if id.token.inst.rateLimit > 0 {
			limit = id.token.inst.rateLimit
		}
	case "app":
		key = "app:" + strconv.FormatInt(id.app.id, 10)
	default:
		return &bucket{limit: s.cfg.UnauthenticatedRateLimit, reset: now.Add(time.Hour)}
	}
	return s.bucketFor(key, limit, now)
}

func (s *Simulator) unauthBucketLocked(r *http.Request, now time.Time) *bucket {
	return s.bucketFor("ip:"+clientIP(r), s.cfg.UnauthenticatedRateLimit, now)
}

// bucketFor returns the named budget, starting a new hour once the old
// one has passed (GitHub's windows start at the first request).
func (s *Simulator) bucketFor(key string, limit int, now time.Time) *bucket {
	b := s.buckets[key]
	if b == nil || !now.Before(b.reset) {
		b = &bucket{limit: limit, reset: now.Add(time.Hour)}
		s.buckets[key] = b
	}
	b.limit = limit
	return b
}

func (s *Simulator) setRateHeaders(h http.Header, b *bucket, now time.Time) {
	h.Set("X-RateLimit-Limit", strconv.Itoa(b.limit))
	h.Set("X-RateLimit-Remaining", strconv.Itoa(max(b.limit-b.used, 0)))
	h.Set("X-RateLimit-Used", strconv.Itoa(b.used))
	h.Set("X-RateLimit-Reset", strconv.FormatInt(b.reset.Unix(), 10))
	h.Set("X-RateLimit-Resource", "core")
}

// SetRateLimitUsed sets how much of a budget is used in the current hour,
// for tests of exhaustion: key is "user:<login>", "installation:<id>" or
// "app:<id>".
func (s *Simulator) SetRateLimitUsed(key string, used int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	limit := s.cfg.RateLimit
	if b := s.buckets[key]; b != nil {
		limit = b.limit
	}
	s.bucketFor(key, limit, s.clock.Now()).used = used
}

// jwtClaims are the claims GitHub reads from an App JWT.
type jwtClaims struct {
	Iat json.RawMessage `json:"iat"`
	Exp json.RawMessage `json:"exp"`
	Iss json.RawMessage `json:"iss"`
}

// verifyAppJWTLocked checks an App JWT the way GitHub does: RS256 signed
// by the App's key; iss is the App id (number or string) or client id;
// exp in the future but at most 10 minutes ahead; iat at most 60 s in
// the future (clock drift) and at most 11 minutes before exp (GitHub's own
// examples back-date iat by 60 s and set exp 10 minutes ahead).
func (s *Simulator) verifyAppJWTLocked(tok string, now time.Time) (*app, error) {
	parts := strings.Split(tok, ".")
	decodeErr := errors.New("A JSON web token could not be decoded") //nolint:staticcheck,revive // ST1005/error-strings: GitHub's own message, verbatim on the wire
	if len(parts) != 3 {
		return nil, decodeErr
	}
	hdrRaw, err1 := base64.RawURLEncoding.DecodeString(parts[0])
	claimsRaw, err2 := base64.RawURLEncoding.DecodeString(parts[1])
	sig, err3 := base64.RawURLEncoding.DecodeString(parts[2])
	if err1 != nil || err2 != nil || err3 != nil {
		return nil, decodeErr
	}
	var hdr struct {
		Alg string `json:"alg"`
	}
	if json.Unmarshal(hdrRaw, &hdr) != nil {
		return nil, decodeErr
	}
	if hdr.Alg != "RS256" {
		return nil, errors.New("'alg' must be RS256")
	}
	var c jwtClaims
	if json.Unmarshal(claimsRaw, &c) != nil {
		return nil, decodeErr
	}
	iss := strings.Trim(string(c.Iss), `"`)
	var a *app
	for _, cand := range s.apps {
		if iss == strconv.FormatInt(cand.id, 10) || (cand.clientID != "" && iss == cand.clientID) {
			a = cand
		}
	}
	if a == nil {
		if _, err := strconv.ParseInt(iss, 10, 64); err != nil && !strings.HasPrefix(iss, "Iv") {
			return nil, errors.New("'Issuer' claim ('iss') must be an Integer")
		}
		return nil, errors.New("Integration not found") //nolint:staticcheck,revive // ST1005/error-strings: GitHub's own message, verbatim on the wire
	}
	digest := sha256.Sum256([]byte(parts[0] + "." + parts[1]))
	if rsa.VerifyPKCS1v15(a.key, crypto.SHA256, digest[:], sig) != nil {
		return nil, decodeErr
	}
	iat, okIat := numericDate(c.Iat)
	exp, okExp := numericDate(c.Exp)
	if !okIat {
		return nil, errors.New("'Issued at' claim ('iat') must be an Integer representing the time that the assertion was issued.") //nolint:staticcheck,revive // ST1005/error-strings: GitHub's own message, verbatim on the wire
	}
	if !okExp || !exp.After(now) {
		return nil, errors.New("'Expiration time' claim ('exp') must be a numeric value representing the future time at which the assertion expires.") //nolint:staticcheck,revive // ST1005/error-strings: GitHub's own message, verbatim on the wire
	}
	if exp.After(now.Add(10*time.Minute)) || exp.Sub(iat) > 11*time.Minute {
		return nil, errors.New("'Expiration time' claim ('exp') is too far in the future.") //nolint:staticcheck,revive // ST1005/error-strings: GitHub's own message, verbatim on the wire
	}
	if iat.After(now.Add(60 * time.Second)) {
		return nil, errors.New("'Issued at' claim ('iat') must be an Integer representing a time in the past.") //nolint:staticcheck,revive // ST1005/error-strings: GitHub's own message, verbatim on the wire
	}
	return a, nil
}

// numericDate reads a JWT NumericDate (integer seconds; fractions are
// truncated).
func numericDate(raw json.RawMessage) (time.Time, bool) {
	var f float64
	if len(raw) == 0 || json.Unmarshal(raw, &f) != nil || math.IsNaN(f) || math.IsInf(f, 0) {
		return time.Time{}, false
	}
	return time.Unix(int64(f), 0), true
}

// handleAccessToken is POST /app/installations/{installation_id}/access_tokens.
func (s *Simulator) handleAccessToken(q *request) (int, any, error) {
	id, err := strconv.ParseInt(q.vars["installation_id"], 10, 64)
	in := s.installations[id]
	if err != nil || in == nil || in.app != q.id.app {
		return 0, nil, errNotFound()
	}
	var req struct {
		Repositories  []string          `json:"repositories"`
		RepositoryIDs []int64           `json:"repository_ids"`
		Permissions   map[string]string `json:"permissions"`
	}
	if len(strings.TrimSpace(string(q.body))) > 0 {
		if err := json.Unmarshal(q.body, &req); err != nil {
			return 0, nil, &apiError{code: http.StatusBadRequest, msg: "Problems parsing JSON"}
		}
	}
	perms := map[string]string{}
	for k, v := range in.permissions {
		perms[k] = v
	}
	if req.Permissions != nil {
		perms = map[string]string{}
		for k, v := range req.Permissions {
			if !hasPermission(in.permissions, k, v) {
				return 0, nil, errValidation("The permissions requested are not granted to this installation.")
			}
			perms[k] = v
		}
	}
	t := &accessToken{inst: in, expires: q.now.Add(time.Hour), permissions: perms}
	selection := in.selection
	var repos []*repo
	if len(req.Repositories) > 0 || len(req.RepositoryIDs) > 0 {
		t.repos = map[string]bool{}
		selection = "selected"
		for _, name := range req.Repositories {
			rp := s.repos[strings.ToLower(in.account.login+"/"+name)]
			if rp == nil || (in.selection != "all" && !in.repos[strings.ToLower(rp.name)]) {
				return 0, nil, errValidation("There is at least one repository that does not exist or is not accessible to the parent installation.")
			}
			t.repos[strings.ToLower(rp.name)] = true
			repos = append(repos, rp)
		}
		for _, rid := range req.RepositoryIDs {
			var found *repo
			for _, rp := range s.repos {
				if rp.id == rid && rp.owner == in.account && (in.selection == "all" || in.repos[strings.ToLower(rp.name)]) {
					found = rp
				}
			}
			if found == nil {
				return 0, nil, errValidation("There is at least one repository that does not exist or is not accessible to the parent installation.")
			}
			t.repos[strings.ToLower(found.name)] = true
			repos = append(repos, found)
		}
	}
	t.token = "ghs_" + s.randomString(36, alnum)
	s.tokens[t.token] = t
	resp := map[string]any{
		"token":                t.token,
		"expires_at":           ghTime(t.expires),
		"permissions":          perms,
		"repository_selection": selection,
	}
	if repos != nil {
		list := make([]any, 0, len(repos))
		for _, rp := range repos {
			list = append(list, s.repoJSON(rp))
		}
		resp["repositories"] = list
	}
	return http.StatusCreated, resp, nil
}

// InstallationToken issues an installation access token directly (Go
// tests that do not exercise the JWT exchange).
func (s *Simulator) InstallationToken(installationID int64) (string, time.Time, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	in := s.installations[installationID]
	if in == nil {
		return "", time.Time{}, fmt.Errorf("no installation %d", installationID)
	}
	t := &accessToken{inst: in, expires: s.clock.Now().Add(time.Hour), permissions: in.permissions}
	t.token = "ghs_" + s.randomString(36, alnum)
	s.tokens[t.token] = t
	return t.token, t.expires, nil
}

// ParseRSAPublicKey reads a PEM RSA public key (PKIX "PUBLIC KEY", PKCS#1
// "RSA PUBLIC KEY"), certificate, or private key (its public half).
func ParseRSAPublicKey(pemBytes []byte) (*rsa.PublicKey, error) {
	block, _ := pem.Decode(pemBytes)
	if block == nil {
		return nil, errors.New("public key: no PEM block")
	}
	switch block.Type {
	case "PUBLIC KEY":
		k, err := x509.ParsePKIXPublicKey(block.Bytes)
		if err != nil {
			return nil, fmt.Errorf("public key: %w", err)
		}
		rk, ok := k.(*rsa.PublicKey)
		if !ok {
			return nil, errors.New("public key: not RSA")
		}
		return rk, nil
	case "RSA PUBLIC KEY":
		return x509.ParsePKCS1PublicKey(block.Bytes)
	case "CERTIFICATE":
		c, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			return nil, fmt.Errorf("certificate: %w", err)
		}
		rk, ok := c.PublicKey.(*rsa.PublicKey)
		if !ok {
			return nil, errors.New("certificate: not an RSA key")
		}
		return rk, nil
	case "RSA PRIVATE KEY":
		k, err := x509.ParsePKCS1PrivateKey(block.Bytes)
		if err != nil {
			return nil, err
		}
		return &k.PublicKey, nil
	case "PRIVATE KEY":
		k, err := x509.ParsePKCS8PrivateKey(block.Bytes)
		if err != nil {
			return nil, err
		}
		rk, ok := k.(*rsa.PrivateKey)
		if !ok {
			return nil, errors.New("private key: not RSA")
		}
		return &rk.PublicKey, nil
	}
	return nil, fmt.Errorf("public key: unsupported PEM block %q", block.Type)
}

// AppKey is a generated GitHub App key pair for tests.
type AppKey struct {
	Private *rsa.PrivateKey
	// PrivatePEM is the PKCS#1 "RSA PRIVATE KEY" PEM GitHub hands out (what
	// ghinstallation reads).
	PrivatePEM []byte
	// PublicPEM is the PKIX public key for AppConfig.PublicKey.
	PublicPEM string
}

// NewAppKey generates a 2048-bit App key pair.
func NewAppKey() (AppKey, error) {
	k, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return AppKey{}, err
	}
	pub, err := x509.MarshalPKIXPublicKey(&k.PublicKey)
	if err != nil {
		return AppKey{}, err
	}
	return AppKey{
		Private:    k,
		PrivatePEM: pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(k)}),
		PublicPEM:  string(pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pub})),
	}, nil
}

// SignAppJWT signs an RS256 App JWT with the given claims; iss may be a
// string or a number, as GitHub accepts both.
func SignAppJWT(key *rsa.PrivateKey, iss any, iat, exp time.Time) (string, error) {
	hdr := base64.RawURLEncoding.EncodeToString([]byte(`{"alg":"RS256","typ":"JWT"}`))
	claims, err := json.Marshal(map[string]any{"iat": iat.Unix(), "exp": exp.Unix(), "iss": iss})
	if err != nil {
		return "", err
	}
	signing := hdr + "." + base64.RawURLEncoding.EncodeToString(claims)
	digest := sha256.Sum256([]byte(signing))
	sig, err := rsa.SignPKCS1v15(rand.Reader, key, crypto.SHA256, digest[:])
	if err != nil {
		return "", err
	}
	return signing + "." + base64.RawURLEncoding.EncodeToString(sig), nil
}

// secretEqual compares secrets in constant time.
func secretEqual(a, b string) bool {
	return subtle.ConstantTimeCompare([]byte(a), []byte(b)) == 1
}

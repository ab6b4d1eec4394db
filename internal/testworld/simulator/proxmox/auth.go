package proxmoxsim

import (
	"crypto/hmac"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/hyperfleet/hyperfleet/pkg/provider/proxmox/privileges"
)

// Privileges maps ACL paths ("/", "/vms/100", "/storage/local", "/pool/ci")
// to privilege names or role names (Administrator, PVEVMAdmin, ...). In a
// config file a plain list is shorthand for {"/": list}.
type Privileges map[string][]string

// UnmarshalJSON accepts a list (granted on "/") or a path map.
func (p *Privileges) UnmarshalJSON(data []byte) error {
	var list []string
	if err := json.Unmarshal(data, &list); err == nil {
		*p = Privileges{"/": list}
		return nil
	}
	var m map[string][]string
	if err := json.Unmarshal(data, &m); err != nil {
		return fmt.Errorf("privileges must be a list or a map of ACL path to list: %w", err)
	}
	*p = m
	return nil
}

// roleNames are the built-in Proxmox roles usable in privilege lists,
// each a filter of the privileges the simulated version knows
// (privileges.Known): PVE 8's VM.Monitor and PVE 9's VM.GuestAgent.* follow
// the version.
var roleNames = map[string]func(priv string) bool{
	"Administrator":     func(string) bool { return true },
	"PVEAdmin":          func(string) bool { return true },
	"PVEAuditor":        inList("Datastore.Audit", "Pool.Audit", "SDN.Audit", "Sys.Audit", "VM.Audit"),
	"PVEVMAdmin":        func(p string) bool { return strings.HasPrefix(p, "VM.") },
	"PVEVMUser":         inList("VM.Audit", "VM.Backup", "VM.Config.CDROM", "VM.Config.Cloudinit", "VM.Console", "VM.PowerMgmt"),
	"PVEDatastoreUser":  inList("Datastore.AllocateSpace", "Datastore.Audit"),
	"PVEDatastoreAdmin": func(p string) bool { return strings.HasPrefix(p, "Datastore.") },
	"PVEPoolUser":       inList("Pool.Audit"),
	"PVEPoolAdmin":      inList("Pool.Allocate", "Pool.Audit"),
	"NoAccess":          func(string) bool { return false },
}

func inList(privs ...string) func(string) bool {
	return func(p string) bool { return slices.Contains(privs, p) }
}

// privSet is a set of privileges per ACL path, roles expanded.
type privSet map[string]map[string]bool

func expandPrivileges(p Privileges, v privileges.Version, custom map[string][]string) privSet {
	out := privSet{}
	for path, names := range p {
		set := map[string]bool{}
		for _, n := range names {
			if privs, ok := custom[n]; ok {
				for _, priv := range privs {
					set[priv] = true
				}
				continue
			}
			if keep, ok := roleNames[n]; ok {
				for _, priv := range privileges.Known(v) {
					if keep(priv) {
						set[priv] = true
					}
				}
				continue
			}
			set[n] = true
		}
		out[normACLPath(path)] = set
	}
	return out
}

func normACLPath(p string) string {
	p = "/" + strings.Trim(p, "/")
	return p
}

// at returns the privileges that apply on path: the most specific ACL path
// that is path itself or one of its parents wins, as ACL propagation with
// overriding child entries does in Proxmox.
func (ps privSet) at(path string) map[string]bool {
	path = normACLPath(path)
	best, bestLen := map[string]bool(nil), -1
	for p, set := range ps {
		if p == "/" || path == p || strings.HasPrefix(path, p+"/") {
			if len(p) > bestLen {
				best, bestLen = set, len(p)
			}
		}
	}
	return best
}

type user struct {
	id       string
	password string
	disabled bool
	expire   int64
	// grants are the roles and privileges given to the user per ACL
	// path (the config's, then pveum aclmod's); privs is them expanded.
	grants Privileges
	privs  privSet
	tokens map[string]*token
}

type token struct {
	id      string
	secret  string
	expire  int64
	privsep bool
	grants  Privileges
	privs   privSet
}

// identity is the authenticated caller of a request.
type identity struct {
	user  *user
	token *token // nil for ticket sessions
}

// userString is the user as it appears in UPIDs: user@realm!token for API
// tokens.
func (id *identity) userString() string {
	if id.token != nil {
		return id.user.id + "!" + id.token.id
	}
	return id.user.id
}

// has reports whether the caller holds priv on path.
func (id *identity) has(path, priv string) bool {
	if id.user.id == "root@pam" && id.token == nil {
		return true
	}
	userHas := id.user.id == "root@pam" || id.user.privs.at(path)[priv]
	if id.token == nil || !id.token.privsep {
		return userHas
	}
	return userHas && id.token.privs.at(path)[priv]
}

func (s *Simulator) initUsers() {
	for _, u := range s.cfg.Users {
		nu := &user{id: u.ID, password: u.Password, disabled: u.Disabled, expire: u.Expire,
			grants: clonePrivileges(u.Privileges), tokens: map[string]*token{}}
		for _, t := range u.Tokens {
			privsep := true
			if t.Privsep != nil {
				privsep = *t.Privsep
			}
			nu.tokens[t.ID] = &token{id: t.ID, secret: t.Secret, expire: t.Expire, privsep: privsep, grants: clonePrivileges(t.Privileges)}
		}
		s.users[u.ID] = nu
	}
	s.expandGrantsLocked()
}

// expandGrantsLocked recomputes every user's and token's privileges from
// their grants, after the grants or a custom role changed (pveum).
func (s *Simulator) expandGrantsLocked() {
	for _, u := range s.users {
		u.privs = expandPrivileges(u.grants, s.version(), s.roles)
		for _, t := range u.tokens {
			t.privs = expandPrivileges(t.grants, s.version(), s.roles)
		}
	}
}

func clonePrivileges(p Privileges) Privileges {
	out := Privileges{}
	for path, names := range p {
		out[normACLPath(path)] = append(out[normACLPath(path)], names...)
	}
	return out
}

const (
	reasonNoTicket   = "No ticket"
	reasonAuthFailed = "Authentication failed!"
	reasonBadCSRF    = "Permission denied - invalid csrf token"
)

// authenticate checks the API token or the ticket cookie (plus the CSRF
// header on non-GET ticket requests).
func (s *Simulator) authenticate(r *http.Request) (*identity, *apiError) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.clock.Now()
	if h := r.Header.Get("Authorization"); strings.HasPrefix(h, "PVEAPIToken") {
		id, ok := s.checkTokenLocked(strings.TrimPrefix(strings.TrimPrefix(h, "PVEAPIToken"), "="), now)
		if !ok {
			return nil, &apiError{code: http.StatusUnauthorized, msg: reasonAuthFailed}
		}
		// Token requests skip the CSRF check: there is no cookie to abuse.
		return id, nil
	}
	c, err := r.Cookie("PVEAuthCookie")
	if err != nil || c.Value == "" {
		return nil, &apiError{code: http.StatusUnauthorized, msg: reasonNoTicket}
	}
	ticket := c.Value
	if strings.Contains(ticket, "%") {
		if un, err := url.QueryUnescape(ticket); err == nil {
			ticket = un
		}
	}
	u, ok := s.verifyTicketLocked(ticket, now)
	if !ok {
		return nil, &apiError{code: http.StatusUnauthorized, msg: reasonAuthFailed}
	}
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		if !s.verifyCSRF(r.Header.Get("CSRFPreventionToken"), u.id, now) {
			return nil, &apiError{code: http.StatusUnauthorized, msg: reasonBadCSRF}
		}
	}
	return &identity{user: u}, nil
}

// checkTokenLocked verifies "user@realm!tokenid=secret". The value is split
// at its LAST '=' because the token id itself may not contain one but a
// client may send secrets that do.
func (s *Simulator) checkTokenLocked(v string, now time.Time) (*identity, bool) {
	i := strings.LastIndex(v, "=")
	if i < 0 {
		return nil, false
	}
	full, secret := v[:i], v[i+1:]
	bang := strings.Index(full, "!")
	if bang < 0 || !userIDRE.MatchString(full[:bang]) || !tokenNameRE.MatchString(full[bang+1:]) {
		return nil, false
	}
	u := s.users[full[:bang]]
	if u == nil || !s.userActive(u, now) {
		return nil, false
	}
	t := u.tokens[full[bang+1:]]
	if t == nil || (t.expire != 0 && now.Unix() > t.expire) {
		return nil, false
	}
	if subtle.ConstantTimeCompare([]byte(t.secret), []byte(secret)) != 1 {
		return nil, false
	}
	return &identity{user: u, token: t}, true
}

func (s *Simulator) userActive(u *user, now time.Time) bool {
	return !u.disabled && (u.expire == 0 || now.Unix() <= u.expire)
}

func (s *Simulator) sign(data string) string {
	m := hmac.New(sha256.New, s.secret)
	m.Write([]byte(data))
	return base64.RawStdEncoding.EncodeToString(m.Sum(nil))
}

// makeTicket builds "PVE:<user>:<HEXTIME>::<signature>".
func (s *Simulator) makeTicket(userID string, now time.Time) string {
	plain := fmt.Sprintf("PVE:%s:%08X", userID, now.Unix())
	return plain + "::" + s.sign(plain)
}

func (s *Simulator) makeCSRF(userID string, now time.Time) string {
	ts := fmt.Sprintf("%08X", now.Unix())
	return ts + ":" + s.sign(ts+":"+userID)
}

func (s *Simulator) verifyTicketLocked(ticket string, now time.Time) (*user, bool) {
	i := strings.Index(ticket, "::")
	if i < 0 || !strings.HasPrefix(ticket, "PVE:") {
		return nil, false
	}
	plain, sig := ticket[:i], ticket[i+2:]
	if !hmac.Equal([]byte(sig), []byte(s.sign(plain))) {
		return nil, false
	}
	j := strings.LastIndex(plain, ":")
	ts, err := strconv.ParseInt(plain[j+1:], 16, 64)
	if err != nil {
		return nil, false
	}
	age := now.Sub(time.Unix(ts, 0))
	if age > s.cfg.TicketLifetime.D() || age < -5*time.Minute {
		return nil, false
	}
	u := s.users[plain[len("PVE:"):j]]
	if u == nil || !s.userActive(u, now) {
		return nil, false
	}
	return u, true
}

func (s *Simulator) verifyCSRF(tok, userID string, now time.Time) bool {
	i := strings.Index(tok, ":")
	if i < 0 {
		return false
	}
	ts, err := strconv.ParseInt(tok[:i], 16, 64)
	if err != nil {
		return false
	}
	if age := now.Sub(time.Unix(ts, 0)); age > s.cfg.TicketLifetime.D() || age < -5*time.Minute {
		return false
	}
	return hmac.Equal([]byte(tok[i+1:]), []byte(s.sign(tok[:i]+":"+userID)))
}

var ticketSchema = sch(
	param{name: "username", kind: kString, maxLen: 64},
	param{name: "password", kind: kString},
	param{name: "realm", kind: kString, optional: true, maxLen: 32},
	param{name: "otp", kind: kString, optional: true},
	param{name: "path", kind: kString, optional: true, maxLen: 64},
	param{name: "privs", kind: kString, optional: true, maxLen: 64},
	param{name: "new-format", kind: kBool, optional: true},
	param{name: "tfa-challenge", kind: kString, optional: true},
)

// handleTicket is POST /access/ticket: a login with a password, or a renewal
// when the password is a still valid ticket of the same user.
func (s *Simulator) handleTicket(q *apiRequest) (any, error) {
	now := s.clock.Now()
	userID := q.str("username")
	if realm := q.str("realm"); realm != "" && !strings.Contains(userID, "@") {
		userID += "@" + realm
	}
	fail := &apiError{code: http.StatusUnauthorized, msg: "authentication failure"}
	u := s.users[userID]
	if u == nil || !s.userActive(u, now) {
		return nil, fail
	}
	pw := q.str("password")
	ok := u.password != "" && subtle.ConstantTimeCompare([]byte(u.password), []byte(pw)) == 1
	if !ok && strings.HasPrefix(pw, "PVE:") {
		if tu, valid := s.verifyTicketLocked(pw, now); valid && tu == u {
			ok = true
		}
	}
	if !ok {
		return nil, fail
	}
	id := &identity{user: u}
	return map[string]any{
		"username":            u.id,
		"ticket":              s.makeTicket(u.id, now),
		"CSRFPreventionToken": s.makeCSRF(u.id, now),
		"cap":                 capabilities(id, s.version()),
	}, nil
}

// capabilities is the "cap" object of a login: privileges per category on
// the category root, each as {"Priv": 1}.
func capabilities(id *identity, v privileges.Version) map[string]map[string]int {
	cats := map[string]string{"vms": "/vms", "storage": "/storage", "nodes": "/nodes", "dc": "/", "access": "/access", "sdn": "/sdn", "mapping": "/mapping"}
	out := map[string]map[string]int{}
	for cat, path := range cats {
		m := map[string]int{}
		for _, p := range privileges.Known(v) {
			if id.has(path, p) {
				m[p] = 1
			}
		}
		out[cat] = m
	}
	return out
}

// version is the simulated Proxmox VE major version: the column of
// pkg/provider/proxmox/privileges the API enforces.
func (s *Simulator) version() privileges.Version {
	if s.cfg.PVEVersion == 8 {
		return privileges.PVE8
	}
	return privileges.PVE9
}

// versionStrings are /version's version and release.
func (s *Simulator) versionStrings() (string, string) {
	if s.version() == privileges.PVE8 {
		return pve8Version, pve8Release
	}
	return pveVersion, pveRelease
}

func (s *Simulator) versionString() string { v, _ := s.versionStrings(); return v }

// tablePath is a route's pattern as the privilege table writes it: a
// final "{volume...}" is "{volume}".
func tablePath(pattern string) string { return strings.ReplaceAll(pattern, "...}", "}") }

// CallRecord is one authenticated API call the simulator checked: its
// route, the privilege checks the table gave for it and the per-item
// filters its handler applied (WithCallLog).
type CallRecord struct {
	Method, Path string
	Needs        []privileges.Need
	Filters      []privileges.Need
}

// allowedLocked applies the route's filter for item (privileges.Filter):
// whether the caller may see the item named by vars. It records the filter
// for the call log.
func (s *Simulator) allowedLocked(q *apiRequest, item string, vars map[string]string) bool {
	n, ok := q.route.row.FilterNeed(item, vars)
	if !ok {
		return true
	}
	q.filters = append(q.filters, n)
	return satisfies(q.auth, n, n.Path)
}

// WithCallLog hands every authenticated call's record to log, after its
// permission checks ran (whether or not they passed). Tests derive the
// minimal roles from it.
func WithCallLog(log func(CallRecord)) Option { return func(s *Simulator) { s.callLog = log } }

// needsLocked evaluates the privilege table's row of the request against
// the simulated cluster: the VM's current config and volume types.
func (s *Simulator) needsLocked(q *apiRequest) []privileges.Need {
	call := privileges.Call{Vars: q.vars, Params: q.params, Volume: func(volid string) string {
		if _, vol := s.findVolumeLocked(volid, q.vars["node"]); vol != nil {
			return vol.content
		}
		return ""
	}}
	if id, err := strconv.Atoi(q.vars["vmid"]); err == nil && s.vms[id] != nil {
		v := s.vms[id]
		call.Config = v.conf
		call.StateStorage = func() string { return s.vmstateStorageLocked(v) }
	}
	return q.route.row.Needs(s.version(), call)
}

// checkPermissionsLocked runs before the handler and before parameter
// verification, exactly like pveproxy: a token without VM.Allocate on
// /vms/100 gets 403 whether or not VM 100 exists. The checks are the
// privilege table's (pkg/provider/proxmox/privileges); the first failing
// one is reported in RPCEnvironment.pm's words: "Permission check failed
// (<path>, <privilege>)", the first missing privilege of an all-of check,
// all of an any-of check joined by '|', and a bare "Permission check
// failed" for an 'or' group (exec_api2_perm_check).
func (s *Simulator) checkPermissionsLocked(q *apiRequest) error {
	needs := s.needsLocked(q)
	q.needs = needs
	for _, n := range needs {
		if satisfies(q.auth, n, n.Path) || (n.OrPath != "" && satisfies(q.auth, n, n.OrPath)) {
			continue
		}
		if n.Bare {
			return &apiError{code: http.StatusForbidden, msg: "Permission check failed\n"}
		}
		what := strings.Join(n.Privs, "|")
		if !n.Any {
			for _, p := range n.Privs {
				if !q.auth.has(n.Path, p) {
					what = p
					break
				}
			}
		}
		return &apiError{code: http.StatusForbidden, msg: fmt.Sprintf("Permission check failed (%s, %s)\n", n.Path, what)}
	}
	return nil
}

func satisfies(id *identity, n privileges.Need, path string) bool {
	if n.Any {
		return slices.ContainsFunc(n.Privs, func(p string) bool { return id.has(path, p) })
	}
	for _, p := range n.Privs {
		if !id.has(path, p) {
			return false
		}
	}
	return true
}

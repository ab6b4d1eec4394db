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
	"sort"
	"strconv"
	"strings"
	"time"
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

// allPrivileges are the privileges the simulator knows about.
var allPrivileges = []string{
	"Datastore.Allocate", "Datastore.AllocateSpace", "Datastore.AllocateTemplate", "Datastore.Audit",
	"Pool.Allocate", "Pool.Audit", "SDN.Audit", "SDN.Use", "Sys.Audit", "Sys.Console", "Sys.Modify",
	"Sys.PowerMgmt", "User.Modify", "Permissions.Modify",
	"VM.Allocate", "VM.Audit", "VM.Backup", "VM.Clone", "VM.Config.CDROM", "VM.Config.CPU",
	"VM.Config.Cloudinit", "VM.Config.Disk", "VM.Config.HWType", "VM.Config.Memory", "VM.Config.Network",
	"VM.Config.Options", "VM.Console", "VM.GuestAgent.Audit", "VM.Migrate", "VM.Monitor", "VM.PowerMgmt",
	"VM.Snapshot",
}

// roles are the built-in Proxmox roles usable in privilege lists.
var roles = map[string][]string{
	"Administrator":     allPrivileges,
	"PVEAdmin":          allPrivileges,
	"PVEAuditor":        {"Datastore.Audit", "Pool.Audit", "SDN.Audit", "Sys.Audit", "VM.Audit"},
	"PVEVMAdmin":        filterPrivs("VM."),
	"PVEVMUser":         {"VM.Audit", "VM.Backup", "VM.Config.CDROM", "VM.Config.Cloudinit", "VM.Console", "VM.PowerMgmt"},
	"PVEDatastoreUser":  {"Datastore.AllocateSpace", "Datastore.Audit"},
	"PVEDatastoreAdmin": filterPrivs("Datastore."),
	"PVEPoolUser":       {"Pool.Audit"},
	"PVEPoolAdmin":      {"Pool.Allocate", "Pool.Audit"},
	"NoAccess":          {},
}

func filterPrivs(prefix string) []string {
	var out []string
	for _, p := range allPrivileges {
		if strings.HasPrefix(p, prefix) {
			out = append(out, p)
		}
	}
	return out
}

// privSet is a set of privileges per ACL path, roles expanded.
type privSet map[string]map[string]bool

func expandPrivileges(p Privileges) privSet {
	out := privSet{}
	for path, names := range p {
		set := map[string]bool{}
		for _, n := range names {
			if r, ok := roles[n]; ok {
				for _, priv := range r {
					set[priv] = true
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
	privs    privSet
	tokens   map[string]*token
}

type token struct {
	id      string
	secret  string
	expire  int64
	privsep bool
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
			privs: expandPrivileges(u.Privileges), tokens: map[string]*token{}}
		for _, t := range u.Tokens {
			privsep := true
			if t.Privsep != nil {
				privsep = *t.Privsep
			}
			nu.tokens[t.ID] = &token{id: t.ID, secret: t.Secret, expire: t.Expire, privsep: privsep, privs: expandPrivileges(t.Privileges)}
		}
		s.users[u.ID] = nu
	}
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
		"cap":                 capabilities(id),
	}, nil
}

// capabilities is the "cap" object of a login: privileges per category on
// the category root, each as {"Priv": 1}.
func capabilities(id *identity) map[string]map[string]int {
	cats := map[string]string{"vms": "/vms", "storage": "/storage", "nodes": "/nodes", "dc": "/", "access": "/access", "sdn": "/sdn", "mapping": "/mapping"}
	out := map[string]map[string]int{}
	for cat, path := range cats {
		m := map[string]int{}
		for _, p := range allPrivileges {
			if id.has(path, p) {
				m[p] = 1
			}
		}
		out[cat] = m
	}
	return out
}

// permCheck is one "check => ['perm', path, privs]" of an endpoint.
type permCheck struct {
	path  string
	privs []string
	// any accepts one of privs instead of all of them.
	any bool
	// orPath, when set, also satisfies the check if the caller holds the
	// privileges there (clone's "/vms/{newid} or /pool/{pool}").
	orPath string
}

// checkPermissionsLocked runs before the handler and before parameter
// verification, exactly like pveproxy: a token without VM.Allocate on
// /vms/100 gets 403 whether or not VM 100 exists.
func (s *Simulator) checkPermissionsLocked(q *apiRequest) error {
	if q.route.perms == nil {
		return nil
	}
	for _, c := range q.route.perms(q) {
		if s.satisfies(q.auth, c, c.path) || (c.orPath != "" && s.satisfies(q.auth, c, c.orPath)) {
			continue
		}
		what := c.privs[0]
		if c.any {
			what = strings.Join(c.privs, "|")
		} else {
			for _, p := range c.privs {
				if !q.auth.has(c.path, p) {
					what = p
					break
				}
			}
		}
		return &apiError{code: http.StatusForbidden, msg: fmt.Sprintf("Permission check failed (%s, %s)\n", c.path, what)}
	}
	return nil
}

func (s *Simulator) satisfies(id *identity, c permCheck, path string) bool {
	if c.any {
		for _, p := range c.privs {
			if id.has(path, p) {
				return true
			}
		}
		return false
	}
	for _, p := range c.privs {
		if !id.has(path, p) {
			return false
		}
	}
	return true
}

// configPerms mirrors qemu-server's check_vm_modify_config_perm: each
// changed option needs its own VM.Config.* privilege.
func configPerms(q *apiRequest) []permCheck {
	path := "/vms/" + q.vars["vmid"]
	need := map[string]bool{}
	keys := []string{}
	for k := range q.params {
		keys = append(keys, k)
	}
	if d := q.params["delete"]; d != "" {
		keys = append(keys, splitList(d)...)
	}
	for _, k := range keys {
		if p := configPrivilege(k, q.params[k]); p != "" {
			need[p] = true
		}
	}
	if len(need) == 0 {
		return []permCheck{{path: path, privs: []string{"VM.Config.Options"}}}
	}
	privs := make([]string, 0, len(need))
	for p := range need {
		privs = append(privs, p)
	}
	sort.Strings(privs)
	return []permCheck{{path: path, privs: privs}}
}

func configPrivilege(key, value string) string {
	base := strings.TrimRight(key, "0123456789")
	switch {
	case key == "node" || key == "vmid" || key == "delete" || key == "digest" || key == "skiplock" || key == "revert" || key == "background_delay":
		return ""
	case key == "cores" || key == "sockets" || key == "cpu" || key == "cpulimit" || key == "cpuunits" || key == "vcpus" || key == "affinity" || key == "numa":
		return "VM.Config.CPU"
	case key == "memory" || key == "balloon" || key == "shares":
		return "VM.Config.Memory"
	case base == "net":
		return "VM.Config.Network"
	case base == "ipconfig" || key == "ciuser" || key == "cipassword" || key == "sshkeys" || key == "nameserver" ||
		key == "searchdomain" || key == "cicustom" || key == "citype" || key == "ciupgrade":
		return "VM.Config.Cloudinit"
	case base == "ide" || base == "scsi" || base == "sata" || base == "virtio" || base == "efidisk" || base == "tpmstate" || base == "unused":
		if strings.Contains(value, "media=cdrom") || value == "none" {
			return "VM.Config.CDROM"
		}
		return "VM.Config.Disk"
	case key == "scsihw" || key == "machine" || key == "bios" || key == "vga" || base == "serial" || key == "ostype" || key == "kvm" || key == "smbios1":
		return "VM.Config.HWType"
	default:
		return "VM.Config.Options"
	}
}

// fileWritePerms: PVE 8 checks VM.Monitor; PVE 9 VM.GuestAgent.FileWrite
// or VM.GuestAgent.Unrestricted.
func fileWritePerms(q *apiRequest) []permCheck {
	return []permCheck{{path: "/vms/" + q.vars["vmid"], privs: []string{"VM.GuestAgent.FileWrite", "VM.GuestAgent.Unrestricted", "VM.Monitor"}, any: true}}
}

func agentPerms(q *apiRequest) []permCheck {
	// PVE 8 checks VM.Monitor, PVE 9 VM.GuestAgent.Audit; accept either.
	return []permCheck{{path: "/vms/" + q.vars["vmid"], privs: []string{"VM.GuestAgent.Audit", "VM.Monitor"}, any: true}}
}

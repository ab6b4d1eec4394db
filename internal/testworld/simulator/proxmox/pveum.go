package proxmoxsim

import (
	"bytes"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/hyperfleet/hyperfleet/pkg/provider/proxmox/privileges"
)

// Pveum carries out a pveum command line on the simulated cluster, as
// Proxmox VE's pveum does when the administrator runs it on a node: as
// root, through the access-control API's own handlers, so without
// permission checks. It covers what docs/install.md's step 2 runs (a role,
// a user, an ACL entry, an API token):
//
//	role add <role> --privs <list>
//	role modify <role> --privs <list> [--append]
//	user add <user@realm> [--comment <text>]
//	aclmod <path> --roles <list> (--users <list> | --tokens <list>) [--propagate <bool>]
//	user token add <user@realm> <token> [--privsep <bool>] [--comment <text>] [--expire <epoch>]
//	any of them with --output-format text|json
//
// Lists are separated by commas or spaces, as pveum's privilege and
// role lists are. It returns what pveum prints (the new token's table) or
// pveum's error message. The changes take effect on the API at once.
func (s *Simulator) Pveum(args []string) (string, error) {
	cmd, opts, err := parsePveum(args)
	if err != nil {
		return "", err
	}
	format := opts.take("output-format")
	if format == "" {
		format = "text"
	}
	if format != "text" && format != "json" {
		return "", fmt.Errorf("400 Parameter verification failed.\noutput-format: value '%s' does not have a value in the enumeration 'text, json, json-pretty, yaml'", format)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.roles == nil {
		s.roles = map[string][]string{}
	}
	var out map[string]any
	switch strings.Join(cmd.words, " ") {
	case "role add":
		err = s.pveumRoleAdd(cmd, opts)
	case "role modify":
		err = s.pveumRoleModify(cmd, opts)
	case "user add":
		err = s.pveumUserAdd(cmd, opts)
	case "aclmod":
		err = s.pveumACLMod(cmd, opts)
	case "user token add":
		out, err = s.pveumTokenAdd(cmd, opts)
	default:
		return "", fmt.Errorf("unknown command 'pveum %s'", strings.Join(args, " "))
	}
	if err == nil {
		err = opts.leftover()
	}
	if err != nil {
		return "", err
	}
	s.expandGrantsLocked()
	if out == nil {
		return "", nil
	}
	if format == "json" {
		b, err := json.Marshal(out)
		return string(b) + "\n", err
	}
	return textTable(out), nil
}

// pveumCommand is a command's words (role add) and its positional
// arguments.
type pveumCommand struct {
	words []string
	args  []string
}

// pveumOptions are a command's --options; a boolean option may stand
// alone (--append), as pveum accepts.
type pveumOptions map[string]string

func (o pveumOptions) take(name string) string {
	v := o[name]
	delete(o, name)
	return v
}

func (o pveumOptions) leftover() error {
	for name := range o {
		return fmt.Errorf("400 Parameter verification failed.\n%s: property is not defined in schema and the schema does not allow additional properties", name)
	}
	return nil
}

// pveumBooleans are the options that may be given without a value.
var pveumBooleans = map[string]bool{"append": true, "propagate": true, "privsep": true}

// pveumWords are the words of each command, the rest of a line's
// non-option words being its arguments.
var pveumWords = [][]string{{"user", "token", "add"}, {"role", "modify"}, {"role", "add"}, {"user", "add"}, {"aclmod"}}

func parsePveum(args []string) (pveumCommand, pveumOptions, error) {
	var cmd pveumCommand
	opts := pveumOptions{}
	var plain []string
	for i := 0; i < len(args); i++ {
		a := args[i]
		if !strings.HasPrefix(a, "-") {
			plain = append(plain, a)
			continue
		}
		name := strings.TrimLeft(a, "-")
		if k, v, ok := strings.Cut(name, "="); ok {
			opts[k] = v
			continue
		}
		if pveumBooleans[name] && (i+1 == len(args) || strings.HasPrefix(args[i+1], "-") || !isPveumBool(args[i+1])) {
			opts[name] = "1"
			continue
		}
		if i+1 == len(args) {
			return cmd, nil, fmt.Errorf("400 unable to parse option\nmissing value for option '%s'", name)
		}
		opts[name] = args[i+1]
		i++
	}
	for _, words := range pveumWords {
		if len(plain) >= len(words) && slices.Equal(plain[:len(words)], words) {
			return pveumCommand{words: words, args: plain[len(words):]}, opts, nil
		}
	}
	return cmd, nil, fmt.Errorf("unknown command 'pveum %s'", strings.Join(args, " "))
}

func isPveumBool(v string) bool {
	switch strings.ToLower(v) {
	case "0", "1", "yes", "no", "on", "off", "true", "false":
		return true
	}
	return false
}

func pveumBool(v string, def bool) (bool, error) {
	if v == "" {
		return def, nil
	}
	switch strings.ToLower(v) {
	case "1", "yes", "on", "true":
		return true, nil
	case "0", "no", "off", "false":
		return false, nil
	}
	return false, fmt.Errorf("value '%s' is not a boolean", v)
}

// pveumList splits a pveum list (commas, spaces or both).
func pveumList(v string) []string {
	return strings.FieldsFunc(v, func(r rune) bool { return r == ',' || r == ' ' || r == ';' || r == '\t' || r == '\n' })
}

func (c pveumCommand) want(n int, names ...string) error {
	if len(c.args) < n {
		return fmt.Errorf("400 not enough arguments\npveum %s <%s>", strings.Join(c.words, " "), strings.Join(names, "> <"))
	}
	if len(c.args) > n {
		return fmt.Errorf("400 too many arguments\npveum %s <%s>", strings.Join(c.words, " "), strings.Join(names, "> <"))
	}
	return nil
}

// checkPrivs refuses a privilege the simulated version does not have, as
// Proxmox's verify_privs does (VM.Monitor on Proxmox VE 9).
func (s *Simulator) checkPrivs(privs []string) error {
	known := privileges.Known(s.version())
	for _, p := range privs {
		if !slices.Contains(known, p) {
			return fmt.Errorf("400 Parameter verification failed.\nprivs: invalid privilege '%s'", p)
		}
	}
	return nil
}

func (s *Simulator) pveumRoleAdd(c pveumCommand, o pveumOptions) error {
	if err := c.want(1, "roleid"); err != nil {
		return err
	}
	role, privs := c.args[0], pveumList(o.take("privs"))
	if err := s.checkPrivs(privs); err != nil {
		return err
	}
	if _, builtin := roleNames[role]; builtin || s.roles[role] != nil {
		return fmt.Errorf("create role failed: role '%s' already exists", role)
	}
	s.roles[role] = privs
	return nil
}

func (s *Simulator) pveumRoleModify(c pveumCommand, o pveumOptions) error {
	if err := c.want(1, "roleid"); err != nil {
		return err
	}
	role, privs := c.args[0], pveumList(o.take("privs"))
	appendPrivs, err := pveumBool(o.take("append"), false)
	if err != nil {
		return fmt.Errorf("400 Parameter verification failed.\nappend: %w", err)
	}
	if err := s.checkPrivs(privs); err != nil {
		return err
	}
	if _, builtin := roleNames[role]; builtin {
		return fmt.Errorf("update role failed: cannot modify special role '%s'", role)
	}
	old, ok := s.roles[role]
	if !ok {
		return fmt.Errorf("update role failed: role '%s' does not exist", role)
	}
	if appendPrivs {
		for _, p := range privs {
			if !slices.Contains(old, p) {
				old = append(old, p)
			}
		}
		privs = old
	}
	s.roles[role] = privs
	return nil
}

func (s *Simulator) pveumUserAdd(c pveumCommand, o pveumOptions) error {
	if err := c.want(1, "userid"); err != nil {
		return err
	}
	id := c.args[0]
	o.take("comment")
	if !userIDRE.MatchString(id) {
		return fmt.Errorf("400 Parameter verification failed.\nuserid: value '%s' does not look like a valid user name", id)
	}
	if realm := id[strings.LastIndex(id, "@")+1:]; realm != "pve" && realm != "pam" {
		return fmt.Errorf("create user failed: authentication domain '%s' does not exist", realm)
	}
	if s.users[id] != nil {
		return fmt.Errorf("create user failed: user '%s' already exists", id)
	}
	s.users[id] = &user{id: id, grants: Privileges{}, tokens: map[string]*token{}}
	return nil
}

func (s *Simulator) pveumACLMod(c pveumCommand, o pveumOptions) error {
	if err := c.want(1, "path"); err != nil {
		return err
	}
	path := normACLPath(c.args[0])
	roles := pveumList(o.take("roles"))
	users, tokens := pveumList(o.take("users")), pveumList(o.take("tokens"))
	if _, err := pveumBool(o.take("propagate"), true); err != nil {
		return fmt.Errorf("400 Parameter verification failed.\npropagate: %w", err)
	}
	if len(roles) == 0 {
		return fmt.Errorf("400 Parameter verification failed.\nroles: property is missing and it is not optional")
	}
	if len(users) == 0 && len(tokens) == 0 {
		return fmt.Errorf("either 'users', 'groups' or 'tokens' is required")
	}
	for _, r := range roles {
		if _, builtin := roleNames[r]; !builtin && s.roles[r] == nil {
			return fmt.Errorf("role '%s' does not exist", r)
		}
	}
	var grants []Privileges
	for _, id := range users {
		u := s.users[id]
		if u == nil {
			return fmt.Errorf("user '%s' does not exist", id)
		}
		grants = append(grants, u.grants)
	}
	for _, full := range tokens {
		uid, tid, _ := strings.Cut(full, "!")
		u := s.users[uid]
		if u == nil || u.tokens[tid] == nil {
			return fmt.Errorf("no such token '%s' for user '%s'", tid, uid)
		}
		grants = append(grants, u.tokens[tid].grants)
	}
	for _, g := range grants {
		for _, r := range roles {
			if !slices.Contains(g[path], r) {
				g[path] = append(g[path], r)
			}
		}
	}
	return nil
}

func (s *Simulator) pveumTokenAdd(c pveumCommand, o pveumOptions) (map[string]any, error) {
	if err := c.want(2, "userid", "tokenid"); err != nil {
		return nil, err
	}
	uid, tid := c.args[0], c.args[1]
	o.take("comment")
	privsep, err := pveumBool(o.take("privsep"), true)
	if err != nil {
		return nil, fmt.Errorf("400 Parameter verification failed.\nprivsep: %w", err)
	}
	var expire int64
	if v := o.take("expire"); v != "" {
		if expire, err = strconv.ParseInt(v, 10, 64); err != nil || expire < 0 {
			return nil, fmt.Errorf("400 Parameter verification failed.\nexpire: type check ('integer') failed - got '%s'", v)
		}
	}
	if !tokenNameRE.MatchString(tid) {
		return nil, fmt.Errorf("400 Parameter verification failed.\ntokenid: invalid format - invalid token ID '%s'", tid)
	}
	u := s.users[uid]
	if u == nil {
		return nil, fmt.Errorf("no such user ('%s')", uid)
	}
	if u.tokens[tid] != nil {
		return nil, errors.New("Token already exists.") //nolint:revive,staticcheck // Proxmox's own message, as pveum prints it.
	}
	secret, err := tokenSecret()
	if err != nil {
		return nil, err
	}
	u.tokens[tid] = &token{id: tid, secret: secret, expire: expire, privsep: privsep, grants: Privileges{}}
	info := map[string]any{"privsep": boolString(privsep)}
	if expire != 0 {
		info["expire"] = strconv.FormatInt(expire, 10)
	}
	return map[string]any{"full-tokenid": uid + "!" + tid, "info": info, "value": secret}, nil
}

func boolString(b bool) string {
	if b {
		return "1"
	}
	return "0"
}

// tokenSecret is a new token's secret: a random UUID, as Proxmox's are.
func tokenSecret() (string, error) {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("token secret: %w", err)
	}
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16]), nil
}

// textTable prints a result object as pveum's default text output does: a
// key/value table in box-drawing characters, keys sorted, objects as JSON.
func textTable(obj map[string]any) string {
	keys := sortedKeys(obj)
	rows := [][2]string{{"key", "value"}}
	for _, k := range keys {
		v := obj[k]
		var s string
		switch v := v.(type) {
		case string:
			s = v
		default:
			b, _ := json.Marshal(v)
			s = string(b)
		}
		rows = append(rows, [2]string{k, s})
	}
	w := [2]int{}
	for _, r := range rows {
		for i := range r {
			w[i] = max(w[i], utf8.RuneCountInString(r[i]))
		}
	}
	var b bytes.Buffer
	line := func(l, m, r, fill string) {
		fmt.Fprintf(&b, "%s%s%s%s%s\n", l, strings.Repeat(fill, w[0]+2), m, strings.Repeat(fill, w[1]+2), r)
	}
	row := func(r [2]string) {
		fmt.Fprintf(&b, "│ %s%s │ %s%s │\n", r[0], strings.Repeat(" ", w[0]-utf8.RuneCountInString(r[0])), r[1], strings.Repeat(" ", w[1]-utf8.RuneCountInString(r[1])))
	}
	line("┌", "┬", "┐", "─")
	row(rows[0])
	line("╞", "╪", "╡", "═")
	for i, r := range rows[1:] {
		if i > 0 {
			line("├", "┼", "┤", "─")
		}
		row(r)
	}
	line("└", "┴", "┘", "─")
	return b.String()
}

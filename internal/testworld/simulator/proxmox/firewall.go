package proxmoxsim

import (
	"crypto/sha1" //nolint:gosec // Proxmox's config digest is SHA-1; not a security use
	"encoding/hex"
	"fmt"
	"net/http"
	"regexp"
	"strconv"
	"strings"

	"github.com/hyperfleet/hyperfleet/internal/testworld/simulator/pvefw"
)

// The firewall API (pve-firewall's src/PVE/API2/Firewall/{Cluster,Groups,
// Rules,VM,IPSet}.pm): the datacenter options, security groups and their
// rules, and each VM's options, rules and IPSets, stored as the .fw files
// hold them. firewall_enforce.go turns them into a ruleset for real guests.

// fwState is cluster.fw and every <vmid>.fw.
type fwState struct {
	// options are cluster.fw's [OPTIONS], values as stored.
	options map[string]string
	groups  map[string]*fwGroup
	vms     map[int]*fwVM
}

type fwGroup struct {
	comment string
	rules   []fwRule
}

// fwRule is a rule's properties as stored (type, action, enable, ...).
type fwRule map[string]string

type fwIPSet struct {
	comment string
	entries []fwEntry
}

type fwEntry struct {
	cidr, comment string
	nomatch       bool
}

type fwVM struct {
	options map[string]string
	rules   []fwRule
	ipsets  map[string]*fwIPSet
}

func (s *Simulator) fwLocked() *fwState {
	if s.fw == nil {
		s.fw = &fwState{options: map[string]string{}, groups: map[string]*fwGroup{}, vms: map[int]*fwVM{}}
	}
	return s.fw
}

// fwVMLocked is a VM's firewall config; load_vmfw_conf reads an absent file
// as empty, so it is made on first use (no check that the VM exists).
func (s *Simulator) fwVMLocked(vmid int) *fwVM {
	st := s.fwLocked()
	if st.vms[vmid] == nil {
		st.vms[vmid] = &fwVM{options: map[string]string{}, ipsets: map[string]*fwIPSet{}}
	}
	return st.vms[vmid]
}

// cloneFirewallLocked is clone_vmfw_conf: the new VM gets a copy of the
// source's firewall config (or none).
func (s *Simulator) cloneFirewallLocked(src, dst int) {
	st := s.fwLocked()
	delete(st.vms, dst)
	from := st.vms[src]
	if from == nil {
		return
	}
	to := &fwVM{options: map[string]string{}, ipsets: map[string]*fwIPSet{}}
	for k, v := range from.options {
		to.options[k] = v
	}
	for _, r := range from.rules {
		to.rules = append(to.rules, r.clone())
	}
	for n, set := range from.ipsets {
		to.ipsets[n] = &fwIPSet{comment: set.comment, entries: append([]fwEntry(nil), set.entries...)}
	}
	st.vms[dst] = to
}

// forgetFirewallLocked is remove_vmfw_conf (destroy, a failed clone).
func (s *Simulator) forgetFirewallLocked(vmid int) {
	if s.fw != nil {
		delete(s.fw.vms, vmid)
	}
}

func (r fwRule) clone() fwRule {
	c := fwRule{}
	for k, v := range r {
		c[k] = v
	}
	return c
}

// digestOf is copy_opject_with_digest's and copy_list_with_digest's SHA-1
// over "key:value\n" of each item's sorted keys.
func digestOf(items []map[string]any) string {
	h := sha1.New() //nolint:gosec // see import
	for _, it := range items {
		for _, k := range sortedKeys(it) {
			fmt.Fprintf(h, "%s:%v\n", k, it[k])
		}
	}
	return hex.EncodeToString(h.Sum(nil))
}

// listWithDigest gives every item the digest of the whole list.
func listWithDigest(items []map[string]any) ([]map[string]any, string) {
	d := digestOf(items)
	for _, it := range items {
		it["digest"] = d
	}
	return items, d
}

// assertDigest is PVE::Tools::assert_if_modified.
func assertDigest(q *apiRequest, current string) error {
	if d := q.str("digest"); d != "" && d != current {
		return serverError("detected modified configuration - file changed by other user? Try again.")
	}
	return nil
}

// Option kinds of the option endpoints: booleans and integers answer as
// numbers.
var (
	fwClusterOptions = map[string]paramKind{"enable": kInt, "ebtables": kBool, "policy_in": kString, "policy_out": kString,
		"policy_forward": kString, "log_ratelimit": kString}
	fwVMOptions = map[string]paramKind{"enable": kBool, "macfilter": kBool, "dhcp": kBool, "ndp": kBool, "radv": kBool,
		"ipfilter": kBool, "policy_in": kString, "policy_out": kString, "log_level_in": kString, "log_level_out": kString}
)

func optionsAnswer(opts map[string]string, kinds map[string]paramKind) (map[string]any, string) {
	out := map[string]any{}
	for k, v := range opts {
		if kinds[k] == kString {
			out[k] = v
		} else {
			n, _ := strconv.Atoi(v)
			out[k] = n
		}
	}
	d := digestOf([]map[string]any{out})
	out["digest"] = d
	return out, d
}

// setOptions applies a PUT of options: digest, delete, then the values.
func setOptions(q *apiRequest, opts map[string]string, kinds map[string]paramKind, cluster bool, now int64) error {
	_, d := optionsAnswer(opts, kinds)
	if err := assertDigest(q, d); err != nil {
		return err
	}
	if del := q.str("delete"); del != "" {
		for _, k := range splitList(del) {
			if _, ok := kinds[k]; !ok {
				return paramError(map[string]string{"delete": fmt.Sprintf("no such option '%s'", k)})
			}
			delete(opts, k)
		}
	}
	for k := range kinds {
		if !q.has(k) {
			continue
		}
		v := q.str(k)
		if cluster && k == "enable" {
			// An enable above 1 is a timestamp: Cluster.pm stores time().
			if n, _ := strconv.Atoi(v); n > 1 {
				v = strconv.FormatInt(now, 10)
			}
		}
		opts[k] = v
	}
	return nil
}

var (
	fwLogLevels   = []string{"emerg", "alert", "crit", "err", "warning", "notice", "info", "debug", "nolog"}
	fwPolicies    = []string{"ACCEPT", "REJECT", "DROP"}
	fwGroupP      = param{name: "group", kind: kString, pattern: pvefw.GroupNameRE, maxLen: pvefw.MaxGroupName, format: minLen2}
	fwIPSetNameP  = param{name: "name", kind: kString, pattern: pvefw.IPSetNameRE, maxLen: pvefw.MaxIPSetName, format: minLen2}
	fwPosP        = param{name: "pos", kind: kInt, min: intPtr(0)}
	fwDigestP     = param{name: "digest", kind: kString, optional: true, maxLen: 64}
	fwDeleteP     = param{name: "delete", kind: kString, optional: true}
	fwCommentP    = param{name: "comment", kind: kString, optional: true}
	fwIfaceRE     = regexp.MustCompile(`^[a-zA-Z][a-zA-Z0-9_]{1,20}([:\.]\d+)?$`)
	fwRuleActionP = param{name: "action", kind: kString, pattern: pvefw.GroupNameRE, maxLen: 20, format: minLen2}
)

func minLen2(v string) error {
	if len(v) < 2 {
		return fmtErr("value must be at least 2 characters long")
	}
	return nil
}

// fwRuleParams are add_rule_properties' rule properties.
func fwRuleParams(create bool) []param {
	typ := param{name: "type", kind: kString, enum: []string{"in", "out", "forward", "group"}, optional: !create}
	act := fwRuleActionP
	act.optional = !create
	return []param{typ, act,
		{name: "pos", kind: kInt, min: intPtr(0), optional: true},
		fwDigestP, fwCommentP,
		{name: "macro", kind: kString, optional: true, maxLen: 128},
		{name: "iface", kind: kString, optional: true, maxLen: 20, pattern: fwIfaceRE},
		{name: "source", kind: kString, optional: true, maxLen: 512, format: fwAddrFormat},
		{name: "dest", kind: kString, optional: true, maxLen: 512, format: fwAddrFormat},
		{name: "proto", kind: kString, optional: true, format: fwProtoFormat},
		{name: "enable", kind: kInt, optional: true, min: intPtr(0)},
		{name: "log", kind: kString, optional: true, enum: fwLogLevels},
		{name: "sport", kind: kString, optional: true, format: fwPortFormat},
		{name: "dport", kind: kString, optional: true, format: fwDportFormat},
		{name: "icmp-type", kind: kString, optional: true},
	}
}

func fwAddrFormat(v string) error {
	if _, _, err := pvefw.ParseAddressList(v); err != nil {
		return fmtErr("%v", err)
	}
	return nil
}

func fwProtoFormat(v string) error {
	if _, err := pvefw.ProtoNumber(v); err != nil {
		return fmtErr("%v", err)
	}
	return nil
}

func fwPortFormat(v string) error {
	if _, err := pvefw.ParsePorts(v); err != nil {
		return fmtErr("%v", err)
	}
	return nil
}

// fwDportFormat also takes ICMP type names (dport doubles as the ICMP
// type); verify_rule checks them against the protocol.
func fwDportFormat(v string) error {
	if regexp.MustCompile(`^[a-z][a-z\-]+$`).MatchString(v) {
		return nil
	}
	return fwPortFormat(v)
}

// fwRuleKeys are the properties a rule stores (copy_rule_data).
var fwRuleKeys = []string{"type", "action", "enable", "macro", "iface", "source", "dest", "proto", "log", "sport", "dport", "comment", "icmp-type"}

// copyRuleData is copy_rule_data: a value of "" or "-" deletes.
func copyRuleData(r fwRule, q *apiRequest) {
	for _, k := range fwRuleKeys {
		if !q.has(k) {
			continue
		}
		if v := q.str(k); v == "" || v == "-" {
			delete(r, k)
		} else {
			r[k] = v
		}
	}
}

func (r fwRule) model() pvefw.Rule {
	return pvefw.Rule{Type: r["type"], Action: r["action"], Enable: r["enable"] != "" && r["enable"] != "0",
		Source: r["source"], Dest: r["dest"], Proto: r["proto"], DPort: r["dport"], SPort: r["sport"],
		ICMPType: r["icmp-type"], Iface: r["iface"], Comment: r["comment"]}
}

// verifyRule is verify_rule for env "vm" or "group": sets are looked up in
// the VM's IPSets (vm non-nil) and the cluster's. The simulator has no
// macros and no aliases, and says so.
func (s *Simulator) verifyRule(r fwRule, env string, vm *fwVM) error {
	errs := pvefw.VerifyRule(r.model(), env)
	if r["macro"] != "" {
		errs["macro"] = fmt.Sprintf("macros are not supported by the simulator ('%s')", r["macro"])
	}
	for _, k := range []string{"source", "dest"} {
		v := r[k]
		if !strings.HasPrefix(v, "+") || errs[k] != "" {
			continue
		}
		items, _, err := pvefw.ParseAddressList(v)
		if err != nil {
			continue
		}
		name := items[0].Set
		if vm == nil || vm.ipsets[name] == nil {
			if _, ok := s.clusterIPSetsLocked()[name]; !ok {
				errs[k] = fmt.Sprintf("no such ipset '%s'", name)
			}
		}
	}
	if len(errs) > 0 {
		return paramError(errs)
	}
	return nil
}

// clusterIPSetsLocked are the datacenter's IPSets (none through the API
// yet: the model has them for the compiler).
func (s *Simulator) clusterIPSetsLocked() map[string]*fwIPSet { return nil }

// rulesAnswer is get_rules: each rule's properties, with pos, the list's
// digest and the IP version verify_rule derived.
func rulesAnswer(rules []fwRule) ([]map[string]any, string) {
	items := make([]map[string]any, len(rules))
	for i, r := range rules {
		it := map[string]any{}
		for k, v := range r {
			if k == "enable" {
				n, _ := strconv.Atoi(v)
				it[k] = n
				continue
			}
			it[k] = v
		}
		if v := ruleIPVersion(r); v != 0 {
			it["ipversion"] = v
		}
		items[i] = it
	}
	items, d := listWithDigest(items)
	for i := range items {
		items[i]["pos"] = i
	}
	return items, d
}

func ruleIPVersion(r fwRule) int {
	ver := 0
	for _, k := range []string{"source", "dest"} {
		if r[k] == "" {
			continue
		}
		if _, v, err := pvefw.ParseAddressList(r[k]); err == nil && v != 0 {
			ver = v
		}
	}
	switch r["proto"] {
	case "icmp":
		ver = 4
	case "icmpv6", "ipv6-icmp":
		ver = 6
	}
	return ver
}

// ruleList is where a rules endpoint's rules live: a group's or a VM's.
type ruleList struct {
	env   string
	rules *[]fwRule
	vm    *fwVM
}

func (s *Simulator) groupRulesLocked(q *apiRequest) (*ruleList, error) {
	g := s.fwLocked().groups[q.str("group")]
	if g == nil {
		return nil, serverError("no such security group '%s'", q.str("group"))
	}
	return &ruleList{env: "group", rules: &g.rules}, nil
}

func (s *Simulator) vmRulesLocked(q *apiRequest) (*ruleList, error) {
	v := s.fwVMLocked(int(q.integer("vmid", 0)))
	return &ruleList{env: "vm", rules: &v.rules, vm: v}, nil
}

type ruleSource func(*Simulator, *apiRequest) (*ruleList, error)

func (src ruleSource) list(s *Simulator, q *apiRequest) (any, error) {
	l, err := src(s, q)
	if err != nil {
		return nil, err
	}
	items, _ := rulesAnswer(*l.rules)
	return items, nil
}

func (src ruleSource) get(s *Simulator, q *apiRequest) (any, error) {
	l, err := src(s, q)
	if err != nil {
		return nil, err
	}
	items, _ := rulesAnswer(*l.rules)
	pos := int(q.integer("pos", 0))
	if pos >= len(items) {
		return nil, serverError("no rule at position %d", pos)
	}
	return items[pos], nil
}

// create is create_rule: the new rule goes first, disabled unless enable
// was sent.
func (src ruleSource) create(s *Simulator, q *apiRequest) (any, error) {
	l, err := src(s, q)
	if err != nil {
		return nil, err
	}
	r := fwRule{}
	copyRuleData(r, q)
	if err := s.verifyRule(r, l.env, l.vm); err != nil {
		return nil, err
	}
	if !q.has("enable") {
		r["enable"] = "0"
	}
	*l.rules = append([]fwRule{r}, *l.rules...)
	s.firewallChangedLocked()
	return nil, nil
}

// at is the rule at pos for a change: the list's digest checked first.
func (src ruleSource) at(s *Simulator, q *apiRequest) (*ruleList, int, error) {
	l, err := src(s, q)
	if err != nil {
		return nil, 0, err
	}
	_, d := rulesAnswer(*l.rules)
	if err := assertDigest(q, d); err != nil {
		return nil, 0, err
	}
	pos := int(q.integer("pos", 0))
	if pos >= len(*l.rules) {
		return nil, 0, serverError("no rule at position %d", pos)
	}
	return l, pos, nil
}

// update is update_rule: moveto moves (other arguments ignored), else the
// properties are set and deleted and the rule verified again.
func (src ruleSource) update(s *Simulator, q *apiRequest) (any, error) {
	l, pos, err := src.at(s, q)
	if err != nil {
		return nil, err
	}
	rules := *l.rules
	if q.has("moveto") {
		if to := int(q.integer("moveto", 0)); to != pos {
			moved := rules[pos]
			var out []fwRule
			for i, r := range rules {
				if i == pos {
					continue
				}
				if i == to {
					out = append(out, moved)
				}
				out = append(out, r)
			}
			if to >= len(rules) {
				out = append(out, moved)
			}
			*l.rules = out
			s.firewallChangedLocked()
			return nil, nil
		}
	}
	r := rules[pos].clone()
	copyRuleData(r, q)
	for _, k := range splitList(q.str("delete")) {
		known := k == "pos" || k == "digest"
		for _, rk := range fwRuleKeys {
			known = known || rk == k
		}
		if !known {
			return nil, paramError(map[string]string{"delete": fmt.Sprintf("no such property ('%s')", k)})
		}
		if k == "type" || k == "action" {
			return nil, paramError(map[string]string{"delete": fmt.Sprintf("unable to delete required property '%s'", k)})
		}
		delete(r, k)
	}
	if err := s.verifyRule(r, l.env, l.vm); err != nil {
		return nil, err
	}
	rules[pos] = r
	s.firewallChangedLocked()
	return nil, nil
}

func (src ruleSource) remove(s *Simulator, q *apiRequest) (any, error) {
	l, pos, err := src.at(s, q)
	if err != nil {
		return nil, err
	}
	*l.rules = append((*l.rules)[:pos:pos], (*l.rules)[pos+1:]...)
	s.firewallChangedLocked()
	return nil, nil
}

func (s *Simulator) handleFWClusterOptionsGet(q *apiRequest) (any, error) {
	out, _ := optionsAnswer(s.fwLocked().options, fwClusterOptions)
	return out, nil
}

func (s *Simulator) handleFWClusterOptionsSet(q *apiRequest) (any, error) {
	if err := setOptions(q, s.fwLocked().options, fwClusterOptions, true, s.clock.Now().Unix()); err != nil {
		return nil, err
	}
	s.firewallChangedLocked()
	return nil, nil
}

func (s *Simulator) handleFWVMOptionsGet(q *apiRequest) (any, error) {
	out, _ := optionsAnswer(s.fwVMLocked(int(q.integer("vmid", 0))).options, fwVMOptions)
	return out, nil
}

func (s *Simulator) handleFWVMOptionsSet(q *apiRequest) (any, error) {
	if err := setOptions(q, s.fwVMLocked(int(q.integer("vmid", 0))).options, fwVMOptions, false, 0); err != nil {
		return nil, err
	}
	s.firewallChangedLocked()
	return nil, nil
}

// namedList is a list of named objects (groups, IPSets) by name, each with
// its comment if any, and the list's digest.
func namedList[T any](m map[string]T, key string, comment func(T) string) ([]map[string]any, string) {
	names := sortedKeys(m)
	items := make([]map[string]any, len(names))
	for i, n := range names {
		items[i] = map[string]any{key: n}
		if c := comment(m[n]); c != "" {
			items[i]["comment"] = c
		}
	}
	return listWithDigest(items)
}

func groupList(st *fwState) ([]map[string]any, string) {
	return namedList(st.groups, "group", func(g *fwGroup) string { return g.comment })
}

func (s *Simulator) handleFWGroups(q *apiRequest) (any, error) {
	items, _ := groupList(s.fwLocked())
	return items, nil
}

// handleFWGroupCreate is create_security_group, with rename: the group is
// copied to the new name, every VM rule naming the old one follows, and
// the old one goes.
func (s *Simulator) handleFWGroupCreate(q *apiRequest) (any, error) {
	st := s.fwLocked()
	name := q.str("group")
	if rename := q.str("rename"); rename != "" {
		_, d := groupList(st)
		if err := assertDigest(q, d); err != nil {
			return nil, err
		}
		old := st.groups[rename]
		if old == nil {
			return nil, paramError(map[string]string{"group": fmt.Sprintf("Security group '%s' does not exist", rename)})
		}
		if st.groups[name] != nil && name != rename {
			return nil, paramError(map[string]string{"group": fmt.Sprintf("Security group '%s' does already exist", name)})
		}
		if q.has("comment") {
			old.comment = q.str("comment")
		}
		if name != rename {
			st.groups[name] = old
			delete(st.groups, rename)
			for _, v := range st.vms {
				for _, r := range v.rules {
					if r["type"] == pvefw.TypeGroup && r["action"] == rename {
						r["action"] = name
					}
				}
			}
		}
		s.firewallChangedLocked()
		return nil, nil
	}
	if st.groups[name] != nil {
		return nil, paramError(map[string]string{"group": fmt.Sprintf("Security group '%s' already exists", name)})
	}
	st.groups[name] = &fwGroup{comment: q.str("comment")}
	return nil, nil
}

// handleFWGroupDelete is delete_security_group: only an empty group goes
// (whether a VM still names it is not checked, as on Proxmox).
func (s *Simulator) handleFWGroupDelete(q *apiRequest) (any, error) {
	st := s.fwLocked()
	g := st.groups[q.str("group")]
	if g == nil {
		return nil, serverError("no such security group '%s'", q.str("group"))
	}
	if len(g.rules) > 0 {
		return nil, serverError("Security group '%s' is not empty", q.str("group"))
	}
	delete(st.groups, q.str("group"))
	s.firewallChangedLocked()
	return nil, nil
}

func ipsetList(v *fwVM) ([]map[string]any, string) {
	return namedList(v.ipsets, "name", func(set *fwIPSet) string { return set.comment })
}

func entryList(set *fwIPSet) ([]map[string]any, string) {
	items := make([]map[string]any, len(set.entries))
	for i, e := range set.entries {
		items[i] = map[string]any{"cidr": e.cidr}
		if e.nomatch {
			items[i]["nomatch"] = 1
		}
		if e.comment != "" {
			items[i]["comment"] = e.comment
		}
	}
	return listWithDigest(items)
}

func (s *Simulator) handleFWIPSets(q *apiRequest) (any, error) {
	items, _ := ipsetList(s.fwVMLocked(int(q.integer("vmid", 0))))
	return items, nil
}

// handleFWIPSetCreate is create_ipset, with rename.
func (s *Simulator) handleFWIPSetCreate(q *apiRequest) (any, error) {
	v := s.fwVMLocked(int(q.integer("vmid", 0)))
	name := q.str("name")
	if rename := q.str("rename"); rename != "" {
		_, d := ipsetList(v)
		if err := assertDigest(q, d); err != nil {
			return nil, err
		}
		old := v.ipsets[rename]
		if old == nil {
			return nil, paramError(map[string]string{"name": fmt.Sprintf("IPSet '%s' does not exist", rename)})
		}
		if v.ipsets[name] != nil && name != rename {
			return nil, paramError(map[string]string{"name": fmt.Sprintf("IPSet '%s' does already exist", name)})
		}
		delete(v.ipsets, rename)
		v.ipsets[name] = old
		if q.has("comment") {
			old.comment = q.str("comment")
		}
		s.firewallChangedLocked()
		return nil, nil
	}
	if v.ipsets[name] != nil {
		return nil, paramError(map[string]string{"name": fmt.Sprintf("IPSet '%s' already exists", name)})
	}
	v.ipsets[name] = &fwIPSet{comment: q.str("comment")}
	s.firewallChangedLocked()
	return nil, nil
}

func (s *Simulator) ipsetLocked(q *apiRequest) (*fwVM, *fwIPSet, error) {
	v := s.fwVMLocked(int(q.integer("vmid", 0)))
	set := v.ipsets[q.str("name")]
	if set == nil {
		return nil, nil, serverError("no such IPSet '%s'", q.str("name"))
	}
	return v, set, nil
}

func (s *Simulator) handleFWIPSetGet(q *apiRequest) (any, error) {
	_, set, err := s.ipsetLocked(q)
	if err != nil {
		return nil, err
	}
	items, _ := entryList(set)
	return items, nil
}

// handleFWIPSetDelete is delete_ipset: a set with members goes only with
// force.
func (s *Simulator) handleFWIPSetDelete(q *apiRequest) (any, error) {
	v, set, err := s.ipsetLocked(q)
	if err != nil {
		return nil, err
	}
	if len(set.entries) > 0 && !q.boolean("force", false) {
		return nil, serverError("IPSet '%s' is not empty", q.str("name"))
	}
	delete(v.ipsets, q.str("name"))
	s.firewallChangedLocked()
	return nil, nil
}

// handleFWIPAdd is create_ip: the entry, normalised (clean_cidr,
// parse_ip_or_cidr), goes first.
func (s *Simulator) handleFWIPAdd(q *apiRequest) (any, error) {
	_, set, err := s.ipsetLocked(q)
	if err != nil {
		return nil, err
	}
	cidr, err := pvefw.CanonicalCIDR(q.str("cidr"))
	if err != nil {
		return nil, paramError(map[string]string{"cidr": "aliases are not supported by the simulator"})
	}
	for _, e := range set.entries {
		if e.cidr == cidr {
			return nil, paramError(map[string]string{"cidr": fmt.Sprintf("address '%s' already exists", cidr)})
		}
	}
	if strings.HasSuffix(cidr, "/0") {
		return nil, paramError(map[string]string{"cidr": "a zero prefix is not allowed in ipset entries"})
	}
	set.entries = append([]fwEntry{{cidr: cidr, nomatch: q.boolean("nomatch", false), comment: q.str("comment")}}, set.entries...)
	s.firewallChangedLocked()
	return nil, nil
}

func (s *Simulator) handleFWIPGet(q *apiRequest) (any, error) {
	_, set, err := s.ipsetLocked(q)
	if err != nil {
		return nil, err
	}
	items, _ := entryList(set)
	for i, e := range set.entries {
		if e.cidr == q.str("cidr") {
			return items[i], nil
		}
	}
	return nil, paramError(map[string]string{"cidr": "no such IP/Network"})
}

// ipsetForChangeLocked is the IPSet an entry change is for, its digest
// checked.
func (s *Simulator) ipsetForChangeLocked(q *apiRequest) (*fwIPSet, error) {
	_, set, err := s.ipsetLocked(q)
	if err != nil {
		return nil, err
	}
	_, d := entryList(set)
	if err := assertDigest(q, d); err != nil {
		return nil, err
	}
	return set, nil
}

// handleFWIPUpdate is update_ip: nomatch and comment are set to what was
// sent (unset when not sent).
func (s *Simulator) handleFWIPUpdate(q *apiRequest) (any, error) {
	set, err := s.ipsetForChangeLocked(q)
	if err != nil {
		return nil, err
	}
	for i, e := range set.entries {
		if e.cidr == q.str("cidr") {
			set.entries[i].nomatch = q.boolean("nomatch", false)
			set.entries[i].comment = q.str("comment")
			s.firewallChangedLocked()
			return nil, nil
		}
	}
	return nil, paramError(map[string]string{"cidr": "no such IP/Network"})
}

func (s *Simulator) handleFWIPRemove(q *apiRequest) (any, error) {
	set, err := s.ipsetForChangeLocked(q)
	if err != nil {
		return nil, err
	}
	var keep []fwEntry
	for _, e := range set.entries {
		if e.cidr != q.str("cidr") {
			keep = append(keep, e)
		}
	}
	set.entries = keep
	s.firewallChangedLocked()
	return nil, nil
}

// firewallRoutes are the firewall endpoints.
func firewallRoutes() []*route {
	opt := func(kinds map[string]paramKind, extra ...param) *schema {
		ps := append([]param{fwDigestP, fwDeleteP}, extra...)
		for k, kind := range kinds {
			p := param{name: k, kind: kind, optional: true}
			switch k {
			case "enable":
				if kind == kInt {
					p.min = intPtr(0)
				}
			case "policy_in", "policy_out":
				p.enum = fwPolicies
			case "policy_forward":
				p.enum = []string{"ACCEPT", "DROP"}
			case "log_level_in", "log_level_out":
				p.enum = fwLogLevels
			}
			ps = append(ps, p)
		}
		return sch(ps...)
	}
	group := ruleSource((*Simulator).groupRulesLocked)
	vmr := ruleSource((*Simulator).vmRulesLocked)
	const vmfw = "/nodes/{node}/qemu/{vmid}/firewall"
	cidrP := param{name: "cidr", kind: kString}
	moveto := param{name: "moveto", kind: kInt, optional: true, min: intPtr(0)}
	return []*route{
		newRoute(http.MethodGet, "/cluster/firewall/options", classOther, sch(), (*Simulator).handleFWClusterOptionsGet),
		newRoute(http.MethodPut, "/cluster/firewall/options", classOther, opt(fwClusterOptions), (*Simulator).handleFWClusterOptionsSet),
		newRoute(http.MethodGet, "/cluster/firewall/groups", classOther, sch(), (*Simulator).handleFWGroups),
		newRoute(http.MethodPost, "/cluster/firewall/groups", classOther, sch(fwGroupP, fwCommentP, fwDigestP,
			param{name: "rename", kind: kString, optional: true, pattern: pvefw.GroupNameRE, maxLen: pvefw.MaxGroupName, format: minLen2}),
			(*Simulator).handleFWGroupCreate),
		newRoute(http.MethodGet, "/cluster/firewall/groups/{group}", classOther, sch(fwGroupP), group.list),
		newRoute(http.MethodPost, "/cluster/firewall/groups/{group}", classOther, sch(append(fwRuleParams(true), fwGroupP)...), group.create),
		newRoute(http.MethodDelete, "/cluster/firewall/groups/{group}", classOther, sch(fwGroupP), (*Simulator).handleFWGroupDelete),
		newRoute(http.MethodGet, "/cluster/firewall/groups/{group}/{pos}", classOther, sch(fwGroupP, fwPosP), group.get),
		newRoute(http.MethodPut, "/cluster/firewall/groups/{group}/{pos}", classOther, sch(append(fwRuleParams(false), fwGroupP, fwPosP, fwDeleteP, moveto)...), group.update),
		newRoute(http.MethodDelete, "/cluster/firewall/groups/{group}/{pos}", classOther, sch(fwGroupP, fwPosP, fwDigestP), group.remove),
		newRoute(http.MethodGet, vmfw+"/options", classConfig, sch(nodeP, vmidP), (*Simulator).handleFWVMOptionsGet),
		newRoute(http.MethodPut, vmfw+"/options", classConfig, opt(fwVMOptions, nodeP, vmidP), (*Simulator).handleFWVMOptionsSet),
		newRoute(http.MethodGet, vmfw+"/rules", classConfig, sch(nodeP, vmidP), vmr.list),
		newRoute(http.MethodPost, vmfw+"/rules", classConfig, sch(append(fwRuleParams(true), nodeP, vmidP)...), vmr.create),
		newRoute(http.MethodGet, vmfw+"/rules/{pos}", classConfig, sch(nodeP, vmidP, fwPosP), vmr.get),
		newRoute(http.MethodPut, vmfw+"/rules/{pos}", classConfig, sch(append(fwRuleParams(false), nodeP, vmidP, fwPosP, fwDeleteP, moveto)...), vmr.update),
		newRoute(http.MethodDelete, vmfw+"/rules/{pos}", classConfig, sch(nodeP, vmidP, fwPosP, fwDigestP), vmr.remove),
		newRoute(http.MethodGet, vmfw+"/ipset", classConfig, sch(nodeP, vmidP), (*Simulator).handleFWIPSets),
		newRoute(http.MethodPost, vmfw+"/ipset", classConfig, sch(nodeP, vmidP, fwIPSetNameP, fwCommentP, fwDigestP,
			param{name: "rename", kind: kString, optional: true, pattern: pvefw.IPSetNameRE, maxLen: pvefw.MaxIPSetName, format: minLen2}),
			(*Simulator).handleFWIPSetCreate),
		newRoute(http.MethodGet, vmfw+"/ipset/{name}", classConfig, sch(nodeP, vmidP, fwIPSetNameP), (*Simulator).handleFWIPSetGet),
		newRoute(http.MethodPost, vmfw+"/ipset/{name}", classConfig, sch(nodeP, vmidP, fwIPSetNameP, cidrP, fwCommentP,
			param{name: "nomatch", kind: kBool, optional: true}), (*Simulator).handleFWIPAdd),
		newRoute(http.MethodDelete, vmfw+"/ipset/{name}", classConfig, sch(nodeP, vmidP, fwIPSetNameP,
			param{name: "force", kind: kBool, optional: true}), (*Simulator).handleFWIPSetDelete),
		// {cidr...}: a network's slash arrives decoded.
		newRoute(http.MethodGet, vmfw+"/ipset/{name}/{cidr...}", classConfig, sch(nodeP, vmidP, fwIPSetNameP, cidrP), (*Simulator).handleFWIPGet),
		newRoute(http.MethodPut, vmfw+"/ipset/{name}/{cidr...}", classConfig, sch(nodeP, vmidP, fwIPSetNameP, cidrP, fwCommentP, fwDigestP,
			param{name: "nomatch", kind: kBool, optional: true}), (*Simulator).handleFWIPUpdate),
		newRoute(http.MethodDelete, vmfw+"/ipset/{name}/{cidr...}", classConfig, sch(nodeP, vmidP, fwIPSetNameP, cidrP, fwDigestP), (*Simulator).handleFWIPRemove),
	}
}

package proxmox

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/http"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"

	proxmox "github.com/luthermonson/go-proxmox"

	"github.com/hyperfleet/hyperfleet/pkg/provider"
)

// A VM with spec.Isolation is held to it by Proxmox VE's firewall
// (pve-firewall), configured through its API (pve-firewall's
// src/PVE/API2/Firewall: Groups.pm, Rules.pm, VM.pm, IPSet.pm):
//
//   - the policy's rules are a cluster-level security group, named from
//     the install and the rules' digest (groupName), so that VMs of one
//     policy share it and an edited policy gets a new group that no placed
//     VM sees. It is built under a staging name and renamed when complete
//     (Proxmox's rename copies the rules in one locked write): a group of
//     the final name is always whole.
//   - the VM's firewall options: enabled, both default policies DROP,
//     ipfilter and macfilter on (anti-spoofing: the VM may send only from
//     its NIC's MAC and the addresses of its ipfilter-net0 IPSet), DHCP
//     when the VM leases its address, NDP on, router advertisements off;
//   - the VM's rules: exactly one, the reference to the group (rules and
//     IPSet entries a clone copied from its template are removed);
//   - ipfilter-net0: the VM's static addresses at configure, a leased one
//     once the guest reports it inside the cluster's VM subnets;
//   - firewall=1 on net0, without which Proxmox filters nothing of the NIC.
//
// Proxmox applies none of it while the datacenter firewall is off
// (cluster.fw's enable): Probe reports that in ClusterInfo.IsolationProblem.
// A VM's firewall configuration goes with the VM when it is destroyed.

// ipfilterSet is the IPSet pve-firewall's ipfilter reads for net0.
const ipfilterSet = "ipfilter-net0"

// maxPortNumbers is how many ports one pve-firewall rule's dport may
// list, a range counting as two (iptables' multiport limit, enforced by
// Firewall.pm's parse_port_name_number_or_range).
const maxPortNumbers = 15

// groupName is the security group of isolation rules with digest on this
// install: "hf", six hex characters of the install's id, ten of the
// digest (18 characters, Proxmox's limit for group names). staging is
// the name it is built under.
func (p *Provider) groupName(digest string) (final, staging string) {
	sum := sha256.Sum256([]byte(p.signer.OperatorID()))
	id := hex.EncodeToString(sum[:3])
	return "hf" + id + digest[:10], "hs" + id + digest[:10]
}

// ownGroupDigest returns the digest part of group when it is named by
// this install's scheme (final or staging), for the sweep.
func (p *Provider) ownGroupDigest(group string) (string, bool) {
	final, staging := p.groupName(strings.Repeat("0", 10))
	if len(group) != len(final) || (!strings.HasPrefix(group, final[:8]) && !strings.HasPrefix(group, staging[:8])) {
		return "", false
	}
	return group[8:], true
}

// ListIsolationObjects implements provider.IsolationObjects: the security
// groups named by this install's scheme.
func (p *Provider) ListIsolationObjects(ctx context.Context) ([]provider.IsolationObject, error) {
	var groups []*proxmox.FirewallSecurityGroup
	if err := p.api.call(ctx, http.MethodGet, "/cluster/firewall/groups", nil, nil, &groups); err != nil {
		return nil, fmt.Errorf("list the firewall security groups: %w", err)
	}
	var out []provider.IsolationObject
	for _, g := range groups {
		if g == nil {
			continue
		}
		if d, ok := p.ownGroupDigest(g.Group); ok {
			out = append(out, provider.IsolationObject{ID: g.Group, Digest: d})
		}
	}
	return out, nil
}

// DeleteIsolationObject implements provider.IsolationObjects. Proxmox does
// not say which VMs reference a group (its API checks none on delete): the
// sweeper's claims decide, and a VM of a deleted group (one disowned, say)
// is left with its default policies, DROP both ways.
func (p *Provider) DeleteIsolationObject(ctx context.Context, o provider.IsolationObject) error {
	if _, ok := p.ownGroupDigest(o.ID); !ok {
		return fmt.Errorf("firewall security group %s is not named by this install: %w", o.ID, provider.ErrNotOwned)
	}
	p.groups.mu.Lock()
	defer p.groups.mu.Unlock()
	delete(p.groups.done, o.ID)
	err := p.deleteGroup(ctx, o.ID)
	if isNotFound(err) {
		return nil
	}
	return err
}

var _ provider.IsolationObjects = (*Provider)(nil)

// firewallGroups remembers the groups this process found or built whole.
type firewallGroups struct {
	mu   sync.Mutex
	done map[string]bool
}

// ensureGroup makes sure the security group of iso's rules exists, whole.
func (p *Provider) ensureGroup(ctx context.Context, iso *provider.Isolation) (string, error) {
	final, staging := p.groupName(iso.RulesDigest())
	p.groups.mu.Lock()
	defer p.groups.mu.Unlock()
	if p.groups.done[final] {
		return final, nil
	}
	var groups []*proxmox.FirewallSecurityGroup
	if err := p.api.call(ctx, http.MethodGet, "/cluster/firewall/groups", nil, nil, &groups); err != nil {
		return "", fmt.Errorf("list the firewall security groups: %w", err)
	}
	has := func(name string) bool {
		return slices.ContainsFunc(groups, func(g *proxmox.FirewallSecurityGroup) bool { return g != nil && g.Group == name })
	}
	if !has(final) {
		if has(staging) {
			// Left by a build this process did not finish: start over.
			if err := p.deleteGroup(ctx, staging); err != nil {
				return "", err
			}
		}
		if err := p.buildGroup(ctx, iso, final, staging); err != nil {
			return "", err
		}
	}
	if p.groups.done == nil {
		p.groups.done = map[string]bool{}
	}
	p.groups.done[final] = true
	return final, nil
}

// buildGroup writes iso's rules into a new group named staging and renames
// it to final.
func (p *Provider) buildGroup(ctx context.Context, iso *provider.Isolation, final, staging string) error {
	comment := fmt.Sprintf("HyperFleet install %s: isolation policy %s (rules %s)", p.signer.OperatorID(), iso.Policy, iso.RulesDigest())
	if err := p.api.call(ctx, http.MethodPost, "/cluster/firewall/groups", nil, map[string]any{"group": staging, "comment": comment}, nil); err != nil {
		return fmt.Errorf("create firewall security group %s: %w", staging, err)
	}
	rules := groupRules(iso)
	// Proxmox puts a new rule first (Rules.pm create_rule): the last rule
	// goes in first.
	for i := len(rules) - 1; i >= 0; i-- {
		if err := p.api.call(ctx, http.MethodPost, "/cluster/firewall/groups/"+staging, nil, rules[i], nil); err != nil {
			return fmt.Errorf("add rule %d to firewall security group %s: %w", i, staging, err)
		}
	}
	if err := p.api.call(ctx, http.MethodPost, "/cluster/firewall/groups", nil, map[string]any{"group": final, "rename": staging, "comment": comment}, nil); err != nil {
		return fmt.Errorf("rename firewall security group %s to %s: %w", staging, final, err)
	}
	p.log.Info("Created the firewall security group of an isolation policy", "group", final, "policy", iso.Policy, "rules", len(rules))
	return nil
}

// deleteGroup empties a group of this install's and deletes it (Proxmox
// deletes only empty groups).
func (p *Provider) deleteGroup(ctx context.Context, group string) error {
	var rules []*proxmox.FirewallRule
	if err := p.api.call(ctx, http.MethodGet, "/cluster/firewall/groups/"+group, nil, nil, &rules); err != nil {
		return fmt.Errorf("read firewall security group %s: %w", group, err)
	}
	for range rules {
		if err := p.api.call(ctx, http.MethodDelete, "/cluster/firewall/groups/"+group+"/0", nil, nil, nil); err != nil {
			return fmt.Errorf("empty firewall security group %s: %w", group, err)
		}
	}
	if err := p.api.call(ctx, http.MethodDelete, "/cluster/firewall/groups/"+group, nil, nil, nil); err != nil {
		return fmt.Errorf("delete firewall security group %s: %w", group, err)
	}
	return nil
}

// groupRules are iso's rules in pve-firewall's terms, in order: egress as
// "out", ingress as "in", a rule split where its ports exceed what one
// rule may list.
func groupRules(iso *provider.Isolation) []map[string]any {
	var out []map[string]any
	for _, dir := range []struct {
		typ   string
		rules []provider.FirewallRule
	}{{"out", iso.Egress}, {"in", iso.Ingress}} {
		for _, r := range dir.rules {
			for _, ports := range portLists(r.Ports) {
				rule := map[string]any{"type": dir.typ, "action": strings.ToUpper(string(r.Action)), "enable": 1}
				if r.CIDR != "" {
					key := "dest"
					if dir.typ == "in" {
						key = "source"
					}
					rule[key] = r.CIDR
				}
				if r.Protocol != "" {
					rule["proto"] = r.Protocol
				}
				if ports != "" {
					rule["dport"] = ports
				}
				if r.Comment != "" {
					rule["comment"] = r.Comment
				}
				out = append(out, rule)
			}
		}
	}
	return out
}

// portLists writes ports as pve-firewall dport lists of at most
// maxPortNumbers numbers each; no ports is one empty list (any port).
func portLists(ports []provider.PortRange) []string {
	if len(ports) == 0 {
		return []string{""}
	}
	var out, cur []string
	n := 0
	for _, r := range ports {
		w := 1
		if r.From != r.To {
			w = 2
		}
		if n+w > maxPortNumbers {
			out, cur, n = append(out, strings.Join(cur, ",")), nil, 0
		}
		cur, n = append(cur, r.String()), n+w
	}
	return append(out, strings.Join(cur, ","))
}

// isolateVM configures the firewall of the VM at node/vmid for iso before
// its first start: group, options, its one rule, its ipfilter IPSet.
// Every write is safe to repeat.
func (p *Provider) isolateVM(ctx context.Context, node string, vmid int, iso *provider.Isolation) error {
	group, err := p.ensureGroup(ctx, iso)
	if err != nil {
		return err
	}
	base := fmt.Sprintf("/nodes/%s/qemu/%d/firewall", node, vmid)
	dhcp := 0
	if iso.DHCP {
		dhcp = 1
	}
	opts := map[string]any{"enable": 1, "policy_in": "DROP", "policy_out": "DROP", "ipfilter": 1, "macfilter": 1, "dhcp": dhcp, "ndp": 1, "radv": 0}
	if err := p.api.call(ctx, http.MethodPut, base+"/options", nil, opts, nil); err != nil {
		return fmt.Errorf("set the firewall options of VM %d: %w", vmid, err)
	}
	if err := p.setVMRules(ctx, base, vmid, group); err != nil {
		return err
	}
	return p.syncIPFilter(ctx, base, vmid, iso.Addresses, true)
}

// setVMRules makes the VM's rules exactly the reference to group.
func (p *Provider) setVMRules(ctx context.Context, base string, vmid int, group string) error {
	var rules []*proxmox.FirewallRule
	if err := p.api.call(ctx, http.MethodGet, base+"/rules", nil, nil, &rules); err != nil {
		return fmt.Errorf("read the firewall rules of VM %d: %w", vmid, err)
	}
	if len(rules) == 1 && rules[0].Type == "group" && rules[0].Action == group && rules[0].Enable == 1 && rules[0].Iface == "" {
		return nil
	}
	for range rules {
		// Copied from the template by the clone, or left by an earlier
		// pass: only the policy decides.
		if err := p.api.call(ctx, http.MethodDelete, base+"/rules/0", nil, nil, nil); err != nil {
			return fmt.Errorf("remove a firewall rule of VM %d: %w", vmid, err)
		}
	}
	rule := map[string]any{"type": "group", "action": group, "enable": 1, "comment": "HyperFleet isolation policy"}
	if err := p.api.call(ctx, http.MethodPost, base+"/rules", nil, rule, nil); err != nil {
		return fmt.Errorf("add the isolation rule of VM %d: %w", vmid, err)
	}
	return nil
}

// syncIPFilter makes the VM's ipfilter-net0 hold addrs; exact removes
// entries not among them (at configure: a clone may carry its template's).
func (p *Provider) syncIPFilter(ctx context.Context, base string, vmid int, addrs []string, exact bool) error {
	var sets []*proxmox.FirewallIPSet
	if err := p.api.call(ctx, http.MethodGet, base+"/ipset", nil, nil, &sets); err != nil {
		return fmt.Errorf("read the IPSets of VM %d: %w", vmid, err)
	}
	if !slices.ContainsFunc(sets, func(s *proxmox.FirewallIPSet) bool { return s != nil && s.Name == ipfilterSet }) {
		body := map[string]any{"name": ipfilterSet, "comment": "HyperFleet: the addresses this VM may send from"}
		if err := p.api.call(ctx, http.MethodPost, base+"/ipset", nil, body, nil); err != nil {
			return fmt.Errorf("create IPSet %s of VM %d: %w", ipfilterSet, vmid, err)
		}
		sets = nil
	}
	var entries []*proxmox.FirewallIPSetEntry
	if sets != nil {
		if err := p.api.call(ctx, http.MethodGet, base+"/ipset/"+ipfilterSet, nil, nil, &entries); err != nil {
			return fmt.Errorf("read IPSet %s of VM %d: %w", ipfilterSet, vmid, err)
		}
	}
	have := map[string]bool{}
	for _, e := range entries {
		if e == nil {
			continue
		}
		if exact && !slices.Contains(addrs, e.CIDR) {
			if err := p.api.call(ctx, http.MethodDelete, base+"/ipset/"+ipfilterSet+"/"+e.CIDR, nil, nil, nil); err != nil {
				return fmt.Errorf("remove %s from IPSet %s of VM %d: %w", e.CIDR, ipfilterSet, vmid, err)
			}
			continue
		}
		have[e.CIDR] = true
	}
	for _, a := range addrs {
		if have[a] {
			continue
		}
		if err := p.api.call(ctx, http.MethodPost, base+"/ipset/"+ipfilterSet, nil, map[string]any{"cidr": a}, nil); err != nil {
			return fmt.Errorf("add %s to IPSet %s of VM %d: %w", a, ipfilterSet, vmid, err)
		}
	}
	return nil
}

// allowLeased adds the addresses the guest reports that iso allows (inside
// its AddressSubnets) to the VM's ipfilter-net0, once per address in this
// process: until then pve-firewall drops what the VM sends from a leased
// address. An address outside the subnets stays out: the VM may have
// taken another VM's.
func (p *Provider) allowLeased(ctx context.Context, node string, vmid int, iso *provider.Isolation, addrs []string) error {
	if iso == nil {
		return nil
	}
	var add []string
	for _, s := range addrs {
		a, err := netip.ParseAddr(s)
		if err != nil || slices.Contains(iso.Addresses, a.String()) || !iso.AllowsAddress(a) {
			continue
		}
		add = append(add, a.String())
	}
	key := strconv.Itoa(vmid) + "/" + strings.Join(add, ",")
	p.mu.Lock()
	done := p.leased[key]
	p.mu.Unlock()
	if len(add) == 0 || done {
		return nil
	}
	base := fmt.Sprintf("/nodes/%s/qemu/%d/firewall", node, vmid)
	if err := p.syncIPFilter(ctx, base, vmid, add, false); err != nil {
		return err
	}
	p.mu.Lock()
	if p.leased == nil {
		p.leased = map[string]bool{}
	}
	p.leased[key] = true
	p.mu.Unlock()
	return nil
}

// forgetLeased drops what allowLeased remembers of vmid (its VM is gone:
// the id may be reused).
func (p *Provider) forgetLeased(vmid int) {
	prefix := strconv.Itoa(vmid) + "/"
	p.mu.Lock()
	defer p.mu.Unlock()
	for k := range p.leased {
		if strings.HasPrefix(k, prefix) {
			delete(p.leased, k)
		}
	}
}

// clusterFirewallOptions are GET /cluster/firewall/options' fields read.
type clusterFirewallOptions struct {
	Enable proxmox.IntOrBool `json:"enable"`
}

// isolationProblem says why Proxmox would not apply the VMs' isolation,
// "" when it would: the datacenter firewall must be on.
func (p *Provider) isolationProblem(ctx context.Context) (string, error) {
	if !p.cfg.Isolated {
		return "", nil
	}
	var opts clusterFirewallOptions
	if err := p.api.call(ctx, http.MethodGet, "/cluster/firewall/options", nil, nil, &opts); err != nil {
		return "", fmt.Errorf("read the datacenter firewall options: %w", err)
	}
	if !bool(opts.Enable) {
		return "the datacenter firewall of Proxmox VE cluster " + p.cfg.Name + " is off, so Proxmox ignores the VMs' firewall rules and their isolation is not enforced: " +
			"enable it (Datacenter > Firewall > Options > Firewall, or pvesh set /cluster/firewall/options --enable 1) after allowing the management traffic the nodes need (docs/networking.md, \"Isolation\")", nil
	}
	return "", nil
}

package proxmoxsim

import (
	"fmt"
	"sort"
	"strings"

	"github.com/hyperfleet/hyperfleet/internal/testworld/simulator/pvefw"
)

// Enforcement: with real guests on a TapNetwork, the firewall configuration
// is compiled (internal/testworld/simulator/pvefw) and loaded into the
// network's namespace whenever it may have changed. Every VM is compiled,
// running or not: the rules name taps (hf<vmid>), so a guest's tap is held
// to them from the moment QEMU plugs it in.

// firewallModelLocked is the stored configuration as the compiler's model.
func (s *Simulator) firewallModelLocked() (pvefw.Cluster, []pvefw.VM) {
	st := s.fwLocked()
	opts := st.options
	c := pvefw.Cluster{Options: pvefw.ClusterOptions{Enable: opts["enable"] != "" && opts["enable"] != "0", Ebtables: optBool(opts, "ebtables")}}
	for _, name := range sortedKeys(st.groups) {
		g := pvefw.Group{Name: name, Comment: st.groups[name].comment}
		for _, r := range st.groups[name].rules {
			g.Rules = append(g.Rules, r.model())
		}
		c.Groups = append(c.Groups, g)
	}
	ids := make([]int, 0, len(s.vms))
	for id := range s.vms {
		ids = append(ids, id)
	}
	sort.Ints(ids)
	var vms []pvefw.VM
	for _, id := range ids {
		net0 := s.vms[id].conf["net0"]
		if net0 == "" {
			continue
		}
		props, _ := propertyString(net0, "")
		vm := pvefw.VM{VMID: id, NetID: "net0", Tap: fmt.Sprintf("hf%d", id), MAC: strings.ToLower(macOf(net0)), Firewall: props["firewall"] == "1"}
		if f := st.vms[id]; f != nil {
			o := f.options
			vm.Options = pvefw.VMOptions{Enable: o["enable"] == "1", PolicyIn: o["policy_in"], PolicyOut: o["policy_out"],
				IPFilter: o["ipfilter"] == "1", Radv: o["radv"] == "1",
				MACFilter: optBool(o, "macfilter"), DHCP: optBool(o, "dhcp"), NDP: optBool(o, "ndp")}
			for _, r := range f.rules {
				vm.Rules = append(vm.Rules, r.model())
			}
			for _, name := range sortedKeys(f.ipsets) {
				set := pvefw.IPSet{Name: name, Comment: f.ipsets[name].comment}
				for _, e := range f.ipsets[name].entries {
					set.Entries = append(set.Entries, pvefw.IPSetEntry{CIDR: e.cidr, NoMatch: e.nomatch, Comment: e.comment})
				}
				vm.IPSets = append(vm.IPSets, set)
			}
		}
		vms = append(vms, vm)
	}
	return c, vms
}

func optBool(o map[string]string, k string) *bool {
	v, ok := o[k]
	if !ok {
		return nil
	}
	b := v == "1"
	return &b
}

// FirewallRuleset returns the nftables ruleset the current firewall
// configuration compiles to (what a TapNetwork's namespace holds), the
// rules the compiler skipped, and the last error loading it: for a test's
// log when a guest's traffic does not go where the test expected.
func (s *Simulator) FirewallRuleset() (pvefw.Compiled, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	c, vms := s.firewallModelLocked()
	comp, err := pvefw.Compile(c, vms)
	if err != nil {
		return comp, err
	}
	return comp, s.fwErr
}

// firewallChangedLocked recompiles the ruleset and, when it changed, loads
// it into the TapNetwork's namespace. A failure is logged and kept for
// FirewallRuleset: like pve-firewall's, it does not fail the API call.
func (s *Simulator) firewallChangedLocked() {
	tn := s.cfg.Guest.QEMU.Network
	if tn == nil || s.closed {
		return
	}
	c, vms := s.firewallModelLocked()
	comp, err := pvefw.Compile(c, vms)
	if err == nil && comp.Ruleset == s.fwApplied {
		return
	}
	if err == nil {
		err = pvefw.Apply(tn.Netns, tn.Bridge, comp.Ruleset)
	}
	s.fwErr = err
	if err != nil {
		s.log.Error("Cannot apply the firewall ruleset", "netns", tn.Netns, "err", err)
		return
	}
	s.fwApplied = comp.Ruleset
	for _, w := range comp.Warnings {
		s.log.Warn("Firewall rule skipped", "reason", w)
	}
}

// removeFirewallLocked takes the simulator's tables out of the
// TapNetwork's namespace (Close).
func (s *Simulator) removeFirewallLocked() error {
	tn := s.cfg.Guest.QEMU.Network
	if tn == nil || s.fwApplied == "" {
		return nil
	}
	s.fwApplied = ""
	if err := pvefw.Remove(tn.Netns); err != nil {
		return fmt.Errorf("remove the firewall ruleset: %w", err)
	}
	return nil
}

// Package pvefw reproduces what Proxmox VE's firewall (pve-firewall,
// src/PVE/Firewall.pm) does to the traffic of a VM on a bridge, for the
// Proxmox simulator's real guests: a model of the configuration the API
// stores (cluster options, security groups, rules, IPSets, VM options) and
// a compiler from it to one nftables ruleset that a test loads into the
// network namespace its guests' taps are plugged into.
//
// What it reproduces, with pve-firewall's semantics (compile,
// compile_iptables_filter, generate_tap_rules_direction,
// ruleset_create_vm_chain, ruleset_generate_vm_rules,
// ruleset_add_group_rule, compile_ipsets, compile_ebtables_filter):
//
//   - the datacenter switch: cluster enable=0 compiles to nothing;
//   - per NIC: firewall=1 on netX puts the tap behind the firewall
//     (conntrack INVALID dropped, ESTABLISHED/RELATED accepted); the VM's
//     own chains exist only with the VM option enable=1;
//   - traffic from the VM (OUT): DHCP client requests (unless dhcp=0: an
//     unset dhcp allows DHCP, as the ruleset generator reads it), the MAC
//     filter (unless macfilter=0), router advertisements dropped unless
//     radv, the ipfilter-net<N> IPSet (with the option ipfilter or an
//     explicit set; it always holds the link-local address derived from
//     the MAC and excludes the rest of fe80::/10, and an implicit set is
//     otherwise empty: with ipfilter and no set the VM sends IPv4 only as
//     DHCP), NDP (unless ndp=0), the rules in order, policy_out (default
//     ACCEPT);
//   - traffic to the VM (IN): DHCP answers, NDP, the rules, policy_in
//     (default DROP);
//   - rules: type in/out/group, ACCEPT/DROP/REJECT, enable, iface,
//     source/dest (addresses, networks, ranges, lists, +ipset with the
//     VM's sets before the cluster's, +dc/ and +guest/ scopes), proto
//     (names and numbers), dport/sport ("80", "80:90", "80,443:445"),
//     icmp-type; a group rule runs the group's rules (cluster IPSets only)
//     and an ACCEPT in it ends the VM's chain;
//   - IPSets with nomatch entries (hash:net: the most specific entry
//     decides);
//   - the layer-2 filter of the ebtables table (cluster option ebtables,
//     default on): non-IP frames from the VM must carry its MAC, and ARP
//     from it must name an address of an explicit ipfilter-net<N> set;
//   - policies DROP and REJECT accept the critical ICMP errors
//     (fragmentation needed, time exceeded) as PVEFW-Drop/PVEFW-Reject do;
//     REJECT answers TCP with a reset, UDP with port unreachable, drops
//     ICMP and answers the rest with host prohibited.
//
// What it does not: macros and aliases (the simulator's API refuses them),
// port names from /etc/services, logging, the host firewall (traffic to and
// from the bridge's own address is held to the VM's rules only), the
// cluster-level rules and forward policy, SDN/VNet firewalls, ips/NFQUEUE,
// the smurf, tcpflags and blacklist filters, conntrack helpers, layer-2
// protocol lists, and REJECT of traffic the namespace itself sends to a VM
// (it is dropped: nftables cannot reject on a bridge's output path). The
// ruleset is one pass per packet over a single bridge where Proxmox has a
// firewall bridge per NIC: a packet between two VMs meets the sender's OUT
// chain and then the receiver's IN chain, as on Proxmox.
//
// How (Ruleset): a "bridge" family table filters on the bridge's forward,
// input and output hooks, matching taps by name (iifname/oifname) and
// IP/transport fields; conntrack state comes from br_netfilter (the
// bridge's nf_call_iptables, which Apply turns on), read by an "inet"
// table at prerouting and output and handed to the bridge table as bits of
// the packet mark, because this kernel has no conntrack in the bridge
// family (nf_conntrack_bridge); REJECT is carried the same way to the inet
// table's forward and input hooks, which can reject (the bridge family
// cannot without nft_reject_bridge).
package pvefw

package proxmoxsim

import (
	"encoding/binary"
	"fmt"
	"net"
	"path"
	"strings"
)

// agentReadyLocked applies qemu-server's agent_available checks, in order.
func (s *Simulator) agentReadyLocked(q *apiRequest) (*vm, error) {
	v, err := s.vmOnNodeLocked(q)
	if err != nil {
		return nil, err
	}
	if !agentEnabled(v.conf["agent"]) {
		return nil, serverError("No QEMU guest agent configured")
	}
	if !v.running {
		return nil, serverError("VM %d is not running", v.vmid)
	}
	if !v.agentUp {
		return nil, serverError("QEMU guest agent is not running")
	}
	if v.paused {
		// The agent's process is held with the guest's vCPUs: qemu-server
		// waits for its answer in vain.
		cmd := "guest-" + path.Base(q.path)
		if cmd == "guest-file-write" {
			cmd = "guest-file-open"
		}
		return nil, serverError("VM %d qmp command '%s' failed - got timeout", v.vmid, cmd)
	}
	return v, nil
}

// realAgentLocked returns the answer of a real guest's own agent to cmd,
// or nil for a simulated guest.
func (s *Simulator) realAgentLocked(v *vm, cmd string) liveAnswer {
	sock := s.real.agentSocketLocked(v.vmid)
	if sock == "" {
		return nil
	}
	return agentCommand(v.vmid, sock, cmd)
}

// handleAgentInterfaces is GET .../agent/network-get-interfaces.
func (s *Simulator) handleAgentInterfaces(q *apiRequest) (any, error) {
	v, err := s.agentReadyLocked(q)
	if err != nil {
		return nil, err
	}
	if live := s.realAgentLocked(v, "guest-network-get-interfaces"); live != nil {
		return live, nil
	}
	ifaces := []map[string]any{{
		"name": "lo", "hardware-address": "00:00:00:00:00:00",
		"ip-addresses": []map[string]any{
			{"ip-address": "127.0.0.1", "ip-address-type": "ipv4", "prefix": 8},
			{"ip-address": "::1", "ip-address-type": "ipv6", "prefix": 128},
		},
		"statistics": map[string]any{"rx-bytes": 0, "rx-packets": 0, "tx-bytes": 0, "tx-packets": 0, "rx-errs": 0, "tx-errs": 0, "rx-dropped": 0, "tx-dropped": 0},
	}}
	for i := 0; i < 32; i++ {
		nv, ok := v.conf[fmt.Sprintf("net%d", i)]
		if !ok {
			continue
		}
		mac := strings.ToLower(macOf(nv))
		addrs := []map[string]any{}
		ip, prefix := s.guestAddress(v, i)
		if ip != "" {
			addrs = append(addrs, map[string]any{"ip-address": ip, "ip-address-type": "ipv4", "prefix": prefix})
		}
		addrs = append(addrs, map[string]any{"ip-address": linkLocal(mac), "ip-address-type": "ipv6", "prefix": 64})
		ifaces = append(ifaces, map[string]any{
			"name": fmt.Sprintf("eth%d", i), "hardware-address": mac, "ip-addresses": addrs,
			"statistics": map[string]any{"rx-bytes": 1024, "rx-packets": 8, "tx-bytes": 512, "tx-packets": 4, "rx-errs": 0, "tx-errs": 0, "rx-dropped": 0, "tx-dropped": 0},
		})
	}
	return map[string]any{"result": ifaces}, nil
}

// guestAddress is the IPv4 of interface i: the static ipconfigN address if
// set, otherwise (first NIC only) the address leased from the range.
func (s *Simulator) guestAddress(v *vm, i int) (string, int) {
	if p, err := propertyString(v.conf[fmt.Sprintf("ipconfig%d", i)], ""); err == nil && p["ip"] != "" && p["ip"] != "dhcp" {
		ip, n, err := net.ParseCIDR(p["ip"])
		if err == nil {
			ones, _ := n.Mask.Size()
			return ip.String(), ones
		}
	}
	if i == 0 && v.ipv4 != "" {
		return v.ipv4, s.addrs.prefix
	}
	return "", 0
}

func macOf(netValue string) string {
	first, _, _ := strings.Cut(netValue, ",")
	_, mac, _ := strings.Cut(first, "=")
	for _, p := range strings.Split(netValue, ",") {
		if strings.HasPrefix(p, "macaddr=") {
			mac = strings.TrimPrefix(p, "macaddr=")
		}
	}
	return mac
}

// linkLocal derives the EUI-64 fe80:: address of a MAC.
func linkLocal(mac string) string {
	hw, err := net.ParseMAC(mac)
	if err != nil || len(hw) != 6 {
		return "fe80::1"
	}
	ip := net.IP{0xfe, 0x80, 0, 0, 0, 0, 0, 0, hw[0] ^ 2, hw[1], hw[2], 0xff, 0xfe, hw[3], hw[4], hw[5]}
	return ip.String()
}

// handleAgentOSInfo is GET .../agent/get-osinfo.
func (s *Simulator) handleAgentOSInfo(q *apiRequest) (any, error) {
	v, err := s.agentReadyLocked(q)
	if err != nil {
		return nil, err
	}
	if live := s.realAgentLocked(v, "guest-get-osinfo"); live != nil {
		return live, nil
	}
	return map[string]any{"result": map[string]any{
		"id": "debian", "name": "Debian GNU/Linux", "pretty-name": "Debian GNU/Linux 12 (bookworm)",
		"version": "12 (bookworm)", "version-id": "12", "kernel-release": "6.1.0-26-amd64",
		"kernel-version": "#1 SMP PREEMPT_DYNAMIC Debian 6.1.112-1", "machine": "x86_64",
	}}, nil
}

// handleAgentHostName is GET .../agent/get-host-name.
func (s *Simulator) handleAgentHostName(q *apiRequest) (any, error) {
	v, err := s.agentReadyLocked(q)
	if err != nil {
		return nil, err
	}
	if live := s.realAgentLocked(v, "guest-get-host-name"); live != nil {
		return live, nil
	}
	name := v.conf["name"]
	if name == "" {
		name = fmt.Sprintf("vm%d", v.vmid)
	}
	return map[string]any{"result": map[string]any{"host-name": name}}, nil
}

// handleAgentPing is POST .../agent/ping.
func (s *Simulator) handleAgentPing(q *apiRequest) (any, error) {
	v, err := s.agentReadyLocked(q)
	if err != nil {
		return nil, err
	}
	if live := s.realAgentLocked(v, "guest-ping"); live != nil {
		return live, nil
	}
	return map[string]any{"result": map[string]any{}}, nil
}

// addressPool hands out guest IPv4 addresses from a range, one per VM,
// kept for the VM's life so restarts report the same address.
type addressPool struct {
	first, last uint32
	prefix      int
	byVM        map[int]uint32
	used        map[uint32]bool
	next        uint32
}

func parseAddressRange(r string) (net.IP, net.IP, error) {
	a, b, ok := strings.Cut(r, "-")
	if !ok {
		return nil, nil, fmt.Errorf("range %q must be <first>-<last>", r)
	}
	first, last := net.ParseIP(strings.TrimSpace(a)).To4(), net.ParseIP(strings.TrimSpace(b)).To4()
	if first == nil || last == nil {
		return nil, nil, fmt.Errorf("range %q: both ends must be IPv4 addresses", r)
	}
	if binary.BigEndian.Uint32(first) > binary.BigEndian.Uint32(last) {
		return nil, nil, fmt.Errorf("range %q: first address is after the last", r)
	}
	return first, last, nil
}

func newAddressPool(r string, prefix int) (*addressPool, error) {
	if r == "" {
		r = "10.99.0.10-10.99.0.250"
	}
	if prefix == 0 {
		prefix = 24
	}
	first, last, err := parseAddressRange(r)
	if err != nil {
		return nil, err
	}
	p := &addressPool{first: binary.BigEndian.Uint32(first), last: binary.BigEndian.Uint32(last), prefix: prefix,
		byVM: map[int]uint32{}, used: map[uint32]bool{}}
	p.next = p.first
	return p, nil
}

// allocate returns the VM's address, or "" when the range is exhausted
// (the guest then reports only link-local addresses, like a DHCP failure).
func (p *addressPool) allocate(vmid int) string {
	if a, ok := p.byVM[vmid]; ok {
		return uint32IP(a)
	}
	size := p.last - p.first + 1
	for i := uint32(0); i < size; i++ {
		a := p.first + (p.next-p.first+i)%size
		if !p.used[a] {
			p.used[a] = true
			p.byVM[vmid] = a
			p.next = a + 1
			return uint32IP(a)
		}
	}
	return ""
}

func (p *addressPool) release(vmid int) {
	if a, ok := p.byVM[vmid]; ok {
		delete(p.used, a)
		delete(p.byVM, vmid)
	}
}

func uint32IP(a uint32) string {
	b := make(net.IP, 4)
	binary.BigEndian.PutUint32(b, a)
	return b.String()
}

package guestnet

import (
	"bufio"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/hyperfleet/hyperfleet/internal/procgroup"
)

// DHCPServer is dnsmasq serving DHCP (and nothing else: no DNS) on a
// Network's bridge, in its namespace.
type DHCPServer struct {
	// LeaseFile and LogFile are dnsmasq's lease database and its output
	// (--log-dhcp: every packet's options, client identifier included).
	LeaseFile, LogFile string
	// HostsFile holds the host reservations (Reserve), one dhcp-host
	// line each.
	HostsFile string
	cmd       *exec.Cmd
	leader    *procgroup.Leader // dnsmasq leads its group
	done      chan struct{}
	mu        sync.Mutex // Reserve's appends and reloads
}

// StartDHCP runs dnsmasq in n's namespace, leasing first-last for
// leaseTime (at least 2 minutes, dnsmasq's minimum), with its files in
// dir. A client that asks for a shorter lease (option 51) gets it: dnsmasq
// grants the shorter of the two. Debian's dnsmasq-base package provides it
// (hack/test-deps.sh --guest installs it). The leases offer no router and
// no DNS server: the guests' world is the bridge's network.
func (n *Network) StartDHCP(dir string, first, last netip.Addr, leaseTime time.Duration) (*DHCPServer, error) {
	bin, err := exec.LookPath("dnsmasq")
	if err != nil {
		return nil, fmt.Errorf("guestnet: dnsmasq is not installed (hack/test-deps.sh --guest installs Debian's dnsmasq-base): %w", err)
	}
	s := &DHCPServer{LeaseFile: filepath.Join(dir, "dnsmasq.leases"), LogFile: filepath.Join(dir, "dnsmasq.log"),
		HostsFile: filepath.Join(dir, "dnsmasq.hosts"), done: make(chan struct{})}
	if err := os.WriteFile(s.HostsFile, nil, 0o644); err != nil {
		return nil, fmt.Errorf("guestnet: %w", err)
	}
	log, err := os.Create(s.LogFile)
	if err != nil {
		return nil, fmt.Errorf("guestnet: %w", err)
	}
	defer log.Close()
	mask := netipMask(n.Prefix.Bits())
	s.cmd = exec.Command("ip", "netns", "exec", n.Netns, bin,
		"--no-daemon", "--conf-file=/dev/null", "--user=root", "--port=0",
		"--interface="+Bridge, "--bind-interfaces", "--log-dhcp", "--log-facility=-",
		"--dhcp-leasefile="+s.LeaseFile, "--pid-file="+filepath.Join(dir, "dnsmasq.pid"),
		fmt.Sprintf("--dhcp-range=%s,%s,%s,%d", first, last, mask, int(leaseTime.Seconds())),
		// Reservations, read again on SIGHUP (Reserve).
		"--dhcp-hostsfile="+s.HostsFile,
		// No router: nothing is routed out of the namespace.
		"--dhcp-option=option:router")
	s.cmd.Stdout, s.cmd.Stderr = log, log
	s.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := s.cmd.Start(); err != nil {
		return nil, fmt.Errorf("guestnet: start dnsmasq: %w", err)
	}
	s.leader = procgroup.New(s.cmd)
	go func() {
		_ = s.leader.Wait(procgroup.KillGroup)
		close(s.done)
	}()
	// dnsmasq logs its DHCP range once it serves it.
	deadline := time.Now().Add(10 * time.Second)
	for {
		out, _ := os.ReadFile(s.LogFile)
		select {
		case <-s.done:
			return nil, fmt.Errorf("guestnet: dnsmasq exited: %s", out)
		default:
		}
		if strings.Contains(string(out), "DHCP, IP range") {
			return s, nil
		}
		if time.Now().After(deadline) {
			s.Stop()
			return nil, fmt.Errorf("guestnet: dnsmasq did not start serving within 10 s: %s", out)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func netipMask(bits int) netip.Addr {
	var b [4]byte
	for i := range bits {
		b[i/8] |= 0x80 >> (i % 8)
	}
	return netip.AddrFrom4(b)
}

// Stop ends dnsmasq and waits for it.
func (s *DHCPServer) Stop() {
	_ = s.leader.Signal(syscall.SIGTERM)
	select {
	case <-s.done:
	case <-time.After(5 * time.Second):
		_ = s.leader.Signal(syscall.SIGKILL)
		<-s.done
	}
}

// Reserve gives the client that names itself hostname (option 12) the
// address addr, as a platform team's dnsmasq.conf line
// dhcp-host=<hostname>,<addr> would: it appends the line to HostsFile and
// has dnsmasq read the file again (SIGHUP), returning once dnsmasq says it
// did. addr may lie outside the leased range, inside the network.
func (s *DHCPServer) Reserve(hostname string, addr netip.Addr) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if strings.ContainsAny(hostname, ", \t\n") || hostname == "" {
		return fmt.Errorf("guestnet: reserve %q: not a host name", hostname)
	}
	before, err := os.ReadFile(s.LogFile)
	if err != nil {
		return fmt.Errorf("guestnet: %w", err)
	}
	f, err := os.OpenFile(s.HostsFile, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		return fmt.Errorf("guestnet: %w", err)
	}
	_, err = fmt.Fprintf(f, "%s,%s\n", hostname, addr)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("guestnet: reserve %s: %w", hostname, err)
	}
	if err := s.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		return fmt.Errorf("guestnet: reload dnsmasq's reservations: %w", err)
	}
	// dnsmasq logs "read <file>" for each hosts file it reads; the log
	// only grows.
	deadline := time.Now().Add(10 * time.Second)
	for {
		out, _ := os.ReadFile(s.LogFile)
		since := string(out[min(len(before), len(out)):])
		if strings.Contains(since, "read "+s.HostsFile) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("guestnet: dnsmasq did not read %s again within 10 s: %s", s.HostsFile, since)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Lease is a line of dnsmasq's lease file.
type Lease struct {
	MAC      string
	Addr     netip.Addr
	Hostname string
	// ClientID is the client identifier (option 61) dnsmasq keyed the
	// lease on, as it writes it (hex bytes, colon-separated), "" without.
	ClientID string
	// Expires is when the lease ends, to the second; zero for an infinite
	// lease. Minus the time it was granted or renewed, it is the lease
	// time dnsmasq gave.
	Expires time.Time
}

// Leases reads the lease file: "<expiry> <MAC> <address> <host name or
// *> <client id or *>" per line, the expiry in seconds since the epoch
// (0: infinite).
func (s *DHCPServer) Leases() ([]Lease, error) {
	f, err := os.Open(s.LeaseFile)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("guestnet: %w", err)
	}
	defer f.Close()
	var leases []Lease
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 5 || fields[0] == "duid" {
			continue
		}
		addr, err := netip.ParseAddr(fields[2])
		if err != nil {
			return nil, fmt.Errorf("guestnet: lease %q: %w", sc.Text(), err)
		}
		exp, err := strconv.ParseInt(fields[0], 10, 64)
		if err != nil {
			return nil, fmt.Errorf("guestnet: lease %q: expiry: %w", sc.Text(), err)
		}
		l := Lease{MAC: fields[1], Addr: addr}
		if exp != 0 {
			l.Expires = time.Unix(exp, 0)
		}
		if fields[3] != "*" {
			l.Hostname = fields[3]
		}
		if fields[4] != "*" {
			l.ClientID = fields[4]
		}
		leases = append(leases, l)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("guestnet: %w", err)
	}
	return leases, nil
}

// Log is dnsmasq's output so far.
func (s *DHCPServer) Log() (string, error) {
	out, err := os.ReadFile(s.LogFile)
	if err != nil {
		return "", fmt.Errorf("guestnet: %w", err)
	}
	return string(out), nil
}

// HexID is a client identifier as dnsmasq writes it: bytes in hex,
// colon-separated.
func HexID(id []byte) string {
	parts := make([]string, len(id))
	for i, b := range id {
		parts[i] = fmt.Sprintf("%02x", b)
	}
	return strings.Join(parts, ":")
}

// Package isolation_test proves network isolation on real guests the way
// Proxmox VE would hold them: the policy compiled from a HypervisorCluster
// and a template (internal/isolation), written by the Proxmox provider
// (pkg/provider/proxmox) through the simulator's pve-firewall API, and
// enforced by the simulator with pve-firewall's semantics in nftables on a
// bridge in a network namespace the test makes, where two tiny guests
// (internal/testworld/tinyguest) take their DHCP leases and try what a
// hostile job would. The libvirt counterpart is pkg/provider/libvirt's
// TestIsolationEnforced, against a real libvirtd's nwfilter.
package isolation_test

import (
	"context"
	"crypto/sha256"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/isolation"
	"github.com/hyperfleet/hyperfleet/internal/testworld/netns"
	"github.com/hyperfleet/hyperfleet/internal/testworld/simulator/guestnet"
	proxmoxsim "github.com/hyperfleet/hyperfleet/internal/testworld/simulator/proxmox"
	"github.com/hyperfleet/hyperfleet/internal/testworld/tinyguest"
	"github.com/hyperfleet/hyperfleet/pkg/ownership"
	"github.com/hyperfleet/hyperfleet/pkg/provider"
	"github.com/hyperfleet/hyperfleet/pkg/provider/proxmox"
)

// The test's network: the bridge's own address stands for the operator
// (agent server, metrics, webhook), the DNS server; other addresses on it
// for a management host, a service the policy allows and the template's
// proxy. The VMs lease inside vmSubnet.
var (
	network    = netip.MustParsePrefix("10.78.0.0/24")
	operator   = netip.MustParseAddr("10.78.0.1")
	management = netip.MustParseAddr("10.78.0.250")
	service    = netip.MustParseAddr("10.78.0.251")
	proxyHost  = netip.MustParseAddr("10.78.0.252")
	vmSubnet   = netip.MustParsePrefix("10.78.0.96/27")
)

// Ports of the operator's endpoints and of the guests' servers.
const (
	agentServerPort = "9443"
	metricsPort     = "8443"
	webhookPort     = "9440"
	sshCheckPort    = "2222"
	guestPort       = "9000"
)

// TestIsolationOnProxmoxRealGuests: two VMs held to policy "web" (TCP to
// the service's port 8080 only), with the cluster's operator, DNS server,
// management address and VM subnet, and the template's proxy. From VM A:
// the agent server, DNS, the proxy and the allowed service answer; the
// service's other port, the operator's metrics and webhook ports, the
// management address and VM B do not. Into VM B: the operator's SSH check
// port from the operator answers; its other port from the operator, and
// anything from VM A, do not. A that takes another address, or another
// MAC, loses even the allowed service; its own MAC back, it reaches it
// again. Two tiny guest boots under TCG: 54 s wall (the dials that must
// fail wait out their 3 s), about 18 CPU-s with QEMU.
//
// Mutation: the provider writing firewall=0 on net0 (Proxmox then filters
// nothing of the NIC) fails every case that must not reach, the spoofing
// ones included.
func TestIsolationOnProxmoxRealGuests(t *testing.T) {
	if testing.Short() {
		t.Skip("boots two guests under TCG: make test runs it")
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root: network namespaces, a bridge and nftables")
	}
	if _, err := exec.LookPath("nft"); err != nil {
		t.Skip("needs nft (Debian's nftables)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	dir := t.TempDir()
	gn := newNetwork(t, dir)
	sim, srv := newSimulator(t, dir, gn)
	endpoint, fingerprint := srv.URL+"/api2/json", proxmoxsim.FormatFingerprint(sha256.Sum256(srv.Certificate().Raw))
	enableDatacenterFirewall(t, srv)

	iso, err := isolation.Compile(ctx, template(), cluster(), isolation.Operator{Ports: []uint16{9443}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	key := sha256.Sum256([]byte("isolation test ownership key"))
	signer, err := ownership.NewSigner("isolationtest", key[:])
	if err != nil {
		t.Fatal(err)
	}
	p, err := proxmox.New(provider.ClusterConfig{
		Name: "lab", Endpoint: endpoint, TokenID: "root@pam!sim", TokenSecret: "00000000-0000-0000-0000-000000000000",
		FingerprintSHA256: fingerprint, DefaultBridge: "vmbr0", VMIDStart: 1000, VMIDEnd: 1999,
		ClonesPerNode: 2, ClonesPerStorage: 2, RequestTimeout: 10 * time.Second, Isolated: true,
		Settings: proxmox.ClusterSettings{ISOStorage: "local"},
	}, provider.Deps{Signer: signer})
	if err != nil {
		t.Fatal(err)
	}
	if info, err := p.Probe(ctx); err != nil || info.IsolationProblem != "" {
		t.Fatalf("Probe: %v, isolation problem %q", err, info.IsolationProblem)
	}

	a, b := vmSpec("job-a", "a", iso), vmSpec("job-b", "b", iso)
	progA, progB := startVM(ctx, t, p, a), startVM(ctx, t, p, b)
	resA, resB := running(ctx, t, p, a, progA), running(ctx, t, p, b, progB)
	vmA, vmB := vmidOf(t, resA.Progress.ID), vmidOf(t, resB.Progress.ID)
	addrB := resB.Addresses[0]
	for _, port := range []string{guestPort, sshCheckPort} {
		if _, err := sim.GuestStart(ctx, vmB, "/init", "serve", port); err != nil {
			t.Fatal(err)
		}
	}
	dial := func(vmid int, address string) (string, bool) {
		t.Helper()
		res, err := sim.GuestExec(ctx, vmid, "/init", "dial", address)
		if err != nil {
			t.Fatal(err)
		}
		return strings.TrimSpace(res.Stdout + res.Stderr), res.ExitCode == 0
	}
	// The control: B's servers run (B reaches itself: loopback is its own).
	waitFor(t, func() bool { _, ok := dial(vmB, "127.0.0.1:"+guestPort); return ok })

	for _, c := range []struct {
		what, address string
		reach         bool
	}{
		{"the agent server", hostPort(operator, agentServerPort), true},
		{"the cluster's DNS server", hostPort(operator, "53"), true},
		{"the template's proxy", hostPort(proxyHost, "3128"), true},
		{"the service the policy allows", hostPort(service, "8080"), true},
		{"the service's other port", hostPort(service, "8081"), false},
		{"the operator's metrics port", hostPort(operator, metricsPort), false},
		{"the operator's webhook port", hostPort(operator, webhookPort), false},
		{"the management address", hostPort(management, "22"), false},
		{"the other job's VM", net.JoinHostPort(addrB, guestPort), false},
		{"the other job's VM on the operator's check port", net.JoinHostPort(addrB, sshCheckPort), false},
	} {
		if out, ok := dial(vmA, c.address); ok != c.reach {
			t.Errorf("VM A reaches %s (%s): %v (%s), want %v", c.what, c.address, ok, out, c.reach)
		}
	}
	// Into a VM: the operator's check, nothing else.
	for _, c := range []struct {
		port  string
		reach bool
	}{{sshCheckPort, true}, {guestPort, false}} {
		conn, err := netns.Dial(gn.Netns, net.JoinHostPort(addrB, c.port), 3*time.Second)
		if conn != nil {
			_ = conn.Close()
		}
		if (err == nil) != c.reach {
			t.Errorf("the operator reaches VM B on port %s: %v, want %v", c.port, err, c.reach)
		}
	}

	// Spoofing. The controls: with its own address and MAC again, A
	// reaches the allowed service (the address or MAC, nothing else,
	// decided).
	allowed := hostPort(service, "8080")
	ownAddr := resA.Addresses[0] + "/24"
	for _, c := range []struct {
		tool, arg string
		reach     bool
	}{
		{"readdress", "10.78.0.120/24", false}, // inside the VM subnet, but B's or nobody's
		{"readdress", ownAddr, true},
		{"remac", "02:48:46:ff:02:0b", false},
		{"remac", a.Network.MACAddress, true},
	} {
		if res, err := sim.GuestExec(ctx, vmA, "/init", c.tool, c.arg); err != nil || res.ExitCode != 0 {
			t.Fatalf("%s %s: %+v, %v", c.tool, c.arg, res, err)
		}
		if out, ok := dial(vmA, allowed); ok != c.reach {
			t.Errorf("after %s %s, VM A reaches the allowed service: %v (%s), want %v", c.tool, c.arg, ok, out, c.reach)
		}
	}
	if t.Failed() {
		if rs, err := sim.FirewallRuleset(); err == nil {
			t.Logf("the simulator's ruleset:\n%s", rs.Ruleset)
		}
	}
}

// cluster is the HypervisorCluster the policy is compiled from.
func cluster() *hfv1.HypervisorCluster {
	return &hfv1.HypervisorCluster{
		ObjectMeta: metav1.ObjectMeta{Name: "lab"},
		Spec: hfv1.HypervisorClusterSpec{
			Provider: hfv1.ProviderProxmox,
			DNS:      &hfv1.ClusterDNSSettings{DNSSettings: hfv1.DNSSettings{Servers: []string{operator.String()}}},
			Network: &hfv1.ClusterNetworkSettings{
				VMSubnets:  []string{vmSubnet.String()},
				Validation: &hfv1.NetworkValidation{SSHTest: true, SSHPort: 2222},
				Isolation: &hfv1.NetworkIsolation{
					OperatorCIDRs:   []string{operator.String()},
					ManagementCIDRs: []string{management.String()},
					DefaultPolicy:   "web",
					Policies: []hfv1.IsolationPolicy{{Name: "web", Egress: []hfv1.EgressRule{
						{CIDRs: []string{service.String()}, Protocol: hfv1.IsolationTCP, Ports: []string{"8080"}},
					}}},
				},
			},
		},
	}
}

// template is the VMs' template: its proxy.
func template() *hfv1.HypervisorMachineTemplate {
	tmpl := &hfv1.HypervisorMachineTemplate{ObjectMeta: metav1.ObjectMeta{Namespace: "ci", Name: "debian"}}
	tmpl.Spec.Network.Proxy = &hfv1.ProxySettings{HTTPProxy: "http://" + hostPort(proxyHost, "3128")}
	return tmpl
}

func hostPort(a netip.Addr, port string) string { return net.JoinHostPort(a.String(), port) }

// newNetwork makes the namespace and bridge, its extra addresses, the
// DHCP server and a server at every address and port the test dials, each
// answering with its name.
func newNetwork(t *testing.T, dir string) *guestnet.Network {
	t.Helper()
	gn, err := guestnet.Create(fmt.Sprintf("hfiso%d", os.Getpid()), network)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = gn.Close() })
	for _, a := range []netip.Addr{management, service, proxyHost} {
		if out, err := exec.Command("ip", "-n", gn.Netns, "addr", "add", netip.PrefixFrom(a, network.Bits()).String(), "dev", guestnet.Bridge).CombinedOutput(); err != nil {
			t.Fatalf("ip addr add %s: %v: %s", a, err, out)
		}
	}
	dhcp, err := gn.StartDHCP(filepath.Join(dir), netip.MustParseAddr("10.78.0.100"), netip.MustParseAddr("10.78.0.119"), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(dhcp.Stop)
	for _, addr := range []string{
		hostPort(operator, agentServerPort), hostPort(operator, metricsPort), hostPort(operator, webhookPort), hostPort(operator, "53"),
		hostPort(management, "22"), hostPort(service, "8080"), hostPort(service, "8081"), hostPort(proxyHost, "3128"),
	} {
		ln, err := gn.Listen(addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = ln.Close() })
		netns.Announce(ln, addr)
	}
	return gn
}

// newSimulator starts the Proxmox simulator whose template boots tiny
// guests on the network's bridge.
func newSimulator(t *testing.T, dir string, gn *guestnet.Network) (*proxmoxsim.Simulator, *httptest.Server) {
	t.Helper()
	img := tinyguest.Build(t)
	disk := filepath.Join(dir, "disk.raw")
	if err := os.WriteFile(disk, make([]byte, 1<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg := proxmoxsim.DefaultConfig()
	cfg.AuthFailureDelay = 0
	cfg.Templates[0].GuestImage = &proxmoxsim.GuestImage{Disk: disk, Kernel: img.Kernel, Initrd: img.Initrd, Append: tinyguest.KernelCmdline}
	cfg.Templates[0].Cores, cfg.Templates[0].MemoryMiB = 1, 256
	cfg.Guest.WorkDir = filepath.Join(dir, "guests")
	cfg.Guest.QEMU.Network = &proxmoxsim.TapNetwork{Netns: gn.Netns, Bridge: guestnet.Bridge, HostAddress: gn.Host.String()}
	sim, err := proxmoxsim.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(sim)
	srv.EnableHTTP2 = false
	srv.StartTLS()
	t.Cleanup(func() {
		srv.Close()
		_ = sim.Close()
	})
	sim.SetFingerprint(proxmoxsim.FormatFingerprint(sha256.Sum256(srv.Certificate().Raw)))
	return sim, srv
}

// enableDatacenterFirewall is the platform team's step: Proxmox applies
// no VM rule before it.
func enableDatacenterFirewall(t *testing.T, srv *httptest.Server) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPut, srv.URL+"/api2/json/cluster/firewall/options", strings.NewReader("enable=1"))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Authorization", "PVEAPIToken=root@pam!sim=00000000-0000-0000-0000-000000000000")
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("enable the datacenter firewall: %s", resp.Status)
	}
}

// vmSpec is one job's VM, held to iso.
func vmSpec(name, n string, iso *provider.Isolation) *provider.VMSpec {
	uid := "9b1d0c2e-0000-4000-8000-00000000000" + n
	own := *iso
	return &provider.VMSpec{
		Owner:   provider.Owner{Namespace: "ci", Name: name, UID: uid, CreatedAt: time.Date(2026, 11, 29, 0, 0, 0, 0, time.UTC)},
		Name:    name,
		Source:  provider.TemplateSource{Linked: true, Settings: proxmox.TemplateRef{ID: 9000}},
		Network: provider.NetworkSpec{Bridge: "vmbr0", Model: "virtio", MACAddress: "02:48:46:ff:02:0" + n},
		CloudInit: provider.CloudInit{
			UserData:      []byte("#cloud-config\n{}\n"),
			MetaData:      []byte("instance-id: " + uid + "\nlocal-hostname: " + name + "\n"),
			NetworkConfig: []byte("version: 2\nethernets:\n  eth0:\n    dhcp4: true\n"),
		},
		Isolation: &own,
	}
}

// startVM drives EnsureVM until the VM boots, and returns its progress.
func startVM(ctx context.Context, t *testing.T, p provider.Provider, spec *provider.VMSpec) provider.Progress {
	t.Helper()
	return ensure(ctx, t, p, spec, provider.Progress{}, provider.PhaseBooting).Progress
}

// running drives EnsureVM until the VM runs with an address.
func running(ctx context.Context, t *testing.T, p provider.Provider, spec *provider.VMSpec, prog provider.Progress) *provider.EnsureResult {
	t.Helper()
	return ensure(ctx, t, p, spec, prog, provider.PhaseRunning)
}

func ensure(ctx context.Context, t *testing.T, p provider.Provider, spec *provider.VMSpec, prog provider.Progress, want provider.Phase) *provider.EnsureResult {
	t.Helper()
	for {
		res, err := p.EnsureVM(ctx, spec, prog)
		switch {
		case err != nil && provider.Classify(err) != provider.ClassTransient:
			t.Fatalf("EnsureVM(%s): %v", spec.Name, err)
		case err == nil:
			prog = res.Progress
			if res.Phase == want || (want == provider.PhaseBooting && res.Phase == provider.PhaseRunning) {
				return res
			}
		}
		select {
		case <-ctx.Done():
			t.Fatalf("EnsureVM(%s): not %s in time (last error %v)", spec.Name, want, err)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func vmidOf(t *testing.T, id provider.ID) int {
	t.Helper()
	var n int
	if _, err := fmt.Sscanf(strings.TrimPrefix(string(id), "proxmox://"), "%d", &n); err != nil {
		t.Fatalf("VM id %q: %v", id, err)
	}
	return n
}

// waitFor polls cond until it holds, failing the test after 30 s.
func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met in 30 s")
		}
		time.Sleep(200 * time.Millisecond)
	}
}

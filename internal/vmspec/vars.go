package vmspec

import (
	"cmp"
	"errors"
	"fmt"
	"net/netip"
	"net/url"
	"path"
	"slices"
	"time"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/agentconfig"
	"github.com/hyperfleet/hyperfleet/internal/agentserver"
	"github.com/hyperfleet/hyperfleet/internal/cloudinit"
	"github.com/hyperfleet/hyperfleet/internal/identity"
	"github.com/hyperfleet/hyperfleet/internal/ipam"
	"github.com/hyperfleet/hyperfleet/pkg/workload"
)

// AgentLocator finds the agent binary the operator serves to VMs whose
// template has spec.bootstrap.agentSource Operator (internal/agentserver's
// Server). Its binaries are fixed for the life of the process; its CA may
// arrive after the start (CAError).
type AgentLocator interface {
	// Lookup returns the download URL and SHA-256 of the agent for a
	// runner os and arch in the CI platform's naming (linux, x64); ok is
	// false when no such binary is served.
	Lookup(os, arch string) (url, sha256 string, ok bool)
	// CA is the PEM CA bundle VMs trust for the download, empty for their
	// system roots.
	CA() string
	// CAError is why the CA VMs should trust is not read yet (its file is
	// missing or holds no certificate); nil once it is, or without one.
	CAError() error
}

// StaticAddr is a claim's address in network mode static, with its pool.
type StaticAddr struct {
	IP   netip.Addr
	Pool *ipam.Pool
}

// Pools are the pools of addrs, in order.
func Pools(addrs []StaticAddr) []*ipam.Pool {
	var out []*ipam.Pool
	for _, a := range addrs {
		out = append(out, a.Pool)
	}
	return out
}

// TemplateVars are the cloud-init variables every VM of a template shares.
// ClaimVars adds the per-VM ones; the template hash renders these alone, so
// both paths must build them here. pools are the template's IPPools in
// spec order (network mode static): one, or an IPv4 and an IPv6 one.
func TemplateVars(ws *workload.Backends, tmpl *hfv1.HypervisorMachineTemplate, cluster *hfv1.HypervisorCluster, pools []*ipam.Pool) cloudinit.Vars {
	spec := tmpl.Spec
	v := cloudinit.Vars{
		NetworkMode:      cmp.Or(string(spec.Network.Mode), cloudinit.NetworkDHCP),
		PowerOffOnFinish: true,
	}
	if g := spec.Guest; g != nil && g.OS == hfv1.GuestWindows {
		// cloudbase-init's user data and the agent's Windows paths
		// (internal/cloudinit's windowsUserData, docs/windows.md).
		v.GuestOS = cloudinit.GuestWindows
	}
	if g := spec.Guest; g != nil {
		// The agent's refusal of an escalating job user
		// (internal/agent/harden.go).
		v.JobMayEscalate = g.JobMayEscalate
	}
	if v.NetworkMode == cloudinit.NetworkDHCP {
		v.DHCPClientIdentifier = cloudinit.DHCPIdentifierMAC
		v.SendHostname = true
		if d := spec.Network.DHCP; d != nil {
			v.DHCPClientIdentifier = cmp.Or(string(d.ClientIdentifier), cloudinit.DHCPIdentifierMAC)
			if d.SendHostname != nil {
				v.SendHostname = *d.SendHostname
			}
			v.IPv6 = d.IPv6
			v.RequestStaticLease = d.RequestStaticLease
			if d.LeaseTime != nil {
				v.DHCPLeaseSeconds = int(d.LeaseTime.Seconds())
			}
		}
	}
	dns := DNS(cluster, tmpl)
	v.DNSServers = cloudinit.List(dns.Servers)
	v.SearchDomains = cloudinit.List(dns.Search)
	if p := spec.Network.Proxy; p != nil {
		v.HTTPProxy, v.HTTPSProxy, v.NoProxy = p.HTTPProxy, p.HTTPSProxy, cloudinit.List(slices.Clone(p.NoProxy))
	}
	if v.NetworkMode == cloudinit.NetworkStatic {
		setPoolVars(&v, pools)
	}

	v.AttestationMethod = cmp.Or(string(spec.Attestation.Method), cloudinit.AttestationNone)
	v.SPIFFEEnabled = v.AttestationMethod != cloudinit.AttestationNone
	v.WorkloadMethod = cloudinit.WorkloadDirect
	if v.SPIFFEEnabled {
		v.WorkloadMethod = cloudinit.WorkloadBroker
	}
	if c := cluster.Spec.SPIRE; v.SPIFFEEnabled && c != nil {
		// Part of the template's hash: a VM built for another trust
		// domain or server is out of date.
		v.TrustDomain, v.SPIREServerAddress = c.TrustDomain, c.ServerAddress
		if c.SecretStore != nil {
			store := identity.StoreSettings(c.SecretStore)
			v.SecretStore = &store
		}
	}
	if spec.Attestation.Method == hfv1.AttestationTPM {
		// The API server defaults devicePath only inside a tpm block; a
		// template with method tpm and none gets the same default.
		v.TPMDevicePath = hfv1.DefaultTPMDevicePath
		if tpm := spec.Attestation.TPM; tpm != nil && tpm.DevicePath != "" {
			v.TPMDevicePath = tpm.DevicePath
		}
	}
	v.BootstrapMethod = cmp.Or(string(spec.Bootstrap.Method), cloudinit.BootstrapJITConfig)
	// The runner part is the CI platform's: its back-end reads it from
	// the template, defaults and resolved release included.
	be, t, ok := ws.Template(tmpl)
	if ok && !workload.HasRunner(be) {
		// No runner and no credential: the agent runs the template's
		// script (docs/generic.md).
		v.Platform, v.GenericScript, v.BootstrapMethod = cloudinit.PlatformGeneric, t.Script, ""
	}
	if ok && t.AgentPlatform != "" {
		// A platform of its own runner kind and credential
		// (workload.Template.AgentPlatform).
		v.Platform, v.BootstrapMethod = t.AgentPlatform, t.BootstrapMethod
	}
	v.RegistrationURL = t.RegistrationURL
	v.RunnerGroup = t.RunnerGroup
	rs := t.Runner
	v.RunnerConfig = cloudinit.RunnerConfig{
		InstallPath: rs.InstallPath, WorkDir: rs.WorkDir, ConfigScript: rs.ConfigScript, RunScript: rs.RunScript,
		OS: rs.OS, Arch: rs.Arch, DownloadURL: rs.DownloadURL, DownloadSHA256: rs.DownloadSHA256,
	}
	return v
}

// setPoolVars sets the subnet settings of a static VM's pools: a dual-stack
// VM's IPv4 pool fills NetmaskBits and Gateway and its IPv6 pool
// NetmaskBitsIPv6 and GatewayIPv6; a single pool, of either family, the
// first two. The template's or cluster's DNS settings win where given;
// otherwise the pools' nameservers and search domains are used, IPv4
// pool's first.
func setPoolVars(v *cloudinit.Vars, pools []*ipam.Pool) {
	pools = slices.DeleteFunc(slices.Clone(pools), func(p *ipam.Pool) bool { return p == nil })
	dual := isDualStack(pools)
	if dual {
		pools = orderedByFamily(pools)
	}
	dns, search := len(v.DNSServers) == 0, len(v.SearchDomains) == 0
	for i, pool := range pools {
		gw := ""
		if g := pool.Gateway(); g.IsValid() {
			gw = g.String()
		}
		if dual && i == 1 {
			v.NetmaskBitsIPv6, v.GatewayIPv6 = pool.Prefix(), gw
		} else {
			v.NetmaskBits, v.Gateway = pool.Prefix(), gw
		}
		for _, ns := range pool.Nameservers {
			if dns && !slices.Contains(v.DNSServers, ns.String()) {
				v.DNSServers = append(v.DNSServers, ns.String())
			}
		}
		for _, d := range pool.SearchDomains {
			if search && !slices.Contains(v.SearchDomains, d) {
				v.SearchDomains = append(v.SearchDomains, d)
			}
		}
	}
}

// isDualStack reports whether pools are an IPv4 and an IPv6 pool (the
// template check refuses two of one family).
func isDualStack(pools []*ipam.Pool) bool {
	return len(pools) == 2 && pools[0].Family != pools[1].Family
}

// orderedByFamily puts the IPv4 pool first.
func orderedByFamily(pools []*ipam.Pool) []*ipam.Pool {
	if len(pools) == 2 && pools[1].Family == ipam.IPv4 {
		return []*ipam.Pool{pools[1], pools[0]}
	}
	return pools
}

// ClaimVars adds a claim's per-VM values to its template's variables.
// addrs are its static addresses, one per pool of its template, in spec
// order.
func ClaimVars(ws *workload.Backends, claim *hfv1.MachineClaim, tmpl *hfv1.HypervisorMachineTemplate, cluster *hfv1.HypervisorCluster, addrs []StaticAddr) cloudinit.Vars {
	v := TemplateVars(ws, tmpl, cluster, Pools(addrs))
	for _, a := range addrs {
		switch {
		case !a.IP.IsValid():
		case len(addrs) == 2 && a.IP.Is6() && v.NetmaskBitsIPv6 > 0:
			v.StaticIPv6 = a.IP.String()
		default:
			v.StaticIP = a.IP.String()
		}
	}
	v.Hostname = Hostname(claim, tmpl.Spec.Network.Hostname)
	v.FQDN = FQDN(v.Hostname, DNS(cluster, tmpl).Domain)
	v.InstanceID = string(claim.UID)
	v.MACAddress = MAC(string(claim.UID))
	v.RunnerName = DefaultRunnerName(claim, v.Hostname)
	v.Claim = agentconfig.ClaimRef{Namespace: claim.Namespace, Name: claim.Name, UID: string(claim.UID)}
	if deadline, ok := Deadline(ws, claim, tmpl); ok {
		v.Deadline = cloudinit.Time{Time: deadline}
	}
	if be, ok := ws.Claim(claim, tmpl); ok {
		// The runner the claim asks for itself (spec.workloadConfig).
		cr := be.Claim(claim)
		if cr.Name != "" {
			v.RunnerName = cr.Name
		}
		v.Labels = cloudinit.List(cr.Labels)
		if cr.Group != "" {
			v.RunnerGroup = cr.Group
		}
		// The job the claim was made for (Buildkite only; Render refuses
		// it on another platform).
		v.AcquireJob = cr.Job
	}
	return v
}

// Deadline is when a claim of a NoRunner back-end (generic) has lived its
// template's ttl (spec.bootstrap.generic.ttl from the claim's creation):
// the operator ends the claim then, and its VM's agent powers off; false
// for a claim whose VM runs a CI platform's runner.
func Deadline(ws *workload.Backends, claim *hfv1.MachineClaim, tmpl *hfv1.HypervisorMachineTemplate) (time.Time, bool) {
	be, ok := ws.Claim(claim, tmpl)
	if !ok || workload.HasRunner(be) {
		return time.Time{}, false
	}
	t, ok := be.Template(tmpl)
	if !ok || t.TTL <= 0 {
		return time.Time{}, false
	}
	return claim.CreationTimestamp.Add(t.TTL), true
}

// RunnerName is the runner name a claim's VM registers with, as
// ClaimVars renders it: the name the claim asks for itself, else its host
// name with the first 8 hex digits of its UID. The pool matches job
// records to claims by it after the claim forgot its runner.
func RunnerName(ws *workload.Backends, claim *hfv1.MachineClaim, tmpl *hfv1.HypervisorMachineTemplate) string {
	if be, ok := ws.Claim(claim, tmpl); ok {
		if cr := be.Claim(claim); cr.Name != "" {
			return cr.Name
		}
	}
	return DefaultRunnerName(claim, Hostname(claim, tmpl.Spec.Network.Hostname))
}

// SetAgentVars fills the agent download variables of a template whose
// agentSource is Operator, for the runner os and arch v already holds;
// other templates keep them empty, so their cloud-init (and hash) does not
// change when an agent server is configured. The error says what to fix;
// the template controller reports it as AgentUnavailable.
func SetAgentVars(ws *workload.Backends, tmpl *hfv1.HypervisorMachineTemplate, agent AgentLocator, v *cloudinit.Vars) error {
	if tmpl.Spec.Bootstrap.AgentSource != hfv1.AgentSourceOperator {
		return nil
	}
	goos, arch := v.RunnerConfig.OS, v.RunnerConfig.Arch
	name, err := agentserver.FileName(goos, arch)
	if err != nil {
		_, t, _ := ws.Template(tmpl)
		return fmt.Errorf("spec.bootstrap.agentSource is Operator, but %w (%s.runner.os and arch); for another platform build the agent into the template and use agentSource Image", err, t.Field)
	}
	if agent == nil {
		return fmt.Errorf("spec.bootstrap.agentSource is Operator, but this operator serves no agent binaries: start the manager with --agent-server-addr, --agent-server-url, --agent-server-cert and --agent-server-key, and --agent-binaries-dir naming a directory with %s; or use agentSource Image with the agent at %s in the template",
			name, cloudinit.AgentBinary)
	}
	u, sum, ok := agent.Lookup(goos, arch)
	if !ok {
		return fmt.Errorf("spec.bootstrap.agentSource is Operator, but the operator's agent server has no %s (for runner os %s, arch %s): put that file into the manager's --agent-binaries-dir and restart the manager",
			name, goos, arch)
	}
	if err := agent.CAError(); err != nil {
		// A VM given no CA would not trust the server: wait for it (the
		// template is checked again within a minute).
		return fmt.Errorf("spec.bootstrap.agentSource is Operator, but %w: put the CA (PEM) in the file --agent-server-ca names (the chart: ca.crt of the agent server's TLS Secret)", err)
	}
	v.AgentDownloadURL, v.AgentSHA256, v.AgentCA = u, sum, agent.CA()
	// The directory of the binaries, for templates that fetch files of
	// their own from it ({{ .BootstrapServiceURL }}/<file>, docs/cloud-init.md
	// "Variables").
	if parsed, err := url.Parse(u); err == nil {
		parsed.RawQuery = ""
		parsed.Path = path.Dir(parsed.Path)
		parsed.RawPath = ""
		v.BootstrapServiceURL = parsed.String()
	}
	return nil
}

// ErrRender marks cloud-init the user's template cannot render: a
// configuration error, not a hypervisor one.
var ErrRender = errors.New("render cloud-init")

// Input is what cloudinit.Render renders for a VM of tmpl with vars: the
// template's own cloud-init documents, if any.
func Input(tmpl *hfv1.HypervisorMachineTemplate, vars cloudinit.Vars) cloudinit.Input {
	in := cloudinit.Input{Vars: vars}
	if ci := tmpl.Spec.CloudInit; ci != nil {
		in.UserData, in.NetworkData, in.MetaData = ci.UserData, ci.NetworkData, ci.MetaData
	}
	return in
}

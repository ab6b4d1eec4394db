package controller

import (
	"fmt"
	"net/netip"
	"net/url"
	"path"
	"strings"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/agentserver"
	"github.com/hyperfleet/hyperfleet/internal/cloudinit"
	"github.com/hyperfleet/hyperfleet/internal/ipam"
)

// AgentLocator finds the agent binary the operator serves to VMs whose
// template has spec.bootstrap.agentSource Operator (internal/agentserver's
// Server). It is fixed for the life of the process.
type AgentLocator interface {
	// Lookup returns the download URL and SHA-256 of the agent for a
	// runner os and arch in GitHub's naming (linux, x64); ok is false when
	// no such binary is served.
	Lookup(os, arch string) (url, sha256 string, ok bool)
	// CA is the PEM CA bundle VMs trust for the download, empty for their
	// system roots.
	CA() string
}

// Runner software defaults, the same as the CRD's, for objects created
// before a default existed.
const (
	defaultInstallPath  = "/opt/actions-runner"
	defaultWorkDir      = "/var/lib/hyperfleet/work"
	defaultConfigScript = "config.sh"
	defaultRunScript    = "run.sh"
)

// templateVars are the cloud-init variables every VM of a template shares.
// The MachineClaim controller adds the per-VM ones (claimVars); the template
// hash renders these alone, so both paths must build them here.
// staticAddr is a claim's address in network mode static, with its pool.
type staticAddr struct {
	ip   netip.Addr
	pool *ipam.Pool
}

func templateVars(tmpl *hfv1.HypervisorMachineTemplate, cluster *hfv1.HypervisorCluster, pool *ipam.Pool) cloudinit.Vars {
	spec := tmpl.Spec
	v := cloudinit.Vars{
		NetworkMode:      orDefault(string(spec.Network.Mode), cloudinit.NetworkDHCP),
		PowerOffOnFinish: true,
	}
	if v.NetworkMode == cloudinit.NetworkDHCP {
		v.DHCPClientIdentifier = cloudinit.DHCPIdentifierMAC
		v.SendHostname = true
		if d := spec.Network.DHCP; d != nil {
			v.DHCPClientIdentifier = orDefault(string(d.ClientIdentifier), cloudinit.DHCPIdentifierMAC)
			if d.SendHostname != nil {
				v.SendHostname = *d.SendHostname
			}
			v.IPv6 = d.IPv6
		}
	}
	dns := effectiveDNS(cluster, tmpl)
	v.DNSServers = cloudinit.List(dns.Servers)
	v.SearchDomains = cloudinit.List(dns.Search)
	if v.NetworkMode == cloudinit.NetworkStatic && pool != nil {
		// The pool's subnet settings; the template's or cluster's DNS
		// settings win where given.
		v.NetmaskBits = pool.Prefix()
		if gw := pool.Gateway(); gw.IsValid() {
			v.Gateway = gw.String()
		}
		if len(v.DNSServers) == 0 {
			for _, ns := range pool.Nameservers {
				v.DNSServers = append(v.DNSServers, ns.String())
			}
		}
		if len(v.SearchDomains) == 0 {
			v.SearchDomains = cloudinit.List(pool.SearchDomains)
		}
	}

	v.AttestationMethod = orDefault(string(spec.Attestation.Method), cloudinit.AttestationNone)
	v.SPIFFEEnabled = v.AttestationMethod != cloudinit.AttestationNone
	v.WorkloadMethod = cloudinit.WorkloadDirect
	if v.SPIFFEEnabled {
		v.WorkloadMethod = cloudinit.WorkloadBroker
	}
	if tpm := spec.Attestation.TPM; tpm != nil {
		v.TPMDevicePath = tpm.DevicePath
	}
	v.BootstrapMethod = orDefault(string(spec.Bootstrap.Method), cloudinit.BootstrapJITConfig)
	gh := spec.Bootstrap.GitHub
	v.RegistrationURL = registrationURL(gh)
	v.RunnerGroup = gh.RunnerGroup
	rc := cloudinit.RunnerConfig{
		InstallPath: defaultInstallPath, WorkDir: defaultWorkDir,
		ConfigScript: defaultConfigScript, RunScript: defaultRunScript, OS: "linux", Arch: "x64",
	}
	if r := gh.Runner; r != nil {
		rc.InstallPath = orDefault(r.InstallPath, rc.InstallPath)
		rc.WorkDir = orDefault(r.WorkDir, rc.WorkDir)
		rc.ConfigScript = orDefault(r.ConfigScript, rc.ConfigScript)
		rc.RunScript = orDefault(r.RunScript, rc.RunScript)
		rc.OS = orDefault(string(r.OS), rc.OS)
		rc.Arch = orDefault(string(r.Arch), rc.Arch)
		rc.DownloadURL = strings.NewReplacer("{os}", rc.OS, "{arch}", rc.Arch).Replace(r.DownloadURL)
		rc.DownloadSHA256 = r.DownloadSHA256
		if rr := tmpl.Status.Runner; r.Version != "" && rr != nil {
			// Resolved by the template controller from the release.
			rc.DownloadURL, rc.DownloadSHA256 = rr.DownloadURL, rr.DownloadSHA256
		}
	}
	v.RunnerConfig = rc
	return v
}

// claimVars adds a claim's per-VM values to its template's variables.
func claimVars(claim *hfv1.MachineClaim, tmpl *hfv1.HypervisorMachineTemplate, cluster *hfv1.HypervisorCluster, addr staticAddr) cloudinit.Vars {
	v := templateVars(tmpl, cluster, addr.pool)
	if addr.ip.IsValid() {
		v.StaticIP = addr.ip.String()
	}
	v.Hostname = hostnameFor(claim, tmpl.Spec.Network.Hostname)
	v.FQDN = fqdnFor(v.Hostname, effectiveDNS(cluster, tmpl).Domain)
	v.InstanceID = string(claim.UID)
	v.MACAddress = macFor(string(claim.UID))
	v.RunnerName = runnerNameFor(claim, v.Hostname)
	if wc := claim.Spec.WorkloadConfig; wc != nil && wc.GitHub != nil {
		if wc.GitHub.RunnerName != "" {
			v.RunnerName = wc.GitHub.RunnerName
		}
		v.Labels = cloudinit.List(wc.GitHub.Labels)
		if wc.GitHub.RunnerGroup != "" {
			v.RunnerGroup = wc.GitHub.RunnerGroup
		}
	}
	return v
}

// registrationURL is where runners register: the runnerURLs template for
// the template's scope, or GitHub's web URL derived from apiBaseURL.
func registrationURL(gh hfv1.GitHubBootstrap) string {
	repo := gh.Repository
	owner := gh.Owner
	if u := gh.RunnerURLs; u != nil {
		r := strings.NewReplacer("{owner}", owner, "{repo}", repo)
		if repo != "" && u.Repository != "" {
			return r.Replace(u.Repository)
		}
		if repo == "" && u.Organization != "" {
			return r.Replace(u.Organization)
		}
	}
	web := "https://github.com"
	if api := strings.TrimRight(gh.APIBaseURL, "/"); api != "" && api != "https://api.github.com" {
		// GitHub Enterprise Server serves its API under /api/v3.
		web = strings.TrimSuffix(api, "/api/v3")
	}
	if repo != "" {
		return web + "/" + owner + "/" + repo
	}
	return web + "/" + owner
}

// setAgentVars fills the agent download variables of a template whose
// agentSource is Operator, for the runner os and arch v already holds;
// other templates keep them empty, so their cloud-init (and hash) does not
// change when an agent server is configured. The error says what to fix;
// the template controller reports it as AgentUnavailable.
func setAgentVars(tmpl *hfv1.HypervisorMachineTemplate, agent AgentLocator, v *cloudinit.Vars) error {
	if tmpl.Spec.Bootstrap.AgentSource != hfv1.AgentSourceOperator {
		return nil
	}
	goos, arch := v.RunnerConfig.OS, v.RunnerConfig.Arch
	name, err := agentserver.FileName(goos, arch)
	if err != nil {
		return fmt.Errorf("spec.bootstrap.agentSource is Operator, but %w (spec.bootstrap.github.runner.os and arch); for another platform build the agent into the template and use agentSource Image", err)
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

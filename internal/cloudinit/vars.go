package cloudinit

import (
	"cmp"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"regexp"
	"strings"
	"time"

	"github.com/hyperfleet/hyperfleet/internal/agentconfig"
)

// Network modes (Vars.NetworkMode), as in spec.network.mode.
const (
	NetworkDHCP      = "dhcp"
	NetworkStatic    = "static"
	NetworkCloudInit = "cloud-init"
)

// maxLeaseSeconds bounds Vars.DHCPLeaseSeconds: a week, as
// spec.network.dhcp.leaseTime's CRD bound.
const maxLeaseSeconds = 7 * 24 * 3600

// DHCP client identifiers (Vars.DHCPClientIdentifier), as in
// spec.network.dhcp.clientIdentifier.
const (
	DHCPIdentifierMAC      = "mac"
	DHCPIdentifierHostname = "hostname"
)

// Attestation methods (Vars.AttestationMethod), as in spec.attestation.method.
const (
	AttestationNone      = "none"
	AttestationJoinToken = "join-token"
	AttestationTPM       = "tpm"
)

// Workload methods (Vars.WorkloadMethod): how the runner credential reaches
// the VM. See agentconfig.WorkloadMethod.
const (
	WorkloadDirect = "direct"
	WorkloadBroker = "broker"
)

// PlatformGeneric (Vars.Platform) is no CI platform: the agent runs
// GenericScript. The CI platforms' names are their own
// (agentconfig.PlatformSpec, registered by pkg/workload/<platform>/...).
const PlatformGeneric = string(agentconfig.PlatformGeneric)

// BootstrapJITConfig is the credential method of a template that names
// none (spec.bootstrap.method's default), for internal/vmspec; a platform's
// own methods are its back-end's (workload.Template.BootstrapMethod).
const BootstrapJITConfig = string(agentconfig.BootstrapJITConfig)

// Vars are the variables a template's spec.cloudInit.userData, networkData
// and metaData see (as {{ .Hostname }} and so on), and the input of the
// operator's own cloud-init. The MachineClaim controller fills them for one
// VM; Canonical gives the per-template form used for the drift hash.
//
// Field comments say where a value comes from and whether it is per-VM
// (zeroed by Canonical). Values are raw: a template that puts them into
// YAML or JSON should use quote or toJson.
type Vars struct {
	// Hostname is the VM's host name, a DNS label (the claim's name). Per-VM.
	Hostname string
	// FQDN is Hostname.<dns domain>, empty without a domain. Per-VM.
	FQDN string
	// InstanceID is the cloud-init instance-id (the claim's UID); a new one
	// makes cloud-init run its per-instance modules in a clone. Per-VM.
	InstanceID string

	// NetworkMode is dhcp, static or cloud-init (spec.network.mode).
	NetworkMode string
	// MACAddress is the first NIC's MAC address; network-config matches the
	// interface by it. Per-VM.
	MACAddress string
	// DHCPClientIdentifier is mac (default when empty) or hostname
	// (spec.network.dhcp.clientIdentifier); dhcp mode.
	DHCPClientIdentifier string
	// SendHostname sends Hostname with DHCP requests so DHCP-driven DNS can
	// register it; dhcp mode.
	SendHostname bool
	// IPv6 also asks for IPv6 (DHCPv6 and router advertisements); dhcp mode.
	IPv6 bool
	// RequestStaticLease asks for the address the DHCP server reserves for
	// Hostname: the DHCP client sends it as host name and as client
	// identifier (spec.network.dhcp.requestStaticLease); dhcp mode.
	RequestStaticLease bool
	// DHCPLeaseSeconds is the lease time the DHCP client asks for (option
	// 51, spec.network.dhcp.leaseTime), 0 for the server's; dhcp mode.
	DHCPLeaseSeconds int
	// StaticIP is the address allocated from the IPPool, without prefix
	// length; static mode. A dual-stack VM's IPv4 address. Per-VM.
	StaticIP string
	// NetmaskBits is the prefix length of StaticIP (the IPPool's prefix).
	NetmaskBits int
	// Gateway is the IPPool's default gateway for StaticIP's family.
	Gateway string
	// StaticIPv6 is a dual-stack VM's IPv6 address, without prefix length
	// (spec.network.ipPoolRefs with an IPv4 and an IPv6 pool; StaticIP is
	// then the IPv4 one); empty for a VM of one pool, whatever its family.
	// Per-VM.
	StaticIPv6 string
	// NetmaskBitsIPv6 is the prefix length of StaticIPv6 (its IPPool's
	// prefix).
	NetmaskBitsIPv6 int
	// GatewayIPv6 is the IPv6 pool's default gateway of a dual-stack VM.
	GatewayIPv6 string
	// DNSServers are the resolvers, in order. Printed with {{ .DNSServers }}
	// they form a JSON (and YAML flow) list.
	DNSServers List
	// SearchDomains are the DNS search domains, in order.
	SearchDomains List
	// HTTPProxy and HTTPSProxy are the template's spec.network.proxy, the
	// proxies of http:// and https:// URLs (scheme://host:port); NoProxy
	// are the hosts the template reaches directly. The agent, the runner,
	// apt and login shells use them, with the operator's own endpoints
	// added to NoProxy (docs/templates.md, "Proxy"). Empty: no proxy.
	HTTPProxy  string
	HTTPSProxy string
	NoProxy    List

	// SPIFFEEnabled is true when the VM attests with SPIRE (attestation
	// method join-token or tpm).
	SPIFFEEnabled bool
	// AttestationMethod is none, join-token or tpm (spec.attestation.method).
	AttestationMethod string
	// SPIFFEID is the VM's SPIFFE ID,
	// spiffe://<trust domain>/vm/<namespace>/<claim>/<uid>. Per-VM.
	SPIFFEID string
	// TrustDomain is the SPIFFE trust domain, such as hyperfleet.io.
	TrustDomain string
	// TrustBundle is the SPIRE server's PEM CA bundle. Zeroed by Canonical:
	// it rotates on its own schedule, not with the template.
	TrustBundle string
	// SPIREServerAddress is the SPIRE server, host:port.
	SPIREServerAddress string
	// TPMDevicePath is the TPM device inside the VM (tpm), such as /dev/tpmrm0.
	TPMDevicePath string
	// BrokerURL is the https:// URL of the operator's credential broker
	// (broker workload method).
	BrokerURL string
	// BrokerCA is the PEM CA bundle the VM trusts for BrokerURL, empty for
	// its system roots.
	BrokerCA string
	// SecretStore is where the VM reads its runner credential instead of
	// asking the broker (spiffe.secretStore in agent.json; BrokerURL and
	// BrokerCA are then empty): a Vault or OpenBao server it logs in to
	// with a JWT-SVID. Its address, mounts and audience are the template's;
	// its role, path and CA bundle come from the three fields below. Nil:
	// the broker.
	SecretStore *agentconfig.SecretStore
	// SecretStoreRole and SecretStorePath are the VM's own login role and
	// credential path in SecretStore. Per-VM.
	SecretStoreRole string
	SecretStorePath string
	// SecretStoreCA is the PEM CA bundle the VM trusts for SecretStore,
	// empty for its system roots. Zeroed by Canonical: it rotates on its
	// own schedule, not with the template.
	SecretStoreCA string

	// WorkloadMethod is direct (the runner credential is placed in the
	// running VM) or broker (fetched after attestation); broker exactly
	// when SPIFFEEnabled.
	WorkloadMethod string
	// Platform is what the VM's agent runs: a registered CI platform
	// (agentconfig.PlatformSpec; empty is the default one, GitHub Actions)
	// or generic (GenericScript, until Deadline).
	Platform string
	// GuestOS is the VM's operating system (spec.guest.os): "" or linux
	// (cloud-init), or windows (cloudbase-init: the user data is MIME
	// multipart with a cloud-config and a PowerShell part,
	// docs/windows.md). Per-template.
	GuestOS string
	// GenericScript is a generic template's spec.bootstrap.generic.script
	// (Platform generic); not a secret.
	GenericScript string
	// ScriptUser is the user a generic VM's agent runs GenericScript as
	// (agentconfig.Generic.User), the one the VM's SPIRE registration
	// entry selects by name. Per-VM: the claim controller sets both from
	// one value.
	ScriptUser string
	// Claim names the VM's MachineClaim (namespace, name, uid). Per-VM.
	Claim agentconfig.ClaimRef
	// Deadline is when a generic VM's ttl ends: its claim's creation plus
	// spec.bootstrap.generic.ttl; printed in RFC 3339, empty for other
	// platforms. Per-VM.
	Deadline Time

	// BootstrapMethod is jit-config or runner-token (spec.bootstrap.method);
	// empty for Platform generic, which has no runner credential.
	// The credential itself is never a variable: it reaches the running VM
	// only (agentconfig.GuestSecrets), never its seed.
	BootstrapMethod string
	// RegistrationURL is the URL the runner registers to, such as
	// https://github.com/octo-org/octo-repo (spec.bootstrap.github.runnerURLs
	// expanded).
	RegistrationURL string
	// RunnerName is the runner's name on GitHub. Per-VM.
	RunnerName string
	// Labels are the runner's labels. Per-claim (zeroed by Canonical).
	Labels List
	// RunnerGroup is the organization runner group. Per-claim (zeroed by
	// Canonical, a claim may override the template's group).
	RunnerGroup string
	// AcquireJob is the Buildkite job (UUID) the claim was made for
	// (spec.workloadConfig.buildkite.jobID): the VM's agent takes a job
	// acquisition token (BootstrapJobToken) and runs buildkite-agent with
	// --acquire-job. Platform buildkite only. Per-claim (zeroed by
	// Canonical).
	AcquireJob string
	// ExpiresAt is when the join token handed to the VM expires (broker
	// mode); printed in RFC 3339, empty when unknown. Per-VM.
	ExpiresAt Time
	// SecretsDeadline is until when the VM's agent waits for the secrets
	// the operator places in the running VM (agentconfig's
	// secretsDeadline); printed in RFC 3339. Per-VM.
	SecretsDeadline Time
	// RunnerConfig is the runner software (spec.bootstrap.github.runner,
	// with defaults applied).
	RunnerConfig RunnerConfig
	// PowerOffOnFinish powers the VM off when its runner exits.
	PowerOffOnFinish bool
	// JobMayEscalate is the template's spec.guest.jobMayEscalate: the
	// agent runs the job even where the job user can become root and the
	// credential serves more than one job (agentconfig jobMayEscalate).
	JobMayEscalate bool
	// PowerOffNotify, when set, is where the agent announces its power-off
	// (the operator's agent server) with this claim's token
	// (docs/architecture.md, "Power-off hints"). Per-VM.
	PowerOffNotify *agentconfig.PowerOffNotify

	// AgentDownloadURL is the https:// URL of the agent binary on the
	// operator's agent server (spec.bootstrap.agentSource Operator);
	// HyperFleet's cloud-config then downloads it to AgentBinary at first
	// boot and installs it only if its SHA-256 is AgentSHA256. Empty: the
	// image has the agent (agentSource Image).
	AgentDownloadURL string
	// AgentSHA256 is the agent binary's SHA-256 (64 lower-case hex digits);
	// set exactly with AgentDownloadURL.
	AgentSHA256 string
	// AgentCA is the PEM CA bundle the VM trusts for AgentDownloadURL,
	// empty for the image's system roots. Zeroed by Canonical: it rotates
	// on its own schedule, not with the template.
	AgentCA string

	// BootstrapServiceURL is where a template that downloads the agent
	// itself at boot fetches it from: with agentSource Operator the agent
	// server's directory of binaries, such as
	// https://hyperfleet-agent.hyperfleet-system.svc:9443/agent/v1, holding
	// hyperfleet-agent-linux-amd64 and its .sha256. HyperFleet's own
	// cloud-config uses AgentDownloadURL instead.
	BootstrapServiceURL string
	// BootstrapServiceBinary is the agent binary when the operator is set
	// up to embed it, else empty. Use it only as {{ .BootstrapServiceBinary
	// | base64 }} with encoding: b64; baking the agent into the image is
	// better.
	BootstrapServiceBinary Bytes

	// canonical is set by Canonical: per-VM values may then be empty.
	canonical bool
}

// RunnerConfig is the runner software, as in spec.bootstrap.github.runner.
type RunnerConfig struct {
	// DownloadURL is the runner package URL with {os} and {arch} replaced;
	// empty when the runner is installed in the image.
	DownloadURL string
	// DownloadSHA256 is the package's SHA-256 (64 hex digits).
	DownloadSHA256 string
	// InstallPath is where the runner lives, such as /opt/actions-runner.
	InstallPath string
	// WorkDir is the job working directory.
	WorkDir string
	// ConfigScript is the registration script, such as config.sh.
	ConfigScript string
	// RunScript is the run script, such as run.sh.
	RunScript string
	// OS is linux, win or osx.
	OS string
	// Arch is x64, arm64 or arm.
	Arch string
}

// DownloadUrl is DownloadURL under the spelling existing templates use
// ({{ .RunnerConfig.DownloadUrl }}, docs/cloud-init.md "Variables").
//
//nolint:revive,staticcheck // users' templates already use this spelling
func (r RunnerConfig) DownloadUrl() string { return r.DownloadURL }

// List is a list of strings that prints as a JSON array, so that
// {{ .DNSServers }} gives ["192.0.2.53","192.0.2.54"], which is also a YAML
// flow sequence. range, index, len and join work on it as on any slice.
type List []string

// String formats the list as a JSON array.
func (l List) String() string {
	if l == nil {
		return "[]"
	}
	b, err := json.Marshal([]string(l))
	if err != nil { // cannot happen for strings
		return "[]"
	}
	return string(b)
}

// Time is a point in time that prints in RFC 3339 (UTC), and as the empty
// string when zero.
type Time struct{ time.Time }

// String formats t in RFC 3339, or "" when t is zero.
func (t Time) String() string {
	if t.IsZero() {
		return ""
	}
	return t.UTC().Format(time.RFC3339)
}

// MarshalJSON encodes t as an RFC 3339 string, or "" when zero.
func (t Time) MarshalJSON() ([]byte, error) { return json.Marshal(t.String()) }

// Bytes is binary content for templates. It can be passed to base64 but not
// printed or ranged over, which keeps a large binary from being expanded by
// accident.
type Bytes struct{ b []byte }

// NewBytes wraps b.
func NewBytes(b []byte) Bytes { return Bytes{b: b} }

// Len is the number of bytes.
func (b Bytes) Len() int { return len(b.b) }

// String describes the content instead of printing it.
func (b Bytes) String() string { return fmt.Sprintf("<%d bytes; use base64>", len(b.b)) }

// Canonical returns v with every per-VM, per-claim and per-issue value
// zeroed: Hostname, FQDN, InstanceID, MACAddress, StaticIP, StaticIPv6, SPIFFEID,
// TrustBundle, AgentCA, BrokerCA, SecretStoreRole, SecretStorePath,
// SecretStoreCA, RunnerName, Labels, RunnerGroup, AcquireJob, ExpiresAt,
// SecretsDeadline, PowerOffNotify, ScriptUser, Claim and Deadline. What remains is the same for every VM of one
// template, so rendering the canonical vars gives identical bytes for all of
// them and the bytes change only when something that shapes the VMs changes
// (docs/architecture.md, "Template drift hash"). Render accepts canonical
// vars with the per-VM values
// empty.
func (v Vars) Canonical() Vars {
	v.Hostname = ""
	v.FQDN = ""
	v.InstanceID = ""
	v.MACAddress = ""
	v.StaticIP = ""
	v.StaticIPv6 = ""
	v.SPIFFEID = ""
	v.TrustBundle = ""
	v.AgentCA = ""
	v.BrokerCA = ""
	v.SecretStoreRole = ""
	v.SecretStorePath = ""
	v.SecretStoreCA = ""
	v.RunnerName = ""
	v.Labels = nil
	v.RunnerGroup = ""
	v.AcquireJob = ""
	v.ExpiresAt = Time{}
	v.SecretsDeadline = Time{}
	v.PowerOffNotify = nil
	v.ScriptUser = ""
	v.Claim = agentconfig.ClaimRef{}
	v.Deadline = Time{}
	v.DNSServers = cloneList(v.DNSServers)
	v.SearchDomains = cloneList(v.SearchDomains)
	v.NoProxy = cloneList(v.NoProxy)
	v.canonical = true
	return v
}

// IsCanonical reports whether v came from Canonical.
func (v Vars) IsCanonical() bool { return v.canonical }

func cloneList(l List) List {
	if l == nil {
		return nil
	}
	return append(List(nil), l...)
}

// checkIPv6 checks the second address of a dual-stack VM. NetmaskBitsIPv6
// marks one (canonical vars keep it while StaticIPv6 is zeroed); its
// StaticIP, when known, must then be the IPv4 address.
func (v *Vars) checkIPv6(nv *netVars) error {
	if v.StaticIPv6 == "" && v.NetmaskBitsIPv6 == 0 && v.GatewayIPv6 == "" {
		return nil
	}
	if v.NetworkMode != NetworkStatic {
		return fmt.Errorf("vars: StaticIPv6, NetmaskBitsIPv6 and GatewayIPv6 are set but NetworkMode is %s; they apply to static only", v.NetworkMode)
	}
	if v.NetmaskBitsIPv6 < 1 || v.NetmaskBitsIPv6 > 128 {
		return fmt.Errorf("vars: NetmaskBitsIPv6 %d must be between 1 and 128", v.NetmaskBitsIPv6)
	}
	if err := v.perVM("StaticIPv6", v.StaticIPv6); err != nil {
		return err
	}
	if nv.addr.IsValid() && !nv.addr.Is4() {
		return fmt.Errorf("vars: StaticIP %s of a dual-stack VM must be its IPv4 address (StaticIPv6 is the IPv6 one)", v.StaticIP)
	}
	if v.StaticIPv6 != "" {
		a, ok := hostIP(v.StaticIPv6)
		if !ok || !a.Is6() {
			return fmt.Errorf("vars: StaticIPv6 %q is not an IPv6 address without prefix, such as 2001:db8::10", v.StaticIPv6)
		}
		nv.addr6 = a
	}
	if v.GatewayIPv6 != "" {
		g, ok := hostIP(v.GatewayIPv6)
		if !ok || !g.Is6() {
			return fmt.Errorf("vars: GatewayIPv6 %q is not an IPv6 address", v.GatewayIPv6)
		}
		nv.gateway6 = g
	}
	if nv.gateway.IsValid() && !nv.gateway.Is4() {
		return fmt.Errorf("vars: Gateway %s of a dual-stack VM must be the IPv4 gateway (GatewayIPv6 is the IPv6 one)", v.Gateway)
	}
	return nil
}

// hostIP parses an address of a VM's network configuration: one without a
// zone, an IPv4-mapped IPv6 address read as the IPv4 address it maps.
func hostIP(s string) (netip.Addr, bool) {
	a, err := netip.ParseAddr(s)
	if err != nil || a.Zone() != "" {
		return netip.Addr{}, false
	}
	return a.Unmap(), true
}

// staticHost parses val, the address of field name that only static
// networking takes, as an IP address without prefix (hostIP). hint ends
// the message of an address that does not parse, static the message of a
// NetworkMode other than static (why the field does not apply).
func (v *Vars) staticHost(name, val, hint, static string) (netip.Addr, error) {
	a, ok := hostIP(val)
	if !ok {
		return netip.Addr{}, fmt.Errorf("vars: %s %q is not an IP address%s", name, val, hint)
	}
	if v.NetworkMode != NetworkStatic {
		return netip.Addr{}, fmt.Errorf("vars: %s is set but NetworkMode is %s; %s", name, v.NetworkMode, static)
	}
	return a, nil
}

// perVM fails for a per-VM value left empty outside canonical vars.
func (v *Vars) perVM(name, val string) error {
	if val == "" && !v.canonical {
		return fmt.Errorf("vars: %s is empty; it is required for a VM (only Canonical vars may leave it empty)", name)
	}
	return nil
}

var (
	dnsLabelRE = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$`)
	dnsNameRE  = regexp.MustCompile(`^([a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?\.)*[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$`)
)

// netVars is the parsed network part of Vars.
type netVars struct {
	mac      string     // canonical lower-case form, "" when unknown
	addr     netip.Addr // static address, invalid when unset
	gateway  netip.Addr // invalid when unset
	addr6    netip.Addr // a dual-stack VM's IPv6 address, invalid when unset
	gateway6 netip.Addr // its gateway, invalid when unset
	dns      []string
}

// checkDHCP checks the settings of NetworkMode dhcp: they agree with each
// other and are not set in another mode.
func (v *Vars) checkDHCP() error {
	switch v.DHCPClientIdentifier {
	case "", DHCPIdentifierMAC:
	case DHCPIdentifierHostname:
		if !v.SendHostname {
			return fmt.Errorf("vars: DHCPClientIdentifier hostname identifies the VM by the host name it sends; SendHostname must be true")
		}
	default:
		return fmt.Errorf("vars: DHCPClientIdentifier %q must be %s or %s", v.DHCPClientIdentifier, DHCPIdentifierMAC, DHCPIdentifierHostname)
	}
	if v.RequestStaticLease && v.DHCPClientIdentifier != DHCPIdentifierHostname {
		return fmt.Errorf("vars: RequestStaticLease asks for the address reserved for the host name; DHCPClientIdentifier must be hostname")
	}
	if v.DHCPLeaseSeconds < 0 || v.DHCPLeaseSeconds > maxLeaseSeconds {
		return fmt.Errorf("vars: DHCPLeaseSeconds %d must be between 0 (the server's) and %d", v.DHCPLeaseSeconds, maxLeaseSeconds)
	}
	if (v.RequestStaticLease || v.DHCPLeaseSeconds > 0) && v.NetworkMode != NetworkDHCP {
		return fmt.Errorf("vars: RequestStaticLease and DHCPLeaseSeconds apply only to NetworkMode dhcp, not %s", v.NetworkMode)
	}
	if v.IPv6 && v.NetworkMode != NetworkDHCP {
		return fmt.Errorf("vars: IPv6 (DHCPv6) applies only to NetworkMode dhcp, not %s", v.NetworkMode)
	}
	return nil
}

// check validates v. Problems here are the operator's (the controller
// filled v), so errors name the Vars field.
func (v *Vars) check() (netVars, error) {
	var nv netVars
	perVM := v.perVM
	if err := perVM("Hostname", v.Hostname); err != nil {
		return nv, err
	}
	if v.Hostname != "" && !dnsLabelRE.MatchString(v.Hostname) {
		return nv, fmt.Errorf("vars: Hostname %q is not a DNS label (lower-case letters, digits and '-', at most 63)", v.Hostname)
	}
	if v.FQDN != "" {
		if len(v.FQDN) > 253 || !dnsNameRE.MatchString(v.FQDN) || !strings.HasPrefix(v.FQDN, v.Hostname+".") {
			return nv, fmt.Errorf("vars: FQDN %q must be Hostname followed by a DNS domain, such as %s.ci.example.com", v.FQDN, v.Hostname)
		}
	}
	if err := perVM("InstanceID", v.InstanceID); err != nil {
		return nv, err
	}
	if strings.ContainsAny(v.InstanceID, "\r\n\x00") || len(v.InstanceID) > 253 {
		return nv, fmt.Errorf("vars: InstanceID %q must be one line of at most 253 characters", v.InstanceID)
	}

	switch v.NetworkMode {
	case NetworkDHCP, NetworkStatic, NetworkCloudInit:
	default:
		return nv, fmt.Errorf("vars: NetworkMode %q must be %s, %s or %s", v.NetworkMode, NetworkDHCP, NetworkStatic, NetworkCloudInit)
	}
	if v.MACAddress != "" {
		hw, err := net.ParseMAC(v.MACAddress)
		if err != nil || len(hw) != 6 {
			return nv, fmt.Errorf("vars: MACAddress %q is not a 48-bit MAC address such as bc:24:11:00:00:01", v.MACAddress)
		}
		nv.mac = hw.String()
	}
	if err := v.checkDHCP(); err != nil {
		return nv, err
	}
	if v.NetworkMode == NetworkStatic {
		if err := perVM("StaticIP", v.StaticIP); err != nil {
			return nv, err
		}
	}
	if v.StaticIP != "" {
		a, err := v.staticHost("StaticIP", v.StaticIP, " without prefix, such as 192.0.2.10 or 2001:db8::10", "it applies to static only")
		if err != nil {
			return nv, err
		}
		nv.addr = a
	}
	if v.NetworkMode == NetworkStatic {
		maxBits := 128
		if nv.addr.Is4() {
			maxBits = 32
		}
		if v.NetmaskBits < 1 || v.NetmaskBits > maxBits {
			return nv, fmt.Errorf("vars: NetmaskBits %d must be between 1 and %d", v.NetmaskBits, maxBits)
		}
	}
	if v.Gateway != "" {
		g, err := v.staticHost("Gateway", v.Gateway, "", "DHCP supplies the gateway")
		if err != nil {
			return nv, err
		}
		nv.gateway = g
		if nv.addr.IsValid() && nv.addr.Is4() != nv.gateway.Is4() {
			return nv, fmt.Errorf("vars: Gateway %s and StaticIP %s are of different IP families", v.Gateway, v.StaticIP)
		}
	}
	if err := v.checkIPv6(&nv); err != nil {
		return nv, err
	}
	for _, s := range v.DNSServers {
		a, err := netip.ParseAddr(s)
		if err != nil {
			return nv, fmt.Errorf("vars: DNSServers entry %q is not an IP address", s)
		}
		nv.dns = append(nv.dns, a.Unmap().String())
	}
	for _, d := range v.SearchDomains {
		if len(d) > 253 || !dnsNameRE.MatchString(d) {
			return nv, fmt.Errorf("vars: SearchDomains entry %q is not a DNS name", d)
		}
	}

	switch v.AttestationMethod {
	case "", AttestationNone:
		if v.SPIFFEEnabled {
			return nv, fmt.Errorf("vars: SPIFFEEnabled is true but AttestationMethod is %q; set join-token or tpm", v.AttestationMethod)
		}
	case AttestationJoinToken, AttestationTPM:
		if !v.SPIFFEEnabled {
			return nv, fmt.Errorf("vars: AttestationMethod %s attests with SPIRE; SPIFFEEnabled must be true", v.AttestationMethod)
		}
	default:
		return nv, fmt.Errorf("vars: AttestationMethod %q must be none, join-token or tpm", v.AttestationMethod)
	}
	switch v.WorkloadMethod {
	case WorkloadDirect:
		if v.SPIFFEEnabled {
			return nv, fmt.Errorf("vars: WorkloadMethod direct puts the runner credential into cloud-init, but with SPIFFE attestation it must come from the broker: set WorkloadMethod broker")
		}
	case WorkloadBroker:
		if !v.SPIFFEEnabled {
			return nv, fmt.Errorf("vars: WorkloadMethod broker needs SPIFFE attestation (SPIFFEEnabled)")
		}
	default:
		return nv, fmt.Errorf("vars: WorkloadMethod %q must be %s or %s", v.WorkloadMethod, WorkloadDirect, WorkloadBroker)
	}
	if err := v.checkPlatform(); err != nil {
		return nv, err
	}
	if err := v.checkProxy(); err != nil {
		return nv, err
	}
	return nv, v.checkAgent()
}

// checkPlatform checks the variables of the agent's runner kind: a
// registered platform (the default one when Platform is empty) and one of
// its credential methods, or generic.
func (v *Vars) checkPlatform() error {
	if v.Platform == PlatformGeneric {
		if v.AcquireJob != "" {
			return fmt.Errorf("vars: AcquireJob is set but Platform is %q, which binds no VM to a job", v.Platform)
		}
		return v.checkGeneric()
	}
	spec, ok := v.platformSpec()
	switch {
	case !ok:
		return fmt.Errorf("vars: Platform %q must be one of %q (empty: the registered default platform, PlatformSpec.Default)", v.Platform, agentconfig.RegisteredPlatforms())
	case v.AcquireJob != "" && !spec.BindsJob:
		return fmt.Errorf("vars: AcquireJob is set but Platform is %q, which binds no VM to a job", spec.Platform)
	case !spec.Takes(agentconfig.BootstrapMethod(v.BootstrapMethod)):
		return fmt.Errorf("vars: BootstrapMethod %q must be %s with Platform %s", v.BootstrapMethod, spec.MethodNames(), spec.Platform)
	}
	return nil
}

// platformSpec is the spec of v's CI platform: Platform's, or the default
// one's when it is empty.
func (v *Vars) platformSpec() (agentconfig.PlatformSpec, bool) {
	return agentconfig.LookupPlatform(cmp.Or(agentconfig.Platform(v.Platform), agentconfig.DefaultPlatform()))
}

// checkGeneric validates the variables of Platform generic.
func (v *Vars) checkGeneric() error {
	if v.BootstrapMethod != "" {
		return fmt.Errorf("vars: BootstrapMethod %q is set but Platform is generic, which has no runner credential", v.BootstrapMethod)
	}
	if strings.TrimSpace(v.GenericScript) == "" {
		return fmt.Errorf("vars: GenericScript is empty; Platform generic runs it")
	}
	if err := v.perVM("Deadline", v.Deadline.String()); err != nil {
		return err
	}
	if err := v.perVM("ScriptUser", v.ScriptUser); err != nil {
		return err
	}
	if v.ScriptUser != "" && !agentconfig.ValidUserName(v.ScriptUser) {
		return fmt.Errorf("vars: ScriptUser %q is not a user name (lower-case letters, digits, _ and -, at most 32 bytes)", v.ScriptUser)
	}
	return v.perVM("Claim", v.Claim.UID)
}

var sha256RE = regexp.MustCompile(`^[0-9a-f]{64}$`)

// checkAgent validates the agent download variables. They reach a shell
// script as arguments (never as code), but a value the script refuses
// would only show up as VMs powering off.
func (v *Vars) checkAgent() error {
	if v.AgentDownloadURL == "" {
		if v.AgentSHA256 != "" || v.AgentCA != "" {
			return fmt.Errorf("vars: AgentSHA256 and AgentCA apply only with AgentDownloadURL")
		}
		return nil
	}
	u, err := url.Parse(v.AgentDownloadURL)
	if err != nil || u.Scheme != "https" || u.Host == "" || len(v.AgentDownloadURL) > 2048 ||
		strings.ContainsFunc(v.AgentDownloadURL, func(r rune) bool { return r <= ' ' || r == 0x7f }) {
		return fmt.Errorf("vars: AgentDownloadURL %q must be an https:// URL of at most 2048 characters without spaces", v.AgentDownloadURL)
	}
	if !sha256RE.MatchString(v.AgentSHA256) {
		return fmt.Errorf("vars: AgentSHA256 %q must be 64 lower-case hex digits", v.AgentSHA256)
	}
	if v.AgentCA != "" {
		if b, _ := pem.Decode([]byte(v.AgentCA)); b == nil || b.Type != "CERTIFICATE" {
			return fmt.Errorf("vars: AgentCA must be PEM certificates (-----BEGIN CERTIFICATE-----)")
		}
	}
	return nil
}

// secrets are the per-VM secret values in v: only the notice token (no
// credential is ever a variable).
func (v *Vars) secrets() []string {
	if n := v.PowerOffNotify; n != nil {
		return []string{n.Token}
	}
	return nil
}

// receivesSecrets reports whether the VM receives GuestSecrets in the
// running guest: its runner credential (direct; never for a generic VM),
// its join token, or its TPM enrollment proof.
func (v *Vars) receivesSecrets() bool {
	if v.Platform == PlatformGeneric && !v.SPIFFEEnabled {
		// No runner credential and no identity: nothing to receive.
		return false
	}
	return v.WorkloadMethod == WorkloadDirect || v.SPIFFEEnabled && (v.AttestationMethod == AttestationJoinToken || v.AttestationMethod == AttestationTPM)
}

package cloudinit

import (
	"bytes"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/hyperfleet/hyperfleet/internal/agentconfig"
)

// perVMFields are the Vars fields Canonical must zero; templateFields are
// the ones it must keep. Every exported field is in exactly one list, so a
// new field fails this test until someone decides which it is.
var (
	perVMFields = []string{"Hostname", "FQDN", "InstanceID", "MACAddress", "StaticIP", "StaticIPv6", "SPIFFEID",
		"TrustBundle", "AgentCA", "BrokerCA", "SecretStoreRole", "SecretStorePath", "SecretStoreCA", "RunnerName", "Labels",
		"RunnerGroup", "AcquireJob", "ExpiresAt", "SecretsDeadline", "PowerOffNotify", "ScriptUser", "Claim", "Deadline"}
	templateFields = []string{"NetworkMode", "DHCPClientIdentifier", "SendHostname", "IPv6", "RequestStaticLease", "DHCPLeaseSeconds", "NetmaskBits", "Gateway",
		"NetmaskBitsIPv6", "GatewayIPv6",
		"DNSServers", "SearchDomains", "HTTPProxy", "HTTPSProxy", "NoProxy", "SPIFFEEnabled", "AttestationMethod", "TrustDomain", "SPIREServerAddress",
		"TPMDevicePath", "BrokerURL", "SecretStore", "WorkloadMethod", "BootstrapMethod", "RegistrationURL", "RunnerConfig",
		"PowerOffOnFinish", "AgentDownloadURL", "AgentSHA256", "BootstrapServiceURL", "BootstrapServiceBinary", "Platform", "GenericScript", "GuestOS", "JobMayEscalate"}
)

func TestCanonicalFieldClassification(t *testing.T) {
	seen := map[string]int{}
	for _, f := range append(append([]string{}, perVMFields...), templateFields...) {
		seen[f]++
	}
	typ := reflect.TypeFor[Vars]()
	for i := range typ.NumField() {
		f := typ.Field(i)
		if !f.IsExported() {
			continue
		}
		if seen[f.Name] != 1 {
			t.Errorf("Vars.%s is in %d of perVMFields/templateFields; put it in exactly one (and zero it in Canonical if it is per-VM)", f.Name, seen[f.Name])
		}
		delete(seen, f.Name)
	}
	for f := range seen {
		t.Errorf("%s is listed but is not a Vars field", f)
	}

	// Canonical zeroes exactly the per-VM fields.
	v := operatorAgentVars(spiffeVars(runnerTokenVars(baseVars())))
	v.NetworkMode, v.StaticIP, v.NetmaskBits, v.Gateway = NetworkStatic, "192.0.2.10", 24, "192.0.2.1"
	v.StaticIPv6, v.NetmaskBitsIPv6, v.GatewayIPv6 = "2001:db8::10", 64, "2001:db8::1"
	v.SecretsDeadline = Time{time.Date(2025, 6, 1, 12, 0, 0, 0, time.UTC)} // not a valid VM; Canonical does not care
	v.PowerOffNotify = &agentconfig.PowerOffNotify{URL: "https://op.example.com/hints/v1/power-off", Token: "t"}
	v.Claim = agentconfig.ClaimRef{Namespace: "ci", Name: "runner-a", UID: "uid-a"}
	v.ScriptUser = "batch"
	v.Deadline = Time{time.Date(2025, 6, 1, 13, 0, 0, 0, time.UTC)}
	v.AcquireJob = "0190a3b2-6c1e-4a8f-9d2b-3e4f5a6b7c8d"
	v.BrokerCA = testCA
	v.SecretStore = &agentconfig.SecretStore{Address: "https://vault.example.com:8200", AuthMount: "jwt", Audience: "hyperfleet-secret-store", KVMount: "secret"}
	v.SecretStoreRole, v.SecretStorePath, v.SecretStoreCA = "uid-a", "hyperfleet/hyperfleet.io/vm/ci/runner-a/uid-a", testCA
	c := reflect.ValueOf(v.Canonical())
	orig := reflect.ValueOf(v)
	for _, f := range perVMFields {
		if !c.FieldByName(f).IsZero() {
			t.Errorf("Canonical kept per-VM field %s = %v", f, c.FieldByName(f))
		}
		if orig.FieldByName(f).IsZero() {
			t.Errorf("test setup: per-VM field %s is already zero, so the check proves nothing", f)
		}
	}
	for _, f := range templateFields {
		if !reflect.DeepEqual(c.FieldByName(f).Interface(), orig.FieldByName(f).Interface()) {
			t.Errorf("Canonical changed template field %s", f)
		}
	}
	if !v.Canonical().IsCanonical() || v.IsCanonical() {
		t.Error("IsCanonical does not tell canonical vars apart")
	}
}

// vmOf returns the vars of the n-th VM of one template: every per-VM value
// differs between VMs.
func vmOf(base Vars, n int) Vars {
	s := string(rune('a' + n))
	v := base
	v.Hostname = "runner-" + s
	v.FQDN = v.Hostname + ".ci.example.com"
	v.InstanceID = "uid-" + s
	v.MACAddress = "bc:24:11:00:00:0" + string(rune('1'+n))
	if v.NetworkMode == NetworkStatic {
		v.StaticIP = "192.0.2." + string(rune('1'+n))
	}
	v.RunnerName = v.Hostname
	v.Labels = List{"self-hosted", "pool-" + s}
	v.RunnerGroup = "group-" + s
	v.ExpiresAt = Time{time.Date(2025, 6, 1, n, 0, 0, 0, time.UTC)}
	v.SecretsDeadline = Time{time.Date(2025, 6, 1, n, 30, 0, 0, time.UTC)}
	if v.SPIFFEEnabled {
		v.SPIFFEID = "spiffe://hyperfleet.io/vm/ci/" + v.Hostname + "/" + v.InstanceID
		v.TrustBundle = testCA + strings.Repeat("\n", n) // rotation changes the bytes
	}
	return v
}

func TestCanonicalRenderIsPerTemplate(t *testing.T) {
	static := runnerTokenVars(baseVars())
	static.NetworkMode, static.NetmaskBits, static.Gateway, static.DNSServers = NetworkStatic, 24, "192.0.2.1", List{"192.0.2.53"}
	static.SendHostname, static.DHCPClientIdentifier = false, ""
	templates := map[string]Input{
		"dhcp jit":          {Vars: baseVars()},
		"static token":      {Vars: static},
		"spiffe":            {Vars: spiffeVars(baseVars())},
		"user cloud-config": {Vars: baseVars(), UserData: mergeUserData, MetaData: "zone: {{ .Hostname }}-zone\n"},
		"user script":       {Vars: baseVars(), UserData: "#!/bin/sh\necho {{ .RunnerName }}\n"},
	}
	for name, in := range templates {
		t.Run(name, func(t *testing.T) {
			var first *Output
			for n := range 3 {
				vm := in
				vm.Vars = vmOf(in.Vars, n)
				// Each VM renders on its own...
				own, err := Render(vm)
				if err != nil {
					t.Fatalf("VM %d: %v", n, err)
				}
				// ...and its canonical form is the template's.
				vm.Vars = vm.Vars.Canonical()
				out, err := Render(vm)
				if err != nil {
					t.Fatalf("VM %d canonical: %v", n, err)
				}
				if bytes.Equal(own.UserData, out.UserData) {
					t.Errorf("VM %d: canonical user-data equals the VM's own; per-VM values were not removed", n)
				}
				if first == nil {
					first = out
					continue
				}
				if !bytes.Equal(first.UserData, out.UserData) || !bytes.Equal(first.MetaData, out.MetaData) || !bytes.Equal(first.NetworkConfig, out.NetworkConfig) {
					t.Errorf("VM %d renders different canonical bytes than VM 0:\n%s\n---\n%s", n, out.UserData, first.UserData)
				}
			}
		})
	}

	// A change that shapes the VMs changes the canonical bytes.
	base := Input{Vars: baseVars()}
	changed := map[string]func(*Input){
		"user data":        func(in *Input) { in.UserData = "#cloud-config\npackages: [git]\n" },
		"network mode":     func(in *Input) { in.Vars.IPv6 = true },
		"dns":              func(in *Input) { in.Vars.DNSServers = List{"192.0.2.99"} },
		"runner config":    func(in *Input) { in.Vars.RunnerConfig.WorkDir = "/work" },
		"power off":        func(in *Input) { in.Vars.PowerOffOnFinish = false },
		"job may escalate": func(in *Input) { in.Vars.JobMayEscalate = true },
	}
	ref, err := Render(Input{Vars: base.Vars.Canonical()})
	if err != nil {
		t.Fatal(err)
	}
	for name, change := range changed {
		in := base
		in.Vars.DNSServers = append(List(nil), base.Vars.DNSServers...)
		change(&in)
		in.Vars = in.Vars.Canonical()
		out, err := Render(in)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if bytes.Equal(out.UserData, ref.UserData) && bytes.Equal(out.NetworkConfig, ref.NetworkConfig) {
			t.Errorf("changing the %s does not change the canonical rendering", name)
		}
	}
}

func TestCanonicalDoesNotAlias(t *testing.T) {
	v := baseVars()
	c := v.Canonical()
	c.DNSServers[0] = "198.51.100.1"
	if v.DNSServers[0] != "192.0.2.53" {
		t.Error("Canonical shares DNSServers with the original")
	}
}

func TestVarsErrors(t *testing.T) {
	for _, tc := range []struct {
		name   string
		mutate func(*Vars)
		want   string
	}{
		{"no hostname", func(v *Vars) { v.Hostname = "" }, "Hostname is empty"},
		{"bad hostname", func(v *Vars) { v.Hostname = "Runner_1" }, "not a DNS label"},
		{"fqdn", func(v *Vars) { v.FQDN = "other.example.com" }, "FQDN"},
		{"no instance id", func(v *Vars) { v.InstanceID = "" }, "InstanceID is empty"},
		{"mode", func(v *Vars) { v.NetworkMode = "bridge" }, "NetworkMode"},
		{"mac", func(v *Vars) { v.MACAddress = "zz:00" }, "MACAddress"},
		{"identifier", func(v *Vars) { v.DHCPClientIdentifier = "duid" }, "DHCPClientIdentifier"},
		{"hostname id without sending", func(v *Vars) { v.DHCPClientIdentifier, v.SendHostname = DHCPIdentifierHostname, false }, "SendHostname must be true"},
		{"static lease with mac id", func(v *Vars) { v.RequestStaticLease = true }, "DHCPClientIdentifier must be hostname"},
		{"lease time too long", func(v *Vars) { v.DHCPLeaseSeconds = 8 * 24 * 3600 }, "DHCPLeaseSeconds 691200 must be between"},
		{"negative lease time", func(v *Vars) { v.DHCPLeaseSeconds = -1 }, "DHCPLeaseSeconds -1"},
		{"lease time static", func(v *Vars) {
			v.NetworkMode, v.DHCPLeaseSeconds, v.StaticIP, v.NetmaskBits, v.DHCPClientIdentifier = NetworkStatic, 600, "192.0.2.1", 24, ""
		}, "apply only to NetworkMode dhcp"},
		{"ipv6 static", func(v *Vars) { v.NetworkMode, v.IPv6, v.StaticIP, v.NetmaskBits = NetworkStatic, true, "192.0.2.1", 24 }, "IPv6 (DHCPv6) applies only"},
		{"static without ip", func(v *Vars) { v.NetworkMode, v.NetmaskBits = NetworkStatic, 24 }, "StaticIP is empty"},
		{"bad ip", func(v *Vars) { v.NetworkMode, v.StaticIP = NetworkStatic, "192.0.2.1/24" }, "without prefix"},
		{"bits", func(v *Vars) { v.NetworkMode, v.StaticIP, v.NetmaskBits = NetworkStatic, "192.0.2.1", 33 }, "between 1 and 32"},
		{"family", func(v *Vars) {
			v.NetworkMode, v.StaticIP, v.NetmaskBits, v.Gateway = NetworkStatic, "192.0.2.1", 24, "2001:db8::1"
		}, "different IP families"},
		{"gateway with dhcp", func(v *Vars) { v.Gateway = "192.0.2.1" }, "DHCP supplies the gateway"},
		{"ipv6 address with dhcp", func(v *Vars) { v.StaticIPv6, v.NetmaskBitsIPv6 = "2001:db8::10", 64 }, "they apply to static only"},
		{"dual without ipv6 address", func(v *Vars) { dualStack(v); v.StaticIPv6 = "" }, "StaticIPv6 is empty"},
		{"dual ipv6 bits", func(v *Vars) { dualStack(v); v.NetmaskBitsIPv6 = 129 }, "NetmaskBitsIPv6 129 must be between 1 and 128"},
		{"dual ipv6 address is ipv4", func(v *Vars) { dualStack(v); v.StaticIPv6 = "192.0.2.11" }, "StaticIPv6 \"192.0.2.11\" is not an IPv6 address"},
		{"dual first address is ipv6", func(v *Vars) {
			dualStack(v)
			v.StaticIP, v.NetmaskBits, v.Gateway = "2001:db8::11", 64, ""
		}, "must be its IPv4 address"},
		{"dual ipv6 gateway", func(v *Vars) { dualStack(v); v.GatewayIPv6 = "192.0.2.1" }, "GatewayIPv6"},
		{"dns", func(v *Vars) { v.DNSServers = List{"dns.example"} }, "DNSServers"},
		{"search", func(v *Vars) { v.SearchDomains = List{"bad domain"} }, "SearchDomains"},
		{"spiffe without method", func(v *Vars) { v.SPIFFEEnabled = true }, "SPIFFEEnabled is true"},
		{"method without spiffe", func(v *Vars) { v.AttestationMethod = AttestationTPM }, "SPIFFEEnabled must be true"},
		{"broker without spiffe", func(v *Vars) { v.WorkloadMethod = WorkloadBroker }, "needs SPIFFE"},
		{"direct with spiffe", func(v *Vars) { v.SPIFFEEnabled, v.AttestationMethod = true, AttestationJoinToken }, "set WorkloadMethod broker"},
		{"bootstrap", func(v *Vars) { v.BootstrapMethod = "pat" }, "BootstrapMethod"},
		{"agent config", func(v *Vars) { v.SecretsDeadline = Time{} }, "secretsDeadline: is empty"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := baseVars()
			tc.mutate(&v)
			_, err := Render(Input{Vars: v})
			if err == nil {
				t.Fatal("Render accepted invalid vars")
			}
			if !strings.Contains(err.Error(), tc.want) || !strings.HasPrefix(err.Error(), "vars: ") {
				t.Errorf("error %q does not start with vars: and mention %q", err, tc.want)
			}
		})
	}
}

// dualStack makes v a dual-stack VM's vars: 192.0.2.10/24 via 192.0.2.1
// and 2001:db8::10/64 via 2001:db8::1.
func dualStack(v *Vars) {
	v.NetworkMode, v.StaticIP, v.NetmaskBits, v.Gateway = NetworkStatic, "192.0.2.10", 24, "192.0.2.1"
	v.StaticIPv6, v.NetmaskBitsIPv6, v.GatewayIPv6 = "2001:db8::10", 64, "2001:db8::1"
}

package machineclaim

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/record"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/dnsreg"
	"github.com/hyperfleet/hyperfleet/internal/dnsreg/rfc2136"
	"github.com/hyperfleet/hyperfleet/internal/testworld/dnsserver"
	proxmoxsim "github.com/hyperfleet/hyperfleet/internal/testworld/simulator/proxmox"
)

// The cluster's VM subnet, and an address outside it that a hostile guest
// reports as its own: the Kubernetes API's service address.
const (
	vmSubnet       = "10.99.0.0/24"
	serviceAddress = "10.96.0.1"
)

// registeringWorld is a simulator world whose cluster registers its VMs'
// names (rfc2136, on a real BIND serving the template's domain) and
// validates their reachability (ping), with the VM subnet 10.99.0.0/24;
// the guest agent of every VM reports guestAddr as its address on net0.
func registeringWorld(t *testing.T, guestAddr string) (*simWorld, *dnsserver.Server) {
	t.Helper()
	bind := dnsserver.StartBIND(t, dnsserver.Options{Zones: []string{authorizedDNSDomain}})
	w := newSimWorld(t, simOptions{
		sim: func(c *proxmoxsim.Config) { c.Guest.AddressRange = guestAddr + "-" + guestAddr },
		cluster: func(c *hfv1.HypervisorCluster) {
			c.Spec.DNS = &hfv1.ClusterDNSSettings{RegisterVMs: true}
			c.Spec.Network = &hfv1.ClusterNetworkSettings{VMSubnets: []string{vmSubnet},
				Validation: &hfv1.NetworkValidation{TimeoutSeconds: 1}}
		},
	})
	reg, err := rfc2136.Factory(dnsreg.Config{Zone: authorizedDNSDomain, TTL: time.Minute,
		Options:     map[string]string{rfc2136.OptionServer: bind.Addr},
		Credentials: map[string][]byte{rfc2136.CredentialKey: []byte(dnsserver.UpdateKey.Clause())}})
	if err != nil {
		t.Fatal(err)
	}
	w.r.DNS.Clusters = dnsreg.NewClusters()
	w.r.DNS.Clusters.Set(simCluster, dnsreg.Cluster{Registrar: reg, Key: "k", RegisterVMs: true})
	return w, bind
}

// conditionIs reports whether the claim's condition typ has a status (any
// when empty).
func conditionIs(typ hfv1.ConditionType, status metav1.ConditionStatus) func(*hfv1.MachineClaim) bool {
	return func(c *hfv1.MachineClaim) bool {
		cond := hfv1.FindCondition(c.Status.Conditions, typ)
		return cond != nil && (status == "" || cond.Status == status)
	}
}

// TestGuestReportedAddressIsNotRegisteredOrProbed performs, with a guest,
// the attack of a VM that claims another host's address: a VM on DHCP
// whose guest agent reports the Kubernetes API's service address
// (10.96.0.1) as its own, on a cluster whose VMs get their addresses in
// 10.99.0.0/24. The operator must neither publish that address under the
// VM's name (a real BIND holds no A record for it) nor send its
// validation's probes there (no round starts); the claim's DNSRegistered
// and NetworkValidated conditions say AddressOutsideVMSubnets, naming the
// address and spec.network.vmSubnets, with a warning event. The version
// before registered runner-1.team-a.ci.example.com A 10.96.0.1 and pinged
// it.
func TestGuestReportedAddressIsNotRegisteredOrProbed(t *testing.T) {
	w, bind := registeringWorld(t, serviceAddress)
	claim := w.newClaim("runner-1")
	w.runUntil(claim, "a running VM", provisioned)
	got := w.runUntil(claim, "a DNSRegistered condition", conditionIs(hfv1.MachineClaimDNSRegisteredCondition, ""))
	if n := got.Status.Network; n == nil || len(n.Addresses) != 1 || n.Addresses[0] != serviceAddress {
		t.Fatalf("the claim's status.network %+v, want the guest's report %s: the attack was not tried", n, serviceAddress)
	}
	fqdn := "runner-1." + authorizedDNSDomain + "."
	if a := bind.Lookup(t, fqdn, dns.TypeA); len(a) != 0 {
		t.Errorf("%s was registered with %v: a guest's foreign address was published under its name", fqdn, a)
	}
	for _, typ := range []hfv1.ConditionType{hfv1.MachineClaimDNSRegisteredCondition, hfv1.MachineClaimNetworkValidatedCondition} {
		cond := hfv1.FindCondition(got.Status.Conditions, typ)
		if cond == nil || cond.Status != metav1.ConditionFalse || cond.Reason != string(hfv1.AddressOutsideVMSubnetsReason) ||
			!strings.Contains(cond.Message, serviceAddress) || !strings.Contains(cond.Message, "spec.network.vmSubnets") {
			t.Errorf("%s = %+v, want False, AddressOutsideVMSubnets, naming %s and spec.network.vmSubnets", typ, cond, serviceAddress)
		}
	}
	if _, finished, running := w.r.memory.takeRound(got.UID); finished || running {
		t.Errorf("a validation round was started for the guest's foreign address (running %v, finished %v)", running, finished)
	}
	if !hasEvent(drainEvents(w.r.Recorder.(*record.FakeRecorder)), "Warning "+string(hfv1.AddressOutsideVMSubnetsReason)) {
		t.Error("no AddressOutsideVMSubnets warning event")
	}
}

// TestVMSubnetAddressIsRegisteredUntilTheSubnetGoes: the same world with a
// guest that reports an address in the VM subnet (10.99.0.10): the VM's
// name is registered with it and a validation round probes it. When the
// cluster's owner then takes the subnet out of spec.network.vmSubnets, the
// records go from DNS and the claim says AddressOutsideVMSubnets.
func TestVMSubnetAddressIsRegisteredUntilTheSubnetGoes(t *testing.T) {
	w, bind := registeringWorld(t, "10.99.0.10")
	claim := w.newClaim("runner-2")
	w.runUntil(claim, "a running VM", provisioned)
	got := w.runUntil(claim, "DNSRegistered True", conditionIs(hfv1.MachineClaimDNSRegisteredCondition, metav1.ConditionTrue))
	fqdn := "runner-2." + authorizedDNSDomain + "."
	if a := addrsOfRRs(bind.Lookup(t, fqdn, dns.TypeA)); len(a) != 1 || a[0] != "10.99.0.10" {
		t.Fatalf("%s has A %v, want 10.99.0.10", fqdn, a)
	}
	if _, finished, running := w.r.memory.takeRound(got.UID); !finished && !running {
		t.Error("no validation round probes the VM's address in the VM subnet")
	}

	cluster := &hfv1.HypervisorCluster{}
	if err := w.kube.Get(context.Background(), client.ObjectKey{Name: simCluster}, cluster); err != nil {
		t.Fatal(err)
	}
	cluster.Spec.Network.VMSubnets = []string{"10.98.0.0/24"}
	cluster.Spec.Network.Validation.Enabled = ptr.To(false)
	if err := w.kube.Update(context.Background(), cluster); err != nil {
		t.Fatal(err)
	}
	w.runUntil(claim, "DNSRegistered AddressOutsideVMSubnets", func(c *hfv1.MachineClaim) bool {
		cond := hfv1.FindCondition(c.Status.Conditions, hfv1.MachineClaimDNSRegisteredCondition)
		return cond != nil && cond.Reason == string(hfv1.AddressOutsideVMSubnetsReason)
	})
	if a := bind.Lookup(t, fqdn, dns.TypeA); len(a) != 0 {
		t.Errorf("%s still has %v once its address left the VM subnets", fqdn, a)
	}
}

// addrsOfRRs are the addresses of the A records in rrs.
func addrsOfRRs(rrs []dns.RR) []string {
	var out []string
	for _, rr := range rrs {
		if a, ok := rr.(*dns.A); ok {
			out = append(out, a.A.String())
		}
	}
	return out
}

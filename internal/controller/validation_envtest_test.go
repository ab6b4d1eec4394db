package controller_test

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/metrics"
	"github.com/hyperfleet/hyperfleet/internal/testworld/dnsserver"
	"github.com/hyperfleet/hyperfleet/internal/testworld/netns"
	"github.com/hyperfleet/hyperfleet/internal/testworld/sshserver"
)

// validationNet joins a network namespace to the host by a veth pair:
// the namespace's end (NSAddr) stands for a VM's address, which the
// operator in the host reaches over a real network stack (ping, SSH), and
// the host's end (HostAddr) is where BIND serves the zone at port 53.
func validationNet(t *testing.T) *netns.Link {
	t.Helper()
	n := os.Getpid() % 250
	l, err := netns.Create(fmt.Sprintf("hfval%d", os.Getpid()%100000), netip.MustParsePrefix(fmt.Sprintf("198.18.%d.0/29", n)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := l.Close(); err != nil {
			t.Errorf("remove the network namespace: %v", err)
		}
	})
	return l
}

// serveSSH runs an SSH server (golang.org/x/crypto/ssh's) in the
// namespace at its end's address; it lets nobody log in.
func serveSSH(t *testing.T, l *netns.Link) int {
	t.Helper()
	srv, err := sshserver.New()
	if err != nil {
		t.Fatal(err)
	}
	ln, err := l.Listen("0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	srv.Serve(ln)
	return ln.Addr().(*net.TCPAddr).Port
}

// validatingCluster validates its VMs' names at server and their
// reachability by ping and SSH on sshPort; network failures fail the
// claim, DNS failures are only reported.
func validatingCluster(server netip.Addr, sshPort int) func(*hfv1.HypervisorCluster) {
	return func(c *hfv1.HypervisorCluster) {
		c.Spec.DNS = &hfv1.ClusterDNSSettings{
			DNSSettings: hfv1.DNSSettings{Domain: dnsTestZone, Servers: []string{server.String()}},
			Validation:  &hfv1.DNSValidation{ValidateReverse: true, TimeoutSeconds: 3},
		}
		c.Spec.Network = &hfv1.ClusterNetworkSettings{Validation: &hfv1.NetworkValidation{
			SSHTest: true, SSHPort: int32(sshPort), TimeoutSeconds: 3, OnFailure: hfv1.ValidationFailClaim,
		}}
	}
}

// TestNetworkValidation: on a cluster with dns.validation and
// network.validation, a running claim whose address answers ping and SSH
// and whose name a real BIND resolves (forward and reverse) is
// NetworkValidated with every check passed in status.networkValidation;
// a claim at an address nobody answers, with no record in DNS, is
// reported (DNSLookupFailed, the first failed check) and, since the
// network checks' onFailure is FailClaim, ends Failed. The metrics count
// both.
func TestNetworkValidation(t *testing.T) {
	l := validationNet(t)
	rev, err := reverseZone(l.NSAddr)
	if err != nil {
		t.Fatal(err)
	}
	bind := dnsserver.StartBIND(t, dnsserver.Options{Zones: []string{dnsTestZone, rev}, Listen: l.HostAddr})
	bind.Add(t, fmt.Sprintf("val-ok.%s. 60 IN A %s", dnsTestZone, l.NSAddr))
	bind.Add(t, fmt.Sprintf("%s 60 IN PTR val-ok.%s.", mustReverse(l.NSAddr), dnsTestZone))
	sshPort := serveSSH(t, l)

	sim := startSim(t, nil)
	startOperator(t, operatorOptions{})
	f := newFixture(t, sim, validatingCluster(l.HostAddr, sshPort))
	// The pool's first address is the namespace's end, its second one
	// nothing answers.
	pool := &hfv1.IPPool{
		ObjectMeta: metav1.ObjectMeta{Name: "pool-" + f.namespace},
		Spec: hfv1.IPPoolSpec{Addresses: []string{l.NSAddr.String() + "-" + l.NSAddr.Next().String()}, Prefix: 29,
			Gateways: []string{l.HostAddr.String()}},
	}
	f.create(pool)
	t.Cleanup(func() { _ = env.Client.Delete(context.Background(), pool) })
	static := f.staticTemplate(t, pool)
	passedBefore := testutil.ToFloat64(metrics.NetworkValidations.WithLabelValues(f.cluster.Name, "ssh", "passed"))
	failedBefore := testutil.ToFloat64(metrics.NetworkValidations.WithLabelValues(f.cluster.Name, "forward", "failed"))

	ok := newClaimOf(f, static, "val-ok")
	cond := waitClaimCondition(t, ok, hfv1.MachineClaimNetworkValidatedCondition, metav1.ConditionTrue, hfv1.NetworkValidatedReason)
	got, err := getClaim(t, ok)
	if err != nil {
		t.Fatal(err)
	}
	if a := got.Status.Network.IPAllocations; len(a) != 1 || !strings.HasPrefix(a[0].Address, l.NSAddr.String()+"/") {
		t.Fatalf("claim val-ok has %+v, want %s", a, l.NSAddr)
	}
	st := got.Status.NetworkValidation
	if st == nil || st.LastValidated == nil || len(st.Checks) != 4 {
		t.Fatalf("status.networkValidation = %+v, want four checks", st)
	}
	for i, want := range []hfv1.NetworkCheck{hfv1.CheckForward, hfv1.CheckReverse, hfv1.CheckPing, hfv1.CheckSSH} {
		if c := st.Checks[i]; c.Check != want || !c.Passed {
			t.Errorf("check %d = %+v, want %s passed", i, c, want)
		}
	}
	for _, want := range []string{"val-ok." + dnsTestZone + " resolves to " + l.NSAddr.String(), "ping answered by " + l.NSAddr.String(), "ssh-ed25519 SHA256:"} {
		if !strings.Contains(cond.Message, want) {
			t.Errorf("NetworkValidated's message %q lacks %q", cond.Message, want)
		}
	}
	if got.Status.Phase != hfv1.MachineClaimBootstrapping && got.Status.Phase != hfv1.MachineClaimReady {
		t.Errorf("validated claim in phase %s", got.Status.Phase)
	}

	bad := newClaimOf(f, static, "val-bad")
	eventually(t, 60*time.Second, "claim val-bad ended", func() error {
		got, err = getClaim(t, bad)
		if err == nil && got.Status.End == nil {
			err = fmt.Errorf("not ended: %+v", got.Status.Conditions)
		}
		return err
	})
	nv := hfv1.FindCondition(got.Status.Conditions, hfv1.MachineClaimNetworkValidatedCondition)
	if nv == nil || nv.Status != metav1.ConditionFalse || nv.Reason != string(hfv1.DNSLookupFailedReason) || !strings.Contains(nv.Message, "no address") {
		t.Errorf("val-bad NetworkValidated = %+v, want False DNSLookupFailed naming the missing record", nv)
	}
	if !got.Status.End.Failed || got.Status.End.Reason != hfv1.EndFailed || !strings.HasPrefix(got.Status.TerminationReason, string(hfv1.NetworkValidationFailedReason)+":") {
		t.Errorf("val-bad ended with %+v (%q), want failed for NetworkValidationFailed", got.Status.End, got.Status.TerminationReason)
	}
	for _, c := range got.Status.NetworkValidation.Checks {
		if c.Passed {
			t.Errorf("val-bad: check %s passed: %s", c.Check, c.Message)
		}
	}
	if n := testutil.ToFloat64(metrics.NetworkValidations.WithLabelValues(f.cluster.Name, "ssh", "passed")); n < passedBefore+1 {
		t.Errorf("hyperfleet_network_validation_total{check=ssh,result=passed} = %v, want at least %v", n, passedBefore+1)
	}
	if n := testutil.ToFloat64(metrics.NetworkValidations.WithLabelValues(f.cluster.Name, "forward", "failed")); n < failedBefore+1 {
		t.Errorf("hyperfleet_network_validation_total{check=forward,result=failed} = %v, want at least %v", n, failedBefore+1)
	}
}

// reverseZone is the in-addr.arpa zone of addr's /24.
func reverseZone(addr netip.Addr) (string, error) {
	if !addr.Is4() {
		return "", fmt.Errorf("%s is not IPv4", addr)
	}
	b := addr.As4()
	return fmt.Sprintf("%d.%d.%d.in-addr.arpa", b[2], b[1], b[0]), nil
}

func mustReverse(addr netip.Addr) string {
	b := addr.As4()
	return fmt.Sprintf("%d.%d.%d.%d.in-addr.arpa.", b[3], b[2], b[1], b[0])
}

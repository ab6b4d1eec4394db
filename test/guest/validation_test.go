//go:build guest

package guest

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/dnsreg"
	"github.com/hyperfleet/hyperfleet/internal/dnsreg/rfc2136"
	"github.com/hyperfleet/hyperfleet/internal/metrics"
	"github.com/hyperfleet/hyperfleet/internal/testworld/devenv"
	"github.com/hyperfleet/hyperfleet/internal/testworld/dnsserver"
	"github.com/hyperfleet/hyperfleet/internal/testworld/simulator/guestnet"
)

// The in-process operator builds DNS back-ends from dnsreg's registry, as
// the binary does once its main registered rfc2136 (cmd/hyperfleet).
func init() { dnsreg.Register(dnsreg.TypeRFC2136, rfc2136.Factory) }

// validationZone is the guests' DNS domain in the validation scenario.
const validationZone = "ci.example.test"

// validateOnBridge sets opts up for DNS and network validation of real
// guests on gn's bridge: the host joins the bridge (at its .254), a real
// BIND listens there at port 53 with the forward zone and the bridge
// network's reverse zone, the bridge network is the cluster's VM subnet
// (spec.network.vmSubnets), the cluster registers its VMs on that BIND
// (rfc2136) and validates them against it (dns.servers), forward and
// reverse, pings them from the operator's own network and reads their SSH
// servers' host keys (the guest image runs openssh-server, as Debian's
// cloud images do). The returned probe, run on each running guest, reads
// the guest's own host keys through its guest agent; the returned check,
// run after the jobs, reads what the operator found and compares the host
// key it saw with the guest's.
func validateOnBridge(t *testing.T, gn *guestnet.Network, opts *devenv.Options) (probe func(context.Context, *devenv.World, int, hfv1.MachineClaim) error, check func(w *devenv.World)) {
	t.Helper()
	host, err := gn.Join(254)
	if err != nil {
		t.Fatal(err)
	}
	b := gn.Prefix.Addr().As4()
	reverse := fmt.Sprintf("%d.%d.%d.in-addr.arpa", b[2], b[1], b[0])
	bind := dnsserver.StartBIND(t, dnsserver.Options{Zones: []string{validationZone, reverse}, Listen: host})
	opts.Secrets = []*corev1.Secret{{ObjectMeta: metav1.ObjectMeta{Name: "dns-update-key"}, StringData: map[string]string{"tsig.key": dnsserver.UpdateKey.Clause()}}}
	opts.ClusterDNS = &hfv1.ClusterDNSSettings{
		DNSSettings: hfv1.DNSSettings{Domain: validationZone, Servers: []string{host.String()}},
		RegisterVMs: true,
		DNSProvider: &hfv1.DNSProvider{
			Type: dnsreg.TypeRFC2136, ReverseZones: []string{reverse}, TTLSeconds: 60,
			RFC2136: &hfv1.RFC2136Settings{Server: bind.Addr},
			Credentials: []hfv1.NamedSecretKeySelector{{Name: rfc2136.CredentialKey,
				SecretKeyRef: hfv1.SecretKeySelector{Namespace: devenv.SystemNamespace, Name: "dns-update-key", Key: "tsig.key"}}},
		},
		Validation: &hfv1.DNSValidation{ValidateReverse: true, TimeoutSeconds: 5},
	}
	// The VM is validated as soon as it reports an address, before
	// cloud-init has made its SSH host keys and sshd has started (26 s
	// later in a CI run under load): the SSH check waits for it up to its
	// timeout.
	// The guests lease their addresses on the bridge's network: the
	// cluster's VM subnet, without which an address a guest reports is
	// neither registered nor probed.
	opts.ClusterNetwork = &hfv1.ClusterNetworkSettings{VMSubnets: []string{gn.Prefix.String()},
		Validation: &hfv1.NetworkValidation{TimeoutSeconds: 90, SSHTest: true}}
	before := map[string]float64{}
	for _, check := range []string{"forward", "reverse", "ping", "ssh"} {
		before[check] = testutil.ToFloat64(metrics.NetworkValidations.WithLabelValues(devenv.ClusterName, check, "passed"))
	}
	var mu sync.Mutex
	hostKeys := map[string]string{} // claim name -> ssh-keygen -l of the guest's host keys
	probe = func(ctx context.Context, w *devenv.World, vmid int, claim hfv1.MachineClaim) error {
		res, err := w.Proxmox.GuestExec(ctx, vmid, "sh", "-c", "for k in /etc/ssh/ssh_host_*_key.pub; do ssh-keygen -l -f \"$k\"; done")
		if err != nil {
			return err
		}
		if res.ExitCode != 0 || !strings.Contains(res.Stdout, "SHA256:") {
			return fmt.Errorf("the guest's SSH host keys: exit %d, output %q (stderr %q)", res.ExitCode, res.Stdout, res.Stderr)
		}
		mu.Lock()
		hostKeys[claim.Name] = res.Stdout
		mu.Unlock()
		return nil
	}
	return probe, func(w *devenv.World) {
		t.Helper()
		var events corev1.EventList
		if err := w.API.Client.List(context.Background(), &events, client.InNamespace(devenv.Namespace)); err != nil {
			t.Fatal(err)
		}
		validated := 0
		for _, e := range events.Items {
			if e.InvolvedObject.Kind != "MachineClaim" {
				continue
			}
			if isValidationReason(e.Reason) {
				// Said for the record; the Validated event below is what
				// must be there.
				t.Logf("claim %s: %s %s: %s", e.InvolvedObject.Name, e.Type, e.Reason, e.Message)
			}
			if e.Reason != string(hfv1.NetworkValidatedReason) {
				continue
			}
			validated++
			t.Logf("claim %s: %s", e.InvolvedObject.Name, e.Message)
			addr, err := pingedAddr(e.Message)
			if err != nil || !gn.Prefix.Contains(addr) {
				t.Errorf("claim %s: the validation pinged %v (%v), not an address of the guests' network %s", e.InvolvedObject.Name, addr, err, gn.Prefix)
				continue
			}
			fqdn := e.InvolvedObject.Name + "." + validationZone
			for _, want := range []string{
				fmt.Sprintf("%s resolves to %s at %s", fqdn, addr, host),
				fmt.Sprintf("the PTR records of %s name %s at %s", addr, fqdn, host),
				fmt.Sprintf("SSH on port %d answered by %s (", hfv1.DefaultSSHPort, addr),
			} {
				if !strings.Contains(e.Message, want) {
					t.Errorf("claim %s: the validation's message lacks %q", e.InvolvedObject.Name, want)
				}
			}
			// The key the check saw is the guest's own, not some other
			// server's on that address.
			fp, err := sshFingerprint(e.Message)
			mu.Lock()
			keys := hostKeys[e.InvolvedObject.Name]
			mu.Unlock()
			if err != nil || keys == "" || !strings.Contains(keys, fp+" ") {
				t.Errorf("claim %s: the SSH check saw host key %q (%v); the guest's host keys are %q", e.InvolvedObject.Name, fp, err, keys)
			}
		}
		if validated == 0 {
			t.Errorf("no claim was NetworkValidated (event %s); events: %+v", hfv1.NetworkValidatedReason, events.Items)
		}
		for check, n := range before {
			if got := testutil.ToFloat64(metrics.NetworkValidations.WithLabelValues(devenv.ClusterName, check, "passed")); got <= n {
				t.Errorf("hyperfleet_network_validation_total{check=%q,result=\"passed\"} = %v, not above %v", check, got, n)
			}
		}
	}
}

// isValidationReason: a failure reason of the NetworkValidated condition.
func isValidationReason(reason string) bool {
	switch hfv1.ConditionReason(reason) {
	case hfv1.DNSLookupFailedReason, hfv1.ReverseLookupMismatchReason, hfv1.PingFailedReason, hfv1.PingNotPermittedReason,
		hfv1.SSHUnreachableReason, hfv1.ValidationNotPossibleReason, hfv1.NetworkValidationFailedReason, hfv1.AddressOutsideVMSubnetsReason:
		return true
	}
	return false
}

// sshFingerprint reads the fingerprint out of "SSH on port N answered by
// <addr> (<type> <fingerprint>)".
func sshFingerprint(msg string) (string, error) {
	_, rest, ok := strings.Cut(msg, "SSH on port ")
	if !ok {
		return "", fmt.Errorf("no SSH check in %q", msg)
	}
	_, rest, ok = strings.Cut(rest, "(")
	if !ok {
		return "", fmt.Errorf("no host key in %q", msg)
	}
	key, _, _ := strings.Cut(rest, ")")
	_, fp, ok := strings.Cut(key, " ")
	if !ok || !strings.HasPrefix(fp, "SHA256:") {
		return "", fmt.Errorf("host key %q has no SHA256 fingerprint", key)
	}
	return fp, nil
}

// pingedAddr reads the address out of "ping answered by <addr> in <rtt>".
func pingedAddr(msg string) (netip.Addr, error) {
	_, rest, ok := strings.Cut(msg, "ping answered by ")
	if !ok {
		return netip.Addr{}, fmt.Errorf("no ping in %q", msg)
	}
	a, _, _ := strings.Cut(rest, " ")
	return netip.ParseAddr(a)
}

package controller

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/record"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/dnsreg"
	"github.com/hyperfleet/hyperfleet/internal/phase"
)

// checkedRegistrar is a dnsreg.Registrar whose Check answers err.
type checkedRegistrar struct {
	dnsreg.Registrar
	err    *error
	checks *int
}

func (r checkedRegistrar) Check(context.Context) error {
	*r.checks++
	return *r.err
}

// TestCheckDNS: the cluster's dnsProvider is built from its spec and its
// Secret, checked and reported in DNSReady (never in Ready, and never
// stopping the pass); a result stands for its interval; a failure's reason
// is the error's (DNSServerUnreachable without a class, SecretNotFound for
// a missing Secret, the library's otherwise); a cluster without a
// dnsProvider has neither a registrar nor the condition.
func TestCheckDNS(t *testing.T) {
	ctx := context.Background()
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "hf", Name: "tsig"}, Data: map[string][]byte{"key": []byte("hmac-sha256:k:c2VjcmV0")}}
	cluster := &hfv1.HypervisorCluster{ObjectMeta: metav1.ObjectMeta{Name: "pve", UID: "uid-1", Generation: 1}}
	cluster.Spec.DNS = &hfv1.ClusterDNSSettings{
		DNSSettings: hfv1.DNSSettings{Domain: "ci.example.test"},
		RegisterVMs: true,
		DNSProvider: &hfv1.DNSProvider{Type: dnsreg.TypeRFC2136, ReverseZones: []string{"2.0.192.in-addr.arpa"},
			RFC2136:     &hfv1.RFC2136Settings{Server: "192.0.2.53:53"},
			Credentials: []hfv1.NamedSecretKeySelector{{Name: "tsigKey", SecretKeyRef: hfv1.SecretKeySelector{Namespace: "hf", Name: "tsig", Key: "key"}}}},
	}
	var checkErr error
	checks, builds := 0, 0
	var built dnsreg.Config
	clk := clocktesting.NewFakeClock(unitEpoch)
	rec := record.NewFakeRecorder(16)
	r := &HypervisorClusterReconciler{Client: unitWorld(t, interceptor.Funcs{}, secret), Recorder: rec, Clock: clk, DNS: dnsreg.NewClusters(),
		DNSFactories: map[hfv1.DNSProviderType]dnsreg.Factory{dnsreg.TypeRFC2136: func(cfg dnsreg.Config) (dnsreg.Registrar, error) {
			builds++
			built = cfg
			return checkedRegistrar{err: &checkErr, checks: &checks}, nil
		}}}
	pass := func(want metav1.ConditionStatus, reason hfv1.ConditionReason) {
		t.Helper()
		if res, err := r.checkDNS(ctx, &clusterScope{cluster: cluster}); err != nil || res != phase.Next() {
			t.Fatalf("checkDNS = %v, %v; want the next phase", res, err)
		}
		c := meta.FindStatusCondition(cluster.Status.Conditions, string(hfv1.HypervisorClusterDNSReadyCondition))
		if c == nil || c.Status != want || c.Reason != string(reason) {
			t.Fatalf("DNSReady = %+v, want %s/%s", c, want, reason)
		}
		if meta.FindStatusCondition(cluster.Status.Conditions, string(hfv1.ReadyCondition)) != nil {
			t.Fatal("checkDNS set Ready")
		}
	}

	pass(metav1.ConditionTrue, hfv1.ReadyReason)
	if builds != 1 || checks != 1 || built.Zone != "ci.example.test" || built.Options["server"] != "192.0.2.53:53" || built.Options["transport"] != "tcp" ||
		string(built.Credentials["tsigKey"]) != "hmac-sha256:k:c2VjcmV0" || built.TTL.Seconds() != hfv1.DefaultDNSTTLSeconds {
		t.Fatalf("built %d, checked %d times, config %+v", builds, checks, built)
	}
	if _, ok := r.DNS.Registering("pve"); !ok {
		t.Fatal("the cluster's registrar is not registering")
	}
	// Within the interval, a poll neither rebuilds nor checks again.
	pass(metav1.ConditionTrue, hfv1.ReadyReason)
	if builds != 1 || checks != 1 {
		t.Fatalf("a poll within the interval built %d and checked %d times", builds, checks)
	}

	// The server goes silent: the next check reports it, once as an event.
	checkErr = errors.New("read tcp: i/o timeout")
	clk.Step(dnsCheckInterval)
	pass(metav1.ConditionFalse, hfv1.DNSServerUnreachableReason)
	if e := nextEvent(rec); !strings.HasPrefix(e, "Warning DNSServerUnreachable") || !strings.Contains(e, "VMs are still created and deleted") {
		t.Fatalf("event %q", e)
	}
	if dc, _ := r.DNS.Get("pve"); dc.CheckErr == nil {
		t.Fatal("the failed check is not recorded for the claims")
	}
	// A refusal is retried sooner, with the library's reason.
	checkErr = fmt.Errorf("zone ci.example.test.: %w", dnsreg.ErrRefused)
	clk.Step(dnsRetryInterval)
	pass(metav1.ConditionFalse, "DNSUpdateRefused")
	checkErr = nil
	clk.Step(dnsRetryInterval)
	pass(metav1.ConditionTrue, hfv1.ReadyReason)
	if builds != 1 {
		t.Fatalf("rebuilt %d times without a change", builds)
	}

	// A new generation naming a missing Secret.
	cluster.Generation = 2
	cluster.Spec.DNS.DNSProvider.Credentials[0].SecretKeyRef.Name = "missing"
	pass(metav1.ConditionFalse, hfv1.SecretNotFoundReason)
	if _, ok := r.DNS.Registering("pve"); ok {
		t.Fatal("a cluster whose registrar could not be built registers VMs")
	}

	// No dnsProvider: no registrar, no condition.
	cluster.Generation = 3
	cluster.Spec.DNS = &hfv1.ClusterDNSSettings{DNSSettings: hfv1.DNSSettings{Domain: "ci.example.test"}}
	if _, err := r.checkDNS(ctx, &clusterScope{cluster: cluster}); err != nil {
		t.Fatal(err)
	}
	if _, ok := r.DNS.Get("pve"); ok || meta.FindStatusCondition(cluster.Status.Conditions, string(hfv1.HypervisorClusterDNSReadyCondition)) != nil {
		t.Fatal("a cluster without a dnsProvider keeps its registrar or DNSReady")
	}
}

// nextEvent is the next recorded event, "" when there is none.
func nextEvent(rec *record.FakeRecorder) string {
	select {
	case e := <-rec.Events:
		return e
	default:
		return ""
	}
}

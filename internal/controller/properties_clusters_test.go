package controller_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	"pgregory.net/rapid"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/testworld/proptest"
	proxmoxsim "github.com/hyperfleet/hyperfleet/internal/testworld/simulator/proxmox"
)

// clusterSpec is a generated HypervisorCluster connection: each field may
// be wrong in the way people get it wrong.
type clusterSpec struct {
	secretMissing bool // the token Secret does not exist (yet)
	tokenWrong    bool // the Secret holds another token's secret
	portWrong     bool // spec.endpoint names a port nothing listens on
	fpWrong       bool // spec.tls.fingerprintSHA256 is another certificate's
}

// reason is the Ready reason the operator must give for the spec: the
// first problem on the way to a connection (the Secret is read before
// anything is dialled, the TLS handshake comes before the token is sent).
func (c clusterSpec) reason() hfv1.ConditionReason {
	switch {
	case c.secretMissing:
		return hfv1.SecretNotFoundReason
	case c.portWrong:
		return hfv1.UnreachableReason
	case c.fpWrong:
		return hfv1.InvalidTLSReason
	case c.tokenWrong:
		return hfv1.AuthenticationFailedReason
	}
	return hfv1.ReadyReason
}

// clusterWorld is one operator and one simulator; each case brings its
// own HypervisorCluster (with its token Secret), template and claim.
type clusterWorld struct {
	*propertyWorld
}

func (w *clusterWorld) clusterCondition(t *rapid.T, name string, typ hfv1.ConditionType) *metav1.Condition {
	t.Helper()
	var c hfv1.HypervisorCluster
	if err := env.Client.Get(context.Background(), client.ObjectKey{Name: name}, &c); err != nil {
		t.Fatal(err)
	}
	return meta.FindStatusCondition(c.Status.Conditions, string(typ))
}

// waitCluster waits until the cluster's Ready condition has status and
// reason, and its Connected condition agrees.
func (w *clusterWorld) waitCluster(t *rapid.T, name string, status metav1.ConditionStatus, reason hfv1.ConditionReason) {
	t.Helper()
	within(t, 15*time.Second, fmt.Sprintf("cluster %s Ready=%s (%s)", name, status, reason), func() error {
		ready := w.clusterCondition(t, name, hfv1.ReadyCondition)
		if ready == nil || ready.Status != status || ready.Reason != string(reason) {
			return fmt.Errorf("Ready is %+v", ready)
		}
		connected := w.clusterCondition(t, name, hfv1.HypervisorClusterConnectedCondition)
		if wantConnected := status == metav1.ConditionTrue; (connected != nil && connected.Status == metav1.ConditionTrue) != wantConnected {
			return fmt.Errorf("Ready is %s but Connected is %+v", status, connected)
		}
		return nil
	})
}

// checkWaits checks that the claim waits for its cluster, saying so, and
// that no VM of it is on the hypervisor, for a while.
func (w *clusterWorld) checkWaits(t *rapid.T, claim *hfv1.MachineClaim, cluster string) {
	t.Helper()
	within(t, 10*time.Second, "claim "+claim.Name+" waiting for its cluster", func() error {
		c, err := getClaim(w.f.t, claim)
		if err != nil {
			return err
		}
		cond := meta.FindStatusCondition(c.Status.Conditions, string(hfv1.MachineClaimProvisionedCondition))
		if cond == nil || cond.Status != metav1.ConditionFalse ||
			(cond.Reason != string(hfv1.ClusterUnavailableReason) && cond.Reason != string(hfv1.TemplateNotReadyReason)) {
			return fmt.Errorf("Provisioned is %+v", cond)
		}
		if !strings.Contains(cond.Message, cluster) {
			// Its template may not be validated yet; once it is, the
			// claim must say which cluster it waits for.
			return fmt.Errorf("waits (%s) without naming its cluster %s: %s", cond.Reason, cluster, cond.Message)
		}
		return nil
	})
	deadline := time.Now().Add(300 * time.Millisecond)
	for time.Now().Before(deadline) {
		c, err := getClaim(w.f.t, claim)
		if err != nil {
			t.Fatal(err)
		}
		if vms := w.vmsOf(string(c.UID)); len(vms) > 0 || c.Status.VMRef != nil {
			t.Fatalf("claim %s got VM %v (%+v) on an unavailable cluster %s", claim.Name, vms, c.Status.VMRef, cluster)
		}
		time.Sleep(30 * time.Millisecond)
	}
}

// waitVM waits until the claim's VM is on the hypervisor.
func (w *clusterWorld) waitVM(t *rapid.T, claim *hfv1.MachineClaim) {
	t.Helper()
	within(t, 15*time.Second, "claim "+claim.Name+" has a VM", func() error {
		c, err := getClaim(w.f.t, claim)
		if err != nil {
			return err
		}
		if len(w.vmsOf(string(c.UID))) == 0 {
			return fmt.Errorf("phase %s, conditions %v", c.Status.Phase, c.Status.Conditions)
		}
		return nil
	})
}

// Feature: hyperfleet-operator, Property 1: Hypervisor Connection Management
//
// TestHypervisorConnectionProperty: a HypervisorCluster with generated
// connection parameters (its token Secret present or missing, the right
// token or another's, its endpoint's port right or wrong, its TLS
// fingerprint the server's or another's) is Ready and Connected exactly
// when every one is right, and otherwise says which is wrong (the first
// on the way to a connection); a claim on it waits, naming the cluster,
// and no VM of it is created; once the parameters are fixed (the Secret
// created or corrected, the spec edited) the cluster connects and the
// claim gets its VM. A connected cluster whose API stops answering (the
// probe's requests fail, the rest of the API still works) is marked
// Unreachable, and a claim made then waits without a VM.
func TestHypervisorConnectionProperty(t *testing.T) {
	longScenario(t)
	sim := startSim(t, func(c *proxmoxsim.Config) {
		c.Latency = propertyLatency()
		c.RefreshInterval = proxmoxsim.Duration(100 * time.Millisecond)
	})
	op := startOperator(t, operatorOptions{maxRetryDelay: time.Second})
	w := &clusterWorld{&propertyWorld{sim: sim, op: op, f: newFixture(t, sim, nil)}}
	ctx := context.Background()
	var refused, connected, outages int
	proptest.Check(t, proptest.Minimum, func(rt *rapid.T) {
		w.n++
		name := fmt.Sprintf("p1-%d-%s", w.n, w.f.namespace)
		spec := clusterSpec{}
		if rapid.IntRange(0, 1).Draw(rt, "misconfigured") == 1 {
			spec = clusterSpec{
				secretMissing: rapid.Bool().Draw(rt, "secret missing"),
				tokenWrong:    rapid.Bool().Draw(rt, "token wrong"),
				portWrong:     rapid.Bool().Draw(rt, "port wrong"),
				fpWrong:       rapid.Bool().Draw(rt, "fingerprint wrong"),
			}
		}
		outage := spec.reason() == hfv1.ReadyReason && rapid.IntRange(0, 5).Draw(rt, "outage (5)") == 5
		token := simTokenSecret
		if spec.tokenWrong {
			token = "11111111-1111-1111-1111-111111111111"
		}
		secret := &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Namespace: secretNamespace, Name: name},
			StringData: map[string]string{"id": simTokenID, "secret": token},
		}
		if !spec.secretMissing {
			if err := env.Client.Create(ctx, secret); err != nil {
				rt.Fatal(err)
			}
		}
		endpoint, fp := sim.url, sim.fingerprint
		if spec.portWrong {
			endpoint = "https://127.0.0.1:1/api2/json"
		}
		if spec.fpWrong {
			fp = strings.Repeat("AB:", 31) + "AB"
		}
		cluster := &hfv1.HypervisorCluster{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: hfv1.HypervisorClusterSpec{
				Provider: hfv1.ProviderProxmox,
				Endpoint: endpoint,
				Credentials: hfv1.HypervisorCredentials{
					TokenID:     &hfv1.SecretKeySelector{Namespace: secretNamespace, Name: name, Key: "id"},
					TokenSecret: &hfv1.SecretKeySelector{Namespace: secretNamespace, Name: name, Key: "secret"},
				},
				TLS:          &hfv1.HypervisorTLS{FingerprintSHA256: fp},
				Proxmox:      &hfv1.ProxmoxClusterSettings{VMIDRange: &hfv1.VMIDRange{Start: 2000, End: 2999}},
				PollInterval: &metav1.Duration{Duration: time.Second},
			},
		}
		if err := env.Client.Create(ctx, cluster); err != nil {
			rt.Fatal(err)
		}
		tmpl := w.f.template.DeepCopy()
		tmpl.ObjectMeta = metav1.ObjectMeta{Namespace: w.f.namespace, Name: fmt.Sprintf("p1-%d", w.n)}
		tmpl.Spec.HypervisorClusterRef = hfv1.ObjectName{Name: name}
		tmpl.Spec.Source.Proxmox.TemplateID = ptr.To[int32](9000)
		if err := env.Client.Create(ctx, tmpl); err != nil {
			rt.Fatal(err)
		}
		claim := &hfv1.MachineClaim{
			ObjectMeta: metav1.ObjectMeta{Namespace: w.f.namespace, Name: fmt.Sprintf("p1-%d", w.n)},
			Spec:       hfv1.MachineClaimSpec{TemplateRef: hfv1.ObjectName{Name: tmpl.Name}},
		}
		defer w.removeCase(rt, claim, tmpl, cluster, secret)

		switch {
		case spec.reason() != hfv1.ReadyReason:
			refused++
			w.waitCluster(rt, name, metav1.ConditionFalse, spec.reason())
			if err := env.Client.Create(ctx, claim); err != nil {
				rt.Fatal(err)
			}
			w.checkWaits(rt, claim, name)
			// Started: every parameter fixed, in the way an admin
			// would: the Secret created or corrected, the spec edited.
			if spec.secretMissing || spec.tokenWrong {
				var s corev1.Secret
				err := env.Client.Get(ctx, client.ObjectKeyFromObject(secret), &s)
				switch {
				case apierrors.IsNotFound(err):
					secret.StringData["secret"] = simTokenSecret
					err = env.Client.Create(ctx, secret)
				case err == nil:
					s.StringData = map[string]string{"secret": simTokenSecret}
					err = env.Client.Update(ctx, &s)
				}
				if err != nil {
					rt.Fatal(err)
				}
			}
			if spec.portWrong || spec.fpWrong {
				if err := retry.RetryOnConflict(conflictRetry, func() error {
					var c hfv1.HypervisorCluster
					if err := env.Client.Get(ctx, client.ObjectKey{Name: name}, &c); err != nil {
						return err
					}
					c.Spec.Endpoint, c.Spec.TLS.FingerprintSHA256 = sim.url, sim.fingerprint
					return env.Client.Update(ctx, &c)
				}); err != nil {
					rt.Fatal(err)
				}
			}
			w.waitCluster(rt, name, metav1.ConditionTrue, hfv1.ReadyReason)
			w.waitVM(rt, claim)
		case outage:
			outages++
			w.waitCluster(rt, name, metav1.ConditionTrue, hfv1.ReadyReason)
			// Stopped: the probe's requests (version, nodes) fail; clone
			// and the rest would still work, so a claim that ignored the
			// cluster's state would get a VM.
			kind := rapid.SampledFrom([]proxmoxsim.FaultSpec{{ErrorRate: 1, ErrorCode: 503}, {DropRate: 1}}).Draw(rt, "outage kind")
			if err := sim.SetFaults(proxmoxsim.Faults{Classes: map[string]proxmoxsim.FaultSpec{"other": kind}}); err != nil {
				rt.Fatal(err)
			}
			defer func() { _ = sim.SetFaults(proxmoxsim.Faults{}) }()
			w.waitCluster(rt, name, metav1.ConditionFalse, hfv1.UnreachableReason)
			if err := env.Client.Create(ctx, claim); err != nil {
				rt.Fatal(err)
			}
			w.checkWaits(rt, claim, name)
		default:
			connected++
			w.waitCluster(rt, name, metav1.ConditionTrue, hfv1.ReadyReason)
			if err := env.Client.Create(ctx, claim); err != nil {
				rt.Fatal(err)
			}
			w.waitVM(rt, claim)
		}
	})
	t.Logf("cases: %d misconfigured, %d connected, %d outages", refused, connected, outages)
	// Outages cost seconds each (a Ready cluster absorbs three failed
	// probes, a second apart, before it is marked down), so they are a
	// small share; rapid's draws vary it from run to run.
	if cases := refused + connected + outages; refused*4 < cases || connected*10 < cases || outages == 0 {
		t.Errorf("the generator made %d misconfigured clusters, %d connected and %d outages of %d; want a quarter, a tenth and one at least", refused, connected, outages, cases)
	}
}

// removeCase deletes a case's claim, template, cluster and Secret, and
// waits until the claim's VM and the cluster are gone.
func (w *clusterWorld) removeCase(t *rapid.T, claim *hfv1.MachineClaim, tmpl *hfv1.HypervisorMachineTemplate, cluster *hfv1.HypervisorCluster, secret *corev1.Secret) {
	ctx := context.Background()
	_ = w.sim.SetFaults(proxmoxsim.Faults{})
	if got, err := getClaim(w.f.t, claim); err == nil {
		var vmids []int
		if ref := got.Status.VMRef; ref != nil {
			vmids = append(vmids, int(ref.VMID))
		}
		w.deleteAndCheckGone(t, got, vmids)
	}
	_ = env.Client.Delete(ctx, tmpl)
	_ = env.Client.Delete(ctx, cluster)
	within(t, 30*time.Second, "cluster "+cluster.Name+" gone", func() error {
		err := env.Client.Get(ctx, client.ObjectKeyFromObject(cluster), &hfv1.HypervisorCluster{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("still there (%w)", err)
	})
	_ = env.Client.Delete(ctx, secret)
}

package controller_test

import (
	"context"
	"errors"
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

// p1Draw draws a case of property 1: a cluster's connection parameters
// and, for a cluster that connects, whether its API then stops answering.
func p1Draw(rt *rapid.T) (spec clusterSpec, outage bool, kind proxmoxsim.FaultSpec) {
	if rapid.IntRange(0, 1).Draw(rt, "misconfigured") == 1 {
		spec = clusterSpec{
			secretMissing: rapid.Bool().Draw(rt, "secret missing"),
			tokenWrong:    rapid.Bool().Draw(rt, "token wrong"),
			portWrong:     rapid.Bool().Draw(rt, "port wrong"),
			fpWrong:       rapid.Bool().Draw(rt, "fingerprint wrong"),
		}
	}
	outage = spec.reason() == hfv1.ReadyReason && rapid.IntRange(0, 2).Draw(rt, "outage (2)") == 2
	if outage {
		kind = rapid.SampledFrom([]proxmoxsim.FaultSpec{{ErrorRate: 1, ErrorCode: 503}, {DropRate: 1}}).Draw(rt, "outage kind")
	}
	return spec, outage, kind
}

// clusterOf is a cluster of sim and its token Secret, with spec's mistakes.
func clusterOf(name, url, fingerprint string, spec clusterSpec) (*hfv1.HypervisorCluster, *corev1.Secret) {
	token := simTokenSecret
	if spec.tokenWrong {
		token = "11111111-1111-1111-1111-111111111111"
	}
	secret := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: secretNamespace, Name: name},
		StringData: map[string]string{"id": simTokenID, "secret": token},
	}
	if spec.portWrong {
		url = "https://127.0.0.1:1/api2/json"
	}
	if spec.fpWrong {
		fingerprint = strings.Repeat("AB:", 31) + "AB"
	}
	cluster := &hfv1.HypervisorCluster{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: hfv1.HypervisorClusterSpec{
			Provider: hfv1.ProviderProxmox,
			Endpoint: url,
			Credentials: hfv1.HypervisorCredentials{
				TokenID:     &hfv1.SecretKeySelector{Namespace: secretNamespace, Name: name, Key: "id"},
				TokenSecret: &hfv1.SecretKeySelector{Namespace: secretNamespace, Name: name, Key: "secret"},
			},
			TLS:          &hfv1.HypervisorTLS{FingerprintSHA256: fingerprint},
			Proxmox:      &hfv1.ProxmoxClusterSettings{VMIDRange: &hfv1.VMIDRange{Start: 2000, End: 2999}},
			PollInterval: &metav1.Duration{Duration: time.Second},
		},
	}
	return cluster, secret
}

// clusterState checks a cluster's Ready condition against status and
// reason, and that its Connected condition agrees.
func clusterState(c *hfv1.HypervisorCluster, status metav1.ConditionStatus, reason hfv1.ConditionReason) error {
	ready := meta.FindStatusCondition(c.Status.Conditions, string(hfv1.ReadyCondition))
	if ready == nil || ready.Status != status || ready.Reason != string(reason) {
		return fmt.Errorf("Ready is %+v, want %s (%s)", ready, status, reason)
	}
	connected := meta.FindStatusCondition(c.Status.Conditions, string(hfv1.HypervisorClusterConnectedCondition))
	if wantConnected := status == metav1.ConditionTrue; (connected != nil && connected.Status == metav1.ConditionTrue) != wantConnected {
		return fmt.Errorf("Ready is %s but Connected is %+v", status, connected)
	}
	return nil
}

// claimWaits checks that a claim waits for its cluster, saying so and
// naming it (its template may not be validated yet: it then waits for the
// template, which itself waits for the cluster).
func claimWaits(c *hfv1.MachineClaim, cluster string) error {
	cond := meta.FindStatusCondition(c.Status.Conditions, string(hfv1.MachineClaimProvisionedCondition))
	if cond == nil || cond.Status != metav1.ConditionFalse ||
		(cond.Reason != string(hfv1.ClusterUnavailableReason) && cond.Reason != string(hfv1.TemplateNotReadyReason)) {
		return fmt.Errorf("Provisioned is %+v", cond)
	}
	if !strings.Contains(cond.Message, cluster) {
		return fmt.Errorf("waits (%s) without naming its cluster %s: %s", cond.Reason, cluster, cond.Message)
	}
	return nil
}

// Feature: hyperfleet-operator, Property 1: Hypervisor Connection Management
//
// TestHypervisorConnectionProperty, in the cheap world (cheapworld_test.go:
// the reconcilers on the fake API server, the real Proxmox provider against
// the in-process simulator, fake time): a HypervisorCluster with generated
// connection parameters (its token Secret present or missing, the right
// token or another's, its endpoint's port right or wrong, its TLS
// fingerprint the server's or another's) is Ready and Connected exactly
// when every one is right, and otherwise says which is wrong (the first on
// the way to a connection); a claim on it waits, naming the cluster, and no
// VM of it is ever created while the cluster is unavailable (checked after
// every reconcile round over a minute of fake time, not sampled); once the
// parameters are fixed (the Secret created or corrected, the spec edited)
// the cluster connects and the claim gets its VM. A connected cluster whose
// API stops answering (its probe's requests fail with 503s or dropped
// connections, the rest of the API still works) is marked Unreachable, a
// claim made then waits without a VM, and once the API answers again the
// cluster is Ready and the claim gets its VM. Every case's objects are then
// removed, the claim's VM with it.
//
// Mutation: the claim controller and the template controller both
// ignoring the cluster's health (machineclaim/phases.go's loadProvider
// taking any connected provider, hypervisormachinetemplate_phases.go's
// checkOnHypervisor any connected cluster) fails this test in its first
// outage case: the claim is placed on the unreachable cluster. Either
// alone passes it (the other still holds the claim, and the outage's
// failing requests stop a placement), as it passed the envtest test. The
// envtest test would have caught the pair only in the outage cases rapid
// drew (it asked for one at least); this test draws one case in six.
func TestHypervisorConnectionProperty(t *testing.T) {
	w := newCheapWorld(t, cheapOptions{maxRetryDelay: time.Second})
	sim := w.StartSim(nil)
	w.ensurePATSecret()
	var refused, connected, outages, n int
	proptest.Check(t, proptest.Minimum, func(rt *rapid.T) {
		defer w.Case(rt)()
		n++
		name := fmt.Sprintf("p1-%d", n)
		spec, outage, kind := p1Draw(rt)
		cluster, secret := clusterOf(name, sim.url, sim.fingerprint, spec)
		if !spec.secretMissing {
			w.Create(secret)
		}
		w.Create(cluster)
		tmpl := cheapTemplate(name, name)
		w.Create(tmpl)
		claim := cheapClaim(name, name)
		defer func() {
			_ = sim.SetFaults(proxmoxsim.Faults{})
			w.removeAll(sim, claim, tmpl, cluster, secret)
		}()
		waitCluster := func(status metav1.ConditionStatus, reason hfv1.ConditionReason) {
			rt.Helper()
			w.RunUntil(5*time.Minute, fmt.Sprintf("cluster %s Ready=%s (%s)", name, status, reason), func() error {
				if !w.Get(cluster) {
					return errors.New("cluster gone")
				}
				return clusterState(cluster, status, reason)
			})
		}
		waits := func() {
			rt.Helper()
			w.Create(claim)
			// No VM, ever, while the cluster is unavailable.
			w.RunFor(time.Minute, "claim "+name+" on unavailable cluster "+name, func() error {
				if !w.Get(claim) {
					return errors.New("claim gone")
				}
				if vms := cheapVMsOf(sim.Simulator, string(claim.UID)); len(vms) > 0 || claim.Status.VMRef != nil {
					return fmt.Errorf("got VM %v (%+v)", vms, claim.Status.VMRef)
				}
				return nil
			})
			if err := claimWaits(claim, name); err != nil {
				rt.Fatalf("claim %s on unavailable cluster %s: %v", name, name, err)
			}
		}
		switch {
		case spec.reason() != hfv1.ReadyReason:
			refused++
			waitCluster(metav1.ConditionFalse, spec.reason())
			waits()
			// Every parameter fixed, as an admin would: the Secret
			// created or corrected, the spec edited.
			if spec.secretMissing {
				secret.StringData["secret"] = simTokenSecret
				w.Create(secret)
			} else if spec.tokenWrong {
				cheapEdit(w, secret, func(s *corev1.Secret) { s.Data["secret"] = []byte(simTokenSecret) })
			}
			if spec.portWrong || spec.fpWrong {
				cheapEdit(w, cluster, func(c *hfv1.HypervisorCluster) {
					c.Spec.Endpoint, c.Spec.TLS.FingerprintSHA256 = sim.url, sim.fingerprint
				})
			}
			waitCluster(metav1.ConditionTrue, hfv1.ReadyReason)
		case outage:
			outages++
			waitCluster(metav1.ConditionTrue, hfv1.ReadyReason)
			// The probe's requests (version, nodes) fail; clone and the
			// rest would still work, so a claim that ignored the
			// cluster's state would get a VM.
			if err := sim.SetFaults(proxmoxsim.Faults{Classes: map[string]proxmoxsim.FaultSpec{"other": kind}}); err != nil {
				rt.Fatal(err)
			}
			waitCluster(metav1.ConditionFalse, hfv1.UnreachableReason)
			waits()
			if err := sim.SetFaults(proxmoxsim.Faults{}); err != nil {
				rt.Fatal(err)
			}
			waitCluster(metav1.ConditionTrue, hfv1.ReadyReason)
		default:
			connected++
			waitCluster(metav1.ConditionTrue, hfv1.ReadyReason)
			w.Create(claim)
		}
		w.RunUntil(5*time.Minute, "claim "+name+" has a VM", func() error { return w.hasVM(sim, claim) })
	})
	t.Logf("cases: %d misconfigured, %d connected, %d outages; %d reconciles", refused, connected, outages, w.Reconciles)
	// The shares need the full count of cases: under -short (the race run)
	// rapid runs a fifth of them, which need not draw every kind.
	if cases := refused + connected + outages; !testing.Short() && (refused*4 < cases || connected*10 < cases || outages == 0) {
		t.Errorf("the generator made %d misconfigured clusters, %d connected and %d outages of %d; want a quarter, a tenth and one at least (outages are a small share, which rapid's draws vary from run to run: a tenth failed one run in two)", refused, connected, outages, cases)
	}
}

// clusterWorld is one operator and one simulator against the real API
// server; each scenario brings its own HypervisorCluster (with its token
// Secret), template and claim.
type clusterWorld struct {
	*propertyWorld
}

func (w *clusterWorld) cluster(t testing.TB, name string) *hfv1.HypervisorCluster {
	t.Helper()
	var c hfv1.HypervisorCluster
	if err := env.Client.Get(context.Background(), client.ObjectKey{Name: name}, &c); err != nil {
		t.Fatal(err)
	}
	return &c
}

// waitCluster waits until the cluster's Ready condition has status and
// reason, and its Connected condition agrees.
func (w *clusterWorld) waitCluster(t testing.TB, name string, status metav1.ConditionStatus, reason hfv1.ConditionReason) {
	t.Helper()
	eventually(t, 15*time.Second, fmt.Sprintf("cluster %s Ready=%s (%s)", name, status, reason), func() error {
		return clusterState(w.cluster(t, name), status, reason)
	})
}

// checkWaits checks that the claim waits for its cluster, saying so, and
// that no VM of it is on the hypervisor.
func (w *clusterWorld) checkWaits(t testing.TB, claim *hfv1.MachineClaim, cluster string) {
	t.Helper()
	eventually(t, 10*time.Second, "claim "+claim.Name+" waiting for its cluster", func() error {
		c, err := getClaim(t, claim)
		if err != nil {
			return err
		}
		return claimWaits(c, cluster)
	})
	c, err := getClaim(t, claim)
	if err != nil {
		t.Fatal(err)
	}
	if vms := w.vmsOf(string(c.UID)); len(vms) > 0 || c.Status.VMRef != nil {
		t.Fatalf("claim %s got VM %v (%+v) on an unavailable cluster %s", claim.Name, vms, c.Status.VMRef, cluster)
	}
}

// waitVM waits until the claim's VM is on the hypervisor.
func (w *clusterWorld) waitVM(t testing.TB, claim *hfv1.MachineClaim) {
	t.Helper()
	eventually(t, 15*time.Second, "claim "+claim.Name+" has a VM", func() error {
		c, err := getClaim(t, claim)
		if err != nil {
			return err
		}
		if len(w.vmsOf(string(c.UID))) == 0 {
			return fmt.Errorf("phase %s, conditions %v", c.Status.Phase, c.Status.Conditions)
		}
		return nil
	})
}

// TestHypervisorConnectionScenarios drives property 1's paths through the
// whole operator against the real API server (its watches, the Secret
// watch waking the cluster, the manager's wiring), one fixed case each: a
// missing Secret created later, a wrong port and fingerprint corrected in
// the spec, and a connected cluster whose probes start failing. The
// property itself is TestHypervisorConnectionProperty.
func TestHypervisorConnectionScenarios(t *testing.T) {
	longScenario(t)
	sim := startSim(t, func(c *proxmoxsim.Config) {
		c.Latency = propertyLatency()
		c.RefreshInterval = proxmoxsim.Duration(100 * time.Millisecond)
	})
	op := startOperator(t, operatorOptions{maxRetryDelay: time.Second})
	w := &clusterWorld{&propertyWorld{sim: sim, op: op, f: newFixture(t, sim, nil)}}
	for _, sc := range []struct {
		name   string
		spec   clusterSpec
		outage bool
	}{
		{name: "secret missing", spec: clusterSpec{secretMissing: true, tokenWrong: true}},
		{name: "port and fingerprint wrong", spec: clusterSpec{portWrong: true, fpWrong: true}},
		{name: "outage", outage: true},
	} {
		t.Run(sc.name, func(t *testing.T) {
			w.n++
			w.connectionScenario(t, fmt.Sprintf("p1-%d-%s", w.n, w.f.namespace), sc.spec, sc.outage)
		})
	}
}

func (w *clusterWorld) connectionScenario(t *testing.T, name string, spec clusterSpec, outage bool) {
	ctx := context.Background()
	cluster, secret := clusterOf(name, w.sim.url, w.sim.fingerprint, spec)
	if !spec.secretMissing {
		if err := env.Client.Create(ctx, secret); err != nil {
			t.Fatal(err)
		}
	}
	if err := env.Client.Create(ctx, cluster); err != nil {
		t.Fatal(err)
	}
	tmpl := w.f.template.DeepCopy()
	tmpl.ObjectMeta = metav1.ObjectMeta{Namespace: w.f.namespace, Name: name[:min(len(name), 40)]}
	tmpl.Spec.HypervisorClusterRef = hfv1.ObjectName{Name: name}
	tmpl.Spec.Source.Proxmox.TemplateID = ptr.To[int32](9000)
	if err := env.Client.Create(ctx, tmpl); err != nil {
		t.Fatal(err)
	}
	claim := &hfv1.MachineClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: w.f.namespace, Name: tmpl.Name},
		Spec:       hfv1.MachineClaimSpec{TemplateRef: hfv1.ObjectName{Name: tmpl.Name}},
	}
	defer w.removeCase(t, claim, tmpl, cluster, secret)
	switch {
	case spec.reason() != hfv1.ReadyReason:
		w.waitCluster(t, name, metav1.ConditionFalse, spec.reason())
		if err := env.Client.Create(ctx, claim); err != nil {
			t.Fatal(err)
		}
		w.checkWaits(t, claim, name)
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
				t.Fatal(err)
			}
		}
		if spec.portWrong || spec.fpWrong {
			if err := retry.RetryOnConflict(conflictRetry, func() error {
				c := w.cluster(t, name)
				c.Spec.Endpoint, c.Spec.TLS.FingerprintSHA256 = w.sim.url, w.sim.fingerprint
				return env.Client.Update(ctx, c)
			}); err != nil {
				t.Fatal(err)
			}
		}
	case outage:
		w.waitCluster(t, name, metav1.ConditionTrue, hfv1.ReadyReason)
		if err := w.sim.SetFaults(proxmoxsim.Faults{Classes: map[string]proxmoxsim.FaultSpec{"other": {ErrorRate: 1, ErrorCode: 503}}}); err != nil {
			t.Fatal(err)
		}
		defer func() { _ = w.sim.SetFaults(proxmoxsim.Faults{}) }()
		w.waitCluster(t, name, metav1.ConditionFalse, hfv1.UnreachableReason)
		if err := env.Client.Create(ctx, claim); err != nil {
			t.Fatal(err)
		}
		w.checkWaits(t, claim, name)
		return
	}
	w.waitCluster(t, name, metav1.ConditionTrue, hfv1.ReadyReason)
	w.waitVM(t, claim)
}

// removeCase deletes a scenario's claim, template, cluster and Secret, and
// waits until the claim with its VM, and the cluster, are gone.
func (w *clusterWorld) removeCase(t testing.TB, claim *hfv1.MachineClaim, tmpl *hfv1.HypervisorMachineTemplate, cluster *hfv1.HypervisorCluster, secret *corev1.Secret) {
	ctx := context.Background()
	_ = w.sim.SetFaults(proxmoxsim.Faults{})
	if got, err := getClaim(t, claim); err == nil {
		if err := env.Client.Delete(ctx, got); err != nil && !apierrors.IsNotFound(err) {
			t.Fatal(err)
		}
		eventually(t, 60*time.Second, "claim "+claim.Name+" gone", func() error {
			if _, err := getClaim(t, claim); !apierrors.IsNotFound(err) {
				return fmt.Errorf("still there (%w)", err)
			}
			return nil
		})
		eventually(t, 10*time.Second, "the VM of claim "+claim.Name+" destroyed", func() error {
			if vms := w.vmsOf(string(got.UID)); len(vms) > 0 {
				return fmt.Errorf("VM %d still there", vms[0].VMID)
			}
			return nil
		})
	}
	_ = env.Client.Delete(ctx, tmpl)
	_ = env.Client.Delete(ctx, cluster)
	eventually(t, 30*time.Second, "cluster "+cluster.Name+" gone", func() error {
		err := env.Client.Get(ctx, client.ObjectKeyFromObject(cluster), &hfv1.HypervisorCluster{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("still there (%w)", err)
	})
	_ = env.Client.Delete(ctx, secret)
}

package controller

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/record"
	clocktesting "k8s.io/utils/clock/testing"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/hypervisors"
	"github.com/hyperfleet/hyperfleet/internal/phase"
	"github.com/hyperfleet/hyperfleet/internal/testworld/testobjects"
	"github.com/hyperfleet/hyperfleet/pkg/provider"
	fakeprovider "github.com/hyperfleet/hyperfleet/pkg/provider/fake"
)

// probeFails is a provider whose probe fails with err.
type probeFails struct {
	provider.Provider
	err error
}

func (p probeFails) Probe(ctx context.Context) (*provider.ClusterInfo, error) {
	if errors.Is(p.err, errProbeHangs) {
		// A partition: no answer until the caller gives up.
		<-ctx.Done()
		return nil, provider.Errorf(provider.ClassTransient, "Unreachable", "%w: GET /version: %w", provider.ErrUnreachable, ctx.Err())
	}
	return nil, p.err
}

// errProbeHangs, as a probe error, makes the probe wait until its context
// ends.
var errProbeHangs = errors.New("the probe hangs")

// unitProviders are Factories of providers on the in-memory hypervisor
// hv; a non-nil probeErr makes their probe fail with it.
func unitProviders(t *testing.T, hv *fakeprovider.Cluster, probeErr error) map[hfv1.HypervisorProvider]provider.Factory {
	t.Helper()
	return map[hfv1.HypervisorProvider]provider.Factory{hfv1.ProviderProxmox: provider.FactoryFunc(func(cfg provider.ClusterConfig, deps provider.Deps) (provider.Provider, error) {
		p, err := hv.NewProvider(cfg, deps)
		if err != nil || probeErr == nil {
			return p, err
		}
		return probeFails{p, probeErr}, nil
	})}
}

// TestReconcileHypervisorCluster runs the HypervisorCluster's phase lists
// from a starting state each: the normal list (tenancy, SPIRE, then the
// connection: refused fields, provider, probe, VM list, listing) and the
// deletion list (hold while claims have VMs on it, keeping the
// connection), with the close that sets Ready and writes the cluster once.
func TestReconcileHypervisorCluster(t *testing.T) {
	const name = "pve"
	newCluster := func(mut ...func(*hfv1.HypervisorCluster)) *hfv1.HypervisorCluster {
		c := &hfv1.HypervisorCluster{
			ObjectMeta: metav1.ObjectMeta{Name: name, Generation: 2, Finalizers: []string{hfv1.HypervisorClusterFinalizer}},
			Spec:       hfv1.HypervisorClusterSpec{Provider: hfv1.ProviderProxmox, Endpoint: "https://pve.example:8006"},
			Status:     hfv1.HypervisorClusterStatus{ObservedGeneration: 1},
		}
		for _, m := range mut {
			m(c)
		}
		return c
	}
	wasReady := func(c *hfv1.HypervisorCluster) {
		c.Status.Conditions = []metav1.Condition{{Type: string(hfv1.ReadyCondition), Status: metav1.ConditionTrue, Reason: string(hfv1.ReadyReason),
			Message: "Connected earlier", LastTransitionTime: metav1.Time{Time: unitEpoch}}}
	}
	withVM := &hfv1.MachineClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: "runs"},
		Status: hfv1.MachineClaimStatus{VMRef: &hfv1.VMReference{HypervisorCluster: name, VMID: 100, Node: "node-1"}}}
	connected := map[hfv1.ConditionType]wantCondition{
		hfv1.ReadyCondition:                              {status: metav1.ConditionTrue, reason: hfv1.ReadyReason, says: []string{"Connected: version fake, 1 of 1 nodes online"}},
		hfv1.HypervisorClusterConnectedCondition:         {status: metav1.ConditionTrue, reason: hfv1.ReadyReason},
		hfv1.HypervisorClusterTLSVerifiedCondition:       {status: metav1.ConditionTrue, reason: hfv1.ReadyReason},
		hfv1.HypervisorClusterTenancyRestrictedCondition: {status: metav1.ConditionFalse, reason: hfv1.AllNamespacesAdmittedReason},
	}
	for _, tc := range []struct {
		name    string
		cluster *hfv1.HypervisorCluster
		objs    []client.Object
		funcs   interceptor.Funcs
		// noFactory: the operator build has no provider for the cluster;
		// probeErr makes the provider's probe fail.
		noFactory bool
		probeErr  error
		// buildErr makes building the provider fail.
		buildErr error
		// ready: the registry holds the cluster Ready from earlier polls.
		ready    bool
		wantRes  ctrl.Result
		wantErr  error
		want     map[hfv1.ConditionType]wantCondition
		events   []string
		observed int64
		// gone: the pass let the cluster go; healthy: the registry holds
		// it Ready after the pass.
		gone, healthy bool
	}{
		{
			name: "a new cluster gets its finalizer and nothing else", cluster: newCluster(func(c *hfv1.HypervisorCluster) { c.Finalizers = nil }),
			want: map[hfv1.ConditionType]wantCondition{hfv1.ReadyCondition: {}}, observed: 1,
		},
		{
			name: "a reachable cluster is Connected and Ready and polled at its interval", cluster: newCluster(),
			wantRes: ctrl.Result{RequeueAfter: defaultPollInterval}, want: connected, events: []string{"Normal Connected"},
			observed: 2, healthy: true,
		},
		{
			name: "a cluster still setting deprecated fields is connected and told where they moved",
			cluster: newCluster(func(c *hfv1.HypervisorCluster) {
				c.Spec.VMIDRange = &hfv1.VMIDRange{Start: 1000, End: 1999} //nolint:staticcheck // the deprecated field under test
			}),
			wantRes: ctrl.Result{RequeueAfter: defaultPollInterval}, want: connected, events: []string{"Normal DeprecatedField", "Normal Connected"},
			observed: 2, healthy: true,
		},
		{
			name: "an unreachable cluster is not Ready and retried with a backoff", cluster: newCluster(), probeErr: provider.ErrUnreachable,
			wantRes: ctrl.Result{RequeueAfter: probeBackoff(1)},
			want: map[hfv1.ConditionType]wantCondition{
				hfv1.ReadyCondition:                      {status: metav1.ConditionFalse, reason: hfv1.UnreachableReason, says: []string{"New VMs on this cluster are paused until it is reachable"}},
				hfv1.HypervisorClusterConnectedCondition: {status: metav1.ConditionFalse, reason: hfv1.UnreachableReason},
			},
			events: []string{"Warning Unreachable"}, observed: 2,
		},
		{
			name: "a Ready cluster absorbs one transient probe failure", cluster: newCluster(wasReady), probeErr: provider.ErrUnreachable, ready: true,
			wantRes: ctrl.Result{RequeueAfter: time.Second},
			want: map[hfv1.ConditionType]wantCondition{
				hfv1.ReadyCondition:                      {status: metav1.ConditionTrue, reason: hfv1.ReadyReason, says: []string{"Connected earlier"}},
				hfv1.HypervisorClusterConnectedCondition: {},
			},
			observed: 2, healthy: true,
		},
		{
			name: "a probe with no answer gives up at spec.probeTimeout and says so", probeErr: errProbeHangs,
			cluster: newCluster(func(c *hfv1.HypervisorCluster) {
				c.Spec.ProbeTimeout = &metav1.Duration{Duration: 20 * time.Millisecond}
			}),
			wantRes: ctrl.Result{RequeueAfter: probeBackoff(1)},
			want: map[hfv1.ConditionType]wantCondition{
				hfv1.ReadyCondition:                      {status: metav1.ConditionFalse, reason: hfv1.UnreachableReason, says: []string{"no answer within spec.probeTimeout (20ms"}},
				hfv1.HypervisorClusterConnectedCondition: {status: metav1.ConditionFalse, reason: hfv1.UnreachableReason, says: []string{"spec.probeTimeout"}},
			},
			events: []string{"Warning Unreachable"}, observed: 2,
		},
		{
			name: "refused credentials name the field to fix", cluster: newCluster(), probeErr: fmt.Errorf("token refused: %w", provider.ErrUnauthorized),
			wantRes: ctrl.Result{RequeueAfter: probeBackoff(1)},
			want: map[hfv1.ConditionType]wantCondition{
				hfv1.ReadyCondition: {status: metav1.ConditionFalse, reason: hfv1.AuthenticationFailedReason, says: []string{"token refused"}},
			},
			events: []string{"Warning AuthenticationFailed"}, observed: 2,
		},
		{
			name: "a client certificate that cannot be used is reported before any connection", cluster: newCluster(),
			buildErr: provider.Errorf(provider.ClassConfiguration, string(hfv1.InvalidClientCertificateReason), "spec.credentials.clientCert: tls: private key does not match public key"),
			wantRes:  ctrl.Result{RequeueAfter: maxProbeBackoff},
			want: map[hfv1.ConditionType]wantCondition{
				hfv1.ReadyCondition:                      {status: metav1.ConditionFalse, reason: hfv1.InvalidClientCertificateReason, says: []string{"spec.credentials.clientCert: tls: private key does not match public key"}},
				hfv1.HypervisorClusterConnectedCondition: {status: metav1.ConditionFalse, reason: hfv1.InvalidClientCertificateReason},
			},
			events: []string{"Warning InvalidClientCertificate"}, observed: 2,
		},
		{
			name: "a Ready cluster whose proxy refuses the client certificate is marked down at once", cluster: newCluster(wasReady), ready: true,
			probeErr: provider.Errorf(provider.ClassConfiguration, string(hfv1.ClientCertificateRefusedReason), "GET /version: the TLS proxy in front of the Proxmox API refused the client certificate"),
			wantRes:  ctrl.Result{RequeueAfter: probeBackoff(1)},
			want: map[hfv1.ConditionType]wantCondition{
				hfv1.ReadyCondition:                      {status: metav1.ConditionFalse, reason: hfv1.ClientCertificateRefusedReason, says: []string{"refused the client certificate"}},
				hfv1.HypervisorClusterConnectedCondition: {status: metav1.ConditionFalse, reason: hfv1.ClientCertificateRefusedReason},
			},
			events: []string{"Warning ClientCertificateRefused"}, observed: 2,
		},
		{
			name: "a provider this build lacks is a terminal error", cluster: newCluster(), noFactory: true,
			wantErr: reconcile.TerminalError(nil),
			want: map[hfv1.ConditionType]wantCondition{
				hfv1.ReadyCondition: {status: metav1.ConditionFalse, reason: hfv1.UnreachableReason, says: []string{`spec.provider: no implementation for "proxmox"`}},
			},
			events: []string{"Warning Unreachable"}, observed: 1,
		},
		{
			name: "a failed status write is the pass's error", cluster: newCluster(), funcs: failStatusWrites(),
			wantErr: errInjected, want: map[hfv1.ConditionType]wantCondition{hfv1.ReadyCondition: {}},
			events: []string{"Normal Connected"}, observed: 1, healthy: true,
		},
		{
			name: "a deleted cluster with claims' VMs on it is held, connected and polled", cluster: deleting(newCluster()), objs: []client.Object{withVM},
			wantRes: ctrl.Result{RequeueAfter: defaultPollInterval},
			want: map[hfv1.ConditionType]wantCondition{
				hfv1.ReadyCondition:                      {status: metav1.ConditionFalse, reason: hfv1.InUseReason, says: []string{"1 MachineClaims with VMs on this cluster: team/runs"}},
				hfv1.HypervisorClusterConnectedCondition: {status: metav1.ConditionTrue, reason: hfv1.ReadyReason},
			},
			events: []string{"Warning InUse", "Normal Connected"}, observed: 2, healthy: true,
		},
		{
			name: "a deleted cluster no claim uses goes and is forgotten", cluster: deleting(newCluster()), ready: true,
			gone: true,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			clk := clocktesting.NewFakeClock(unitEpoch)
			hv, err := fakeprovider.NewCluster(clk, fakeprovider.DefaultOptions())
			if err != nil {
				t.Fatal(err)
			}
			c := unitWorld(t, tc.funcs, append(tc.objs, tc.cluster)...)
			rec := record.NewFakeRecorder(16)
			r := &HypervisorClusterReconciler{Client: c, Registry: hypervisors.NewRegistry(), Signer: testobjects.Signer(t), Recorder: rec, Clock: clk}
			if !tc.noFactory {
				r.Factories = unitProviders(t, hv, tc.probeErr)
			}
			if tc.buildErr != nil {
				r.Factories = map[hfv1.HypervisorProvider]provider.Factory{hfv1.ProviderProxmox: provider.FactoryFunc(func(provider.ClusterConfig, provider.Deps) (provider.Provider, error) {
					return nil, tc.buildErr
				})}
			}
			if tc.ready {
				r.Registry.SetHealth(name, hypervisors.Health{Ready: true}, unitEpoch)
			}
			res, err := r.Reconcile(ctx, ctrl.Request{NamespacedName: client.ObjectKeyFromObject(tc.cluster)})
			if got := r.Registry.Health(name).Ready; got != tc.healthy {
				t.Errorf("the registry holds the cluster Ready: %v, want %v", got, tc.healthy)
			}
			if !checkPass(t, c, rec, tc.cluster.DeepCopy(), res, err, passWant{res: tc.wantRes, err: tc.wantErr, events: tc.events, gone: tc.gone,
				finalizer: hfv1.HypervisorClusterFinalizer, observed: tc.observed, conds: tc.want}) {
				if _, _, connected := r.Registry.Provider(name); connected {
					t.Error("the registry still holds the gone cluster's provider")
				}
			}
		})
	}
}

// TestReportDeprecatedOncePerGeneration: a cluster that sets deprecated
// fields gets one DeprecatedField event naming each field and its new
// path, not one per poll; a new generation that still sets one is told
// again, and one that moved every field is not.
func TestReportDeprecatedOncePerGeneration(t *testing.T) {
	ctx := context.Background()
	// Proxmox's kind reads (and reports) the fields its section replaced.
	cluster := &hfv1.HypervisorCluster{ObjectMeta: metav1.ObjectMeta{Name: "pve", UID: "uid-1", Generation: 1},
		Spec: hfv1.HypervisorClusterSpec{Provider: hfv1.ProviderProxmox}}
	cluster.Spec.VMIDRange = &hfv1.VMIDRange{Start: 1000, End: 1999} //nolint:staticcheck // the deprecated field under test
	cluster.Spec.ISOStorage = "isos"                                 //nolint:staticcheck // the deprecated field under test
	rec := record.NewFakeRecorder(16)
	r := &HypervisorClusterReconciler{Recorder: rec}
	pass := func() []string {
		t.Helper()
		if res, err := r.reportDeprecated(ctx, &clusterScope{cluster: cluster}); err != nil || res != phase.Next() {
			t.Fatalf("reportDeprecated = %v, %v; want the next phase", res, err)
		}
		var got []string
		for len(rec.Events) > 0 {
			got = append(got, <-rec.Events)
		}
		return got
	}
	first := pass()
	if len(first) != 1 || !strings.HasPrefix(first[0], "Normal DeprecatedField ") ||
		!strings.Contains(first[0], "spec.vmidRange is deprecated: move it to spec.proxmox.vmidRange") ||
		!strings.Contains(first[0], "spec.isoStorage is deprecated: move it to spec.proxmox.isoStorage") {
		t.Fatalf("first pass: events %q, want one DeprecatedField event naming both fields and their new paths", first)
	}
	if got := pass(); len(got) != 0 {
		t.Errorf("a poll of the same generation: events %q, want none", got)
	}
	cluster.Generation = 2
	cluster.Spec.VMIDRange = nil //nolint:staticcheck // the deprecated field under test
	cluster.Spec.Proxmox = &hfv1.ProxmoxClusterSettings{VMIDRange: &hfv1.VMIDRange{Start: 1000, End: 1999}}
	if got := pass(); len(got) != 1 || strings.Contains(got[0], "vmidRange") || !strings.Contains(got[0], "spec.isoStorage") {
		t.Errorf("generation 2, which moved vmidRange only: events %q, want one naming spec.isoStorage alone", got)
	}
	cluster.Generation = 3
	cluster.Spec.ISOStorage = "" //nolint:staticcheck // the deprecated field under test
	cluster.Spec.Proxmox.ISOStorage = "isos"
	if got := pass(); len(got) != 0 {
		t.Errorf("generation 3, which moved every field: events %q, want none", got)
	}
	cluster.Generation = 4
	cluster.Spec.ISOStorage = "isos" //nolint:staticcheck // the deprecated field under test
	cluster.Spec.Proxmox.ISOStorage = ""
	if got := pass(); len(got) != 1 {
		t.Errorf("generation 4, back on a deprecated field: events %q, want one", got)
	}
}

// TestReportDeprecatedNamesOldTokenID: a cluster stored with
// spec.credentials.tokenId (read as tokenID, so it still connects) is told
// in the DeprecatedField event to rename it.
func TestReportDeprecatedNamesOldTokenID(t *testing.T) {
	cluster := &hfv1.HypervisorCluster{ObjectMeta: metav1.ObjectMeta{Name: "pve", UID: "uid-1", Generation: 1}}
	doc := `{"spec":{"credentials":{"tokenId":{"namespace":"hf","name":"pve","key":"tokenId"},"tokenSecret":{"namespace":"hf","name":"pve","key":"s"}}}}`
	if err := json.Unmarshal([]byte(doc), cluster); err != nil {
		t.Fatal(err)
	}
	if cluster.Spec.Credentials.TokenID == nil || cluster.Spec.Credentials.TokenID.Name != "pve" {
		t.Fatalf("tokenId read as TokenID %+v", cluster.Spec.Credentials.TokenID)
	}
	rec := record.NewFakeRecorder(4)
	r := &HypervisorClusterReconciler{Recorder: rec}
	if _, err := r.reportDeprecated(context.Background(), &clusterScope{cluster: cluster}); err != nil {
		t.Fatal(err)
	}
	if len(rec.Events) != 1 {
		t.Fatalf("%d events, want one DeprecatedField event", len(rec.Events))
	}
	if ev := <-rec.Events; !strings.HasPrefix(ev, "Normal DeprecatedField ") ||
		!strings.Contains(ev, "spec.credentials.tokenId is deprecated: move it to spec.credentials.tokenID") {
		t.Errorf("event %q, want one naming spec.credentials.tokenId and spec.credentials.tokenID", ev)
	}
}

// TestIsolationEnforcedCondition: not configured, configured but not
// enforced by the hypervisor (its probe says why), enforced.
func TestIsolationEnforcedCondition(t *testing.T) {
	isolated := func() *hfv1.HypervisorCluster {
		return &hfv1.HypervisorCluster{Spec: hfv1.HypervisorClusterSpec{Network: &hfv1.ClusterNetworkSettings{
			Isolation: &hfv1.NetworkIsolation{OperatorCIDRs: []string{"192.0.2.5"}, DefaultPolicy: "web", Policies: []hfv1.IsolationPolicy{{Name: "web"}}}}}}
	}
	for _, tc := range []struct {
		name    string
		cluster *hfv1.HypervisorCluster
		problem string
		status  metav1.ConditionStatus
		reason  hfv1.ConditionReason
		says    string
	}{
		{"not configured", &hfv1.HypervisorCluster{}, "", metav1.ConditionFalse, hfv1.IsolationNotConfiguredReason, "spec.network.isolation is unset"},
		{"firewall off", isolated(), "the datacenter firewall of Proxmox VE cluster pve is off", metav1.ConditionFalse, hfv1.IsolationNotEnforcedReason, "datacenter firewall"},
		{"enforced", isolated(), "", metav1.ConditionTrue, hfv1.IsolationActiveReason, "(default web)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			setIsolationCondition(tc.cluster, &provider.ClusterInfo{IsolationProblem: tc.problem})
			c := hfv1.FindCondition(tc.cluster.Status.Conditions, hfv1.HypervisorClusterIsolationEnforcedCondition)
			if c == nil || c.Status != tc.status || c.Reason != string(tc.reason) || !strings.Contains(c.Message, tc.says) {
				t.Fatalf("condition %+v, want %s %s saying %q", c, tc.status, tc.reason, tc.says)
			}
		})
	}
}

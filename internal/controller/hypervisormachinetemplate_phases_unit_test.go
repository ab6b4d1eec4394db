package controller

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/record"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/hypervisors"
	"github.com/hyperfleet/hyperfleet/internal/phase"
	"github.com/hyperfleet/hyperfleet/internal/testworld/testobjects"
	"github.com/hyperfleet/hyperfleet/pkg/provider"
	fakeprovider "github.com/hyperfleet/hyperfleet/pkg/provider/fake"
)

// TestReconcileHypervisorMachineTemplate runs the template's phase lists
// from a starting state each: the validation list (credential reach,
// refused fields, cluster, tenancy, identity, metadata, Secrets, runner
// release, IPPool, rendering, the template on the hypervisor) and the
// deletion list (hold while claims use it), with the close that sets
// Valid and Ready, writes the template once and reports a change of
// validity.
func TestReconcileHypervisorMachineTemplate(t *testing.T) {
	const ns, cluster = "team", "pve"
	newTemplate := func(mut ...func(*hfv1.HypervisorMachineTemplate)) *hfv1.HypervisorMachineTemplate {
		tm := &hfv1.HypervisorMachineTemplate{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "debian", Generation: 2, Finalizers: []string{hfv1.HypervisorMachineTemplateFinalizer}},
			Spec: hfv1.HypervisorMachineTemplateSpec{
				HypervisorClusterRef: hfv1.ObjectName{Name: cluster},
				Source:               hfv1.MachineSource{Proxmox: hfv1.ProxmoxSource{TemplateID: ptr.To[int32](9000)}},
				Resources:            hfv1.MachineResources{CPU: 2, Memory: resource.MustParse("2Gi")},
				Bootstrap: hfv1.Bootstrap{GitHub: &hfv1.GitHubBootstrap{Owner: "octo-org", Organization: "octo-org",
					Credentials: hfv1.GitHubCredentials{PAT: &hfv1.LocalSecretKeySelector{Name: "github", Key: "token"}}}},
			},
			Status: hfv1.HypervisorMachineTemplateStatus{ObservedGeneration: 1},
		}
		for _, m := range mut {
			m(tm)
		}
		return tm
	}
	wasValid := func(tm *hfv1.HypervisorMachineTemplate) {
		tm.Status.Conditions = []metav1.Condition{{Type: string(hfv1.HypervisorMachineTemplateValidCondition), Status: metav1.ConditionTrue,
			Reason: string(hfv1.ReadyReason), Message: "valid earlier", LastTransitionTime: metav1.Time{Time: unitEpoch}}}
		tm.Status.TemplateHash = "earlier-hash"
		tm.Status.ResolvedTemplate = &hfv1.ResolvedTemplate{VMID: 9000, Node: "node-1"}
	}
	pveCluster := &hfv1.HypervisorCluster{ObjectMeta: metav1.ObjectMeta{Name: cluster}, Spec: hfv1.HypervisorClusterSpec{Provider: hfv1.ProviderProxmox}}
	pat := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "github"}, Data: map[string][]byte{"token": []byte("ghp_unit")}}
	world := []client.Object{pveCluster, pat, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}}
	usesIt := &hfv1.MachineClaim{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "runs", Finalizers: []string{hfv1.MachineClaimFinalizer}},
		Spec:   hfv1.MachineClaimSpec{TemplateRef: hfv1.ObjectName{Name: "debian"}},
		Status: hfv1.MachineClaimStatus{VMRef: &hfv1.VMReference{HypervisorCluster: cluster, VMID: 100, Node: "node-1"}}}
	invalid := func(reason hfv1.ConditionReason, says ...string) map[hfv1.ConditionType]wantCondition {
		w := wantCondition{status: metav1.ConditionFalse, reason: reason, says: says}
		return map[hfv1.ConditionType]wantCondition{hfv1.HypervisorMachineTemplateValidCondition: w, hfv1.ReadyCondition: w}
	}
	valid := wantCondition{status: metav1.ConditionTrue, reason: hfv1.ReadyReason, says: []string{"Template 9000 (ci-template) on pve/node-1 is valid"}}
	untouched := map[hfv1.ConditionType]wantCondition{hfv1.ReadyCondition: {}}
	ipPool := func(name string, addresses ...string) *hfv1.IPPool {
		prefix := int32(24)
		if strings.Contains(addresses[0], ":") {
			prefix = 64
		}
		return &hfv1.IPPool{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: hfv1.IPPoolSpec{Addresses: addresses, Prefix: prefix}}
	}
	pools := []client.Object{ipPool("v4", "192.0.2.0/24"), ipPool("v4-b", "198.51.100.0/24"), ipPool("v6", "2001:db8::/64")}
	staticOn := func(names ...string) func(*hfv1.HypervisorMachineTemplate) {
		return func(tm *hfv1.HypervisorMachineTemplate) {
			tm.Spec.Network = hfv1.MachineNetwork{Mode: hfv1.NetworkModeStatic}
			for _, n := range names {
				tm.Spec.Network.IPPoolRefs = append(tm.Spec.Network.IPPoolRefs, hfv1.ObjectName{Name: n})
			}
		}
	}
	for _, tc := range []struct {
		name  string
		tmpl  *hfv1.HypervisorMachineTemplate
		objs  []client.Object
		funcs interceptor.Funcs
		// offline: the registry holds no connected provider for the
		// cluster.
		offline bool
		// validateErr, when set, is what the provider's ValidateTemplate
		// returns.
		validateErr error
		wantRes     ctrl.Result
		wantErr     error
		want        map[hfv1.ConditionType]wantCondition
		events      []string
		observed    int64
		// resolved is the template id status.resolvedTemplate names (0:
		// none); gone: the pass let the template go.
		resolved int32
		gone     bool
	}{
		{
			name: "a new template gets its finalizer and nothing else", tmpl: newTemplate(func(tm *hfv1.HypervisorMachineTemplate) { tm.Finalizers = nil }),
			objs: world, want: untouched, observed: 1,
		},
		{
			name: "a valid template is Valid and Ready, says so once, and is validated again later", tmpl: newTemplate(), objs: world,
			wantRes: ctrl.Result{RequeueAfter: 10 * waitForDependency},
			want: map[hfv1.ConditionType]wantCondition{
				hfv1.HypervisorMachineTemplateValidCondition:              valid,
				hfv1.ReadyCondition:                                       valid,
				hfv1.HypervisorMachineTemplateReusableCredentialCondition: {status: metav1.ConditionFalse, reason: hfv1.SingleUseCredentialReason},
			},
			events: []string{"Normal Validated"}, observed: 2, resolved: 9000,
		},
		{
			name: "a dual-stack template with an IPv6 and an IPv4 IPPool is valid", tmpl: newTemplate(wasValid, staticOn("v6", "v4")), objs: append(pools, world...),
			wantRes:  ctrl.Result{RequeueAfter: 10 * waitForDependency},
			want:     map[hfv1.ConditionType]wantCondition{hfv1.HypervisorMachineTemplateValidCondition: valid, hfv1.ReadyCondition: valid},
			observed: 2, resolved: 9000,
		},
		{
			name: "a template naming an isolation policy its cluster does not define is refused, naming the policies",
			tmpl: newTemplate(func(tm *hfv1.HypervisorMachineTemplate) { tm.Spec.Network.IsolationPolicy = "strict" }),
			objs: append([]client.Object{&hfv1.HypervisorCluster{ObjectMeta: metav1.ObjectMeta{Name: cluster}, Spec: hfv1.HypervisorClusterSpec{
				Provider: hfv1.ProviderProxmox, Network: &hfv1.ClusterNetworkSettings{Isolation: &hfv1.NetworkIsolation{
					OperatorCIDRs: []string{"192.0.2.5"}, Policies: []hfv1.IsolationPolicy{{Name: "web"}}}}}}}, world[1:]...),
			wantRes: ctrl.Result{RequeueAfter: waitForDependency},
			want:    invalid(hfv1.IsolationPolicyNotFoundReason, "spec.network.isolationPolicy names strict, which HypervisorCluster pve does not define (its policies: web, default (built in))"),
			events:  []string{"Warning IsolationPolicyNotFound"}, observed: 2,
		},
		{
			name: "a template naming an isolation policy on a cluster without isolation is refused",
			tmpl: newTemplate(func(tm *hfv1.HypervisorMachineTemplate) { tm.Spec.Network.IsolationPolicy = "web" }), objs: world,
			wantRes: ctrl.Result{RequeueAfter: waitForDependency},
			want:    invalid(hfv1.IsolationPolicyNotFoundReason, "HypervisorCluster pve has no spec.network.isolation"),
			events:  []string{"Warning IsolationPolicyNotFound"}, observed: 2,
		},
		{
			name: "two IPPools of one family are refused, naming both", tmpl: newTemplate(staticOn("v4", "v4-b")), objs: append(pools, world...),
			wantRes: ctrl.Result{RequeueAfter: waitForDependency},
			want:    invalid(hfv1.IPPoolFamilyConflictReason, "spec.network.ipPoolRefs: IPPools v4 and v4-b are both IPv4", "name one IPv4 and one IPv6 IPPool"),
			events:  []string{"Warning IPPoolFamilyConflict"}, observed: 2,
		},
		{
			name: "a missing IPPool of a dual-stack template", tmpl: newTemplate(staticOn("v4", "v6-gone")), objs: append(pools, world...),
			wantRes: ctrl.Result{RequeueAfter: waitForDependency},
			want:    invalid(hfv1.TemplateInvalidReason, "spec.network.ipPoolRefs: IPPool v6-gone"),
			events:  []string{"Warning TemplateInvalid"}, observed: 2,
		},
		{
			name: "a template still valid emits no event", tmpl: newTemplate(wasValid), objs: world,
			wantRes:  ctrl.Result{RequeueAfter: 10 * waitForDependency},
			want:     map[hfv1.ConditionType]wantCondition{hfv1.HypervisorMachineTemplateValidCondition: valid, hfv1.ReadyCondition: valid},
			observed: 2, resolved: 9000,
		},
		{
			name: "a missing cluster", tmpl: newTemplate(), objs: []client.Object{pat},
			wantRes: ctrl.Result{RequeueAfter: waitForDependency},
			want:    invalid(hfv1.ClusterUnavailableReason, "spec.hypervisorClusterRef: HypervisorCluster pve does not exist"),
			events:  []string{"Warning ClusterUnavailable"}, observed: 2,
		},
		{
			name: "a cluster that is not connected", tmpl: newTemplate(), objs: world, offline: true,
			wantRes: ctrl.Result{RequeueAfter: waitForDependency},
			want:    invalid(hfv1.ClusterUnavailableReason, "HypervisorCluster pve is not ready"),
			events:  []string{"Warning ClusterUnavailable"}, observed: 2,
		},
		{
			name: "a field the operator does not act on", tmpl: newTemplate(func(tm *hfv1.HypervisorMachineTemplate) {
				tm.Spec.Bootstrap.GitHub.Runner = &hfv1.RunnerSoftware{OS: "osx"}
			}),
			objs: world, wantRes: ctrl.Result{RequeueAfter: waitForDependency},
			want:   invalid(hfv1.UnsupportedReason, "runner.os: osx is not supported"),
			events: []string{"Warning Unsupported"}, observed: 2,
		},
		{
			name: "a DHCP client that cannot request a lease time is refused before any VM boots", tmpl: newTemplate(func(tm *hfv1.HypervisorMachineTemplate) {
				tm.Spec.Network.DHCP = &hfv1.DHCPOptions{Client: hfv1.DHCPClientNetworkd, LeaseTime: &metav1.Duration{Duration: 3600e9}}
			}),
			objs: world, wantRes: ctrl.Result{RequeueAfter: waitForDependency},
			want:   invalid(hfv1.DHCPClientUnsupportedReason, "spec.network.dhcp.client: systemd-networkd", "remove leaseTime"),
			events: []string{"Warning DHCPClientUnsupported"}, observed: 2,
		},
		{
			name: "isc-dhcp-client with a static lease and a lease time is valid", tmpl: newTemplate(func(tm *hfv1.HypervisorMachineTemplate) {
				tm.Spec.Network.DHCP = &hfv1.DHCPOptions{Client: hfv1.DHCPClientISC, ClientIdentifier: hfv1.DHCPClientIdentifierHostname,
					RequestStaticLease: true, LeaseTime: &metav1.Duration{Duration: 3600e9}}
			}, wasValid),
			objs: world, wantRes: ctrl.Result{RequeueAfter: 10 * waitForDependency},
			want:     map[hfv1.ConditionType]wantCondition{hfv1.HypervisorMachineTemplateValidCondition: valid, hfv1.ReadyCondition: valid},
			observed: 2, resolved: 9000,
		},
		{
			name: "a namespace the cluster does not admit learns nothing about it", tmpl: newTemplate(wasValid),
			objs: []client.Object{pat, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}},
				&hfv1.HypervisorCluster{ObjectMeta: metav1.ObjectMeta{Name: cluster}, Spec: hfv1.HypervisorClusterSpec{Provider: hfv1.ProviderProxmox,
					AllowedNamespaces: &metav1.LabelSelector{MatchLabels: map[string]string{"tenant": "yes"}}}}},
			wantRes: ctrl.Result{RequeueAfter: waitForDependency},
			want:    invalid(hfv1.NamespaceNotAllowedReason, "HypervisorCluster pve does not admit namespace team"),
			events:  []string{"Warning NamespaceNotAllowed"}, observed: 2,
		},
		{
			name: "a Secret the template references is missing", tmpl: newTemplate(), objs: []client.Object{pveCluster},
			wantRes: ctrl.Result{RequeueAfter: waitForDependency},
			want:    invalid(hfv1.SecretNotFoundReason, "github"),
			events:  []string{"Warning SecretNotFound"}, observed: 2,
		},
		{
			name: "a template the hypervisor does not have", tmpl: newTemplate(func(tm *hfv1.HypervisorMachineTemplate) { tm.Spec.Source.Proxmox.TemplateID = ptr.To[int32](9999) }),
			objs: world, wantRes: ctrl.Result{RequeueAfter: waitForDependency},
			want:   invalid(hfv1.TemplateNotFoundReason),
			events: []string{"Warning TemplateNotFound"}, observed: 2,
		},
		{
			name: "a request to a Ready cluster that fails on the way is retried within seconds, not a minute", tmpl: newTemplate(wasValid), objs: world,
			validateErr: fmt.Errorf("GET /cluster/resources: 503 Can't connect to 127.0.0.1:85 (Connection refused): %w", provider.ErrUnreachable),
			wantRes:     ctrl.Result{RequeueAfter: transientRecheck},
			want:        invalid(hfv1.ClusterUnavailableReason, "503 Can't connect"),
			events:      []string{"Warning ClusterUnavailable"}, observed: 2, resolved: 9000,
		},
		{
			name: "a failed read of the cluster ends the pass before observedGeneration moves", tmpl: newTemplate(wasValid), objs: world,
			funcs: failGets(&hfv1.HypervisorCluster{}), wantErr: errInjected,
			want:     map[hfv1.ConditionType]wantCondition{hfv1.HypervisorMachineTemplateValidCondition: {status: metav1.ConditionTrue, reason: hfv1.ReadyReason, says: []string{"valid earlier"}}},
			observed: 1, resolved: 9000,
		},
		{
			name: "a failed status write is the pass's error, and no event claims what was not written", tmpl: newTemplate(), objs: world,
			funcs: failStatusWrites(), wantErr: errInjected, want: untouched, observed: 1,
		},
		{
			name: "a deleted template a claim's VM was built from is held", tmpl: deleting(newTemplate(wasValid)), objs: append([]client.Object{usesIt}, world...),
			wantRes: ctrl.Result{RequeueAfter: waitForDependency},
			want: map[hfv1.ConditionType]wantCondition{
				hfv1.ReadyCondition:                          {status: metav1.ConditionFalse, reason: hfv1.InUseReason, says: []string{"1 MachineClaims built from this template: team/runs"}},
				hfv1.HypervisorMachineTemplateValidCondition: {status: metav1.ConditionTrue, reason: hfv1.ReadyReason, says: []string{"valid earlier"}},
			},
			events: []string{"Warning InUse"}, observed: 2, resolved: 9000,
		},
		{
			name: "a deleted template no claim uses goes", tmpl: deleting(newTemplate(wasValid)), objs: world, gone: true,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			hv, err := fakeprovider.NewCluster(clocktesting.NewFakeClock(unitEpoch), fakeprovider.DefaultOptions())
			if err != nil {
				t.Fatal(err)
			}
			reg := hypervisors.NewRegistry()
			if !tc.offline {
				cfg := provider.ClusterConfig{Name: cluster, VMIDStart: 100, VMIDEnd: 999}
				if _, err := reg.Connect(cluster, cfg, func() (provider.Provider, error) {
					p, err := hv.NewProvider(cfg, provider.Deps{Signer: testobjects.Signer(t)})
					if err != nil || tc.validateErr == nil {
						return p, err
					}
					return failingValidation{Provider: p, err: tc.validateErr}, nil
				}); err != nil {
					t.Fatal(err)
				}
				reg.SetHealth(cluster, hypervisors.Health{Ready: true}, unitEpoch)
			}
			c := unitWorld(t, tc.funcs, append(tc.objs, tc.tmpl)...)
			rec := record.NewFakeRecorder(16)
			r := &HypervisorMachineTemplateReconciler{Client: c, Registry: reg, Recorder: rec, Workloads: ciPlatforms}
			res, err := r.Reconcile(ctx, ctrl.Request{NamespacedName: client.ObjectKeyFromObject(tc.tmpl)})
			got := tc.tmpl.DeepCopy()
			if !checkPass(t, c, rec, got, res, err, passWant{res: tc.wantRes, err: tc.wantErr, events: tc.events, gone: tc.gone,
				finalizer: hfv1.HypervisorMachineTemplateFinalizer, observed: tc.observed, conds: tc.want}) {
				return
			}
			switch rt := got.Status.ResolvedTemplate; {
			case tc.resolved == 0 && (rt != nil || got.Status.TemplateHash != ""):
				t.Errorf("status names template %+v, hash %q; want none", rt, got.Status.TemplateHash)
			case tc.resolved != 0 && (rt == nil || rt.VMID != tc.resolved || got.Status.TemplateHash == ""):
				t.Errorf("status names template %+v, hash %q; want %d with a hash", rt, got.Status.TemplateHash, tc.resolved)
			}
		})
	}
}

// failingValidation is a provider whose ValidateTemplate fails with err.
type failingValidation struct {
	provider.Provider
	err error
}

func (f failingValidation) ValidateTemplate(context.Context, provider.TemplateSource) (*provider.TemplateInfo, error) {
	return nil, f.err
}

// TestTemplateReportsOldSpellingsOncePerGeneration: a template stored with
// templateId, appId or installationId (read as templateID, appID and
// installationID) gets one DeprecatedField event naming each old spelling
// and its new one, not one per requeue; a new generation that still has
// one is told again, and one that renamed them all is not.
func TestTemplateReportsOldSpellingsOncePerGeneration(t *testing.T) {
	ctx := context.Background()
	tm := &hfv1.HypervisorMachineTemplate{ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: "debian", UID: "uid-1", Generation: 1}}
	doc := `{"spec":{"source":{"proxmox":{"templateId":9000}},"bootstrap":{"github":{"credentials":{"app":` +
		`{"appId":{"name":"gh","key":"id"},"installationId":{"name":"gh","key":"inst"},"privateKey":{"name":"gh","key":"pem"}}}}}}}`
	if err := json.Unmarshal([]byte(doc), tm); err != nil {
		t.Fatal(err)
	}
	rec := record.NewFakeRecorder(16)
	r := &HypervisorMachineTemplateReconciler{Recorder: rec}
	pass := func() []string {
		t.Helper()
		if res, err := r.reportDeprecated(ctx, &templateScope{tmpl: tm}); err != nil || res != phase.Next() {
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
		!strings.Contains(first[0], "spec.source.proxmox.templateId is now templateID") ||
		!strings.Contains(first[0], "spec.bootstrap.github.credentials.app.appId is now appID") ||
		!strings.Contains(first[0], "spec.bootstrap.github.credentials.app.installationId is now installationID") {
		t.Fatalf("first pass: events %q, want one DeprecatedField event naming the three old spellings and their new ones", first)
	}
	if got := pass(); len(got) != 0 {
		t.Errorf("a requeue of the same generation: events %q, want none", got)
	}
	tm.Generation = 2
	tm.Spec.Source.Proxmox.DeprecatedTemplateID = nil //nolint:staticcheck // the deprecated field under test
	if got := pass(); len(got) != 1 || strings.Contains(got[0], "templateId") || !strings.Contains(got[0], "appId") {
		t.Errorf("generation 2, which renamed templateId only: events %q, want one naming appId, not templateId", got)
	}
	tm.Generation = 3
	tm.Spec.Bootstrap.GitHub.Credentials.App.DeprecatedAppID = nil          //nolint:staticcheck // the deprecated field under test
	tm.Spec.Bootstrap.GitHub.Credentials.App.DeprecatedInstallationID = nil //nolint:staticcheck // the deprecated field under test
	if got := pass(); len(got) != 0 {
		t.Errorf("generation 3, which renamed every field: events %q, want none", got)
	}
	if tm.Spec.Source.Proxmox.TemplateID == nil || *tm.Spec.Source.Proxmox.TemplateID != 9000 {
		t.Errorf("templateId read as %v, want 9000", tm.Spec.Source.Proxmox.TemplateID)
	}
}

package tenancy

import (
	"context"
	"errors"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/pkg/workload"
)

// TestTenancyViolations covers each allow-list and its default when left
// out, and that one entry must allow every value (entries do not add up).
func TestTenancyViolations(t *testing.T) {
	cluster := &hfv1.HypervisorCluster{Spec: hfv1.HypervisorClusterSpec{Provider: hfv1.ProviderProxmox, DefaultBridge: "vmbr0", DefaultStorage: "local-lvm"}}
	base := func() *hfv1.HypervisorMachineTemplate {
		return &hfv1.HypervisorMachineTemplate{Spec: hfv1.HypervisorMachineTemplateSpec{
			Source: hfv1.MachineSource{Proxmox: hfv1.ProxmoxSource{TemplateID: ptr.To[int32](9000), CloneMode: hfv1.CloneModeLinked}},
		}}
	}
	minimal := hfv1.TenancyRule{Templates: []hfv1.AllowedTemplate{{ID: ptr.To[int32](9000)}}}
	vlans := minimal
	vlans.VLANs = []hfv1.VLANRange{{Start: 100, End: 199}, {Start: 300, End: 300}}
	lists := minimal
	lists.Bridges, lists.Storages, lists.ResourcePools = []string{"vmbr5"}, []string{"fast"}, []string{"ci"}
	snippets := minimal
	snippets.Snippets = []string{"local:snippets/kit.yaml", "local:snippets/team-a.yaml"}
	tagged := hfv1.TenancyRule{Templates: []hfv1.AllowedTemplate{{Tag: "CI"}}}
	named := hfv1.TenancyRule{Templates: []hfv1.AllowedTemplate{{Name: "debian-12-ci"}}}
	selector := func(tags ...string) func(*hfv1.HypervisorMachineTemplate) {
		return func(tm *hfv1.HypervisorMachineTemplate) {
			tm.Spec.Source.Proxmox.TemplateID = nil
			tm.Spec.Source.Proxmox.TemplateSelector = &hfv1.TemplateSelector{MatchTags: tags}
		}
	}
	native := func(p *hfv1.ProxmoxCloudInit) func(*hfv1.HypervisorMachineTemplate) {
		return func(tm *hfv1.HypervisorMachineTemplate) {
			tm.Spec.CloudInit = &hfv1.CloudInit{Delivery: hfv1.CloudInitDeliveryProxmox, Proxmox: p}
		}
	}

	cases := []struct {
		name   string
		rules  []hfv1.TenancyRule
		mutate func(*hfv1.HypervisorMachineTemplate)
		want   string // "" = allowed; otherwise a fragment of the problem
	}{
		{"defaults allowed", []hfv1.TenancyRule{minimal}, nil, ""},
		{"no rules at all", nil, func(tm *hfv1.HypervisorMachineTemplate) { tm.Spec.Network.Bridge = "anything" }, ""},
		{"explicit default bridge", []hfv1.TenancyRule{minimal}, func(tm *hfv1.HypervisorMachineTemplate) { tm.Spec.Network.Bridge = "vmbr0" }, ""},
		{"other bridge, list left out", []hfv1.TenancyRule{minimal}, func(tm *hfv1.HypervisorMachineTemplate) { tm.Spec.Network.Bridge = "vmbr1" }, "allowed bridges: vmbr0"},
		{"default bridge, list set", []hfv1.TenancyRule{lists}, nil, "spec.network.bridge vmbr0 is not allowed; allowed bridges: vmbr5"},
		{"listed bridge", []hfv1.TenancyRule{lists}, func(tm *hfv1.HypervisorMachineTemplate) { tm.Spec.Network.Bridge = "vmbr5" }, ""},
		{"vlan, none allowed", []hfv1.TenancyRule{minimal}, func(tm *hfv1.HypervisorMachineTemplate) { tm.Spec.Network.VLAN = ptr.To[int32](100) }, "only untagged"},
		{"vlan in range", []hfv1.TenancyRule{vlans}, func(tm *hfv1.HypervisorMachineTemplate) { tm.Spec.Network.VLAN = ptr.To[int32](199) }, ""},
		{"vlan single", []hfv1.TenancyRule{vlans}, func(tm *hfv1.HypervisorMachineTemplate) { tm.Spec.Network.VLAN = ptr.To[int32](300) }, ""},
		{"vlan out of range", []hfv1.TenancyRule{vlans}, func(tm *hfv1.HypervisorMachineTemplate) { tm.Spec.Network.VLAN = ptr.To[int32](200) }, "allowed VLANs: 100-199, 300-300"},
		{"untagged with vlans set", []hfv1.TenancyRule{vlans}, nil, "a VLAN is required"},
		{"untagged through a second entry", []hfv1.TenancyRule{vlans, minimal}, nil, ""},
		{"template by name needs a name entry", []hfv1.TenancyRule{minimal}, func(tm *hfv1.HypervisorMachineTemplate) {
			tm.Spec.Source.Proxmox.TemplateID, tm.Spec.Source.Proxmox.TemplateName = nil, "debian"
		}, "allowed names: none"},
		{"selector needs a tag entry", []hfv1.TenancyRule{minimal}, selector("ci", "debian12"), "allowed tags: none"},
		{"selector with the allowed tag", []hfv1.TenancyRule{tagged}, selector("debian12", "CI"), ""},
		{"selector without the allowed tag", []hfv1.TenancyRule{tagged}, selector("debian12"), "matchTags debian12 include no allowed tag; allowed tags: ci"},
		{"name entry does not allow a selector", []hfv1.TenancyRule{named}, selector("debian-12-ci"), "allowed tags: none"},
		{"tag entry does not allow an id", []hfv1.TenancyRule{tagged}, nil, "allowed ids: none"},
		{"tag entry does not allow a name", []hfv1.TenancyRule{tagged}, func(tm *hfv1.HypervisorMachineTemplate) {
			tm.Spec.Source.Proxmox.TemplateID, tm.Spec.Source.Proxmox.TemplateName = nil, "ci"
		}, "allowed names: none"},
		{"linked clone ignores storages", []hfv1.TenancyRule{lists}, func(tm *hfv1.HypervisorMachineTemplate) { tm.Spec.Network.Bridge = "vmbr5" }, ""},
		{"full clone to default storage, list left out", []hfv1.TenancyRule{minimal}, func(tm *hfv1.HypervisorMachineTemplate) {
			tm.Spec.Source.Proxmox.CloneMode = hfv1.CloneModeFull
		}, ""},
		{"full clone elsewhere, list left out", []hfv1.TenancyRule{minimal}, func(tm *hfv1.HypervisorMachineTemplate) {
			tm.Spec.Source.Proxmox.CloneMode, tm.Spec.Source.Proxmox.Storage = hfv1.CloneModeFull, "fast"
		}, "leave it unset"},
		{"full clone to the default, list without it", []hfv1.TenancyRule{lists}, func(tm *hfv1.HypervisorMachineTemplate) {
			tm.Spec.Network.Bridge = "vmbr5"
			tm.Spec.Source.Proxmox.CloneMode = hfv1.CloneModeFull
		}, "storage local-lvm is not allowed; allowed storages: fast"},
		{"pool, none allowed", []hfv1.TenancyRule{minimal}, func(tm *hfv1.HypervisorMachineTemplate) { tm.Spec.Source.Proxmox.Pool = "ci" }, "allowed resource pools: none"},
		{"listed pool", []hfv1.TenancyRule{lists}, func(tm *hfv1.HypervisorMachineTemplate) {
			tm.Spec.Network.Bridge, tm.Spec.Source.Proxmox.Pool = "vmbr5", "ci"
		}, ""},
		{"kit snippet, none allowed", []hfv1.TenancyRule{minimal}, native(&hfv1.ProxmoxCloudInit{VendorSnippet: "local:snippets/kit.yaml"}),
			"spec.cloudInit.proxmox.vendorSnippet local:snippets/kit.yaml is not allowed; allowed snippets: none"},
		{"listed snippets", []hfv1.TenancyRule{snippets}, native(&hfv1.ProxmoxCloudInit{VendorSnippet: "local:snippets/kit.yaml", UserSnippet: "local:snippets/team-a.yaml"}), ""},
		{"another team's user-data", []hfv1.TenancyRule{snippets}, native(&hfv1.ProxmoxCloudInit{UserSnippet: "local:snippets/team-b.yaml"}),
			"userSnippet local:snippets/team-b.yaml is not allowed; allowed snippets: local:snippets/kit.yaml, local:snippets/team-a.yaml"},
		{"drive storage, list left out", []hfv1.TenancyRule{minimal}, native(&hfv1.ProxmoxCloudInit{DriveStorage: "fast"}), "driveStorage fast is not allowed; allowed storages: none"},
		{"listed drive storage", []hfv1.TenancyRule{lists}, func(tm *hfv1.HypervisorMachineTemplate) {
			tm.Spec.Network.Bridge = "vmbr5"
			native(&hfv1.ProxmoxCloudInit{DriveStorage: "fast"})(tm)
		}, ""},
		{"snippets under iso are not used", []hfv1.TenancyRule{minimal}, func(tm *hfv1.HypervisorMachineTemplate) {
			native(&hfv1.ProxmoxCloudInit{VendorSnippet: "local:snippets/kit.yaml"})(tm)
			tm.Spec.CloudInit.Delivery = hfv1.CloudInitDeliveryISO
		}, ""},
		// Bridge allowed by one entry, VLAN by another: not allowed.
		{"entries do not add up", []hfv1.TenancyRule{lists, vlans}, func(tm *hfv1.HypervisorMachineTemplate) {
			tm.Spec.Network.Bridge, tm.Spec.Network.VLAN = "vmbr5", ptr.To[int32](150)
		}, "spec.network."},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tmpl := base()
			if tc.mutate != nil {
				tc.mutate(tmpl)
			}
			got := strings.Join(Violations(tmpl, cluster, tc.rules, nil), "; ")
			switch {
			case tc.want == "" && got != "":
				t.Errorf("refused: %s", got)
			case tc.want != "" && !strings.Contains(got, tc.want):
				t.Errorf("problems %q do not mention %q", got, tc.want)
			}
		})
	}
}

// TestTenancyCondition: the cluster warns until it restricts both who
// may use it and what they may use.
func TestTenancyCondition(t *testing.T) {
	rule := hfv1.TenancyRule{Templates: []hfv1.AllowedTemplate{{ID: ptr.To[int32](9000)}}}
	cases := []struct {
		name    string
		spec    hfv1.HypervisorClusterSpec
		reason  string
		mention string
	}{
		{"nothing set", hfv1.HypervisorClusterSpec{}, string(hfv1.AllNamespacesAdmittedReason), "spec.tenancy is unset"},
		{"empty selector", hfv1.HypervisorClusterSpec{AllowedNamespaces: &tenantSelectorAll, Tenancy: []hfv1.TenancyRule{rule}}, string(hfv1.AllNamespacesAdmittedReason), "spec.allowedNamespaces is unset or {}"},
		{"no allow-lists", hfv1.HypervisorClusterSpec{AllowedNamespaces: &tenantSelectorSome}, string(hfv1.NoAllowListsReason), "add spec.tenancy entries"},
		{"restricted", hfv1.HypervisorClusterSpec{AllowedNamespaces: &tenantSelectorSome, Tenancy: []hfv1.TenancyRule{rule}}, string(hfv1.RestrictedReason), ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := &hfv1.HypervisorCluster{Spec: tc.spec}
			SetCondition(c)
			got := c.Status.Conditions[0]
			if got.Type != string(hfv1.HypervisorClusterTenancyRestrictedCondition) || got.Reason != tc.reason || (got.Status == "True") != (tc.reason == string(hfv1.RestrictedReason)) {
				t.Errorf("condition = %+v, want reason %s", got, tc.reason)
			}
			if !strings.Contains(got.Message, tc.mention) {
				t.Errorf("message %q does not mention %q", got.Message, tc.mention)
			}
		})
	}
}

var (
	tenantSelectorAll  = metav1.LabelSelector{}
	tenantSelectorSome = metav1.LabelSelector{MatchLabels: map[string]string{"team": "a"}}
)

// TestTenancyRulesFor: which entries select a namespace, and the two kinds
// of failure: a selector that cannot be parsed admits nobody
// (ErrInvalidSelector), a namespace that cannot be read is an error to
// retry.
func TestTenancyRulesFor(t *testing.T) {
	scheme := runtime.NewScheme()
	if err := corev1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "team-a", Labels: map[string]string{"team": "a", "tenant": "yes"}}},
	).Build()
	rule := func(team string) hfv1.TenancyRule {
		return hfv1.TenancyRule{NamespaceSelector: metav1.LabelSelector{MatchLabels: map[string]string{"team": team}}}
	}
	tenants := &metav1.LabelSelector{MatchLabels: map[string]string{"tenant": "yes"}}
	bogus := metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "team", Operator: "Bogus"}}}
	cases := []struct {
		name         string
		spec         hfv1.HypervisorClusterSpec
		ns           string
		rules        int
		admitted     bool
		invalid, err bool
	}{
		{"no lists", hfv1.HypervisorClusterSpec{}, "team-a", 0, true, false, false},
		{"not selected by allowedNamespaces", hfv1.HypervisorClusterSpec{AllowedNamespaces: &metav1.LabelSelector{MatchLabels: map[string]string{"tenant": "no"}}}, "team-a", 0, false, false, false},
		{"selected by one entry", hfv1.HypervisorClusterSpec{AllowedNamespaces: tenants, Tenancy: []hfv1.TenancyRule{rule("a"), rule("b"), rule("a")}}, "team-a", 2, true, false, false},
		{"no entry selects it", hfv1.HypervisorClusterSpec{Tenancy: []hfv1.TenancyRule{rule("b")}}, "team-a", 0, false, false, false},
		{"invalid allowedNamespaces", hfv1.HypervisorClusterSpec{AllowedNamespaces: &bogus}, "team-a", 0, false, true, true},
		{"invalid entry selector", hfv1.HypervisorClusterSpec{Tenancy: []hfv1.TenancyRule{{NamespaceSelector: bogus}}}, "team-a", 0, false, true, true},
		{"namespace unreadable", hfv1.HypervisorClusterSpec{Tenancy: []hfv1.TenancyRule{rule("a")}}, "missing", 0, false, false, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cluster := &hfv1.HypervisorCluster{ObjectMeta: metav1.ObjectMeta{Name: "pve"}, Spec: tc.spec}
			rules, admitted, err := RulesFor(context.Background(), c, cluster, tc.ns)
			if len(rules) != tc.rules || admitted != tc.admitted || (err != nil) != tc.err || errors.Is(err, ErrInvalidSelector) != tc.invalid {
				t.Errorf("rules %d admitted %v err %v; want %d %v (error %v, invalid selector %v)", len(rules), admitted, err, tc.rules, tc.admitted, tc.err, tc.invalid)
			}
		})
	}
}

// TestTenancyAPIHostsAndDNSDomains covers the CI platform API hosts a
// template's credentials are used at (the platforms' public services, or
// the hosts a rule lists) and the DNS domain its VMs are named under.
func TestTenancyAPIHostsAndDNSDomains(t *testing.T) {
	cluster := &hfv1.HypervisorCluster{Spec: hfv1.HypervisorClusterSpec{Provider: hfv1.ProviderProxmox, DefaultBridge: "vmbr0", DefaultStorage: "local-lvm",
		DNS: &hfv1.ClusterDNSSettings{DNSSettings: hfv1.DNSSettings{Domain: "ci.example.com"}}}}
	minimal := hfv1.TenancyRule{Templates: []hfv1.AllowedTemplate{{ID: ptr.To[int32](9000)}}}
	hostRule := minimal
	hostRule.APIHosts = []string{"GHES.example.com", "gitlab.example.com:8443"}
	domains := minimal
	domains.DNSDomains = []string{"team-a.ci.example.com"}
	withDomain := func(d string) func(*hfv1.HypervisorMachineTemplate) {
		return func(tm *hfv1.HypervisorMachineTemplate) { tm.Spec.Network.DNS = &hfv1.DNSSettings{Domain: d} }
	}
	ghes := []workload.APIHost{{Field: "spec.bootstrap.github.apiBaseURL", Host: "ghes.example.com"}}
	public := []workload.APIHost{{Field: "spec.bootstrap.github.apiBaseURL", Host: "api.github.com", Public: true}}
	tenant := []workload.APIHost{{Field: "spec.bootstrap.gitlab.url", Host: "evil.example.net"}}

	cases := []struct {
		name   string
		rules  []hfv1.TenancyRule
		mutate func(*hfv1.HypervisorMachineTemplate)
		hosts  []workload.APIHost
		want   string // "" = allowed; otherwise a fragment of the problem
	}{
		{name: "public API host", rules: []hfv1.TenancyRule{minimal}, hosts: public},
		{name: "other API host, list left out", rules: []hfv1.TenancyRule{minimal}, hosts: ghes,
			want: "spec.bootstrap.github.apiBaseURL names API host ghes.example.com, which is not allowed; allowed hosts besides the CI platforms' public services: none"},
		{name: "listed API host, any case", rules: []hfv1.TenancyRule{hostRule}, hosts: ghes},
		{name: "listed API host with its port", rules: []hfv1.TenancyRule{hostRule},
			hosts: []workload.APIHost{{Field: "spec.bootstrap.gitlab.url", Host: "gitlab.example.com:8443"}}},
		{name: "same host, another port", rules: []hfv1.TenancyRule{hostRule},
			hosts: []workload.APIHost{{Field: "spec.bootstrap.gitlab.url", Host: "gitlab.example.com"}}, want: "API host gitlab.example.com, which is not allowed"},
		{name: "tenant's own API host", rules: []hfv1.TenancyRule{hostRule}, hosts: tenant,
			want: "spec.bootstrap.gitlab.url names API host evil.example.net, which is not allowed; allowed hosts besides the CI platforms' public services: GHES.example.com, gitlab.example.com:8443"},
		{name: "any API host without rules", hosts: tenant},
		{name: "cluster's domain, list left out", rules: []hfv1.TenancyRule{minimal}, mutate: withDomain("ci.example.com")},
		{name: "below the cluster's domain, list left out", rules: []hfv1.TenancyRule{minimal}, mutate: withDomain("team-b.ci.example.com"),
			want: "spec.network.dns.domain team-b.ci.example.com is not allowed; allowed: the cluster's dns.domain (ci.example.com) only"},
		{name: "listed domain", rules: []hfv1.TenancyRule{domains}, mutate: withDomain("team-a.ci.example.com")},
		{name: "domain below a listed one", rules: []hfv1.TenancyRule{domains}, mutate: withDomain("vms.team-a.ci.example.com")},
		{name: "another team's domain", rules: []hfv1.TenancyRule{domains}, mutate: withDomain("team-b.ci.example.com"),
			want: "spec.network.dns.domain team-b.ci.example.com is not allowed; allowed domains (and the domains below them): team-a.ci.example.com"},
		{name: "a suffix that is not a parent", rules: []hfv1.TenancyRule{domains}, mutate: withDomain("xteam-a.ci.example.com"), want: "is not allowed"},
		{name: "no domain of its own", rules: []hfv1.TenancyRule{domains}, mutate: func(tm *hfv1.HypervisorMachineTemplate) { tm.Spec.Network.DNS = &hfv1.DNSSettings{} }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tmpl := &hfv1.HypervisorMachineTemplate{Spec: hfv1.HypervisorMachineTemplateSpec{
				Source: hfv1.MachineSource{Proxmox: hfv1.ProxmoxSource{TemplateID: ptr.To[int32](9000), CloneMode: hfv1.CloneModeLinked}},
			}}
			if tc.mutate != nil {
				tc.mutate(tmpl)
			}
			got := strings.Join(Violations(tmpl, cluster, tc.rules, tc.hosts), "; ")
			switch {
			case tc.want == "" && got != "":
				t.Errorf("refused: %s", got)
			case tc.want != "" && !strings.Contains(got, tc.want):
				t.Errorf("problems %q do not mention %q", got, tc.want)
			}
		})
	}
}

// TestTenancyBridgeWithoutClusterDefault: a cluster that leaves
// defaultBridge unset lets each hypervisor kind attach a VM whose template
// names no bridge to the kind's own default, which the platform team chose
// by leaving the field unset; a bridge the template names must still be
// on the rule's list.
func TestTenancyBridgeWithoutClusterDefault(t *testing.T) {
	cluster := &hfv1.HypervisorCluster{Spec: hfv1.HypervisorClusterSpec{Provider: hfv1.ProviderLibvirt}}
	minimal := hfv1.TenancyRule{Templates: []hfv1.AllowedTemplate{{Name: "debian-12-ci"}}}
	listed := minimal
	listed.Bridges = []string{"br-ci"}
	cases := []struct {
		name   string
		rule   hfv1.TenancyRule
		bridge string
		want   string // "" = allowed; otherwise a fragment of the problem
	}{
		{name: "no bridge anywhere", rule: minimal},
		{name: "no bridge, a list", rule: listed},
		{name: "named bridge, list left out", rule: minimal, bridge: "br-ci",
			want: "spec.network.bridge br-ci is not allowed; allowed bridges: none (or leave it unset for the cluster's default)"},
		{name: "named bridge on the list", rule: listed, bridge: "br-ci"},
		{name: "named bridge off the list", rule: listed, bridge: "br-other", want: "allowed bridges: br-ci"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tmpl := &hfv1.HypervisorMachineTemplate{Spec: hfv1.HypervisorMachineTemplateSpec{
				Source: hfv1.MachineSource{Libvirt: &hfv1.LibvirtSource{Domain: "debian-12-ci"}},
			}}
			tmpl.Spec.Network.Bridge = tc.bridge
			got := bridgeViolation(tmpl, cluster, &tc.rule)
			switch {
			case tc.want == "" && got != "":
				t.Errorf("refused: %s", got)
			case tc.want != "" && !strings.Contains(got, tc.want):
				t.Errorf("problem %q does not mention %q", got, tc.want)
			}
		})
	}
}

// TestTenancyIsolationPolicies: a namespace gets the cluster's default
// isolation policy unless its rule lists others, and may name only those;
// on a cluster without isolation nothing is checked here (the template's
// own check refuses a policy there).
func TestTenancyIsolationPolicies(t *testing.T) {
	isolated := &hfv1.HypervisorCluster{Spec: hfv1.HypervisorClusterSpec{Provider: hfv1.ProviderProxmox, Network: &hfv1.ClusterNetworkSettings{
		Isolation: &hfv1.NetworkIsolation{OperatorCIDRs: []string{"192.0.2.5"}, DefaultPolicy: "web", Policies: []hfv1.IsolationPolicy{{Name: "web"}, {Name: "build"}}},
	}}}
	open := &hfv1.HypervisorCluster{Spec: hfv1.HypervisorClusterSpec{Provider: hfv1.ProviderProxmox}}
	minimal := hfv1.TenancyRule{Templates: []hfv1.AllowedTemplate{{ID: ptr.To[int32](9000)}}}
	listed := minimal
	listed.IsolationPolicies = []string{"build"}
	cases := []struct {
		name    string
		cluster *hfv1.HypervisorCluster
		rule    hfv1.TenancyRule
		policy  string
		want    string
	}{
		{"the default, list left out", isolated, minimal, "", ""},
		{"the default named, list left out", isolated, minimal, "web", ""},
		{"another, list left out", isolated, minimal, "build", "spec.network.isolationPolicy build is not allowed; allowed isolation policies: web"},
		{"listed", isolated, listed, "build", ""},
		{"the default, not listed", isolated, listed, "", "the cluster's default isolation policy web (spec.network.isolationPolicy is unset) is not allowed; allowed isolation policies: build"},
		{"no isolation on the cluster", open, minimal, "", ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tmpl := &hfv1.HypervisorMachineTemplate{Spec: hfv1.HypervisorMachineTemplateSpec{
				Source: hfv1.MachineSource{Proxmox: hfv1.ProxmoxSource{TemplateID: ptr.To[int32](9000), CloneMode: hfv1.CloneModeLinked}},
			}}
			tmpl.Spec.Network.IsolationPolicy = tc.policy
			got := strings.Join(Violations(tmpl, tc.cluster, []hfv1.TenancyRule{tc.rule}, nil), "; ")
			if (tc.want == "") != (got == "") || !strings.Contains(got, tc.want) {
				t.Fatalf("violations %q, want %q", got, tc.want)
			}
		})
	}
}

// TestTenancyHardware covers spec.hardware against a rule: each CPU type,
// flag, device mapping and extra disk storage must be listed (nested
// virtualization through nested-virt in cpuFlags), an extra disk with no
// storage goes to, and is allowed as, the cluster's defaultStorage, and
// one rule must allow all of it.
func TestTenancyHardware(t *testing.T) {
	cluster := &hfv1.HypervisorCluster{Spec: hfv1.HypervisorClusterSpec{Provider: hfv1.ProviderProxmox, DefaultStorage: "local-lvm"}}
	minimal := hfv1.TenancyRule{Templates: []hfv1.AllowedTemplate{{ID: ptr.To[int32](9000)}}}
	kvm := minimal
	kvm.CPUTypes, kvm.CPUFlags = []string{"host"}, []string{"nested-virt", "+aes"}
	gpu := minimal
	gpu.Devices, gpu.Storages = []string{"gpu"}, []string{"scratch"}
	disk := func(size, storage string) hfv1.ExtraDisk {
		return hfv1.ExtraDisk{Size: resource.MustParse(size), Storage: storage}
	}
	cases := []struct {
		name  string
		rules []hfv1.TenancyRule
		hw    *hfv1.MachineHardware
		want  []string // fragments of the problems; none = allowed
	}{
		{"no hardware", []hfv1.TenancyRule{minimal}, nil, nil},
		{"empty hardware", []hfv1.TenancyRule{minimal}, &hfv1.MachineHardware{}, nil},
		{"cpu type, none allowed", []hfv1.TenancyRule{minimal}, &hfv1.MachineHardware{CPUType: "host"},
			[]string{"spec.hardware.cpuType host is not allowed; allowed CPU types: none"}},
		{"cpu type listed", []hfv1.TenancyRule{kvm}, &hfv1.MachineHardware{CPUType: "host"}, nil},
		{"cpu type not listed", []hfv1.TenancyRule{kvm}, &hfv1.MachineHardware{CPUType: "x86-64-v3"},
			[]string{"spec.hardware.cpuType x86-64-v3 is not allowed; allowed CPU types: host"}},
		{"flag listed", []hfv1.TenancyRule{kvm}, &hfv1.MachineHardware{CPUFlags: []string{"+aes"}}, nil},
		{"flag listed with the other sign", []hfv1.TenancyRule{kvm}, &hfv1.MachineHardware{CPUFlags: []string{"-aes"}},
			[]string{"spec.hardware.cpuFlags -aes is not allowed; allowed CPU flags: nested-virt, +aes"}},
		{"nested, none allowed", []hfv1.TenancyRule{minimal}, &hfv1.MachineHardware{NestedVirtualization: true},
			[]string{"spec.hardware.nestedVirtualization is not allowed; ask the cluster's owner to list nested-virt"}},
		{"nested allowed", []hfv1.TenancyRule{kvm}, &hfv1.MachineHardware{CPUType: "host", NestedVirtualization: true}, nil},
		{"device, none allowed", []hfv1.TenancyRule{kvm}, &hfv1.MachineHardware{Devices: []hfv1.DeviceRequest{{Mapping: "gpu"}}},
			[]string{"spec.hardware.devices mapping gpu is not allowed; allowed device mappings: none"}},
		{"device listed", []hfv1.TenancyRule{gpu}, &hfv1.MachineHardware{Devices: []hfv1.DeviceRequest{{Mapping: "gpu"}}}, nil},
		{"extra disk on the default storage", []hfv1.TenancyRule{minimal}, &hfv1.MachineHardware{ExtraDisks: []hfv1.ExtraDisk{disk("10Gi", "")}}, nil},
		{"extra disk naming the default storage", []hfv1.TenancyRule{gpu}, &hfv1.MachineHardware{ExtraDisks: []hfv1.ExtraDisk{disk("10Gi", "local-lvm")}}, nil},
		{"extra disk on a listed storage", []hfv1.TenancyRule{gpu}, &hfv1.MachineHardware{ExtraDisks: []hfv1.ExtraDisk{disk("10Gi", "scratch")}}, nil},
		{"extra disk elsewhere", []hfv1.TenancyRule{gpu}, &hfv1.MachineHardware{ExtraDisks: []hfv1.ExtraDisk{disk("10Gi", ""), disk("1Gi", "fast")}},
			[]string{"spec.hardware.extraDisks[1].storage fast is not allowed; allowed storages: scratch (or leave it unset for the cluster's defaultStorage)"}},
		{"every problem named", []hfv1.TenancyRule{minimal}, &hfv1.MachineHardware{CPUType: "host", CPUFlags: []string{"+pcid"}, NestedVirtualization: true,
			Devices: []hfv1.DeviceRequest{{Mapping: "gpu"}}, ExtraDisks: []hfv1.ExtraDisk{disk("1Gi", "fast")}},
			[]string{"cpuType host", "cpuFlags +pcid", "nestedVirtualization", "mapping gpu", "extraDisks[0].storage fast"}},
		{"rules do not add up", []hfv1.TenancyRule{kvm, gpu}, &hfv1.MachineHardware{CPUType: "host", Devices: []hfv1.DeviceRequest{{Mapping: "gpu"}}},
			[]string{"spec.hardware.devices mapping gpu is not allowed"}},
		{"one rule allows all", []hfv1.TenancyRule{minimal, {Templates: minimal.Templates, CPUTypes: []string{"host"}, CPUFlags: []string{"nested-virt"}, Devices: []string{"gpu"}}},
			&hfv1.MachineHardware{CPUType: "host", NestedVirtualization: true, Devices: []hfv1.DeviceRequest{{Mapping: "gpu"}}}, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tmpl := &hfv1.HypervisorMachineTemplate{Spec: hfv1.HypervisorMachineTemplateSpec{
				Source:   hfv1.MachineSource{Proxmox: hfv1.ProxmoxSource{TemplateID: ptr.To[int32](9000), CloneMode: hfv1.CloneModeLinked}},
				Hardware: tc.hw,
			}}
			got := Violations(tmpl, cluster, tc.rules, nil)
			if len(got) != len(tc.want) {
				t.Fatalf("violations %q, want %d like %q", got, len(tc.want), tc.want)
			}
			joined := strings.Join(got, "; ")
			for _, w := range tc.want {
				if !strings.Contains(joined, w) {
					t.Fatalf("violations %q, want %q among them", got, w)
				}
			}
		})
	}
}

// Package tenancy is the admin allow-lists of a HypervisorCluster
// (spec.allowedNamespaces and spec.tenancy; docs/security.md "Admin
// allow-lists"): which namespaces the cluster admits (RulesFor), what a
// template in one of them may use (Violations), and the TenancyRestricted
// condition that reports it.
package tenancy

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/conditions"
	"github.com/hyperfleet/hyperfleet/internal/isolation"
	"github.com/hyperfleet/hyperfleet/internal/vmspec"
	"github.com/hyperfleet/hyperfleet/pkg/provider"
	"github.com/hyperfleet/hyperfleet/pkg/workload"
)

// ErrInvalidSelector marks a cluster selector that cannot be parsed: the
// cluster then admits nobody until its owner fixes it.
var ErrInvalidSelector = errors.New("invalid namespace selector")

// RulesFor returns the spec.tenancy entries that select namespace,
// and whether the cluster admits the namespace at all: its
// allowedNamespaces must select it and, when the cluster has tenancy
// entries, at least one of them must. An error wrapping ErrInvalidSelector
// means the cluster admits nobody; any other is a failed read, worth a
// retry.
func RulesFor(ctx context.Context, c client.Reader, cluster *hfv1.HypervisorCluster, namespace string) ([]hfv1.TenancyRule, bool, error) {
	if sel := cluster.Spec.AllowedNamespaces; sel != nil {
		if _, err := metav1.LabelSelectorAsSelector(sel); err != nil {
			return nil, false, fmt.Errorf("spec.allowedNamespaces of HypervisorCluster %s: %w: %w", cluster.Name, ErrInvalidSelector, err)
		}
	}
	admitted, err := SelectorAdmits(ctx, c, cluster.Spec.AllowedNamespaces, namespace)
	if err != nil || !admitted {
		return nil, false, err
	}
	if len(cluster.Spec.Tenancy) == 0 {
		return nil, true, nil
	}
	var ns corev1.Namespace
	if err := c.Get(ctx, client.ObjectKey{Name: namespace}, &ns); err != nil {
		return nil, false, fmt.Errorf("read namespace %s: %w", namespace, err)
	}
	var rules []hfv1.TenancyRule
	for i, rule := range cluster.Spec.Tenancy {
		sel, err := metav1.LabelSelectorAsSelector(&rule.NamespaceSelector)
		if err != nil {
			return nil, false, fmt.Errorf("spec.tenancy[%d].namespaceSelector of HypervisorCluster %s: %w: %w", i, cluster.Name, ErrInvalidSelector, err)
		}
		if sel.Matches(labels.Set(ns.Labels)) {
			rules = append(rules, rule)
		}
	}
	return rules, len(rules) > 0, nil
}

// Violations says what the template uses that the selected rules do
// not allow: nothing when one rule allows every value (or the cluster has
// no rules). Otherwise it returns the problems found against the rule that
// comes closest, each naming the template's field and what is allowed.
// hosts are the CI platform API hosts the template's credentials are used
// at (workload.Template.APIHosts, which its platform's back-end reads).
func Violations(tmpl *hfv1.HypervisorMachineTemplate, cluster *hfv1.HypervisorCluster, rules []hfv1.TenancyRule, hosts []workload.APIHost) []string {
	var best []string
	for i := range rules {
		v := ruleViolations(tmpl, cluster, &rules[i], hosts)
		if len(v) == 0 {
			return nil
		}
		if best == nil || len(v) < len(best) {
			best = v
		}
	}
	return best
}

func ruleViolations(tmpl *hfv1.HypervisorMachineTemplate, cluster *hfv1.HypervisorCluster, rule *hfv1.TenancyRule, hosts []workload.APIHost) []string {
	var out []string
	add := func(s string) {
		if s != "" {
			out = append(out, s)
		}
	}
	// What the template names in its hypervisor kind's own sections (its
	// template, storages, pools, files) is the kind's to check. A template
	// no registered kind reads is on a cluster that is never connected
	// (the operator's factories are the registered kinds'), so no VM is
	// made of it that such a check would have to stop.
	if kind, ok := provider.TemplateKind(tmpl, cluster); ok {
		out = append(out, kind.TenancyViolations(tmpl, cluster, rule)...)
	}
	add(bridgeViolation(tmpl, cluster, rule))
	add(vlanViolation(tmpl, rule))
	for _, v := range apiHostViolations(hosts, rule) {
		add(v)
	}
	add(dnsDomainViolation(tmpl, cluster, rule))
	add(isolationViolation(tmpl, cluster, rule))
	out = append(out, hardwareViolations(tmpl, cluster, rule)...)
	return out
}

// hardwareViolations checks spec.hardware: the CPU model and flags, nested
// virtualization, the device mappings and the extra disks' storages. A
// CPU model or flag reaches the host's CPU (a host model exposes every
// feature, nested virtualization lets a guest run KVM of its own), a
// device is a piece of one host and a disk takes space on a storage other
// teams share: each one the platform team allows per namespace.
func hardwareViolations(tmpl *hfv1.HypervisorMachineTemplate, cluster *hfv1.HypervisorCluster, rule *hfv1.TenancyRule) []string {
	hw := vmspec.Hardware(tmpl, cluster)
	if hw == nil {
		return nil
	}
	var out []string
	if hw.CPUType != "" && !slices.Contains(rule.CPUTypes, hw.CPUType) {
		out = append(out, fmt.Sprintf("spec.hardware.cpuType %s is not allowed; allowed CPU types: %s (ask the cluster's owner to list it in spec.tenancy[].cpuTypes, or leave it unset for the template's own)",
			hw.CPUType, listOrNone(rule.CPUTypes)))
	}
	for _, f := range hw.CPUFlags {
		if !slices.Contains(rule.CPUFlags, f) {
			out = append(out, fmt.Sprintf("spec.hardware.cpuFlags %s is not allowed; allowed CPU flags: %s (ask the cluster's owner to list it in spec.tenancy[].cpuFlags)",
				f, listOrNone(rule.CPUFlags)))
		}
	}
	if hw.NestedVirtualization && !slices.Contains(rule.CPUFlags, nestedVirtFlag) {
		out = append(out, "spec.hardware.nestedVirtualization is not allowed; ask the cluster's owner to list "+nestedVirtFlag+" in spec.tenancy[].cpuFlags, or remove it")
	}
	for _, m := range hw.Devices {
		if !slices.Contains(rule.Devices, m) {
			out = append(out, fmt.Sprintf("spec.hardware.devices mapping %s is not allowed; allowed device mappings: %s (ask the cluster's owner to list it in spec.tenancy[].devices)",
				m, listOrNone(rule.Devices)))
		}
	}
	for i, d := range hw.ExtraDisks {
		// An unset storage with no cluster default is the kind's own
		// default, which the platform team chose by leaving defaultStorage
		// unset: allowed like the cluster's default.
		if d.Storage == "" || d.Storage == cluster.Spec.DefaultStorage || slices.Contains(rule.Storages, d.Storage) {
			continue
		}
		out = append(out, fmt.Sprintf("spec.hardware.extraDisks[%d].storage %s is not allowed; allowed storages: %s (or leave it unset for the cluster's defaultStorage)",
			i, d.Storage, listOrNone(rule.Storages)))
	}
	return out
}

// nestedVirtFlag is the entry of a rule's cpuFlags that allows
// spec.hardware.nestedVirtualization.
const nestedVirtFlag = "nested-virt"

// isolationViolation checks the network isolation policy the template's
// VMs get: one the rule lists, or (the rule listing none) the cluster's
// default. A namespace that could name any policy would give its VMs
// another team's egress.
func isolationViolation(tmpl *hfv1.HypervisorMachineTemplate, cluster *hfv1.HypervisorCluster, rule *hfv1.TenancyRule) string {
	name := isolation.PolicyName(tmpl, cluster)
	if name == "" {
		return ""
	}
	allowed := rule.IsolationPolicies
	if len(allowed) == 0 {
		allowed = []string{isolation.DefaultPolicyName(cluster)}
	}
	if slices.Contains(allowed, name) {
		return ""
	}
	field := "spec.network.isolationPolicy " + name
	if tmpl.Spec.Network.IsolationPolicy == "" {
		field = "the cluster's default isolation policy " + name + " (spec.network.isolationPolicy is unset)"
	}
	return fmt.Sprintf("%s is not allowed; allowed isolation policies: %s (ask the cluster's owner to list it in spec.tenancy[].isolationPolicies)", field, strings.Join(allowed, ", "))
}

// APIHostViolations says which of hosts (a template's CI platform API
// hosts) the selected rules do not allow: nothing when one rule allows
// them all (or the cluster has no rules), else the problems against the
// rule that comes closest. The RunnerPool controller asks it before it
// calls a template's API to verify a pool's scope: Violations, checked by
// the template's own controller, may not have run since the template's
// last edit.
func APIHostViolations(rules []hfv1.TenancyRule, hosts []workload.APIHost) []string {
	var best []string
	for i := range rules {
		v := apiHostViolations(hosts, &rules[i])
		if len(v) == 0 {
			return nil
		}
		if best == nil || len(v) < len(best) {
			best = v
		}
	}
	return best
}

// apiHostViolations checks the CI platform API hosts the template's
// credentials are used at: a platform's public service, or a host the
// rule lists. A host a tenant chose would otherwise have the operator
// call, and believe, a server the tenant runs: its runner lists "verify"
// any scope (docs/security.md, "The API host is part of the scope").
func apiHostViolations(hosts []workload.APIHost, rule *hfv1.TenancyRule) []string {
	allowed := make(map[string]bool, len(rule.APIHosts))
	for _, h := range rule.APIHosts {
		allowed[workload.NormalizeHost(h)] = true
	}
	var out []string
	for _, h := range hosts {
		if h.Public || allowed[h.Host] {
			continue
		}
		out = append(out, fmt.Sprintf("%s names API host %s, which is not allowed; allowed hosts besides the CI platforms' public services: %s",
			h.Field, h.Host, listOrNone(rule.APIHosts)))
	}
	return out
}

// dnsDomainViolation checks the DNS domain the template gives its VMs:
// the cluster's own, or one the rule lists (or a domain below one). The
// operator registers and validates VMs' names under it, so a namespace that
// could name any domain would publish its VMs under another team's names.
func dnsDomainViolation(tmpl *hfv1.HypervisorMachineTemplate, cluster *hfv1.HypervisorCluster, rule *hfv1.TenancyRule) string {
	dns := tmpl.Spec.Network.DNS
	if dns == nil || dns.Domain == "" {
		return ""
	}
	domain := strings.ToLower(strings.TrimSuffix(dns.Domain, "."))
	if len(rule.DNSDomains) == 0 {
		// Only the cluster's own domain itself: the domains below it may
		// be other teams' (their rules list them).
		cd := cluster.Spec.DNS
		if cd != nil && cd.Domain != "" && domain == strings.ToLower(strings.TrimSuffix(cd.Domain, ".")) {
			return ""
		}
		own := "none"
		if cd != nil && cd.Domain != "" {
			own = cd.Domain
		}
		return fmt.Sprintf("spec.network.dns.domain %s is not allowed; allowed: the cluster's dns.domain (%s) only; leave it unset, or ask the cluster's owner to list it in spec.tenancy[].dnsDomains", dns.Domain, own)
	}
	for _, a := range rule.DNSDomains {
		a = strings.ToLower(strings.TrimSuffix(a, "."))
		if domain == a || strings.HasSuffix(domain, "."+a) {
			return ""
		}
	}
	return fmt.Sprintf("spec.network.dns.domain %s is not allowed; allowed domains (and the domains below them): %s (or leave it unset for the cluster's)", dns.Domain, strings.Join(rule.DNSDomains, ", "))
}

// bridgeViolation checks the bridge the VM really gets: the template's, or
// the cluster's defaultBridge. With neither, the VM gets the hypervisor
// kind's own default, which the platform team chose when it left
// defaultBridge unset: allowed whatever the rule lists.
func bridgeViolation(tmpl *hfv1.HypervisorMachineTemplate, cluster *hfv1.HypervisorCluster, rule *hfv1.TenancyRule) string {
	bridge := cmp.Or(tmpl.Spec.Network.Bridge, cluster.Spec.DefaultBridge)
	if bridge == "" {
		return ""
	}
	allowed := rule.Bridges
	if len(allowed) == 0 && cluster.Spec.DefaultBridge != "" {
		allowed = []string{cluster.Spec.DefaultBridge}
	}
	if slices.Contains(allowed, bridge) {
		return ""
	}
	return fmt.Sprintf("spec.network.bridge %s is not allowed; allowed bridges: %s (or leave it unset for the cluster's default)", bridge, listOrNone(allowed))
}

func vlanViolation(tmpl *hfv1.HypervisorMachineTemplate, rule *hfv1.TenancyRule) string {
	vlan := tmpl.Spec.Network.VLAN
	if len(rule.VLANs) == 0 {
		if vlan == nil {
			return ""
		}
		return fmt.Sprintf("spec.network.vlan %d is not allowed; only untagged traffic is (remove network.vlan)", *vlan)
	}
	ranges := make([]string, 0, len(rule.VLANs))
	for _, r := range rule.VLANs {
		if vlan != nil && *vlan >= r.Start && *vlan <= r.End {
			return ""
		}
		ranges = append(ranges, fmt.Sprintf("%d-%d", r.Start, r.End))
	}
	if vlan == nil {
		return "spec.network.vlan is unset (untagged) but a VLAN is required; set it within " + strings.Join(ranges, ", ")
	}
	return fmt.Sprintf("spec.network.vlan %d is not allowed; allowed VLANs: %s", *vlan, strings.Join(ranges, ", "))
}

func listOrNone(values []string) string {
	if len(values) == 0 {
		return "none"
	}
	return strings.Join(values, ", ")
}

// SetCondition warns, in the cluster's status, while tenants are
// not restricted: every namespace admitted, or no allow-lists.
func SetCondition(cluster *hfv1.HypervisorCluster) {
	sel := cluster.Spec.AllowedNamespaces
	allNamespaces := sel == nil || (len(sel.MatchLabels) == 0 && len(sel.MatchExpressions) == 0)
	var problems []string
	reason := hfv1.RestrictedReason
	if allNamespaces {
		reason = hfv1.AllNamespacesAdmittedReason
		problems = append(problems, "spec.allowedNamespaces is unset or {}, so templates in every namespace may use this cluster: set it to a selector of the tenant namespaces")
	}
	if len(cluster.Spec.Tenancy) == 0 {
		if reason == hfv1.RestrictedReason {
			reason = hfv1.NoAllowListsReason
		}
		problems = append(problems, "spec.tenancy is unset, so admitted namespaces may use any bridge, VLAN, template, storage, resource pool, DNS domain, CI platform API host and isolation policy: add spec.tenancy entries (docs/security.md)")
	}
	status, msg := metav1.ConditionTrue, "Only selected namespaces use this cluster, within the spec.tenancy allow-lists"
	if len(problems) > 0 {
		status, msg = metav1.ConditionFalse, strings.Join(problems, "; ")
	}
	conditions.Set(&cluster.Status.Conditions, cluster.Generation, hfv1.HypervisorClusterTenancyRestrictedCondition, status, reason, msg)
}

// SelectorAdmits applies an allowedNamespaces selector: unset or empty
// admits every namespace.
func SelectorAdmits(ctx context.Context, c client.Reader, selector *metav1.LabelSelector, namespace string) (bool, error) {
	if selector == nil {
		return true, nil
	}
	sel, err := metav1.LabelSelectorAsSelector(selector)
	if err != nil {
		return false, fmt.Errorf("spec.allowedNamespaces is not a valid selector: %w", err)
	}
	if sel.Empty() {
		return true, nil
	}
	var ns corev1.Namespace
	if err := c.Get(ctx, client.ObjectKey{Name: namespace}, &ns); err != nil {
		return false, fmt.Errorf("read namespace %s: %w", namespace, err)
	}
	return sel.Matches(labels.Set(ns.Labels)), nil
}

// AdmittingRule returns the index in spec.tenancy of the rule that admits
// tmpl in namespace: the first that selects the namespace and allows
// everything the template uses, the rule Violations passes it with; -1
// when the cluster has no rules or none admits it. Its limits are the
// namespace's quota on the cluster for the template's VMs
// (internal/quota). An error is a failed read or an invalid selector, as
// RulesFor's.
func AdmittingRule(ctx context.Context, c client.Reader, cluster *hfv1.HypervisorCluster, namespace string, tmpl *hfv1.HypervisorMachineTemplate, hosts []workload.APIHost) (int, error) {
	if len(cluster.Spec.Tenancy) == 0 {
		return -1, nil
	}
	var ns corev1.Namespace
	if err := c.Get(ctx, client.ObjectKey{Name: namespace}, &ns); err != nil {
		return -1, fmt.Errorf("read namespace %s: %w", namespace, err)
	}
	for i := range cluster.Spec.Tenancy {
		rule := &cluster.Spec.Tenancy[i]
		sel, err := metav1.LabelSelectorAsSelector(&rule.NamespaceSelector)
		if err != nil {
			return -1, fmt.Errorf("spec.tenancy[%d].namespaceSelector of HypervisorCluster %s: %w: %w", i, cluster.Name, ErrInvalidSelector, err)
		}
		if sel.Matches(labels.Set(ns.Labels)) && len(ruleViolations(tmpl, cluster, rule, hosts)) == 0 {
			return i, nil
		}
	}
	return -1, nil
}

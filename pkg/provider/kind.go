package provider

import (
	"encoding/json"
	"maps"
	"slices"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/pkg/registry"
)

// Kind is one hypervisor kind (a value of a HypervisorCluster's
// spec.provider) as the shared code meets it: its Factory, and everything
// that reads or speaks about its own sections of the API (spec.<kind> of a
// cluster, source.<kind> and the kind's native cloud-init of a template on
// such a cluster).
// The shared code (the controllers, internal/clusterconfig, vmspec,
// tenancy) asks the kind and names none of its fields, ids or advice;
// adding a kind is its API section, its package and one Register line in
// the binary's main.
//
// Every method but New is pure: it reads the objects it is given and makes
// no call.
type Kind interface {
	// Factory builds the kind's Providers from a ClusterConfig that
	// ReadCluster completed.
	Factory

	// ReadCluster sets in cfg what the kind's section of cluster says
	// (and any deprecated top-level field the section replaced): its
	// Settings, and the neutral fields the section decides (VMIDStart and
	// VMIDEnd). cfg holds the neutral fields already. An error names the
	// field and the fix.
	ReadCluster(cluster *hfv1.HypervisorCluster, cfg *ClusterConfig) error
	// MovedFields lists the deprecated top-level fields cluster sets that
	// the kind's section replaced, in the order of the spec.
	MovedFields(cluster *hfv1.HypervisorCluster) []MovedField

	// ReadsTemplate says whether tmpl sets the kind's source section
	// (source.<kind> names a template).
	ReadsTemplate(tmpl *hfv1.HypervisorMachineTemplate) bool
	// ReadSource is tmpl's source as the kind's Providers take it: its
	// Settings, Linked and, when tmpl uses the kind's own cloud-init
	// delivery, Native. TPM is the caller's (it is not the kind's).
	ReadSource(tmpl *hfv1.HypervisorMachineTemplate) TemplateSource
	// NativeCloudInit is what tmpl's section of the kind's own cloud-init
	// sets (user, keys, files on the hypervisor, seed storage), nil when
	// tmpl does not use the kind's own delivery. The caller adds the
	// per-VM parts (addresses, resolver).
	NativeCloudInit(tmpl *hfv1.HypervisorMachineTemplate) *NativeCloudInit
	// HashInput is the kind's part of tmpl's drift hash: its source
	// section, and its native cloud-init section (nil when tmpl does not
	// use the kind's own delivery). Its encoding must stay what it was,
	// or an upgrade would see every VM as stale.
	HashInput(tmpl *hfv1.HypervisorMachineTemplate) (source, native json.RawMessage, err error)
	// TenancyViolations says what tmpl's sections of this kind name that
	// rule does not allow on cluster (its template allow-list, storages,
	// resource pools, files), each naming the field and what is allowed;
	// none when it allows all.
	TenancyViolations(tmpl *hfv1.HypervisorMachineTemplate, cluster *hfv1.HypervisorCluster, rule *hfv1.TenancyRule) []string

	// DescribeTemplate names a template ValidateTemplate found, for
	// messages ("9000 (ci-template)").
	DescribeTemplate(info *TemplateInfo) string
	// Advice says how to fix what topic names on the template of info,
	// in the kind's own words and tools.
	Advice(topic AdviceTopic, info *TemplateInfo) string
	// ResolvedTemplate is what a template's status records about where
	// its source resolved to.
	ResolvedTemplate(info *TemplateInfo) hfv1.ResolvedTemplate
}

// MovedField is a deprecated field a cluster sets, with the path that
// replaces it.
type MovedField struct {
	Field, Replacement string
}

// AdviceTopic is a problem of a hypervisor template a Kind advises on.
type AdviceTopic string

const (
	// AdviceGuestAgent: the template has no guest channel
	// (TemplateInfo.GuestFiles false), which PlaceGuestFile needs.
	AdviceGuestAgent AdviceTopic = "GuestAgent"
	// AdviceLinkedClone: the template's storage cannot hold the linked
	// clones its source asks for.
	AdviceLinkedClone AdviceTopic = "LinkedClone"
)

// kinds are the hypervisor kinds registered with Register.
var kinds = registry.New[hfv1.HypervisorProvider, Kind]("hypervisor kind")

// Register makes a hypervisor kind available under its spec.provider
// name. The binary's main registers every kind it ships, next to its CI
// platforms (workload.Register), so that supporting one more is its
// package and one line there. Registering a name twice, or an empty name
// or nil kind, is a programming error and panics.
func Register(name hfv1.HypervisorProvider, k Kind) { kinds.Register(name, k) }

// Registered returns a copy of the kinds registered so far.
func Registered() map[hfv1.HypervisorProvider]Kind { return kinds.Registered() }

// KindOf returns the kind registered under name (a cluster's
// spec.provider).
func KindOf(name hfv1.HypervisorProvider) (Kind, bool) { return kinds.Lookup(name) }

// TemplateKind returns the registered kind that reads tmpl's sections on
// cluster: the kind of the cluster's spec.provider; for a cluster that
// names no registered kind, the first registered kind, by name, whose
// source section tmpl sets. False when neither finds one. (A cluster of a
// kind this build does not register is never connected, so the second
// rule only ever describes a template, never makes a VM of it.)
func TemplateKind(tmpl *hfv1.HypervisorMachineTemplate, cluster *hfv1.HypervisorCluster) (Kind, bool) {
	if k, ok := KindOf(cluster.Spec.Provider); ok {
		return k, true
	}
	all := kinds.Registered()
	for _, name := range slices.Sorted(maps.Keys(all)) {
		if all[name].ReadsTemplate(tmpl) {
			return all[name], true
		}
	}
	return nil, false
}

// Factories are the factories of kinds, by name.
func Factories(kinds map[hfv1.HypervisorProvider]Kind) map[hfv1.HypervisorProvider]Factory {
	out := make(map[hfv1.HypervisorProvider]Factory, len(kinds))
	for name, k := range kinds {
		out[name] = k
	}
	return out
}

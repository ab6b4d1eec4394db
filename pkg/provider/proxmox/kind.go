package proxmox

import (
	"bytes"
	"cmp"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/pkg/provider"
)

// Kind is Proxmox VE as a hypervisor kind (spec.provider proxmox): the
// only code that reads a cluster's spec.proxmox, a template's
// source.proxmox and cloudInit.proxmox, and speaks of VM ids, ISO storages
// and resource pools. The binary's main registers it
// (provider.Register(hfv1.ProviderProxmox, proxmox.Kind)).
var Kind provider.Kind = hypervisorKind{}

// hypervisorKind implements provider.Kind; it holds nothing.
type hypervisorKind struct{}

// ClusterSettings is Proxmox's own part of a ClusterConfig
// (ClusterConfig.Settings), read from the cluster's spec.proxmox.
type ClusterSettings struct {
	// ISOStorage receives cloud-init ISOs; it must be file-based and allow
	// iso content on every allowed node. Empty: hfv1.DefaultISOStorage.
	ISOStorage string
}

// clusterSettings is cfg's ClusterSettings with the defaults applied: a
// configuration built without Kind.ReadCluster (nil Settings) gets them
// all; Settings of another kind is refused.
func clusterSettings(cfg provider.ClusterConfig) (ClusterSettings, error) {
	var s ClusterSettings
	switch v := cfg.Settings.(type) {
	case nil:
	case ClusterSettings:
		s = v
	case *ClusterSettings:
		s = *v
	default:
		return s, fmt.Errorf("settings of type %T are not Proxmox VE's (spec.provider must be proxmox)", cfg.Settings)
	}
	s.ISOStorage = cmp.Or(s.ISOStorage, hfv1.DefaultISOStorage)
	return s, nil
}

// TemplateRef is Proxmox's own naming of a template and of its clones'
// place (provider.TemplateSource.Settings), read from source.proxmox.
type TemplateRef struct {
	// ID is the template's VM id; zero when Name is used.
	ID int
	// Name is the template's name; used when ID is zero.
	Name string
	// Selector selects one template per node instead of ID and Name: the
	// tags of a templateSelector's matchTags, lower-cased, sorted and
	// joined by ',' (one string, so that a TemplateRef stays comparable as
	// the TemplateSource holding it is compared): the templates carrying
	// every tag, one on each node that holds a copy.
	Selector string
	// Storage and Format are the target of a full clone; empty means the
	// cluster's default storage and the source format.
	Storage string
	Format  string
	// ResourcePool puts the VM into this Proxmox resource pool.
	ResourcePool string
}

var _ provider.SourceSettings = TemplateRef{}

// Record implements provider.SourceSettings.
func (r TemplateRef) Record() provider.SourceRecord {
	return provider.SourceRecord{Number: r.ID, Name: r.Name, Tags: r.selectorTags(), Storage: r.Storage, Format: r.Format, Pool: r.ResourcePool}
}

// selectorTags are the tags of r's Selector, nil without one.
func (r TemplateRef) selectorTags() []string {
	if r.Selector == "" {
		return nil
	}
	return strings.Split(r.Selector, ",")
}

// FromRecord implements provider.SourceSettings.
func (TemplateRef) FromRecord(rec provider.SourceRecord) provider.SourceSettings {
	return TemplateRef{ID: rec.Number, Name: rec.Name, Selector: strings.Join(rec.Tags, ","), Storage: rec.Storage, Format: rec.Format, ResourcePool: rec.Pool}
}

// templateRefOf is src's TemplateRef; zero (no template named) when its Settings
// are not Proxmox's.
func templateRefOf(src provider.TemplateSource) TemplateRef {
	switch r := src.Settings.(type) {
	case TemplateRef:
		return r
	case *TemplateRef:
		if r != nil {
			return *r
		}
	}
	return TemplateRef{}
}

// New implements provider.Factory.
func (hypervisorKind) New(cfg provider.ClusterConfig, deps provider.Deps) (provider.Provider, error) {
	return Factory.New(cfg, deps)
}

// ReadCluster sets the VM id range (spec.proxmox.vmidRange, else the
// deprecated spec.vmidRange, else every id Proxmox allows) and the ISO
// storage (spec.proxmox.isoStorage, else the deprecated spec.isoStorage,
// else hfv1.DefaultISOStorage). These are the one readers of the
// deprecated fields.
func (hypervisorKind) ReadCluster(cluster *hfv1.HypervisorCluster, cfg *provider.ClusterConfig) error {
	s := cluster.Spec
	rg := s.VMIDRange //nolint:staticcheck // the one reader of the deprecated field
	var iso string
	if p := s.Proxmox; p != nil {
		if p.VMIDRange != nil {
			rg = p.VMIDRange
		}
		iso = p.ISOStorage
	}
	cfg.VMIDStart, cfg.VMIDEnd = minVMID, maxVMID
	if rg != nil {
		cfg.VMIDStart, cfg.VMIDEnd = int(rg.Start), int(rg.End)
	}
	cfg.Settings = ClusterSettings{ISOStorage: cmp.Or(iso, s.ISOStorage, hfv1.DefaultISOStorage)} //nolint:staticcheck // the one reader of the deprecated field
	return nil
}

// MovedFields implements provider.Kind: spec.vmidRange and spec.isoStorage
// moved into spec.proxmox.
func (hypervisorKind) MovedFields(cluster *hfv1.HypervisorCluster) []provider.MovedField {
	var out []provider.MovedField
	if cluster.Spec.VMIDRange != nil { //nolint:staticcheck // reports the deprecated field
		out = append(out, provider.MovedField{Field: "spec.vmidRange", Replacement: "spec.proxmox.vmidRange"})
	}
	if cluster.Spec.ISOStorage != "" { //nolint:staticcheck // reports the deprecated field
		out = append(out, provider.MovedField{Field: "spec.isoStorage", Replacement: "spec.proxmox.isoStorage"})
	}
	return out
}

// ReadsTemplate implements provider.Kind: source.proxmox names a template
// by id, by name or by tags.
func (hypervisorKind) ReadsTemplate(tmpl *hfv1.HypervisorMachineTemplate) bool {
	src := tmpl.Spec.Source.Proxmox
	return src.TemplateID != nil || src.TemplateName != "" || (src.TemplateSelector != nil && len(src.TemplateSelector.MatchTags) > 0)
}

// ReadSource implements provider.Kind.
func (hypervisorKind) ReadSource(tmpl *hfv1.HypervisorMachineTemplate) provider.TemplateSource {
	src := tmpl.Spec.Source.Proxmox
	ref := TemplateRef{Name: src.TemplateName, Storage: src.Storage, Format: string(src.Format), ResourcePool: src.Pool}
	if src.TemplateID != nil {
		ref.ID = int(*src.TemplateID)
	}
	if sel := src.TemplateSelector; sel != nil {
		ref.Selector = strings.Join(normalizeTags(sel.MatchTags), ",")
	}
	out := provider.TemplateSource{Linked: src.CloneMode != hfv1.CloneModeFull, Settings: ref}
	if p := nativeSection(tmpl); p != nil {
		// Checked with the template: what the VMs' drive names on the
		// hypervisor.
		out.Native = &provider.NativeFiles{VendorData: p.VendorSnippet, UserData: p.UserSnippet, Storage: p.DriveStorage}
	}
	return out
}

// nativeSection is tmpl's cloudInit.proxmox under delivery proxmox, nil
// otherwise.
func nativeSection(tmpl *hfv1.HypervisorMachineTemplate) *hfv1.ProxmoxCloudInit {
	if ci := tmpl.Spec.CloudInit; usesNative(tmpl) && ci.Proxmox != nil {
		return ci.Proxmox
	}
	return nil
}

// usesNative says whether tmpl's VMs take their cloud-init from Proxmox's
// own drive (cloudInit.delivery proxmox).
func usesNative(tmpl *hfv1.HypervisorMachineTemplate) bool {
	ci := tmpl.Spec.CloudInit
	return ci != nil && ci.Delivery == hfv1.CloudInitDeliveryProxmox
}

// NativeCloudInit implements provider.Kind: the user, keys and snippets of
// cloudInit.proxmox, and the storage of the VM's drive.
func (hypervisorKind) NativeCloudInit(tmpl *hfv1.HypervisorMachineTemplate) *provider.NativeCloudInit {
	if !usesNative(tmpl) {
		return nil
	}
	n := &provider.NativeCloudInit{}
	if p := nativeSection(tmpl); p != nil {
		n.User, n.SSHAuthorizedKeys = p.User, slices.Clone(p.SSHAuthorizedKeys)
		n.VendorData, n.UserData, n.Storage = p.VendorSnippet, p.UserSnippet, p.DriveStorage
	}
	return n
}

// HashInput implements provider.Kind. The source is encoded as versions
// before the API spelt its id fields ID encoded it: templateId, not
// templateID (api/v1alpha1/spelling.go); the hash must not change with the
// spelling, or an upgrade would see every VM cloned by template id as
// stale. The key cannot occur inside a value: the source's strings are
// names that hold no quote. The native part is cloudInit.proxmox (empty
// when unset) under delivery proxmox, where those fields, not the
// rendered files, reach the VM.
func (hypervisorKind) HashInput(tmpl *hfv1.HypervisorMachineTemplate) (source, native json.RawMessage, err error) {
	raw, err := json.Marshal(tmpl.Spec.Source.Proxmox)
	if err != nil {
		return nil, nil, fmt.Errorf("encode spec.source.proxmox: %w", err)
	}
	source = bytes.Replace(raw, []byte(`"templateID":`), []byte(`"templateId":`), 1)
	if usesNative(tmpl) {
		if native, err = json.Marshal(cmp.Or(tmpl.Spec.CloudInit.Proxmox, &hfv1.ProxmoxCloudInit{})); err != nil {
			return nil, nil, fmt.Errorf("encode spec.cloudInit.proxmox: %w", err)
		}
	}
	return source, native, nil
}

// TenancyViolations implements provider.Kind: the template (by id or
// name), the full clone's target storage, the resource pool, and the
// snippets and drive storage of Proxmox's own cloud-init.
func (hypervisorKind) TenancyViolations(tmpl *hfv1.HypervisorMachineTemplate, cluster *hfv1.HypervisorCluster, rule *hfv1.TenancyRule) []string {
	src := &tmpl.Spec.Source.Proxmox
	var out []string
	for _, v := range []string{templateViolation(src, rule), storageViolation(src, cluster, rule), poolViolation(src, rule)} {
		if v != "" {
			out = append(out, v)
		}
	}
	if p := nativeSection(tmpl); p != nil {
		out = append(out, nativeViolations(p, rule)...)
	}
	return out
}

// templateViolation checks the template against the rule's allow-list,
// whose entries name a template by id or by name, or allow every
// template carrying a tag. A tag entry allows only a selector that asks
// for its tag (every template the selector picks then carries it), never
// an id or a name (which may name a template without the tag); an id or
// name entry never allows a selector (which may pick other templates).
func templateViolation(src *hfv1.ProxmoxSource, rule *hfv1.TenancyRule) string {
	if sel := src.TemplateSelector; sel != nil {
		return selectorViolation(sel, rule)
	}
	var ids, names []string
	for _, t := range rule.Templates {
		switch {
		case t.ID != nil:
			if src.TemplateID != nil && *src.TemplateID == *t.ID {
				return ""
			}
			ids = append(ids, strconv.Itoa(int(*t.ID)))
		case t.Name != "":
			if src.TemplateName == t.Name {
				return ""
			}
			names = append(names, t.Name)
		}
	}
	if src.TemplateID != nil {
		return fmt.Sprintf("spec.source.proxmox.templateID %d is not allowed; allowed ids: %s", *src.TemplateID, listOrNone(ids))
	}
	return fmt.Sprintf("spec.source.proxmox.templateName %q is not allowed; allowed names: %s", src.TemplateName, listOrNone(names))
}

// selectorViolation checks a templateSelector against the rule's tag
// entries, compared lower-cased as Proxmox stores tags.
func selectorViolation(sel *hfv1.TemplateSelector, rule *hfv1.TenancyRule) string {
	asked := normalizeTags(sel.MatchTags)
	var tags []string
	for _, t := range rule.Templates {
		if t.Tag == "" {
			continue
		}
		tag := strings.ToLower(t.Tag)
		if slices.Contains(asked, tag) {
			return ""
		}
		tags = append(tags, tag)
	}
	return fmt.Sprintf("spec.source.proxmox.templateSelector.matchTags %s include no allowed tag; allowed tags: %s", strings.Join(asked, ","), listOrNone(tags))
}

// storageViolation checks the target storage of a full clone. Linked
// clones, and full clones without a target, stay on the template's own
// storage, which the admin chose by allowing the template.
func storageViolation(src *hfv1.ProxmoxSource, cluster *hfv1.HypervisorCluster, rule *hfv1.TenancyRule) string {
	if src.CloneMode != hfv1.CloneModeFull {
		return ""
	}
	target := src.Storage
	if len(rule.Storages) == 0 {
		if target == "" || target == cluster.Spec.DefaultStorage {
			return ""
		}
		return fmt.Sprintf("spec.source.proxmox.storage %s is not allowed; leave it unset to use the cluster's default storage", target)
	}
	if target == "" {
		target = cluster.Spec.DefaultStorage
	}
	if target == "" || slices.Contains(rule.Storages, target) {
		return ""
	}
	return fmt.Sprintf("spec.source.proxmox.storage %s is not allowed; allowed storages: %s", target, strings.Join(rule.Storages, ", "))
}

func poolViolation(src *hfv1.ProxmoxSource, rule *hfv1.TenancyRule) string {
	if src.Pool == "" || slices.Contains(rule.ResourcePools, src.Pool) {
		return ""
	}
	return fmt.Sprintf("spec.source.proxmox.pool %s is not allowed; allowed resource pools: %s", src.Pool, listOrNone(rule.ResourcePools))
}

// nativeViolations checks what Proxmox's own cloud-init drive of the
// template's VMs names: its snippets (a VM boots with the file, so a
// namespace that could name any would read another team's) and the
// storage of the drive.
func nativeViolations(p *hfv1.ProxmoxCloudInit, rule *hfv1.TenancyRule) []string {
	var out []string
	for field, v := range map[string]string{"vendorSnippet": p.VendorSnippet, "userSnippet": p.UserSnippet} {
		if v != "" && !slices.Contains(rule.Snippets, v) {
			out = append(out, fmt.Sprintf("spec.cloudInit.proxmox.%s %s is not allowed; allowed snippets: %s", field, v, listOrNone(rule.Snippets)))
		}
	}
	slices.Sort(out)
	if s := p.DriveStorage; s != "" && !slices.Contains(rule.Storages, s) {
		out = append(out, fmt.Sprintf("spec.cloudInit.proxmox.driveStorage %s is not allowed; allowed storages: %s (or leave it unset for the VM's disk storage)", s, listOrNone(rule.Storages)))
	}
	return out
}

func listOrNone(values []string) string {
	if len(values) == 0 {
		return "none"
	}
	return strings.Join(values, ", ")
}

// DescribeTemplate implements provider.Kind: the template's VM id and
// name, and for a selector that it has copies (TemplateInfo.Nodes says
// where).
func (hypervisorKind) DescribeTemplate(info *provider.TemplateInfo) string {
	one := strconv.Itoa(info.ID)
	if info.Name != "" {
		one = fmt.Sprintf("%d (%s)", info.ID, info.Name)
	}
	if len(info.Nodes) > 0 {
		return one + " and its copies"
	}
	return one
}

// Advice implements provider.Kind, with the qm commands and storage types
// of Proxmox VE.
func (hypervisorKind) Advice(topic provider.AdviceTopic, info *provider.TemplateInfo) string {
	switch topic {
	case provider.AdviceGuestAgent:
		return fmt.Sprintf("Enable it on the template (Proxmox VE: qm set %d --agent enabled=1, with qemu-guest-agent in the image; docs/templates.md)", info.ID)
	case provider.AdviceLinkedClone:
		return fmt.Sprintf("spec.source.proxmox.cloneMode: template %d is on storage %s, which cannot hold linked clones; use cloneMode: full or move the template to LVM-thin, ZFS, RBD or qcow2 on a directory",
			info.ID, strings.Join(info.Storages, ", "))
	}
	return ""
}

// ResolvedTemplate implements provider.Kind: the template's VM id, node
// and first storage.
func (hypervisorKind) ResolvedTemplate(info *provider.TemplateInfo) hfv1.ResolvedTemplate {
	out := hfv1.ResolvedTemplate{VMID: int32(info.ID), Node: info.Node}
	if len(info.Storages) > 0 {
		out.Storage = info.Storages[0]
	}
	return out
}

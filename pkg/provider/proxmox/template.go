package proxmox

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/hyperfleet/hyperfleet/pkg/provider"
	"github.com/hyperfleet/hyperfleet/pkg/provider/proxmox/privileges"
)

// templateInfo is what a clone needs to know about its template.
type templateInfo struct {
	id          int
	name        string
	node        string
	disks       []templateDisk
	diskBytes   int64
	cores       int
	memoryBytes int64
	agent       bool
	// tpm is the version of the template's tpmstate0, "" without one.
	tpm string
	// cpu is the template's cpu option, "" for Proxmox's default;
	// drives are its drive keys, CD-ROMs too (extraDiskKeys).
	cpu    string
	drives []string
	tags   []string
	at     time.Time
}

// templateDisk is one volume a clone copies.
type templateDisk struct {
	key     string
	storage string
	format  string
	// copied says Proxmox copies the volume in full even in a linked
	// clone: cloud-init drives and TPM state (qemu-server's clone_vm,
	// src/PVE/API2/Qemu.pm: "$full || drive_is_cloudinit($drive) ||
	// $opt eq 'tpmstate0'").
	copied bool
}

// Fields of the machine template the messages point at.
const (
	fieldTemplateID   = "spec.source.proxmox.templateID"
	fieldTemplateName = "spec.source.proxmox.templateName"
	fieldSelector     = "spec.source.proxmox.templateSelector.matchTags"
	fieldCloneMode    = "spec.source.proxmox.cloneMode"
	fieldStorage      = "spec.source.proxmox.storage"
	fieldFormat       = "spec.source.proxmox.format"
	fieldPool         = "spec.source.proxmox.pool"
	fieldAddTPM       = "spec.attestation.tpm.addVirtualTPM"
)

func configErr(reason, field, format string, args ...any) error {
	return provider.Errorf(provider.ClassConfiguration, reason, field+": "+format, args...)
}

// template resolves src to its template, from cache when fresh.
func (p *Provider) template(ctx context.Context, src provider.TemplateSource) (*templateInfo, error) {
	ref := templateRefOf(src)
	p.mu.Lock()
	if ref.ID != 0 {
		if t := p.templates[ref.ID]; t != nil && p.clock.Since(t.at) < templateTTL {
			p.mu.Unlock()
			return t, nil
		}
	} else {
		for _, t := range p.templates {
			if t.name == ref.Name && p.clock.Since(t.at) < templateTTL {
				p.mu.Unlock()
				return t, nil
			}
		}
	}
	p.mu.Unlock()
	view, err := p.clusterView(ctx, viewTTL)
	if err != nil {
		return nil, err
	}
	id, node, err := findTemplate(view, src)
	if err != nil {
		return nil, err
	}
	cfg, err := p.api.config(ctx, node, id)
	if isNotFound(err) {
		return nil, configErr("TemplateNotFound", fieldTemplateID, "VM %d does not exist on node %s: %w", id, node, err)
	}
	if err != nil {
		return nil, err
	}
	if ref.ID == 0 && cfg["name"] != ref.Name {
		// The listing is pvestatd's, seconds old: the VM it still shows
		// under this name has been renamed since. Resolving the name to
		// it would clone a template the spec no longer names (found by
		// property 3's test, TestTemplateValidationProperty in
		// internal/controller).
		return nil, configErr("TemplateNotFound", fieldTemplateName, "no template is named %q: VM %d was, and is now named %q: %w", ref.Name, id, cfg["name"], provider.ErrNotFound)
	}
	if cfg["template"] != "1" {
		field := fieldTemplateID
		if ref.ID == 0 {
			field = fieldTemplateName
		}
		return nil, configErr("NotATemplate", field, "VM %d is not a template; convert it (qm template %d) or name a template", id, id)
	}
	return p.keepTemplate(id, node, cfg), nil
}

// keepTemplate is the template VM id on node whose config is cfg, kept in
// the cache.
func (p *Provider) keepTemplate(id int, node string, cfg vmConfig) *templateInfo {
	t := &templateInfo{id: id, name: cfg["name"], node: node, agent: agentOn(cfg["agent"]), tpm: cfg.tpmVersion(), tags: cfg.tags(), at: p.clock.Now(),
		cpu: cfg["cpu"], drives: cfg.drives()}
	for _, k := range cfg.disks() {
		d := parseDrive(cfg[k])
		t.disks = append(t.disks, templateDisk{key: k, storage: d.storage(), format: d.format(),
			copied: d.cloudInit() || k == tpmKey})
	}
	_, t.diskBytes = cfg.bootDisk()
	t.cores = 1 // qemu-server's defaults: one socket, one core
	if n, err := strconv.Atoi(cfg["cores"]); err == nil && n > 0 {
		t.cores = n
	}
	if n, err := strconv.Atoi(cfg["sockets"]); err == nil && n > 1 {
		t.cores *= n
	}
	if mib, err := strconv.ParseInt(strings.TrimPrefix(cfg["memory"], "current="), 10, 64); err == nil {
		t.memoryBytes = mib << 20
	} else if cfg["memory"] == "" {
		t.memoryBytes = 512 << 20 // qemu-server's default
	}
	p.mu.Lock()
	p.templates[id] = t
	p.mu.Unlock()
	return t
}

func agentOn(v string) bool {
	first, _, _ := strings.Cut(v, ",")
	return first == "1" || strings.Contains(v, "enabled=1")
}

// findTemplate locates src in a cluster view.
func findTemplate(view *clusterView, src provider.TemplateSource) (int, string, error) {
	ref := templateRefOf(src)
	if ref.ID != 0 {
		r, ok := view.vms[ref.ID]
		if !ok {
			// /cluster/resources lists a VM only to a caller with VM.Audit
			// on it (pve-manager Cluster.pm resources).
			return 0, "", configErr("TemplateNotFound", fieldTemplateID, "VM %d does not exist, or the operator's Proxmox token lacks VM.Audit on /vms/%d to see it (grant it: %s): %w",
				ref.ID, ref.ID, privileges.Fix("VM.Audit"), provider.ErrNotFound)
		}
		return ref.ID, r.Node, nil
	}
	if ref.Name == "" {
		return 0, "", configErr("TemplateNotSet", fieldTemplateID, "set templateID, templateName or templateSelector")
	}
	var ids []int
	for id, r := range view.vms {
		if r.Template == 1 && r.Name == ref.Name {
			ids = append(ids, id)
		}
	}
	sort.Ints(ids)
	switch len(ids) {
	case 0:
		return 0, "", configErr("TemplateNotFound", fieldTemplateName, "no template is named %q: %w", ref.Name, provider.ErrNotFound)
	case 1:
		return ids[0], view.vms[ids[0]].Node, nil
	}
	return 0, "", configErr("TemplateAmbiguous", fieldTemplateName, "%d templates are named %q (ids %v); name exactly one, or use templateID", len(ids), ref.Name, ids)
}

// linkedCloneOK says whether a base volume of format on storage type typ
// can be the parent of a linked clone. Thick LVM cannot.
func linkedCloneOK(typ, format string) bool {
	switch typ {
	case "lvmthin", "zfspool", "rbd":
		return true
	case "dir", "nfs", "cifs", "glusterfs", "btrfs":
		return format == "qcow2" || format == "raw" || format == "vmdk"
	}
	return false
}

// ValidateTemplate implements provider.Provider. Under a templateSelector
// every node's copy is checked as one template is, and the result names
// the nodes holding one (TemplateInfo.Nodes).
func (p *Provider) ValidateTemplate(ctx context.Context, src provider.TemplateSource) (*provider.TemplateInfo, error) {
	ref := templateRefOf(src)
	// Always read the template afresh: the user may just have fixed it.
	p.mu.Lock()
	for id, t := range p.templates {
		selected := ref.Selector != "" && hasTags(t.tags, ref.selectorTags())
		if selected || id == ref.ID || (ref.ID == 0 && ref.Selector == "" && t.name == ref.Name) {
			delete(p.templates, id)
		}
	}
	p.mu.Unlock()
	view, err := p.clusterView(ctx, 0)
	if err != nil {
		return nil, err
	}
	copies, err := p.templateCopies(ctx, src)
	if err != nil {
		return nil, err
	}
	var info *provider.TemplateInfo
	for _, node := range copies.nodes() {
		one, err := p.validateCopy(view, src, copies.on(node))
		if err != nil {
			return nil, err
		}
		info = mergeCopyInfo(info, one)
	}
	if copies.one == nil {
		info.Nodes = copies.nodes()
	}
	if src.Hardware != nil {
		if err := p.checkMappings(ctx, src.Hardware.Devices); err != nil {
			return nil, err
		}
	}
	if ref.ResourcePool != "" {
		var pools []struct {
			PoolID string `json:"poolid"`
		}
		if err := p.api.call(ctx, http.MethodGet, "/pools", nil, nil, &pools); err != nil {
			return nil, err
		}
		found := false
		for _, pl := range pools {
			found = found || pl.PoolID == ref.ResourcePool
		}
		if !found {
			return nil, configErr("PoolNotFound", fieldPool, "resource pool %q does not exist, or the operator's token lacks Pool.Audit on /pool/%s to see it; create it with pveum pool add %s, or grant the privilege: %s",
				ref.ResourcePool, ref.ResourcePool, ref.ResourcePool, privileges.Fix("Pool.Audit"))
		}
	}
	for _, node := range copies.nodes() {
		t := copies.on(node)
		if err := p.checkTemplateHardware(ctx, view, t, src); err != nil {
			return nil, err
		}
		if src.Native != nil {
			if err := p.checkNativeFiles(ctx, view, t, src.Native); err != nil {
				return nil, err
			}
		}
		if !t.agent {
			p.log.Info("Template has no QEMU guest agent; VMs will never report addresses", "template", t.id)
		}
	}
	return info, nil
}

// mergeCopyInfo adds what ValidateTemplate learned of one more copy of a
// selected template to what it learned of the others (nil before the
// first): the first copy names the template, a property holds only when
// it holds for every copy, and the storages and disk size are every
// copy's.
func mergeCopyInfo(info, one *provider.TemplateInfo) *provider.TemplateInfo {
	if info == nil {
		return one
	}
	info.LinkedCloneSupported = info.LinkedCloneSupported && one.LinkedCloneSupported
	info.GuestFiles = info.GuestFiles && one.GuestFiles
	info.TPM = info.TPM && one.TPM
	info.DiskBytes = max(info.DiskBytes, one.DiskBytes)
	for _, s := range one.Storages {
		if !slices.Contains(info.Storages, s) {
			info.Storages = append(info.Storages, s)
		}
	}
	return info
}

// validateCopy checks one template (one copy of a selected template)
// against src on its own node: the install's tag, its storages and clone
// mode, a full clone's target, its TPM.
func (p *Provider) validateCopy(view *clusterView, src provider.TemplateSource, t *templateInfo) (*provider.TemplateInfo, error) {
	ref := templateRefOf(src)
	if p.signer.HasOperatorTag(t.tags) {
		return nil, configErr("TemplateTagged", fieldTemplateID,
			"template %d carries this install's tag %q; remove the tag (clones of it would look already configured)", t.id, p.signer.OperatorTag())
	}
	info := &provider.TemplateInfo{ID: t.id, Name: t.name, Node: t.node, DiskBytes: t.diskBytes, Cores: t.cores,
		MemoryBytes: t.memoryBytes, LinkedCloneSupported: true, GuestFiles: t.agent, TPM: t.tpm == "v2.0"}
	seen := map[string]bool{}
	for _, d := range t.disks {
		if !seen[d.storage] {
			seen[d.storage] = true
			info.Storages = append(info.Storages, d.storage)
		}
		if d.copied {
			// Proxmox copies cloud-init drives and TPM state in full,
			// whatever the mode.
			continue
		}
		st, ok := view.storages[t.node][d.storage]
		if !ok {
			// /cluster/resources lists a storage only to a caller with
			// Datastore.Audit on it (pve-manager Cluster.pm resources).
			return nil, configErr("StorageNotVisible", fieldTemplateID,
				"template %d's disk %s is on storage %q, which /cluster/resources does not list: the operator's Proxmox token lacks Datastore.Audit on /storage/%s; grant it: %s",
				t.id, d.key, d.storage, d.storage, privileges.Fix("Datastore.Audit"))
		}
		if !linkedCloneOK(st.PluginType, d.format) {
			info.LinkedCloneSupported = false
			if src.Linked {
				typ := st.PluginType
				if typ == "" {
					typ = "unknown type"
				}
				return nil, configErr("LinkedCloneUnsupported", fieldCloneMode,
					"template %d's disk %s is on storage %q (%s, %s), which cannot hold linked clones; use a full clone or move the template to LVM-thin, ZFS, Ceph RBD or a directory storage",
					t.id, d.key, d.storage, typ, d.format)
			}
		}
	}
	if src.Linked {
		if ref.Storage != "" {
			return nil, configErr("StorageWithLinkedClone", fieldStorage, "a linked clone stays on the template's storage; clear storage or use a full clone")
		}
		if ref.Format != "" {
			return nil, configErr("FormatWithLinkedClone", fieldFormat, "a linked clone keeps the template's format; clear format or use a full clone")
		}
	} else {
		if ref.Format != "" && ref.Format != "raw" && ref.Format != "qcow2" && ref.Format != "vmdk" {
			return nil, configErr("InvalidFormat", fieldFormat, "%q is not a disk format; use raw, qcow2 or vmdk", ref.Format)
		}
		if target := ref.Storage; target != "" || p.cfg.DefaultStorage != "" {
			field := fieldStorage
			if target == "" {
				target, field = p.cfg.DefaultStorage, "spec.defaultStorage of the HypervisorCluster"
			}
			st, ok := view.storages[t.node][target]
			if !ok {
				return nil, configErr("StorageNotFound", field, "storage %q does not exist on node %s, where template %d lives", target, t.node, t.id)
			}
			if !strings.Contains(","+st.Content+",", ",images,") {
				return nil, configErr("StorageNoImages", field, "storage %q does not allow VM disks (content %q); enable images on it or pick another", target, st.Content)
			}
		}
	}
	if err := checkTemplateTPM(t, src.TPM); err != nil {
		return nil, err
	}
	return info, nil
}

// checkTemplateTPM refuses a template whose VMs would lack the TPM 2.0
// they need: without addVirtualTPM the clone keeps the template's
// tpmstate0, which must exist and be v2.0 (Proxmox cannot change a TPM
// state's version after creation: prohibit_tpm_version_change in
// qemu-server's src/PVE/API2/Qemu.pm). With addVirtualTPM the VM gets a
// new state whatever the template has.
func checkTemplateTPM(t *templateInfo, need *provider.VMTPM) error {
	if need == nil || need.Add || t.tpm == "v2.0" {
		return nil
	}
	fix := fmt.Sprintf("add one to the template (qm set %d --tpmstate0 <storage>:1,version=v2.0, before the template is ever started; docs/templates.md, \"TPM\") or set addVirtualTPM", t.id)
	if t.tpm == "" {
		return configErr("TemplateHasNoTPM", fieldAddTPM, "%s has no TPM (tpmstate0) and attestation method tpm needs a TPM 2.0; %s", fmtTemplate(t), fix)
	}
	return configErr("TemplateTPMVersion", fieldAddTPM, "%s's TPM (tpmstate0) is version %s and attestation method tpm needs v2.0, which Proxmox cannot change in place; remove it and %s", fmtTemplate(t), t.tpm, fix)
}

// checkNativeFiles checks, on the template's node, what a native
// cloud-init of its VMs names: the storage of Proxmox's drive takes VM
// disks, and each snippet is on a storage with snippets content and
// exists. Proxmox's API cannot write snippets, so a missing one is the
// platform team's to place; without this check the VM's start would fail
// with qemu-server's "can't open" after the clone. A node-local storage
// is checked on the template's node only.
func (p *Provider) checkNativeFiles(ctx context.Context, view *clusterView, t *templateInfo, n *provider.NativeFiles) error {
	if s := n.Storage; s != "" {
		st, ok := view.storages[t.node][s]
		if !ok {
			return configErr("StorageNotFound", fieldDriveStorage, "storage %q does not exist on node %s, where template %d lives", s, t.node, t.id)
		}
		if !strings.Contains(","+st.Content+",", ",images,") {
			return configErr("StorageNoImages", fieldDriveStorage, "storage %q does not allow VM disks (content %q), which Proxmox's cloud-init drive is; enable images on it or pick another", s, st.Content)
		}
	}
	for _, f := range []struct{ field, volid string }{
		{"spec.cloudInit.proxmox.vendorSnippet", n.VendorData}, {"spec.cloudInit.proxmox.userSnippet", n.UserData},
	} {
		if f.volid == "" {
			continue
		}
		storage, _, _ := strings.Cut(f.volid, ":")
		st, ok := view.storages[t.node][storage]
		if !ok {
			return configErr("StorageNotFound", f.field, "storage %q of %s does not exist on node %s, where template %d lives", storage, f.volid, t.node, t.id)
		}
		if !strings.Contains(","+st.Content+",", ",snippets,") {
			return configErr("StorageNoSnippets", f.field, "storage %q does not hold snippets (content %q); enable snippets on it (pvesm set %s --content %s,snippets) and place %s there", storage, st.Content, storage, st.Content, f.volid)
		}
		found, err := p.api.volumeExists(ctx, t.node, storage, f.volid)
		if err != nil {
			return fmt.Errorf("look for %s on node %s: %w", f.volid, t.node, err)
		}
		if !found {
			return configErr("SnippetNotFound", f.field, "%s does not exist on node %s; Proxmox's API cannot write snippets, so place the file there (hyperfleet proxmox-kit prints the kit)", f.volid, t.node)
		}
	}
	return nil
}

// cloneStorageKeys are the storages a clone of t for spec writes to, as
// keys for the per-storage clone limit.
func (p *Provider) cloneStorageKeys(view *clusterView, t *templateInfo, spec *provider.VMSpec, node string) []string {
	target := p.fullCloneStorage(spec)
	seen := map[string]bool{}
	var out []string
	for _, d := range t.disks {
		sid := d.storage
		if target != "" {
			sid = target
		}
		k := storageKey(view, node, sid)
		if !seen[k] {
			seen[k] = true
			out = append(out, k)
		}
	}
	return out
}

// fmtTemplate names a template in messages.
func fmtTemplate(t *templateInfo) string {
	if t.name != "" {
		return fmt.Sprintf("template %d (%s)", t.id, t.name)
	}
	return fmt.Sprintf("template %d", t.id)
}

package privileges

import (
	"fmt"
	"regexp"
	"slices"
	"sort"
	"strings"
)

// Call is what Needs reads of one API call.
type Call struct {
	// Vars are the path's variables (node, vmid, storage, volume ...).
	Vars map[string]string
	// Params are the request's parameters.
	Params map[string]string
	// Config is the current config of the VM the call is about (for a
	// clone its source), nil if there is none.
	Config map[string]string
	// Volume returns the content type ("iso", "images", "backup") of a
	// volume id, "" if unknown; nil means "iso" for every volume.
	Volume func(volid string) string
	// StateStorage returns the storage a suspend to disk without
	// statestorage saves the VM's memory to (qemu-server QemuConfig.pm
	// find_vmstate_storage for Config); nil or "" leaves that check out.
	StateStorage func() string
}

// Need is one check with its path filled in.
type Need struct {
	Path  string
	Privs []string
	Any   bool
	// OrPath, if set, is another path where Privs also pass.
	OrPath string
	// Bare is a check of an 'or' group: RPCEnvironment.pm's
	// exec_api2_perm_check reports its failure as a bare "Permission check
	// failed", naming neither path nor privilege.
	Bare bool
}

// String is Proxmox's "<path>, <privs>" of a failed check (PVE's
// RPCEnvironment.pm check and check_any).
func (n Need) String() string {
	if n.Any {
		return n.Path + ", " + strings.Join(n.Privs, "|")
	}
	return n.Path + ", " + strings.Join(n.Privs, ",")
}

// Needs returns the checks Proxmox version v runs for call, in order.
func (e *Endpoint) Needs(v Version, c Call) []Need {
	var out []Need
	for _, ch := range e.Checks[v] {
		if ch.If != "" && c.Params[ch.If] == "" {
			continue
		}
		n := Need{Path: fill(ch.Path, c), Privs: ch.Privs, Any: ch.Any, Bare: ch.OrPath != ""}
		if ch.OrPath != "" && !strings.Contains(fill(ch.OrPath, c), "{") {
			n.OrPath = fill(ch.OrPath, c)
		}
		out = append(out, n)
	}
	switch e.Rule {
	case RuleConfig:
		out = append(out, configNeeds(c)...)
	case RuleClone:
		out = append(out, cloneNeeds(c)...)
	case RuleResize:
		if sid := storageOf(c.Config[c.Params["disk"]]); sid != "" {
			out = append(out, Need{Path: "/storage/" + sid, Privs: []string{"Datastore.AllocateSpace"}})
		}
	case RuleVolumeAccess:
		out = append(out, volumeAccess(c, c.Vars["volume"])...)
	case RuleContentDelete:
		// Backups of a VM need Datastore.AllocateSpace and VM.Backup
		// instead; HyperFleet deletes ISOs only.
		out = append(out, Need{Path: "/storage/" + c.Vars["storage"], Privs: []string{"Datastore.Allocate"}})
	case RuleSuspend:
		out = append(out, suspendNeeds(c)...)
	}
	return out
}

// suspendNeeds is vm_suspend's (qemu-server Qemu.pm) check with todisk:
// VM.Config.Disk on the VM, then Datastore.AllocateSpace on the state
// storage: the statestorage parameter, else the one find_vmstate_storage
// picks from the VM's config. A pause (no todisk) checks nothing more.
func suspendNeeds(c Call) []Need {
	if c.Params["todisk"] != "1" {
		return nil
	}
	out := []Need{{Path: "/vms/" + c.Vars["vmid"], Privs: []string{"VM.Config.Disk"}}}
	sid := c.Params["statestorage"]
	if sid == "" && c.StateStorage != nil {
		sid = c.StateStorage()
	}
	if sid != "" {
		out = append(out, Need{Path: "/storage/" + sid, Privs: []string{"Datastore.AllocateSpace"}})
	}
	return out
}

// FilterNeed is the row's filter for item with the item's variables (its
// vmid, storage, node or poolid), ok false if the row has none.
func (e *Endpoint) FilterNeed(item string, vars map[string]string) (Need, bool) {
	for _, f := range e.Filters {
		if f.Item == item {
			return Need{Path: fill(f.Path, Call{Vars: vars}), Privs: f.Privs, Any: f.Any}, true
		}
	}
	return Need{}, false
}

var varRE = regexp.MustCompile(`\{([a-z]+)\}`)

func fill(tmpl string, c Call) string {
	return varRE.ReplaceAllStringFunc(tmpl, func(m string) string {
		name := m[1 : len(m)-1]
		if v := c.Vars[name]; v != "" {
			return v
		}
		if v := c.Params[name]; v != "" {
			return v
		}
		return m
	})
}

// The option groups of qemu-server's Qemu.pm ($cpuoptions, $memoryoptions,
// $hwtypeoptions, $generaloptions, $vmpoweroptions, $diskoptions,
// $cloudinitoptions), the same in qemu-server 8.4 and 9.2 but for
// allow-ksm and running-nets-host-mtu (9 only, never sent by HyperFleet).
var optionGroups = map[string][]string{
	"VM.Config.CPU":     {"cores", "cpu", "runningcpu", "cpulimit", "cpuunits", "numa", "smp", "sockets", "vcpus"},
	"VM.Config.Memory":  {"memory", "balloon", "shares", "allow-ksm"},
	"VM.Config.HWType":  {"acpi", "hotplug", "kvm", "machine", "runningmachine", "scsihw", "smbios1", "tablet", "vga", "watchdog", "audio0", "rng0"},
	"VM.Config.Options": {"agent", "autostart", "bios", "description", "keyboard", "localtime", "migrate_downtime", "migrate_speed", "name", "onboot", "ostype", "protection", "reboot", "startdate", "startup", "tdf", "template"},
	"VM.PowerMgmt":      {"freeze"},
	"VM.Config.Disk":    {"boot", "bootdisk", "vmstatestorage"},
	"cloudinit":         {"cicustom", "cipassword", "citype", "ciuser", "ciupgrade", "nameserver", "searchdomain", "sshkeys"},
}

var (
	driveRE  = regexp.MustCompile(`^(ide[0-3]|scsi([0-9]|[1-2][0-9]|30)|sata[0-5]|virtio([0-9]|1[0-5])|efidisk0|tpmstate0)$`)
	newDisk  = regexp.MustCompile(`^([^:,]+):([0-9.]+)$`)
	skipKeys = map[string]bool{"node": true, "vmid": true, "delete": true, "digest": true, "skiplock": true, "revert": true, "background_delay": true, "force": true}
)

// optionNeed is check_vm_modify_config_perm for one option; ok is false
// for options checked elsewhere (drives, tags through
// assert_tag_permissions, which checks VM.Config.Options too).
func optionNeed(vmPath, key string) (Need, bool) {
	base := strings.TrimRight(key, "0123456789")
	switch {
	case skipKeys[key], driveRE.MatchString(key), key == "cdrom", base == "unused", base == "serial", base == "usb", base == "hostpci", base == "virtiofs", key == "tags":
		return Need{}, false
	case base == "numa" && base != key:
		return Need{Path: vmPath, Privs: []string{"VM.Config.CPU"}}, true
	case base == "net", key == "running-nets-host-mtu":
		return Need{Path: vmPath, Privs: []string{"VM.Config.Network"}}, true
	case key == "vmstate":
		// "the user needs Disk and PowerMgmt privileges to change the
		// vmstate"; the storage's privilege is checked when the volume
		// is freed (configNeeds).
		return Need{Path: vmPath, Privs: []string{"VM.Config.Disk", "VM.PowerMgmt"}}, true
	case base == "ipconfig":
		return Need{Path: vmPath, Privs: []string{"VM.Config.Cloudinit", "VM.Config.Network"}, Any: true}, true
	}
	for priv, keys := range optionGroups {
		if !slices.Contains(keys, key) {
			continue
		}
		if priv == "cloudinit" {
			return Need{Path: vmPath, Privs: []string{"VM.Config.Cloudinit", "VM.Config.Network"}, Any: true}, true
		}
		return Need{Path: vmPath, Privs: []string{priv}}, true
	}
	// Anything else is "only root can set '<opt>' config"; HyperFleet sends
	// none of those.
	return Need{Path: vmPath, Privs: []string{"VM.Config.Options"}}, true
}

// drivePrivs is update_vm's check_drive_perms.
func drivePrivs(value string) []string {
	switch {
	case isCloudInit(value):
		return []string{"VM.Config.Cloudinit", "VM.Config.CDROM"}
	case strings.Contains(value, "media=cdrom") || value == "none" || value == "cdrom":
		return []string{"VM.Config.CDROM"}
	}
	return []string{"VM.Config.Disk"}
}

func isCloudInit(value string) bool {
	vol, _, _ := strings.Cut(value, ",")
	_, name, _ := strings.Cut(vol, ":")
	return strings.HasSuffix(name, "-cloudinit") || strings.HasSuffix(name, "-cloudinit.qcow2") || name == "cloudinit"
}

func storageOf(value string) string {
	vol, _, _ := strings.Cut(value, ",")
	sid, _, ok := strings.Cut(vol, ":")
	if !ok {
		return ""
	}
	return sid
}

// OwnedBy reports whether volid is a volume of VM vmid by its name
// (pve-storage parse_volname: vm-<vmid>-... or base-<vmid>-..., on file
// storages under <vmid>/), as qemu-server's vm_is_volid_owner decides.
func OwnedBy(volid, vmid string) bool {
	_, name, ok := strings.Cut(volid, ":")
	if !ok || vmid == "" {
		return false
	}
	name = name[strings.LastIndex(name, "/")+1:]
	return strings.HasPrefix(name, "vm-"+vmid+"-") || strings.HasPrefix(name, "base-"+vmid+"-")
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// configNeeds is update_vm's checks after its entry check, in its order:
// options to delete, options to set, storage access, bridges, then per
// drive the old and the new value.
func configNeeds(c Call) []Need {
	vmPath := "/vms/" + c.Vars["vmid"]
	var out []Need
	var deleted []string
	for _, k := range strings.FieldsFunc(c.Params["delete"], func(r rune) bool { return r == ',' || r == ';' || r == ' ' }) {
		deleted = append(deleted, k)
		if n, ok := optionNeed(vmPath, k); ok {
			out = append(out, n)
		}
	}
	keys := sortedKeys(c.Params)
	for _, k := range keys {
		if n, ok := optionNeed(vmPath, k); ok {
			out = append(out, n)
		}
	}
	for _, k := range keys {
		if !driveRE.MatchString(k) {
			continue
		}
		out = append(out, storageAccess(c, c.Params[k])...)
	}
	for _, k := range keys {
		if strings.TrimRight(k, "0123456789") == "net" {
			out = append(out, bridgeNeeds(c.Params[k])...)
		}
	}
	for _, k := range deleted {
		switch {
		case driveRE.MatchString(k) && c.Config[k] != "":
			out = append(out, Need{Path: vmPath, Privs: drivePrivs(c.Config[k])})
		case strings.HasPrefix(k, "unused"):
			out = append(out, Need{Path: vmPath, Privs: []string{"VM.Config.Disk"}})
		case k == "vmstate" && OwnedBy(c.Config[k], c.Vars["vmid"]):
			// try_deallocate_drive (QemuServer.pm) frees a saved state
			// the VM owns only with Datastore.AllocateSpace on its
			// storage; one it does not own is dropped from the config.
			out = append(out, Need{Path: "/storage/" + storageOf(c.Config[k]), Privs: []string{"Datastore.AllocateSpace"}})
		}
	}
	for _, k := range keys {
		if !driveRE.MatchString(k) {
			continue
		}
		if old := c.Config[k]; old != "" {
			out = append(out, Need{Path: vmPath, Privs: drivePrivs(old)})
		}
		out = append(out, Need{Path: vmPath, Privs: drivePrivs(c.Params[k])})
	}
	for _, k := range keys {
		if strings.TrimRight(k, "0123456789") == "hostpci" {
			if old := c.Config[k]; old != "" {
				out = append(out, hostpciNeeds(vmPath, old)...)
			}
			out = append(out, hostpciNeeds(vmPath, c.Params[k])...)
		}
	}
	if _, ok := c.Params["tags"]; ok {
		out = append(out, Need{Path: vmPath, Privs: []string{"VM.Config.Options"}})
	}
	return out
}

// hostpciNeeds is Qemu.pm's check_hostpci_perm for one hostpciN value:
// a mapped device needs Mapping.Use on its mapping and VM.Config.HWType
// on the VM. A raw host device is root@pam's alone ("only root can set
// ... for non-mapped devices"), which no privilege grants: HyperFleet
// never sends one.
func hostpciNeeds(vmPath, value string) []Need {
	for _, part := range strings.Split(value, ",") {
		if k, v, _ := strings.Cut(part, "="); k == "mapping" {
			return []Need{
				{Path: "/mapping/pci/" + v, Privs: []string{"Mapping.Use"}},
				{Path: vmPath, Privs: []string{"VM.Config.HWType"}},
			}
		}
	}
	return nil
}

// storageAccess is Qemu.pm's check_storage_access for one drive value: a
// new disk needs Datastore.AllocateSpace on its storage, an existing volume
// check_volume_access, a cloud-init drive or "none" nothing.
func storageAccess(c Call, value string) []Need {
	vol, _, _ := strings.Cut(value, ",")
	if vol == "" || vol == "none" || isCloudInit(value) {
		return nil
	}
	if m := newDisk.FindStringSubmatch(vol); m != nil && !strings.Contains(value, "media=cdrom") {
		return []Need{{Path: "/storage/" + m[1], Privs: []string{"Datastore.AllocateSpace"}}}
	}
	if vol == "cdrom" {
		return []Need{{Path: "/", Privs: []string{"Sys.Console"}}}
	}
	return volumeAccess(c, vol)
}

// volumeAccess is pve-storage's check_volume_access: Datastore.Allocate on
// the storage passes; otherwise an ISO needs Datastore.AllocateSpace or
// Datastore.Audit, a VM's image Datastore.Audit and VM.Config.Disk on its
// owner (unless the caller is about that VM).
func volumeAccess(c Call, volid string) []Need {
	sid := storageOf(volid)
	if sid == "" {
		return nil
	}
	typ := "iso"
	if c.Volume != nil {
		typ = c.Volume(volid)
	}
	switch typ {
	case "iso", "vztmpl", "import", "":
		return []Need{{Path: "/storage/" + sid, Privs: []string{"Datastore.AllocateSpace", "Datastore.Audit"}, Any: true}}
	}
	return nil
}

// cloneNeeds is clone_vm's check_storage_access_clone and
// check_bridge_access on the source's config.
func cloneNeeds(c Call) []Need {
	var out []Need
	for _, k := range sortedKeys(c.Config) {
		v := c.Config[k]
		if !driveRE.MatchString(k) {
			continue
		}
		vol, _, _ := strings.Cut(v, ",")
		if vol == "" || vol == "none" || strings.Contains(v, "media=cdrom") {
			continue
		}
		sid := storageOf(v)
		if s := c.Params["storage"]; s != "" {
			sid = s
		}
		if sid != "" {
			out = append(out, Need{Path: "/storage/" + sid, Privs: []string{"Datastore.AllocateSpace"}})
		}
	}
	if s := c.Config["vmstatestorage"]; s != "" {
		out = append(out, Need{Path: "/storage/" + s, Privs: []string{"Datastore.AllocateSpace"}})
	}
	for _, k := range sortedKeys(c.Config) {
		if strings.TrimRight(k, "0123456789") == "net" && k != "net" {
			out = append(out, bridgeNeeds(c.Config[k])...)
		}
	}
	return out
}

// bridgeNeeds is pve-guest-common's check_vnet_access for a net option:
// SDN.Use on the bridge (zone localnetwork for a plain bridge), or on its
// VLAN when tagged.
func bridgeNeeds(value string) []Need {
	var bridge, tag string
	for _, part := range strings.Split(value, ",") {
		k, v, _ := strings.Cut(part, "=")
		switch k {
		case "bridge":
			bridge = v
		case "tag":
			tag = v
		}
	}
	if bridge == "" {
		return nil
	}
	path := "/sdn/zones/localnetwork/" + bridge
	if tag != "" {
		path += "/" + tag
	}
	return []Need{{Path: path, Privs: []string{"SDN.Use"}}}
}

// Role is the minimal privilege set that passes needs: every privilege of
// the all-of checks, then for each any-of check its first privilege unless
// the set already holds one of them.
func Role(needs []Need) []string {
	set := map[string]bool{}
	for _, n := range needs {
		if !n.Any {
			for _, p := range n.Privs {
				set[p] = true
			}
		}
	}
	for _, n := range needs {
		if n.Any && !slices.ContainsFunc(n.Privs, func(p string) bool { return set[p] }) {
			set[n.Privs[0]] = true
		}
	}
	out := make([]string, 0, len(set))
	for p := range set {
		out = append(out, p)
	}
	sort.Strings(out)
	return out
}

// RoleName is the role docs/install.md tells administrators to create.
const RoleName = "HyperFleet"

// Fix is the pveum command that grants the missing privilege priv to the
// role of docs/install.md.
func Fix(priv string) string {
	return fmt.Sprintf("pveum role modify %s --append --privs %s", RoleName, priv)
}

// Unnamed returns the check of the row of method and path whose failure
// Proxmox reports without naming it (an 'or' group, such as clone's
// VM.Allocate on /vms/{newid} or /pool/{pool}): the one a bare "Permission
// check failed" of that call means, since the named checks before it
// passed.
func Unnamed(v Version, method, path string) (Check, bool) {
	e, ok := Lookup(method, path)
	if !ok {
		return Check{}, false
	}
	for _, c := range e.Checks[v] {
		if c.OrPath != "" {
			return c, true
		}
	}
	return Check{}, false
}

var deniedRE = regexp.MustCompile(`Permission check failed \(([^,()]+), ([^()]+)\)`)

// ParseDenied reads Proxmox's "Permission check failed (<path>, <privs>)":
// the path and the privileges, of which any one would have passed when
// Proxmox joined several with '|'.
func ParseDenied(msg string) (path string, privs []string, ok bool) {
	m := deniedRE.FindStringSubmatch(msg)
	if m == nil {
		return "", nil, false
	}
	privs = strings.FieldsFunc(m[2], func(r rune) bool { return r == '|' || r == ',' || r == ' ' })
	if len(privs) == 0 {
		// The seed of FuzzParseDenied "(/x, |)": nothing to name, and
		// permissionFix would index privs[0].
		return "", nil, false
	}
	return m[1], privs, true
}

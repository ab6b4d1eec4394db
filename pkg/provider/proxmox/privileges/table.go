// Package privileges is the table of the Proxmox VE API endpoints HyperFleet
// and its simulator know, with the privileges Proxmox VE 8 and 9 check for
// each, read from Proxmox's own API code (the Sources of each column). It is
// the one source of truth for the privileges: the simulator
// (internal/testworld/simulator/proxmox) enforces it, the provider's tests
// record which rows each feature's calls resolve to and derive the minimal
// roles from them (pkg/provider/proxmox/testdata/roles.json), and
// hack/proxmox-roles writes the roles and the table into the docs.
package privileges

// Version is a Proxmox VE major version: a column of the table.
type Version int

// The versions the table covers.
const (
	PVE8 Version = 8
	PVE9 Version = 9
)

// Versions lists the columns in order.
var Versions = []Version{PVE8, PVE9}

// Source is one Proxmox repository at the version a column was read from.
type Source struct {
	// Repo is the GitHub mirror, Branch its branch, Package the Debian
	// package version at Commit.
	Repo, Branch, Package, Commit string
}

// Sources are the exact Proxmox sources of each column.
var Sources = map[Version][]Source{
	PVE8: {
		{"proxmox/qemu-server", "stable-bookworm", "qemu-server 8.4.10", "5ccd363e5908aa5a7b969797babdff1df5159475"},
		{"proxmox/pve-manager", "stable-8", "pve-manager 8.4.21", "2606ac850d46da29638efb35cca45879c436980b"},
		{"proxmox/pve-storage", "stable-8", "libpve-storage-perl 8.3.8", "1af4790d7ef4caacc9db10cc3c5f64575f13e966"},
		{"proxmox/pve-access-control", "stable-bookworm", "libpve-access-control 8.2.3", "0f258e710ec5a7dfd23d054a29cf0ba65fec2362"},
		{"proxmox/pve-guest-common", "master", "libpve-guest-common-perl 5.2.2", "58ad1835bf48ac8a62877cc8889c67b49330113f"},
		{"proxmox/pve-firewall", "stable-bookworm", "pve-firewall 5.1.2", "9b7fdbb369b2767e71272525b37fa6dd74a15330"},
	},
	PVE9: {
		{"proxmox/qemu-server", "master", "qemu-server 9.2.6", "e6352be67f70042a7433a3a3c712b36d02f9f7cb"},
		{"proxmox/pve-manager", "master", "pve-manager 9.x (master)", "14a22df35955d97dfc1af21e117dc894a29df0c9"},
		{"proxmox/pve-storage", "master", "libpve-storage-perl 9.1.7", "0c56bad8b2a7d69e5ce2c243651fe830d6caa936"},
		{"proxmox/pve-access-control", "master", "libpve-access-control 9.1.1", "5ccd07d9302562b73374d331b63d25b04b86766c"},
		{"proxmox/pve-guest-common", "master", "libpve-guest-common-perl 6.0.2", "4a8f6cbf78e1b6992ef77facb4ff2ab3372999e7"},
		{"proxmox/pve-firewall", "master", "pve-firewall 6.0.4", "6f1311f349daee920c7eedcc6e53d7fc5e2cfdbf"},
	},
}

// Privilege names of both versions, as pveum knows them. PVE 9 dropped
// VM.Monitor and split the guest agent's calls into VM.GuestAgent.*
// (qemu-server 9: src/PVE/API2/Qemu/Agent.pm).
var known = map[Version][]string{
	PVE8: append(common(), "VM.Monitor"),
	PVE9: append(common(), "VM.GuestAgent.Audit", "VM.GuestAgent.FileRead", "VM.GuestAgent.FileWrite",
		"VM.GuestAgent.FileSystemMgmt", "VM.GuestAgent.Unrestricted", "VM.Replicate"),
}

func common() []string {
	return []string{
		"Datastore.Allocate", "Datastore.AllocateSpace", "Datastore.AllocateTemplate", "Datastore.Audit",
		"Mapping.Audit", "Mapping.Modify", "Mapping.Use",
		"Pool.Allocate", "Pool.Audit", "SDN.Allocate", "SDN.Audit", "SDN.Use", "Sys.Audit", "Sys.Console", "Sys.Modify",
		"Sys.PowerMgmt", "User.Modify", "Permissions.Modify",
		"VM.Allocate", "VM.Audit", "VM.Backup", "VM.Clone", "VM.Config.CDROM", "VM.Config.CPU",
		"VM.Config.Cloudinit", "VM.Config.Disk", "VM.Config.HWType", "VM.Config.Memory", "VM.Config.Network",
		"VM.Config.Options", "VM.Console", "VM.Migrate", "VM.PowerMgmt", "VM.Snapshot",
	}
}

// Known returns the privileges version v knows, in a stable order.
func Known(v Version) []string { return append([]string(nil), known[v]...) }

// Check is one permission check of an endpoint: Privs (all of them, or one
// with Any) on the ACL path Path, whose {name} parts are the call's path
// variables and parameters.
type Check struct {
	Path  string
	Privs []string
	Any   bool
	// OrPath is an alternative path the privileges also satisfy the check
	// on, used when its variables are set (clone's /pool/{pool}). Such a
	// check is an 'or' group in Proxmox, whose failure names nothing.
	OrPath string
	// If names a parameter: the check runs only when the call sends it.
	If string
}

// Filter is a check a handler makes per item it reads (a VM, a storage, a
// node, a pool, a task) without failing the call: an item the caller lacks
// the privileges on is left out of a listing, or shown without its details.
// Filters matter to a role as much as checks do: the provider cannot use
// what it does not see.
type Filter struct {
	// Item is what the handler checks: vm, storage, node, pool or task.
	Item string
	Check
}

// Rule names a handler's value-dependent checks, evaluated by Needs.
type Rule string

// The handler rules.
const (
	// RuleConfig is update_vm(_async) in qemu-server's Qemu.pm:
	// check_vm_modify_config_perm per option, check_drive_perms per drive
	// (old and new value), check_storage_access for new disks and ISO
	// volumes, check_bridge_access per net (SDN.Use), check_hostpci_perm
	// per hostpciN (Mapping.Use on its mapping, VM.Config.HWType) and
	// assert_tag_permissions (VM.Config.Options) for tags.
	RuleConfig Rule = "config"
	// RuleClone is clone_vm's check_storage_access_clone (Datastore.AllocateSpace
	// on each disk's storage, or on the storage parameter) and
	// check_bridge_access on the source's nets.
	RuleClone Rule = "clone"
	// RuleResize is resize_vm: Datastore.AllocateSpace on the disk's storage.
	RuleResize Rule = "resize"
	// RuleVolumeAccess is pve-storage's check_volume_access of a volume
	// (Content.pm info).
	RuleVolumeAccess Rule = "volume-access"
	// RuleContentDelete is Content.pm delete: Datastore.Allocate on the
	// storage for every volume but backups.
	RuleContentDelete Rule = "content-delete"
	// RuleSuspend is vm_suspend's checks with todisk: VM.Config.Disk on
	// the VM and Datastore.AllocateSpace on the storage the VM's memory is
	// saved to (statestorage, else QemuConfig.pm find_vmstate_storage's
	// pick: Call.StateStorage).
	RuleSuspend Rule = "suspend"
)

// Endpoint is one row: an API method and path template and what each
// version checks.
type Endpoint struct {
	Method string
	// Path is relative to /api2/json, variables in braces.
	Path string
	// Source is the Proxmox file and API method the row was read from.
	Source string
	// Checks per version: the method's "permissions => { check => ... }".
	// A version without an entry checks nothing (user => 'all' or 'world').
	Checks map[Version][]Check
	// Rule adds the handler's value-dependent checks.
	Rule Rule
	// Filters are the handler's per-item checks (the same in 8 and 9).
	Filters []Filter
	// Note says, for humans, what the handler filters or checks beyond
	// Checks (what Filters encode for the simulator).
	Note string
}

func both(c ...Check) map[Version][]Check { return map[Version][]Check{PVE8: c, PVE9: c} }

func vm(privs ...string) map[Version][]Check { return both(Check{Path: "/vms/{vmid}", Privs: privs}) }

// configPrivs is $vm_config_perm_list of Qemu.pm: update_vm's entry check
// wants any one of them.
var configPrivs = []string{"VM.Config.Disk", "VM.Config.CDROM", "VM.Config.CPU", "VM.Config.Memory",
	"VM.Config.Network", "VM.Config.HWType", "VM.Config.Options", "VM.Config.Cloudinit"}

// agentRead is register_command's default: PVE 8 VM.Monitor, PVE 9 the
// command's privilege or VM.GuestAgent.Unrestricted.
func agentRead() map[Version][]Check {
	return map[Version][]Check{
		PVE8: {{Path: "/vms/{vmid}", Privs: []string{"VM.Monitor"}}},
		PVE9: {{Path: "/vms/{vmid}", Privs: []string{"VM.GuestAgent.Audit", "VM.GuestAgent.Unrestricted"}, Any: true}},
	}
}

// Table is every endpoint the provider or the simulator serves.
var Table = []Endpoint{
	// pve-access-control src/PVE/API2/AccessControl.pm create_ticket.
	{Method: "POST", Path: "/access/ticket", Source: "pve-access-control src/PVE/API2/AccessControl.pm create_ticket",
		Note: "user => 'world': the login itself"},
	// pve-manager PVE/API2.pm version.
	{Method: "GET", Path: "/version", Source: "pve-manager PVE/API2.pm version"},
	// pve-manager PVE/API2/Nodes.pm (Nodeinfo) index.
	{Method: "GET", Path: "/nodes", Source: "pve-manager PVE/API2/Nodes.pm index",
		Note:    "node statistics only with Sys.Audit on /nodes/{node}",
		Filters: []Filter{{Item: "node", Check: Check{Path: "/nodes/{node}", Privs: []string{"Sys.Audit"}}}}},
	// pve-manager PVE/API2/Nodes.pm status.
	{Method: "GET", Path: "/nodes/{node}/status", Source: "pve-manager PVE/API2/Nodes.pm status",
		Checks: both(Check{Path: "/nodes/{node}", Privs: []string{"Sys.Audit"}})},
	// pve-manager PVE/API2/Cluster.pm get_status.
	{Method: "GET", Path: "/cluster/status", Source: "pve-manager PVE/API2/Cluster.pm get_status",
		Checks: both(Check{Path: "/", Privs: []string{"Sys.Audit"}})},
	// pve-manager PVE/API2/Cluster.pm resources.
	{Method: "GET", Path: "/cluster/resources", Source: "pve-manager PVE/API2/Cluster.pm resources",
		Note: "lists a VM only with VM.Audit on /vms/{vmid}, a storage only with Datastore.Audit on /storage/{storage}, a node's details only with Sys.Audit on /nodes/{node}",
		Filters: []Filter{
			{Item: "vm", Check: Check{Path: "/vms/{vmid}", Privs: []string{"VM.Audit"}}},
			{Item: "storage", Check: Check{Path: "/storage/{storage}", Privs: []string{"Datastore.Audit"}}},
			{Item: "node", Check: Check{Path: "/nodes/{node}", Privs: []string{"Sys.Audit"}}},
		}},
	// pve-manager PVE/API2/Cluster/Mapping/PCI.pm index.
	{Method: "GET", Path: "/cluster/mapping/pci", Source: "pve-manager PVE/API2/Cluster/Mapping/PCI.pm index",
		Note: "user => 'all'; lists only mappings with Mapping.Modify, Mapping.Use or Mapping.Audit on /mapping/pci/{id}",
		Filters: []Filter{{Item: "mapping", Check: Check{Path: "/mapping/pci/{id}",
			Privs: []string{"Mapping.Modify", "Mapping.Use", "Mapping.Audit"}, Any: true}}}},
	// pve-manager PVE/API2/Cluster.pm nextid.
	{Method: "GET", Path: "/cluster/nextid", Source: "pve-manager PVE/API2/Cluster.pm nextid"},
	// pve-manager PVE/API2/Pool.pm index.
	{Method: "GET", Path: "/pools", Source: "pve-manager PVE/API2/Pool.pm index",
		Note:    "lists only pools with Pool.Audit on /pool/{poolid}",
		Filters: []Filter{{Item: "pool", Check: Check{Path: "/pool/{poolid}", Privs: []string{"Pool.Audit"}}}}},
	// pve-manager PVE/API2/Pool.pm create_pool.
	{Method: "POST", Path: "/pools", Source: "pve-manager PVE/API2/Pool.pm create_pool",
		Checks: both(Check{Path: "/pool/{poolid}", Privs: []string{"Pool.Allocate"}})},
	// pve-manager PVE/API2/Pool.pm read_pool.
	{Method: "GET", Path: "/pools/{poolid}", Source: "pve-manager PVE/API2/Pool.pm read_pool",
		Checks: both(Check{Path: "/pool/{poolid}", Privs: []string{"Pool.Audit"}})},
	// pve-manager PVE/API2/Tasks.pm read_task_status.
	{Method: "GET", Path: "/nodes/{node}/tasks/{upid}/status", Source: "pve-manager PVE/API2/Tasks.pm read_task_status",
		Note:    "Sys.Audit on /nodes/{node} only for tasks of other users",
		Filters: []Filter{{Item: "task", Check: Check{Path: "/nodes/{node}", Privs: []string{"Sys.Audit"}}}}},
	// pve-manager PVE/API2/Tasks.pm read_task_log.
	{Method: "GET", Path: "/nodes/{node}/tasks/{upid}/log", Source: "pve-manager PVE/API2/Tasks.pm read_task_log",
		Note:    "Sys.Audit on /nodes/{node} only for tasks of other users",
		Filters: []Filter{{Item: "task", Check: Check{Path: "/nodes/{node}", Privs: []string{"Sys.Audit"}}}}},
	// qemu-server src/PVE/API2/Qemu.pm vmlist.
	{Method: "GET", Path: "/nodes/{node}/qemu", Source: "qemu-server src/PVE/API2/Qemu.pm vmlist",
		Note:    "lists only VMs with VM.Audit on /vms/{vmid}",
		Filters: []Filter{{Item: "vm", Check: Check{Path: "/vms/{vmid}", Privs: []string{"VM.Audit"}}}}},
	// qemu-server src/PVE/API2/Qemu.pm clone_vm.
	{Method: "POST", Path: "/nodes/{node}/qemu/{vmid}/clone", Source: "qemu-server src/PVE/API2/Qemu.pm clone_vm",
		Checks: both(
			Check{Path: "/vms/{vmid}", Privs: []string{"VM.Clone"}},
			Check{Path: "/vms/{newid}", Privs: []string{"VM.Allocate"}, OrPath: "/pool/{pool}"},
		), Rule: RuleClone},
	// qemu-server src/PVE/API2/Qemu.pm vm_config.
	{Method: "GET", Path: "/nodes/{node}/qemu/{vmid}/config", Source: "qemu-server src/PVE/API2/Qemu.pm vm_config",
		Checks: vm("VM.Audit")},
	// qemu-server src/PVE/API2/Qemu.pm vm_pending.
	{Method: "GET", Path: "/nodes/{node}/qemu/{vmid}/pending", Source: "qemu-server src/PVE/API2/Qemu.pm vm_pending",
		Checks: vm("VM.Audit")},
	// qemu-server src/PVE/API2/Qemu.pm cloudinit_generated_config_dump.
	{Method: "GET", Path: "/nodes/{node}/qemu/{vmid}/cloudinit/dump", Source: "qemu-server src/PVE/API2/Qemu.pm cloudinit_generated_config_dump",
		Checks: vm("VM.Audit")},
	// qemu-server src/PVE/API2/Qemu.pm update_vm_async.
	{Method: "POST", Path: "/nodes/{node}/qemu/{vmid}/config", Source: "qemu-server src/PVE/API2/Qemu.pm update_vm_async",
		Checks: both(Check{Path: "/vms/{vmid}", Privs: configPrivs, Any: true}), Rule: RuleConfig},
	// qemu-server src/PVE/API2/Qemu.pm update_vm.
	{Method: "PUT", Path: "/nodes/{node}/qemu/{vmid}/config", Source: "qemu-server src/PVE/API2/Qemu.pm update_vm",
		Checks: both(Check{Path: "/vms/{vmid}", Privs: configPrivs, Any: true}), Rule: RuleConfig},
	// qemu-server src/PVE/API2/Qemu.pm resize_vm.
	{Method: "PUT", Path: "/nodes/{node}/qemu/{vmid}/resize", Source: "qemu-server src/PVE/API2/Qemu.pm resize_vm",
		Checks: vm("VM.Config.Disk"), Rule: RuleResize},
	// qemu-server src/PVE/API2/Qemu.pm vm_status.
	{Method: "GET", Path: "/nodes/{node}/qemu/{vmid}/status/current", Source: "qemu-server src/PVE/API2/Qemu.pm vm_status",
		Checks: vm("VM.Audit")},
	// qemu-server src/PVE/API2/Qemu.pm vm_start.
	{Method: "POST", Path: "/nodes/{node}/qemu/{vmid}/status/start", Source: "qemu-server src/PVE/API2/Qemu.pm vm_start",
		Checks: vm("VM.PowerMgmt")},
	// qemu-server src/PVE/API2/Qemu.pm vm_stop.
	{Method: "POST", Path: "/nodes/{node}/qemu/{vmid}/status/stop", Source: "qemu-server src/PVE/API2/Qemu.pm vm_stop",
		Checks: vm("VM.PowerMgmt")},
	// qemu-server src/PVE/API2/Qemu.pm vm_shutdown.
	{Method: "POST", Path: "/nodes/{node}/qemu/{vmid}/status/shutdown", Source: "qemu-server src/PVE/API2/Qemu.pm vm_shutdown",
		Checks: vm("VM.PowerMgmt")},
	// qemu-server src/PVE/API2/Qemu.pm vm_suspend: VM.PowerMgmt, and
	// with todisk the "early check for storage permission" (RuleSuspend).
	{Method: "POST", Path: "/nodes/{node}/qemu/{vmid}/status/suspend", Source: "qemu-server src/PVE/API2/Qemu.pm vm_suspend",
		Checks: vm("VM.PowerMgmt"), Rule: RuleSuspend},
	// qemu-server src/PVE/API2/Qemu.pm vm_resume: VM.PowerMgmt alone, also
	// for a VM suspended to disk (which it starts with vm_start).
	{Method: "POST", Path: "/nodes/{node}/qemu/{vmid}/status/resume", Source: "qemu-server src/PVE/API2/Qemu.pm vm_resume",
		Checks: vm("VM.PowerMgmt")},
	// qemu-server src/PVE/API2/Qemu.pm destroy_vm.
	{Method: "DELETE", Path: "/nodes/{node}/qemu/{vmid}", Source: "qemu-server src/PVE/API2/Qemu.pm destroy_vm",
		Checks: vm("VM.Allocate")},
	// qemu-server src/PVE/API2/Qemu/Agent.pm network-get-interfaces (register_command).
	{Method: "GET", Path: "/nodes/{node}/qemu/{vmid}/agent/network-get-interfaces", Source: "qemu-server src/PVE/API2/Qemu/Agent.pm network-get-interfaces",
		Checks: agentRead()},
	// qemu-server src/PVE/API2/Qemu/Agent.pm get-osinfo (register_command).
	{Method: "GET", Path: "/nodes/{node}/qemu/{vmid}/agent/get-osinfo", Source: "qemu-server src/PVE/API2/Qemu/Agent.pm get-osinfo",
		Checks: agentRead()},
	// qemu-server src/PVE/API2/Qemu/Agent.pm get-host-name (register_command).
	{Method: "GET", Path: "/nodes/{node}/qemu/{vmid}/agent/get-host-name", Source: "qemu-server src/PVE/API2/Qemu/Agent.pm get-host-name",
		Checks: agentRead()},
	// qemu-server src/PVE/API2/Qemu/Agent.pm ping (register_command).
	{Method: "POST", Path: "/nodes/{node}/qemu/{vmid}/agent/ping", Source: "qemu-server src/PVE/API2/Qemu/Agent.pm ping",
		Checks: agentRead()},
	// qemu-server src/PVE/API2/Qemu/Agent.pm file-write.
	{Method: "POST", Path: "/nodes/{node}/qemu/{vmid}/agent/file-write", Source: "qemu-server src/PVE/API2/Qemu/Agent.pm file-write",
		Checks: map[Version][]Check{
			PVE8: {{Path: "/vms/{vmid}", Privs: []string{"VM.Monitor"}}},
			PVE9: {{Path: "/vms/{vmid}", Privs: []string{"VM.GuestAgent.FileWrite", "VM.GuestAgent.Unrestricted"}, Any: true}},
		}},
	// pve-storage src/PVE/API2/Storage/Status.pm index (per node).
	{Method: "GET", Path: "/nodes/{node}/storage", Source: "pve-storage src/PVE/API2/Storage/Status.pm index",
		Note: "lists only storages with Datastore.Audit or Datastore.AllocateSpace on /storage/{storage}",
		Filters: []Filter{{Item: "storage", Check: Check{Path: "/storage/{storage}",
			Privs: []string{"Datastore.Audit", "Datastore.AllocateSpace"}, Any: true}}}},
	// pve-storage src/PVE/API2/Storage/Status.pm read_status.
	{Method: "GET", Path: "/nodes/{node}/storage/{storage}/status", Source: "pve-storage src/PVE/API2/Storage/Status.pm read_status",
		Checks: both(Check{Path: "/storage/{storage}", Privs: []string{"Datastore.Audit", "Datastore.AllocateSpace"}, Any: true})},
	// pve-storage src/PVE/API2/Storage/Content.pm index.
	{Method: "GET", Path: "/nodes/{node}/storage/{storage}/content", Source: "pve-storage src/PVE/API2/Storage/Content.pm index",
		Checks: both(Check{Path: "/storage/{storage}", Privs: []string{"Datastore.Audit", "Datastore.AllocateSpace"}, Any: true})},
	// pve-storage src/PVE/API2/Storage/Content.pm info.
	{Method: "GET", Path: "/nodes/{node}/storage/{storage}/content/{volume}", Source: "pve-storage src/PVE/API2/Storage/Content.pm info",
		Rule: RuleVolumeAccess},
	// pve-storage src/PVE/API2/Storage/Content.pm delete.
	{Method: "DELETE", Path: "/nodes/{node}/storage/{storage}/content/{volume}", Source: "pve-storage src/PVE/API2/Storage/Content.pm delete",
		Rule: RuleContentDelete},
	// pve-storage src/PVE/API2/Storage/Status.pm upload.
	{Method: "POST", Path: "/nodes/{node}/storage/{storage}/upload", Source: "pve-storage src/PVE/API2/Storage/Status.pm upload",
		Checks: both(Check{Path: "/storage/{storage}", Privs: []string{"Datastore.AllocateTemplate"}})},
	// pve-firewall src/PVE/API2/Firewall/Cluster.pm get_options.
	{Method: "GET", Path: "/cluster/firewall/options", Source: "pve-firewall src/PVE/API2/Firewall/Cluster.pm get_options",
		Checks: both(Check{Path: "/", Privs: []string{"Sys.Audit"}})},
	// pve-firewall src/PVE/API2/Firewall/Cluster.pm set_options.
	{Method: "PUT", Path: "/cluster/firewall/options", Source: "pve-firewall src/PVE/API2/Firewall/Cluster.pm set_options",
		Checks: both(Check{Path: "/", Privs: []string{"Sys.Modify"}})},
	// pve-firewall src/PVE/API2/Firewall/Groups.pm list_security_groups.
	{Method: "GET", Path: "/cluster/firewall/groups", Source: "pve-firewall src/PVE/API2/Firewall/Groups.pm list_security_groups",
		Note: "user => 'all'"},
	// pve-firewall src/PVE/API2/Firewall/Groups.pm create_security_group.
	{Method: "POST", Path: "/cluster/firewall/groups", Source: "pve-firewall src/PVE/API2/Firewall/Groups.pm create_security_group",
		Checks: both(Check{Path: "/", Privs: []string{"Sys.Modify"}})},
	// pve-firewall src/PVE/API2/Firewall/Rules.pm GroupRules get_rules (rules_audit_permissions 'group').
	{Method: "GET", Path: "/cluster/firewall/groups/{group}", Source: "pve-firewall src/PVE/API2/Firewall/Rules.pm GroupRules get_rules (rules_audit_permissions 'group')",
		Checks: both(Check{Path: "/", Privs: []string{"Sys.Audit"}})},
	// pve-firewall src/PVE/API2/Firewall/Rules.pm GroupRules create_rule (rules_modify_permissions 'group').
	{Method: "POST", Path: "/cluster/firewall/groups/{group}", Source: "pve-firewall src/PVE/API2/Firewall/Rules.pm GroupRules create_rule (rules_modify_permissions 'group')",
		Checks: both(Check{Path: "/", Privs: []string{"Sys.Modify"}})},
	// pve-firewall src/PVE/API2/Firewall/Rules.pm GroupRules delete_security_group.
	{Method: "DELETE", Path: "/cluster/firewall/groups/{group}", Source: "pve-firewall src/PVE/API2/Firewall/Rules.pm GroupRules delete_security_group",
		Checks: both(Check{Path: "/", Privs: []string{"Sys.Modify"}})},
	// pve-firewall src/PVE/API2/Firewall/Rules.pm GroupRules get_rule.
	{Method: "GET", Path: "/cluster/firewall/groups/{group}/{pos}", Source: "pve-firewall src/PVE/API2/Firewall/Rules.pm GroupRules get_rule",
		Checks: both(Check{Path: "/", Privs: []string{"Sys.Audit"}})},
	// pve-firewall src/PVE/API2/Firewall/Rules.pm GroupRules update_rule.
	{Method: "PUT", Path: "/cluster/firewall/groups/{group}/{pos}", Source: "pve-firewall src/PVE/API2/Firewall/Rules.pm GroupRules update_rule",
		Checks: both(Check{Path: "/", Privs: []string{"Sys.Modify"}})},
	// pve-firewall src/PVE/API2/Firewall/Rules.pm GroupRules delete_rule.
	{Method: "DELETE", Path: "/cluster/firewall/groups/{group}/{pos}", Source: "pve-firewall src/PVE/API2/Firewall/Rules.pm GroupRules delete_rule",
		Checks: both(Check{Path: "/", Privs: []string{"Sys.Modify"}})},
	// pve-firewall src/PVE/API2/Firewall/VM.pm get_options.
	{Method: "GET", Path: "/nodes/{node}/qemu/{vmid}/firewall/options", Source: "pve-firewall src/PVE/API2/Firewall/VM.pm get_options",
		Checks: vm("VM.Audit")},
	// pve-firewall src/PVE/API2/Firewall/VM.pm set_options.
	{Method: "PUT", Path: "/nodes/{node}/qemu/{vmid}/firewall/options", Source: "pve-firewall src/PVE/API2/Firewall/VM.pm set_options",
		Checks: vm("VM.Config.Network")},
	// pve-firewall src/PVE/API2/Firewall/Rules.pm VMRules get_rules (rules_audit_permissions 'vm').
	{Method: "GET", Path: "/nodes/{node}/qemu/{vmid}/firewall/rules", Source: "pve-firewall src/PVE/API2/Firewall/Rules.pm VMRules get_rules (rules_audit_permissions 'vm')",
		Checks: vm("VM.Audit")},
	// pve-firewall src/PVE/API2/Firewall/Rules.pm VMRules create_rule (rules_modify_permissions 'vm').
	{Method: "POST", Path: "/nodes/{node}/qemu/{vmid}/firewall/rules", Source: "pve-firewall src/PVE/API2/Firewall/Rules.pm VMRules create_rule (rules_modify_permissions 'vm')",
		Checks: vm("VM.Config.Network")},
	// pve-firewall src/PVE/API2/Firewall/Rules.pm VMRules get_rule.
	{Method: "GET", Path: "/nodes/{node}/qemu/{vmid}/firewall/rules/{pos}", Source: "pve-firewall src/PVE/API2/Firewall/Rules.pm VMRules get_rule",
		Checks: vm("VM.Audit")},
	// pve-firewall src/PVE/API2/Firewall/Rules.pm VMRules update_rule.
	{Method: "PUT", Path: "/nodes/{node}/qemu/{vmid}/firewall/rules/{pos}", Source: "pve-firewall src/PVE/API2/Firewall/Rules.pm VMRules update_rule",
		Checks: vm("VM.Config.Network")},
	// pve-firewall src/PVE/API2/Firewall/Rules.pm VMRules delete_rule.
	{Method: "DELETE", Path: "/nodes/{node}/qemu/{vmid}/firewall/rules/{pos}", Source: "pve-firewall src/PVE/API2/Firewall/Rules.pm VMRules delete_rule",
		Checks: vm("VM.Config.Network")},
	// pve-firewall src/PVE/API2/Firewall/IPSet.pm VMIPSetList ipset_index.
	{Method: "GET", Path: "/nodes/{node}/qemu/{vmid}/firewall/ipset", Source: "pve-firewall src/PVE/API2/Firewall/IPSet.pm VMIPSetList ipset_index",
		Checks: vm("VM.Audit")},
	// pve-firewall src/PVE/API2/Firewall/IPSet.pm VMIPSetList create_ipset.
	{Method: "POST", Path: "/nodes/{node}/qemu/{vmid}/firewall/ipset", Source: "pve-firewall src/PVE/API2/Firewall/IPSet.pm VMIPSetList create_ipset",
		Checks: vm("VM.Config.Network")},
	// pve-firewall src/PVE/API2/Firewall/IPSet.pm VMIPset get_ipset.
	{Method: "GET", Path: "/nodes/{node}/qemu/{vmid}/firewall/ipset/{name}", Source: "pve-firewall src/PVE/API2/Firewall/IPSet.pm VMIPset get_ipset",
		Checks: vm("VM.Audit")},
	// pve-firewall src/PVE/API2/Firewall/IPSet.pm VMIPset create_ip.
	{Method: "POST", Path: "/nodes/{node}/qemu/{vmid}/firewall/ipset/{name}", Source: "pve-firewall src/PVE/API2/Firewall/IPSet.pm VMIPset create_ip",
		Checks: vm("VM.Config.Network")},
	// pve-firewall src/PVE/API2/Firewall/IPSet.pm VMIPset delete_ipset.
	{Method: "DELETE", Path: "/nodes/{node}/qemu/{vmid}/firewall/ipset/{name}", Source: "pve-firewall src/PVE/API2/Firewall/IPSet.pm VMIPset delete_ipset",
		Checks: vm("VM.Config.Network")},
	// pve-firewall src/PVE/API2/Firewall/IPSet.pm VMIPset read_ip.
	{Method: "GET", Path: "/nodes/{node}/qemu/{vmid}/firewall/ipset/{name}/{cidr}", Source: "pve-firewall src/PVE/API2/Firewall/IPSet.pm VMIPset read_ip",
		Checks: vm("VM.Audit")},
	// pve-firewall src/PVE/API2/Firewall/IPSet.pm VMIPset update_ip.
	{Method: "PUT", Path: "/nodes/{node}/qemu/{vmid}/firewall/ipset/{name}/{cidr}", Source: "pve-firewall src/PVE/API2/Firewall/IPSet.pm VMIPset update_ip",
		Checks: vm("VM.Config.Network")},
	// pve-firewall src/PVE/API2/Firewall/IPSet.pm VMIPset remove_ip.
	{Method: "DELETE", Path: "/nodes/{node}/qemu/{vmid}/firewall/ipset/{name}/{cidr}", Source: "pve-firewall src/PVE/API2/Firewall/IPSet.pm VMIPset remove_ip",
		Checks: vm("VM.Config.Network")},
}

// Lookup returns the row of method and path template.
func Lookup(method, path string) (*Endpoint, bool) {
	for i := range Table {
		if Table[i].Method == method && Table[i].Path == path {
			return &Table[i], true
		}
	}
	return nil, false
}

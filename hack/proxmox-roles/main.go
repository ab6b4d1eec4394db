// Command proxmox-roles writes the Proxmox VE roles of docs/install.md
// (step 2) and the privilege table of docs/proxmox-privileges.md from their
// one source: the privilege table of pkg/provider/proxmox/privileges (read
// from Proxmox's own API code) and the minimal roles the provider's tests
// derived from the calls each feature set makes
// (pkg/provider/proxmox/testdata/roles.json, TestMinimalRoles). `make
// verify` runs it and fails when the pages drift.
//
// In docs/install.md it replaces the lines between
// "<!-- BEGIN generated: proxmox roles -->" and
// "<!-- END generated: proxmox roles -->"; docs/proxmox-privileges.md it
// writes whole.
package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"slices"
	"strings"

	"github.com/hyperfleet/hyperfleet/hack/internal/markers"
	"github.com/hyperfleet/hyperfleet/pkg/provider/proxmox/privileges"
)

const (
	beginMarker = "<!-- BEGIN generated: proxmox roles -->"
	endMarker   = "<!-- END generated: proxmox roles -->"
)

func main() {
	rolesPath := flag.String("roles", "pkg/provider/proxmox/testdata/roles.json", "the roles recorded by TestMinimalRoles")
	installPath := flag.String("install", "docs/install.md", "the page whose roles block is rewritten")
	tablePath := flag.String("table", "docs/proxmox-privileges.md", "the privilege table page, written whole")
	flag.Parse()
	if err := run(*rolesPath, *installPath, *tablePath); err != nil {
		fmt.Fprintf(os.Stderr, "proxmox-roles: %v\n", err)
		os.Exit(1)
	}
}

func run(rolesPath, installPath, tablePath string) error {
	raw, err := os.ReadFile(rolesPath)
	if err != nil {
		return err
	}
	var doc rolesDoc
	if err := json.Unmarshal(raw, &doc); err != nil {
		return fmt.Errorf("%s: %w", rolesPath, err)
	}
	if err := doc.validate(); err != nil {
		return fmt.Errorf("%s: %w", rolesPath, err)
	}
	page, err := os.ReadFile(installPath)
	if err != nil {
		return err
	}
	out, err := markers.Replace(page, beginMarker, endMarker, renderRoles(doc))
	if err != nil {
		return fmt.Errorf("%s: %w", installPath, err)
	}
	if err := os.WriteFile(installPath, out, 0o644); err != nil {
		return err
	}
	return os.WriteFile(tablePath, renderTable(doc), 0o644)
}

// rolesDoc is pkg/provider/proxmox/testdata/roles.json.
type rolesDoc struct {
	Features []string                       `json:"features"`
	Calls    map[string][]string            `json:"calls"`
	Roles    map[string]map[string][]string `json:"roles"`
	Why      map[string]map[string][]string `json:"why"`
}

// features describes each feature set for a platform engineer.
var features = map[string]string{
	"base":             "Every cluster: clone, configure, NoCloud ISO upload and deletion, start, stop, destroy, guest-agent reads and the credential's file write, cluster status and resources",
	"spiffe-tpm":       "Templates that attest with SPIRE and the template's own TPM (`spec.attestation.tpm`)",
	"delivery-proxmox": "`delivery: proxmox` (Proxmox's own cloud-init drive)",
	"vtpm":             "`spec.attestation.tpm.addVirtualTPM` (a new tpmstate0 disk per VM)",
	"pools":            "Resource pools (`spec.source.proxmox.pool`)",
	"standby":          "The standby tier (`spec.standby` of a RunnerPool): VMs suspended to disk and resumed for a job",
	"isolation":        "Network isolation (`spec.network.isolation` of the HypervisorCluster): each policy a security group, each VM its firewall options, rule and ipfilter IPSet",
	"hardware":         "`spec.hardware` of a template: the VM's CPU model and flags (VM.Config.CPU) and extra disks (VM.Config.Disk, Datastore.AllocateSpace on their storage), which base's role holds already",
	"devices":          "PCI/GPU passthrough (`spec.hardware.devices` of a template): the PCI resource mappings listed, each VM's hostpciN written with its mapping (Mapping.Use on `/mapping/pci/<id>`, or `/mapping/pci` for every mapping)",
}

func (d rolesDoc) validate() error {
	if len(d.Features) == 0 || d.Features[0] != "base" {
		return errors.New("the first feature set must be base")
	}
	for _, v := range privileges.Versions {
		roles := d.Roles[fmt.Sprint(int(v))]
		for _, f := range d.Features {
			if features[f] == "" {
				return fmt.Errorf("feature set %q has no description in hack/proxmox-roles", f)
			}
			if len(roles[f]) == 0 {
				return fmt.Errorf("PVE %d: no role for %s", v, f)
			}
			for _, p := range roles[f] {
				if !slices.Contains(privileges.Known(v), p) {
					return fmt.Errorf("PVE %d, %s: %s is not a Proxmox VE %d privilege", v, f, p, v)
				}
			}
		}
	}
	return nil
}

// additions are the privileges feature f needs beyond base on v.
func (d rolesDoc) additions(v privileges.Version, f string) []string {
	roles := d.Roles[fmt.Sprint(int(v))]
	var out []string
	for _, p := range roles[f] {
		if !slices.Contains(roles["base"], p) {
			out = append(out, p)
		}
	}
	return out
}

// renderRoles is the block of docs/install.md: per version the base role
// as a pveum command and the additions per feature.
func renderRoles(d rolesDoc) []byte {
	var b bytes.Buffer
	fmt.Fprintln(&b, "<!-- Generated by hack/proxmox-roles from pkg/provider/proxmox/testdata/roles.json; do not edit. -->")
	for _, v := range []privileges.Version{privileges.PVE9, privileges.PVE8} {
		fmt.Fprintf(&b, "\nProxmox VE %d:\n\n", v)
		if v == privileges.PVE8 {
			// The docs test's world is a Proxmox VE 9 (test/deploy,
			// docs_test.go); this test runs the Proxmox VE 8 lines.
			fmt.Fprintln(&b, "<!-- docs-test: run-by TestInstallRolesOnProxmoxVE8 -->")
		}
		fmt.Fprintln(&b, "```sh")
		fmt.Fprintf(&b, "pveum role add %s --privs \"%s\"\n", privileges.RoleName, wrap(d.Roles[fmt.Sprint(int(v))]["base"]))
		for _, f := range d.Features[1:] {
			if add := d.additions(v, f); len(add) > 0 {
				fmt.Fprintf(&b, "# %s:\n", plain(features[f]))
				fmt.Fprintf(&b, "pveum role modify %s --append --privs \"%s\"\n", privileges.RoleName, strings.Join(add, " "))
			}
		}
		fmt.Fprintln(&b, "```")
	}
	fmt.Fprintln(&b, "\n| Feature set | Proxmox VE 9 adds | Proxmox VE 8 adds |")
	fmt.Fprintln(&b, "|---|---|---|")
	for _, f := range d.Features[1:] {
		fmt.Fprintf(&b, "| %s | %s | %s |\n", features[f], privList(d.additions(privileges.PVE9, f)), privList(d.additions(privileges.PVE8, f)))
	}
	return b.Bytes()
}

// wrap joins privileges into lines of about 100 characters, continued
// with a backslash inside the quoted list.
func wrap(privs []string) string {
	var lines []string
	line := ""
	for _, p := range privs {
		if line != "" && len(line)+len(p) > 70 {
			lines = append(lines, line)
			line = ""
		}
		if line != "" {
			line += " "
		}
		line += p
	}
	lines = append(lines, line)
	return strings.Join(lines, " \\\n  ")
}

func plain(s string) string { return strings.ReplaceAll(s, "`", "") }

func privList(privs []string) string {
	if len(privs) == 0 {
		return "nothing"
	}
	out := make([]string, len(privs))
	for i, p := range privs {
		out[i] = "`" + p + "`"
	}
	return strings.Join(out, ", ")
}

// ruleDocs says what each handler rule of the table checks.
var ruleDocs = map[privileges.Rule]string{
	privileges.RuleConfig: "per option (check_vm_modify_config_perm): `cores`/`sockets`/`cpu` VM.Config.CPU, `memory`/`balloon` VM.Config.Memory, " +
		"`net<n>` VM.Config.Network and SDN.Use on `/sdn/zones/localnetwork/<bridge>[/<vlan>]`, `name`/`description`/`agent`/`tags` VM.Config.Options, " +
		"`ipconfig<n>`/`ciuser`/`sshkeys`/`nameserver`/`searchdomain`/`cicustom`/`citype`/`ciupgrade` VM.Config.Cloudinit or VM.Config.Network; " +
		"per drive, old and new value (check_drive_perms): a cloud-init drive VM.Config.Cloudinit and VM.Config.CDROM, a CD-ROM VM.Config.CDROM, a disk VM.Config.Disk; " +
		"a new disk `<storage>:<size>` Datastore.AllocateSpace on `/storage/<storage>`; an ISO volume Datastore.AllocateSpace or Datastore.Audit on its storage (check_volume_access); " +
		"deleting `vmstate` VM.Config.Disk and VM.PowerMgmt, and Datastore.AllocateSpace on the saved state's storage when the VM owns it (try_deallocate_drive); " +
		"`hostpci<n>` `mapping=<id>`, old and new value (check_hostpci_perm): Mapping.Use on `/mapping/pci/<id>` and VM.Config.HWType",
	privileges.RuleClone: "Datastore.AllocateSpace on `/storage/<storage>` of each of the source's disks, or on the `storage` parameter (check_storage_access_clone); " +
		"SDN.Use on each of the source's bridges (check_bridge_access)",
	privileges.RuleResize:        "Datastore.AllocateSpace on the disk's storage",
	privileges.RuleVolumeAccess:  "an ISO: Datastore.AllocateSpace or Datastore.Audit on `/storage/{storage}` (Datastore.Allocate passes every volume; check_volume_access)",
	privileges.RuleContentDelete: "Datastore.Allocate on `/storage/{storage}` (a VM's backup: Datastore.AllocateSpace and VM.Backup instead)",
	privileges.RuleSuspend: "with `todisk`: VM.Config.Disk on `/vms/{vmid}` and Datastore.AllocateSpace on `/storage/<storage>` of the saved state " +
		"(`statestorage`, else find_vmstate_storage's pick: the config's `vmstatestorage`, a shared then a local storage of the VM's disks, `local`)",
}

func renderChecks(checks []privileges.Check) string {
	var parts []string
	for _, c := range checks {
		join := " and "
		if c.Any {
			join = " or "
		}
		s := "`" + strings.Join(c.Privs, "`"+join+"`") + "` on `" + c.Path + "`"
		if c.OrPath != "" {
			s += " (or on `" + c.OrPath + "`)"
		}
		if c.If != "" {
			s += " when `" + c.If + "` is sent"
		}
		parts = append(parts, s)
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, "; ")
}

// renderTable is docs/proxmox-privileges.md.
func renderTable(d rolesDoc) []byte {
	var b bytes.Buffer
	fmt.Fprintln(&b, "<!-- Generated by hack/proxmox-roles from pkg/provider/proxmox/privileges and pkg/provider/proxmox/testdata/roles.json; do not edit. -->")
	fmt.Fprintln(&b, "# Proxmox VE privileges")
	fmt.Fprintln(&b)
	fmt.Fprintln(&b, "Every Proxmox VE API call HyperFleet's provider (`pkg/provider/proxmox`) or its simulator")
	fmt.Fprintln(&b, "(`internal/testworld/simulator/proxmox`) knows, with the privileges Proxmox VE 8 and 9 check for it and the")
	fmt.Fprintln(&b, "ACL path each is checked on, read from Proxmox's own API code. The simulator enforces exactly this table;")
	fmt.Fprintln(&b, "the roles of [install.md](install.md#2-proxmox-ve-a-user-a-role-a-token) are derived from the checks the")
	fmt.Fprintln(&b, "provider's calls meet in it (`TestMinimalRoles`), and a test removes each privilege of each role in turn")
	fmt.Fprintln(&b, "and sees the claim fail naming it (`TestRolesEnforced`).")
	fmt.Fprintln(&b)
	fmt.Fprintln(&b, "## Sources")
	fmt.Fprintln(&b)
	fmt.Fprintln(&b, "| Column | Repository | Branch | Package | Commit |")
	fmt.Fprintln(&b, "|---|---|---|---|---|")
	for _, v := range privileges.Versions {
		for _, s := range privileges.Sources[v] {
			fmt.Fprintf(&b, "| PVE %d | %s | %s | %s | `%s` |\n", v, s.Repo, s.Branch, s.Package, s.Commit)
		}
	}
	fmt.Fprintln(&b)
	fmt.Fprintln(&b, "## Endpoints")
	fmt.Fprintln(&b)
	fmt.Fprintln(&b, "\"Used by\" names the feature sets whose recorded calls include the endpoint; an endpoint no feature set uses is")
	fmt.Fprintln(&b, "served by the simulator for tests and tools.")
	fmt.Fprintln(&b)
	fmt.Fprintln(&b, "| Endpoint | Proxmox VE 8 | Proxmox VE 9 | Also checked by the handler | Source | Used by |")
	fmt.Fprintln(&b, "|---|---|---|---|---|---|")
	for _, e := range privileges.Table {
		var extra []string
		if e.Rule != "" {
			extra = append(extra, ruleDocs[e.Rule])
		}
		if e.Note != "" {
			extra = append(extra, e.Note)
		} else {
			for _, f := range e.Filters {
				extra = append(extra, "per "+f.Item+": "+renderChecks([]privileges.Check{f.Check})+" to see it")
			}
		}
		var used []string
		for _, f := range d.Features {
			if slices.Contains(d.Calls[f], e.Method+" "+e.Path) {
				used = append(used, f)
			}
		}
		fmt.Fprintf(&b, "| `%s %s` | %s | %s | %s | %s | %s |\n", e.Method, e.Path,
			renderChecks(e.Checks[privileges.PVE8]), renderChecks(e.Checks[privileges.PVE9]),
			orDash(strings.Join(extra, "; ")), e.Source, orDash(strings.Join(used, ", ")))
	}
	fmt.Fprintln(&b)
	fmt.Fprintln(&b, "## Why each privilege of the roles")
	fmt.Fprintln(&b)
	fmt.Fprintln(&b, "| Privilege | Proxmox VE 9: endpoints that need it | Proxmox VE 8: endpoints that need it |")
	fmt.Fprintln(&b, "|---|---|---|")
	var all []string
	for _, v := range privileges.Versions {
		for p := range d.Why[fmt.Sprint(int(v))] {
			if !slices.Contains(all, p) {
				all = append(all, p)
			}
		}
	}
	slices.Sort(all)
	for _, p := range all {
		fmt.Fprintf(&b, "| `%s` | %s | %s |\n", p, endpoints(d.Why["9"][p]), endpoints(d.Why["8"][p]))
	}
	return b.Bytes()
}

func endpoints(list []string) string {
	if len(list) == 0 {
		return "—"
	}
	out := make([]string, len(list))
	for i, e := range list {
		out[i] = "`" + e + "`"
	}
	return strings.Join(out, "<br>")
}

func orDash(s string) string {
	if s == "" {
		return "—"
	}
	return s
}

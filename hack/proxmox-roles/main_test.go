package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func testDoc() rolesDoc {
	return rolesDoc{
		Features: []string{"base", "spiffe-tpm", "pools"},
		Calls: map[string][]string{
			"base":       {"POST /nodes/{node}/qemu/{vmid}/clone"},
			"spiffe-tpm": {"POST /nodes/{node}/qemu/{vmid}/clone"},
			"pools":      {"GET /pools", "POST /nodes/{node}/qemu/{vmid}/clone"},
		},
		Roles: map[string]map[string][]string{
			"8": {"base": {"VM.Clone", "VM.Monitor"}, "spiffe-tpm": {"VM.Clone"}, "pools": {"Pool.Audit", "VM.Clone"}},
			"9": {"base": {"VM.Clone", "VM.GuestAgent.FileWrite"}, "spiffe-tpm": {"VM.Clone"}, "pools": {"Pool.Audit", "VM.Clone"}},
		},
		Why: map[string]map[string][]string{
			"9": {"Pool.Audit": {"GET /pools"}},
		},
	}
}

// TestRenderRoles: one block per version, the base role as pveum role
// add, each feature's additions as pveum role modify --append, and no
// command for a feature that adds nothing.
func TestRenderRoles(t *testing.T) {
	got := string(renderRoles(testDoc()))
	for _, want := range []string{
		"Proxmox VE 9:\n\n```sh\npveum role add HyperFleet --privs \"VM.Clone VM.GuestAgent.FileWrite\"\n",
		"Proxmox VE 8:\n\n<!-- docs-test: run-by TestInstallRolesOnProxmoxVE8 -->\n```sh\npveum role add HyperFleet --privs \"VM.Clone VM.Monitor\"\n",
		"# Resource pools (spec.source.proxmox.pool):\npveum role modify HyperFleet --append --privs \"Pool.Audit\"\n",
		"| Templates that attest with SPIRE and the template's own TPM (`spec.attestation.tpm`) | nothing | nothing |",
		"| Resource pools (`spec.source.proxmox.pool`) | `Pool.Audit` | `Pool.Audit` |",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("block lacks %q:\n%s", want, got)
		}
	}
	if strings.Count(got, "pveum role modify") != 2 {
		t.Errorf("want one modify per version (pools only):\n%s", got)
	}
}

func TestValidate(t *testing.T) {
	if err := testDoc().validate(); err != nil {
		t.Fatal(err)
	}
	d := testDoc()
	d.Roles["9"]["base"] = append(d.Roles["9"]["base"], "VM.Monitor")
	if err := d.validate(); err == nil || !strings.Contains(err.Error(), "VM.Monitor is not a Proxmox VE 9 privilege") {
		t.Errorf("VM.Monitor on PVE 9: %v", err)
	}
	d = testDoc()
	d.Features = append(d.Features, "mystery")
	d.Roles["8"]["mystery"], d.Roles["9"]["mystery"] = []string{"VM.Audit"}, []string{"VM.Audit"}
	if err := d.validate(); err == nil || !strings.Contains(err.Error(), "no description") {
		t.Errorf("undescribed feature: %v", err)
	}
}

// TestRun rewrites only the marked block of the install page, writes the
// table page and is idempotent; a page without the markers is an error.
func TestRun(t *testing.T) {
	dir := t.TempDir()
	raw, _ := json.Marshal(testDoc())
	roles := filepath.Join(dir, "roles.json")
	install := filepath.Join(dir, "install.md")
	table := filepath.Join(dir, "table.md")
	if err := os.WriteFile(roles, raw, 0o644); err != nil {
		t.Fatal(err)
	}
	page := "# Install\n\nbefore\n\n" + beginMarker + "\nstale\n" + endMarker + "\n\nafter\n"
	if err := os.WriteFile(install, []byte(page), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := run(roles, install, table); err != nil {
		t.Fatal(err)
	}
	first, _ := os.ReadFile(install)
	s := string(first)
	if strings.Contains(s, "stale") || !strings.HasPrefix(s, "# Install\n\nbefore\n\n"+beginMarker+"\n") || !strings.HasSuffix(s, endMarker+"\n\nafter\n") {
		t.Errorf("install page:\n%s", s)
	}
	if err := run(roles, install, table); err != nil {
		t.Fatal(err)
	}
	if second, _ := os.ReadFile(install); string(second) != s {
		t.Error("a second run changed the page")
	}
	tbl, _ := os.ReadFile(table)
	for _, want := range []string{"| PVE 9 | proxmox/qemu-server | master |", "| `POST /nodes/{node}/qemu/{vmid}/clone` | `VM.Clone` on `/vms/{vmid}`; `VM.Allocate` on `/vms/{newid}` (or on `/pool/{pool}`)",
		"| `Pool.Audit` | `GET /pools` | — |"} {
		if !strings.Contains(string(tbl), want) {
			t.Errorf("table lacks %q", want)
		}
	}
	if err := os.WriteFile(install, []byte("# no markers\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := run(roles, install, table); err == nil {
		t.Error("a page without markers was accepted")
	}
}

package proxmox

import (
	"context"
	"strconv"
	"strings"
	"testing"

	proxmoxsim "github.com/hyperfleet/hyperfleet/internal/testworld/simulator/proxmox"
	"github.com/hyperfleet/hyperfleet/pkg/provider"
)

// tpmEnv adds templates with a TPM 2.0 (9010), a TPM 1.2 (9011) and a
// TPM 2.0 on a directory storage next to a boot disk there (9012).
func tpmEnv(t *testing.T) *env {
	return newEnv(t, func(sim *proxmoxsim.Config, _ *provider.ClusterConfig) {
		sim.Storages = append(sim.Storages, proxmoxsim.StorageConfig{ID: "vmdir", Type: "dir", Content: []string{"images"}, Capacity: 200 << 30, Path: "/srv/vmdir"})
		sim.Templates = append(sim.Templates,
			proxmoxsim.TemplateConfig{VMID: 9010, Node: "pve1", Name: "tpm2", Storage: "local-lvm", Agent: true, TPMVersion: "v2.0"},
			proxmoxsim.TemplateConfig{VMID: 9011, Node: "pve1", Name: "tpm12", Storage: "local-lvm", Agent: true, TPMVersion: "v1.2"},
			proxmoxsim.TemplateConfig{VMID: 9012, Node: "pve1", Name: "dir-tpl", Storage: "vmdir", Format: "qcow2", Agent: true},
		)
	})
}

// TestValidateTemplateTPM: method tpm without addVirtualTPM needs the
// template's tpmstate0 at v2.0; the refusal names the field and the qm
// command that fixes the template. Proxmox copies TPM state in full, so a
// linked clone of a template with one is possible.
func TestValidateTemplateTPM(t *testing.T) {
	e := tpmEnv(t)
	ctx := context.Background()
	own := &provider.VMTPM{}
	info, err := e.p.ValidateTemplate(ctx, provider.TemplateSource{Linked: true, TPM: own, Settings: TemplateRef{ID: 9010}})
	if err != nil || !info.TPM || !info.LinkedCloneSupported {
		t.Fatalf("template with a TPM 2.0: %+v, %v; want TPM and linked clones", info, err)
	}
	for _, c := range []struct {
		id   int
		want []string
	}{
		{9000, []string{"spec.attestation.tpm.addVirtualTPM", "has no TPM", "qm set 9000 --tpmstate0 <storage>:1,version=v2.0"}},
		{9011, []string{"spec.attestation.tpm.addVirtualTPM", "version v1.2", "qm set 9011 --tpmstate0 <storage>:1,version=v2.0"}},
	} {
		_, err := e.p.ValidateTemplate(ctx, provider.TemplateSource{Linked: true, TPM: own, Settings: TemplateRef{ID: c.id}})
		if provider.Classify(err) != provider.ClassConfiguration {
			t.Fatalf("template %d: %v (class %s), want a Configuration error", c.id, err, provider.Classify(err))
		}
		for _, w := range c.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("template %d: %q does not say %q", c.id, err, w)
			}
		}
		if _, err := e.p.ValidateTemplate(ctx, provider.TemplateSource{Linked: true, TPM: &provider.VMTPM{Add: true}, Settings: TemplateRef{ID: c.id}}); err != nil {
			t.Errorf("template %d with addVirtualTPM: %v", c.id, err)
		}
		if info, err := e.p.ValidateTemplate(ctx, provider.TemplateSource{Linked: true, Settings: TemplateRef{ID: c.id}}); err != nil || info.TPM {
			t.Errorf("template %d without TPM need: %+v, %v", c.id, info, err)
		}
	}
}

// TestAddedTPMState: addVirtualTPM allocates a new v2.0 state on the boot
// disk's storage in the configure write, replacing a state the clone
// copied from its template (which may carry the template's endorsement
// key), and GetVM reports the TPM; the VM's deletion frees both.
func TestAddedTPMState(t *testing.T) {
	e := tpmEnv(t)
	cases := []struct {
		name      string
		src       provider.TemplateSource
		wantState string
		replaced  string
	}{
		{"template without TPM", provider.TemplateSource{Linked: true, Settings: TemplateRef{ID: 9000}}, "local-lvm:vm-%d-disk-1,size=4M,version=v2.0", ""},
		{"template's TPM replaced", provider.TemplateSource{Linked: true, Settings: TemplateRef{ID: 9010}}, "local-lvm:vm-%d-disk-2,size=4M,version=v2.0", "local-lvm:vm-%d-disk-1"},
		{"full clone to a directory", provider.TemplateSource{Settings: TemplateRef{ID: 9000, Storage: "vmdir"}}, "vmdir:%d/vm-%d-disk-1.raw,size=4M,version=v2.0", ""},
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e.t = t
			s := testSpec("tpm-"+string(rune('a'+i)), "uid-tpm-"+string(rune('a'+i)))
			s.Source, s.DiskBytes, s.TPM = c.src, 0, &provider.VMTPM{Add: true}
			d := e.ensure(e.p, s, provider.Progress{}, provider.PhaseRunning, 400)
			vmid, err := ParseID(d.prog.ID)
			if err != nil {
				t.Fatal(err)
			}
			cfg := e.vm(vmid).Config
			want := strings.ReplaceAll(c.wantState, "%d", itoa(vmid))
			if cfg["tpmstate0"] != want {
				t.Errorf("tpmstate0 = %q, want %q", cfg["tpmstate0"], want)
			}
			if c.replaced != "" {
				if got, want := cfg["unused0"], strings.ReplaceAll(c.replaced, "%d", itoa(vmid)); got != want {
					t.Errorf("unused0 = %q, want the copied state %q", got, want)
				}
			}
			vm, err := e.p.GetVM(context.Background(), d.prog.VMRef())
			if err != nil || !vm.TPM {
				t.Fatalf("GetVM: %+v, %v; want TPM", vm, err)
			}
			e.remove(e.p, s.Owner, d.prog, 60)
			for _, v := range []string{cfg["tpmstate0"], cfg["unused0"]} {
				if vol, _, _ := strings.Cut(v, ","); vol != "" && e.volume(vol) != nil {
					t.Errorf("volume %s left after the VM's deletion", vol)
				}
			}
		})
	}
}

// TestTemplateTPMKept: without addVirtualTPM a clone keeps (a copy of)
// its template's TPM 2.0 and GetVM reports it.
func TestTemplateTPMKept(t *testing.T) {
	e := tpmEnv(t)
	s := testSpec("tpm-own", "uid-tpm-own")
	s.Source, s.DiskBytes, s.TPM = provider.TemplateSource{Linked: true, Settings: TemplateRef{ID: 9010}}, 0, &provider.VMTPM{}
	d := e.ensure(e.p, s, provider.Progress{}, provider.PhaseRunning, 400)
	vmid, _ := ParseID(d.prog.ID)
	if got := e.vm(vmid).Config["tpmstate0"]; got != "local-lvm:vm-"+itoa(vmid)+"-disk-1,size=4M,version=v2.0" {
		t.Errorf("tpmstate0 = %q, want the template's copied", got)
	}
	if vm, err := e.p.GetVM(context.Background(), d.prog.VMRef()); err != nil || !vm.TPM {
		t.Fatalf("GetVM: %+v, %v; want TPM", vm, err)
	}
}

func itoa(n int) string { return strconv.Itoa(n) }

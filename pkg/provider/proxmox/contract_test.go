package proxmox

import (
	"errors"
	"io/fs"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	proxmoxsim "github.com/hyperfleet/hyperfleet/internal/testworld/simulator/proxmox"
	"github.com/hyperfleet/hyperfleet/pkg/provider"
	"github.com/hyperfleet/hyperfleet/pkg/provider/providertest"
)

// TestContract runs the provider contract suite against the Proxmox VE
// simulator over TLS. The simulator's guest hook runs a long sleep "inside"
// every VM, so the seed files the guest found on its ISO can be read back.
func TestContract(t *testing.T) {
	if _, err := os.Stat("/bin/sleep"); err != nil {
		t.Skip("the guest hook needs /bin/sleep")
	}
	providertest.Run(t, contractHarness)
}

// contractHarness is a fresh simulator and provider for one contract
// subtest or property case.
func contractHarness(t testing.TB) *providertest.Harness {
	guests := t.TempDir()
	e := newEnv(t, func(sim *proxmoxsim.Config, cfg *provider.ClusterConfig) {
		sim.Guest.Command = []string{"/bin/sleep", "86400"}
		sim.Guest.WorkDir = guests
		// The suite asks for no clone limits (zero or at least four).
		cfg.ClonesPerNode, cfg.ClonesPerStorage = 4, 4
	})
	return &providertest.Harness{
		Provider: e.p,
		NewProvider: func(t *testing.T, configure func(*provider.ClusterConfig)) provider.Provider {
			cfg := e.cfg
			if configure != nil {
				configure(&cfg)
			}
			return e.newProvider(cfg)
		},
		Signer:   e.signer,
		Template: provider.TemplateSource{Linked: true, Settings: TemplateRef{ID: 9000}},
		Source: func(r providertest.TemplateRef) provider.TemplateSource {
			return provider.TemplateSource{Settings: TemplateRef{ID: r.Number, Name: r.Name, Storage: r.Storage}}
		},
		Advance: e.advance,
		VMID:    vmidOf,
		ID:      FormatID,
		GuestPowerOff: func(t *testing.T, id provider.ID) {
			vmid := vmidOf(t, id)
			if err := e.sim.GuestPowerOff(vmid); err != nil {
				t.Fatalf("power off VM %d: %v", vmid, err)
			}
		},
		CreateForeignVM: func(t *testing.T, vmid int, description string, tags []string) provider.ID {
			return FormatID(e.createForeignVM(t, vmid, description, tags))
		},
		SetDescription: func(t *testing.T, id provider.ID, description string) {
			vmid := vmidOf(t, id)
			e.rawAs(t, http.MethodPut, "/nodes/"+e.nodeOf(t, vmid)+"/qemu/"+strconv.Itoa(vmid)+"/config", url.Values{"description": {description}})
		},
		CloudInitOf: func(t *testing.T, id provider.ID) provider.CloudInit {
			vmid := vmidOf(t, id)
			seed := filepath.Join(guests, "vm-"+strconv.Itoa(vmid), "seed")
			read := func(name string) []byte {
				b, err := os.ReadFile(filepath.Join(seed, name))
				if err != nil && !os.IsNotExist(err) {
					t.Fatalf("read the seed of VM %d: %v", vmid, err)
				}
				return b
			}
			return provider.CloudInit{UserData: read("user-data"), MetaData: read("meta-data"), NetworkConfig: read("network-config")}
		},
		FailDestroysOtherMissing: func(t *testing.T) func() {
			// What a destroy answers when a disk's storage or volume
			// (the cloud-init ISO among them) is gone; the simulator
			// picks one per request.
			if err := e.sim.SetFaults(proxmoxsim.Faults{Classes: map[string]proxmoxsim.FaultSpec{"destroy": {ErrorRate: 1, Errors: []string{
				"storage 'local-lvm' does not exist",
				"volume 'local:iso/hf-cloudinit-{vmid}.iso' does not exist",
			}}}}); err != nil {
				t.Fatal(err)
			}
			return func() {
				if err := e.sim.SetFaults(proxmoxsim.Faults{}); err != nil {
					t.Fatal(err)
				}
			}
		},
		GuestFileOf: func(t *testing.T, id provider.ID, path string) ([]byte, bool) {
			vmid := vmidOf(t, id)
			b, _, err := e.sim.GuestFile(t.Context(), vmid, path)
			if errors.Is(err, fs.ErrNotExist) {
				return nil, false
			}
			if err != nil {
				t.Fatalf("read %s in the guest of VM %d: %v", path, vmid, err)
			}
			return b, true
		},
		RemoveGuestAgent: func(t *testing.T, id provider.ID) {
			vmid := vmidOf(t, id)
			e.rawAs(t, http.MethodPut, "/nodes/"+e.nodeOf(t, vmid)+"/qemu/"+strconv.Itoa(vmid)+"/config", url.Values{"agent": {"0"}})
		},
		StoredData: func(*testing.T) []string {
			var out []string
			st := e.state()
			for _, s := range st.Storages {
				for _, v := range s.Volumes {
					out = append(out, string(v.Data))
					for _, f := range v.Files {
						out = append(out, f)
					}
				}
			}
			for _, v := range st.VMs {
				out = append(out, v.Description)
				for _, c := range v.Config {
					out = append(out, c)
				}
			}
			return out
		},
	}
}

// nodeOf returns the node of vmid.
func (e *env) nodeOf(t *testing.T, vmid int) string {
	for _, v := range e.state().VMs {
		if v.VMID == vmid {
			return v.Node
		}
	}
	t.Fatalf("VM %d does not exist", vmid)
	return ""
}

// createForeignVM clones the template by hand (as an admin would) to vmid,
// or to the next free id, with exactly description and tags.
func (e *env) createForeignVM(t *testing.T, vmid int, description string, tags []string) int {
	t.Helper()
	if vmid == 0 {
		used := map[int]bool{}
		for _, v := range e.state().VMs {
			used[v.VMID] = true
		}
		// Outside the operator's range, so the foreign VMs do not eat it.
		for vmid = 5000; used[vmid]; vmid++ {
		}
	}
	id := strconv.Itoa(vmid)
	e.rawAs(t, http.MethodPost, "/nodes/pve1/qemu/9000/clone", url.Values{"newid": {id}, "name": {"foreign-" + id}, "description": {description}})
	for i := 0; i < 60; i++ {
		if v := e.vm(vmid); v != nil && v.Lock == "" {
			break
		}
		e.advance(time.Second)
	}
	form := url.Values{"tags": {strings.Join(tags, ";")}}
	if len(tags) == 0 {
		form = url.Values{"delete": {"tags"}}
	}
	e.rawAs(t, http.MethodPut, "/nodes/pve1/qemu/"+id+"/config", form)
	if v := e.vm(vmid); v == nil || v.Description != description {
		t.Fatalf("foreign VM %d: %+v", vmid, v)
	}
	return vmid
}

// vmidOf is the Proxmox VM id of id; the test fails for an ID the
// provider did not write.
func vmidOf(t *testing.T, id provider.ID) int {
	t.Helper()
	vmid, err := ParseID(id)
	if err != nil {
		t.Fatal(err)
	}
	return vmid
}

// Feature: hyperfleet-operator, Property 24: Provider Interface Implementation
//
// TestContractProperty runs the contract's state-machine property
// (providertest.Property: generated sequences of EnsureVM, DeleteVM, guest
// power-offs, VMs made by hand, calls on them, restarts and time) against
// the Proxmox VE simulator.
func TestContractProperty(t *testing.T) {
	providertest.Property(t, contractHarness)
}

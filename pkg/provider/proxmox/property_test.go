package proxmox

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"pgregory.net/rapid"

	"github.com/hyperfleet/hyperfleet/internal/testworld/proptest"
	proxmoxsim "github.com/hyperfleet/hyperfleet/internal/testworld/simulator/proxmox"
	"github.com/hyperfleet/hyperfleet/pkg/provider"
)

// propertyWorld is one simulated cluster for all of a property test's
// cases: two storages for disks (so a full clone's target is a choice)
// and the guest hook, whose seed directory shows what each guest read
// from its cloud-init ISO.
type propertyWorld struct {
	*env
	guests string
	// transient counts the errors the provider got and retried (the
	// injected faults that reached it).
	transient int
}

func newPropertyWorld(t *testing.T) *propertyWorld {
	if _, err := os.Stat("/bin/sleep"); err != nil {
		t.Fatal("the guest hook needs /bin/sleep")
	}
	guests := t.TempDir()
	e := newEnv(t, func(sim *proxmoxsim.Config, cfg *provider.ClusterConfig) {
		sim.Guest.Command = []string{"/bin/sleep", "86400"}
		sim.Guest.WorkDir = guests
		sim.Storages = append(sim.Storages, proxmoxsim.StorageConfig{ID: "fast", Type: "lvmthin", Content: []string{"images"}, Capacity: 500 << 30})
		cfg.DefaultStorage = "local-lvm"
	})
	return &propertyWorld{env: e, guests: guests}
}

// vmSpecs draws a claim's VM as internal/vmspec builds it: its own owner
// and MAC, a linked or full clone (a full one to a named storage or the
// cluster's default), a bridge or the cluster's default, a VLAN tag or
// none, a NIC model, cores, memory and disk, and user-data with a unique
// marker.
func vmSpecs(n int) *rapid.Generator[*provider.VMSpec] {
	return rapid.Custom(func(t *rapid.T) *provider.VMSpec {
		uid := fmt.Sprintf("6f1c9a2e-0000-4000-8000-%012d", n)
		name := fmt.Sprintf("prop-%d", n)
		s := testSpec(name, uid)
		ref := TemplateRef{ID: 9000}
		s.Source = provider.TemplateSource{Linked: rapid.Bool().Draw(t, "linked")}
		if !s.Source.Linked {
			ref.Storage = rapid.SampledFrom([]string{"", "local-lvm", "fast"}).Draw(t, "full clone storage")
		}
		s.Source.Settings = ref
		s.Network = provider.NetworkSpec{
			Bridge:     rapid.SampledFrom([]string{"", "vmbr0", "vmbr1", "vmbr42"}).Draw(t, "bridge"),
			Model:      rapid.SampledFrom([]string{"", "virtio", "e1000"}).Draw(t, "model"),
			MACAddress: macFor(uid),
		}
		if rapid.Bool().Draw(t, "tagged") {
			s.Network.VLAN = rapid.IntRange(1, 4094).Draw(t, "vlan")
		}
		s.CPUCores = rapid.IntRange(1, 8).Draw(t, "cores")
		s.MemoryBytes = int64(rapid.IntRange(1, 8).Draw(t, "memory GiB")) << 30
		s.MemoryHint = s.MemoryBytes
		s.DiskBytes = int64(rapid.IntRange(32, 64).Draw(t, "disk GiB")) << 30
		return s
	})
}

// faultSchedules draws what goes wrong on the cluster while a VM is made:
// for some endpoint classes a share of requests that fail with what a
// loaded Proxmox VE answers (lock timeouts, "VM is locked", refused
// connections) or whose connection drops without an answer.
var faultSchedules = rapid.Custom(func(t *rapid.T) proxmoxsim.Faults {
	f := proxmoxsim.Faults{Classes: map[string]proxmoxsim.FaultSpec{}}
	for _, class := range []string{"clone", "config", "power", "status", "upload", "resources"} {
		if !rapid.Bool().Draw(t, class+" faulty") {
			continue
		}
		f.Classes[class] = proxmoxsim.FaultSpec{
			ErrorRate: float64(rapid.IntRange(0, 30).Draw(t, class+" error %")) / 100,
			DropRate:  float64(rapid.IntRange(0, 10).Draw(t, class+" drop %")) / 100,
		}
	}
	return f
})

// makeVM drives spec to Running under faults, then returns the VM's
// state and what its guest read at boot, with the faults off again.
func (w *propertyWorld) makeVM(t *rapid.T, spec *provider.VMSpec, faults proxmoxsim.Faults) (proxmoxsim.VMState, provider.CloudInit, provider.Progress) {
	if err := w.sim.SetFaults(faults); err != nil {
		t.Fatalf("faults: %v", err)
	}
	out := w.ensure(w.p, spec, provider.Progress{}, provider.PhaseRunning, 400)
	w.transient += len(out.errs)
	if err := w.sim.SetFaults(proxmoxsim.Faults{}); err != nil {
		t.Fatal(err)
	}
	vmid, err := ParseID(out.prog.ID)
	if err != nil {
		t.Fatalf("VM id %q: %v", out.prog.ID, err)
	}
	vm := w.vm(vmid)
	if vm == nil {
		t.Fatalf("VM %d reported Running is not on the cluster", vmid)
	}
	seed := filepath.Join(w.guests, "vm-"+strconv.Itoa(vmid), "seed")
	read := func(name string) []byte {
		b, err := os.ReadFile(filepath.Join(seed, name))
		if err != nil {
			t.Fatalf("the guest of VM %d read no %s: %v", vmid, name, err)
		}
		return b
	}
	return *vm, provider.CloudInit{UserData: read("user-data"), MetaData: read("meta-data"), NetworkConfig: read("network-config")}, out.prog
}

// destroy deletes the VM and checks that nothing of it is left: no VM, no
// volume of its id (disks, cloud-init ISO).
func (w *propertyWorld) destroy(t *rapid.T, spec *provider.VMSpec, prog provider.Progress) {
	w.remove(w.p, spec.Owner, prog, 200)
	vmid, _ := ParseID(prog.ID)
	if w.vm(vmid) != nil {
		t.Fatalf("VM %d still exists after DeleteVM finished", vmid)
	}
	for _, s := range w.state().Storages {
		for _, v := range s.Volumes {
			if v.VMID == vmid || strings.Contains(v.VolID, "-"+strconv.Itoa(vmid)) {
				t.Fatalf("volume %s of VM %d left on storage %s", v.VolID, vmid, s.ID)
			}
		}
	}
}

// diskVolumes are the VM's disk volumes (scsi, virtio, sata, ide disks
// other than CD-ROMs and the cloud-init drive).
func diskVolumes(vm proxmoxsim.VMState) []string {
	var out []string
	for k, v := range vm.Config {
		if !slices.ContainsFunc([]string{"scsi", "virtio", "sata", "ide"}, func(p string) bool { return strings.HasPrefix(k, p) }) {
			continue
		}
		if _, err := strconv.Atoi(strings.TrimLeft(k, "scivrtoade")); err != nil || strings.Contains(v, "media=cdrom") || strings.Contains(v, "cloudinit") {
			continue
		}
		volid, _, _ := strings.Cut(v, ",")
		out = append(out, volid)
	}
	return out
}

// Feature: hyperfleet-operator, Property 19: Proxmox API Integration
//
// TestProxmoxIntegrationProperty: for generated VM specs, each made while
// a generated share of the cluster's API requests fails or drops, the
// provider reaches Running through Proxmox VE's own API with a VM that is a
// linked clone of the template when the spec asks for one (a full copy
// otherwise), whose guest booted with exactly the spec's user-data,
// meta-data and network-config from the cloud-init ISO the provider
// attached, and from which the ISO is gone once it runs; and deleting it
// leaves nothing of it on the cluster.
func TestProxmoxIntegrationProperty(t *testing.T) {
	w := newPropertyWorld(t)
	n := 0
	proptest.Check(t, proptest.Minimum, func(rt *rapid.T) {
		n++
		spec := vmSpecs(n).Draw(rt, "spec")
		ci := spec.CloudInit.(provider.CloudInit)
		ci.UserData = fmt.Appendf(nil, "#cloud-config\nwrite_files:\n- path: /etc/hf/case\n  content: case-%d-%s\n", n, rapid.StringMatching(`[a-z0-9]{4,12}`).Draw(rt, "marker"))
		spec.CloudInit = ci
		vm, seen, prog := w.makeVM(rt, spec, faultSchedules.Draw(rt, "faults"))

		if string(seen.UserData) != string(ci.UserData) || string(seen.MetaData) != string(ci.MetaData) ||
			string(seen.NetworkConfig) != string(ci.NetworkConfig) {
			rt.Fatalf("the guest read other cloud-init data than the spec's:\nuser-data %q\nmeta-data %q\nnetwork-config %q", seen.UserData, seen.MetaData, seen.NetworkConfig)
		}
		disks := diskVolumes(vm)
		if len(disks) == 0 {
			rt.Fatalf("VM %d has no disk: config %v", vm.VMID, vm.Config)
		}
		for _, volid := range disks {
			vol := w.volume(volid)
			if vol == nil {
				rt.Fatalf("disk %s of VM %d is on no storage", volid, vm.VMID)
			}
			if vol.Linked != spec.Source.Linked {
				rt.Fatalf("disk %s of VM %d: linked clone %v, the spec asked for linked %v", volid, vm.VMID, vol.Linked, spec.Source.Linked)
			}
		}
		for k, v := range vm.Config {
			if strings.Contains(v, "media=cdrom") && !strings.HasPrefix(v, "none,") {
				rt.Fatalf("VM %d still has %s=%s attached once running", vm.VMID, k, v)
			}
		}
		for _, s := range w.state().Storages {
			for _, v := range s.Volumes {
				if !strings.HasSuffix(v.VolID, ".iso") {
					continue
				}
				for _, f := range v.Files {
					if f == string(ci.UserData) {
						rt.Fatalf("cloud-init ISO %s of VM %d is still on the cluster once it runs", v.VolID, vm.VMID)
					}
				}
			}
		}
		w.destroy(rt, spec, prog)
	})
	if w.transient == 0 {
		t.Error("no injected fault reached the provider: the fault schedules test nothing")
	}
	t.Logf("%d injected faults retried", w.transient)
}

// Feature: hyperfleet-operator, Property 21: Storage and Network Configuration
//
// TestStorageAndNetworkProperty: for generated bridges (or none: the
// cluster's defaultBridge), VLAN tags, NIC models, clone modes and
// full-clone storages (or none: the cluster's defaultStorage), the VM on
// the cluster has exactly that network device (model, the claim's MAC,
// bridge, tag) and its disks on exactly that storage (a linked clone's on
// the template's), with the spec's cores, memory and disk size.
func TestStorageAndNetworkProperty(t *testing.T) {
	w := newPropertyWorld(t)
	n := 1000
	proptest.Check(t, proptest.Minimum, func(rt *rapid.T) {
		n++
		spec := vmSpecs(n).Draw(rt, "spec")
		vm, _, prog := w.makeVM(rt, spec, proxmoxsim.Faults{})

		bridge := spec.Network.Bridge
		if bridge == "" {
			bridge = w.cfg.DefaultBridge
		}
		model := spec.Network.Model
		if model == "" {
			model = "virtio"
		}
		net0 := vm.Config["net0"]
		fields := map[string]string{}
		for _, kv := range strings.Split(net0, ",") {
			k, v, _ := strings.Cut(kv, "=")
			fields[k] = v
		}
		if !strings.EqualFold(fields[model], spec.Network.MACAddress) || fields["bridge"] != bridge {
			rt.Fatalf("net0 = %q, want model %s with MAC %s on bridge %s", net0, model, spec.Network.MACAddress, bridge)
		}
		if tag, has := fields["tag"]; (spec.Network.VLAN == 0) == has || (has && tag != strconv.Itoa(spec.Network.VLAN)) {
			rt.Fatalf("net0 = %q, want VLAN tag %d (0: none)", net0, spec.Network.VLAN)
		}
		storage := "local-lvm" // the template's
		if !spec.Source.Linked {
			storage = templateRefOf(spec.Source).Storage
			if storage == "" {
				storage = w.cfg.DefaultStorage
			}
		}
		for _, volid := range diskVolumes(vm) {
			if st, _, _ := strings.Cut(volid, ":"); st != storage {
				rt.Fatalf("disk %s of VM %d is on storage %s, want %s (linked %v, asked %q)", volid, vm.VMID, st, storage, spec.Source.Linked, templateRefOf(spec.Source).Storage)
			}
		}
		if vm.Config["cores"] != strconv.Itoa(spec.CPUCores) || vm.Config["memory"] != strconv.FormatInt(spec.MemoryBytes>>20, 10) {
			rt.Fatalf("VM %d has cores %s and memory %s MiB, want %d and %d", vm.VMID, vm.Config["cores"], vm.Config["memory"], spec.CPUCores, spec.MemoryBytes>>20)
		}
		w.destroy(rt, spec, prog)
	})
}

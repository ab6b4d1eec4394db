package proxmox

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"pgregory.net/rapid"

	proxmoxsim "github.com/hyperfleet/hyperfleet/internal/testworld/simulator/proxmox"
	"github.com/hyperfleet/hyperfleet/pkg/provider"
)

// deviceNodes are the nodes of the device tests' cluster.
var deviceNodes = []string{"pve1", "pve2", "pve3"}

// newDeviceEnv is a three-node cluster whose template is on shared
// storage (a VM may go to any node), with room for many VMs per node and
// no task latency, and the PCI mappings given as devices per node.
func newDeviceEnv(t testing.TB, mappings map[string]map[string]int, templateConfig ...string) *env {
	e := newEnv(t, func(sim *proxmoxsim.Config, _ *provider.ClusterConfig) {
		for i := 0; i+1 < len(templateConfig); i += 2 {
			if sim.Templates[0].Config == nil {
				sim.Templates[0].Config = map[string]string{}
			}
			sim.Templates[0].Config[templateConfig[i]] = templateConfig[i+1]
		}
		sim.Nodes[0].Memory = 1 << 40
		for _, n := range deviceNodes[1:] {
			sim.Nodes = append(sim.Nodes, proxmoxsim.NodeConfig{Name: n, CPUs: 64, Memory: 1 << 40})
		}
		sim.Storages = append(sim.Storages, proxmoxsim.StorageConfig{ID: "ceph", Type: "rbd", Content: []string{"images"}, Shared: true, Capacity: 1 << 50})
		sim.Templates[0].Storage, sim.Templates[0].CloudInitStorage = "ceph", "ceph"
		sim.Latency = proxmoxsim.Latency{}
		sim.RefreshInterval = 0
	})
	bus := 0
	for id, perNode := range mappings {
		m := proxmoxsim.PCIMapping{ID: id}
		// Each device in one mapping: a device in two would be counted
		// in each (docs/templates.md, "GPU jobs").
		for _, n := range deviceNodes {
			for range perNode[n] {
				bus++
				m.Devices = append(m.Devices, proxmoxsim.PCIDevice{Node: n, Path: fmt.Sprintf("0000:%02x:00.0", bus)})
			}
		}
		if err := e.sim.SetPCIMapping(m); err != nil {
			t.Fatal(err)
		}
	}
	return e
}

func deviceSpec(n int, devices ...string) *provider.VMSpec {
	s := testSpec(fmt.Sprintf("gpu-%d", n), fmt.Sprintf("9b2d4c1e-0000-4000-8000-%012d", n))
	s.MemoryBytes, s.DiskBytes = 1<<30, 0
	if len(devices) > 0 {
		s.Hardware = &provider.Hardware{Devices: devices}
	}
	return s
}

// TestDevicePlacement: VMs asking for a device of mapping gpu go where one
// is free, get hostpci0 with the mapping, start with a device no other VM
// holds; with every device held the next VM is refused naming each
// node's count, also by a restarted provider, and a deleted VM's device
// is given again.
func TestDevicePlacement(t *testing.T) {
	e := newDeviceEnv(t, map[string]map[string]int{"gpu": {"pve1": 1, "pve2": 2}})
	ctx := context.Background()
	if _, err := e.p.ValidateTemplate(ctx, provider.TemplateSource{Linked: true, Settings: TemplateRef{ID: 9000},
		Hardware: &provider.Hardware{Devices: []string{"gpu", "tpu"}}}); provider.ReasonOf(err) != "DeviceMappingNotFound" || !strings.Contains(err.Error(), `"tpu"`) {
		t.Fatalf("ValidateTemplate with mapping tpu: %v, want DeviceMappingNotFound naming it", err)
	}
	if _, err := e.p.ValidateTemplate(ctx, provider.TemplateSource{Linked: true, Settings: TemplateRef{ID: 9000},
		Hardware: &provider.Hardware{Devices: []string{"gpu"}}}); err != nil {
		t.Fatalf("ValidateTemplate with mapping gpu: %v", err)
	}
	progs := map[int]provider.Progress{}
	for i := range 3 {
		d := e.ensure(e.p, deviceSpec(i, "gpu"), provider.Progress{}, provider.PhaseRunning, 100)
		progs[i] = d.prog
		if v := e.vm(mustVMID(d.prog.ID)); v.Config["hostpci0"] != "mapping=gpu" || v.Node == "pve3" {
			t.Fatalf("VM %d on %s, hostpci0 %q", v.VMID, v.Node, v.Config["hostpci0"])
		}
	}
	checkDevicesUnshared(t, e.sim)
	want := "pve1: no free device of mapping gpu (1 of 1 held); pve2: no free device of mapping gpu (2 of 2 held); pve3: no device of mapping gpu"
	for _, p := range []*Provider{e.p, e.newProvider(e.cfg)} {
		_, err := p.EnsureVM(ctx, deviceSpec(9, "gpu"), provider.Progress{})
		if !errors.Is(err, provider.ErrNoCapacity) || !strings.Contains(err.Error(), want) {
			t.Fatalf("a fourth VM: %v, want %q", err, want)
		}
	}
	// A VM without devices still goes anywhere.
	e.ensure(e.p, deviceSpec(10), provider.Progress{}, provider.PhaseRunning, 100)
	e.remove(e.p, deviceSpec(1).Owner, progs[1], 40)
	e.p = e.newProvider(e.cfg)
	d := e.ensure(e.p, deviceSpec(11, "gpu"), provider.Progress{}, provider.PhaseRunning, 100)
	if d.prog.Node != progs[1].Node {
		t.Fatalf("the freed device is on %s, the VM went to %s", progs[1].Node, d.prog.Node)
	}
	checkDevicesUnshared(t, e.sim)
}

// TestDeviceStandbyRefused: a VM with a device cannot be suspended to
// disk, so a standby VM asking one is refused before any call.
func TestDeviceStandbyRefused(t *testing.T) {
	e := newDeviceEnv(t, map[string]map[string]int{"gpu": {"pve1": 1}})
	s := deviceSpec(1, "gpu")
	s.SuspendsToDisk = true
	_, err := e.p.EnsureVM(context.Background(), s, provider.Progress{})
	if provider.Classify(err) != provider.ClassConfiguration || !strings.Contains(err.Error(), "spec.hardware.devices") {
		t.Fatalf("EnsureVM of a standby VM with a device: %v", err)
	}
	if n := e.nonTemplateVMs(); n != 0 {
		t.Fatalf("%d VMs built", n)
	}
}

// TestDeviceConfigPCIe: pcie=1 only on a q35 template.
func TestDeviceConfigPCIe(t *testing.T) {
	for _, machine := range []string{"", "q35"} {
		var cfg []string
		if machine != "" {
			cfg = []string{"machine", machine}
		}
		e := newDeviceEnv(t, map[string]map[string]int{"gpu": {"pve1": 2}}, cfg...)
		d := e.ensure(e.p, deviceSpec(1, "gpu", "gpu"), provider.Progress{}, provider.PhaseRunning, 100)
		v := e.vm(mustVMID(d.prog.ID))
		pcie := map[string]string{"": "", "q35": ",pcie=1"}[machine]
		if v.Config["hostpci0"] != "mapping=gpu"+pcie || v.Config["hostpci1"] != "mapping=gpu"+pcie {
			t.Errorf("machine %q: hostpci0 %q, hostpci1 %q", machine, v.Config["hostpci0"], v.Config["hostpci1"])
		}
	}
}

// checkDevicesUnshared fails if a device is held by two running VMs.
func checkDevicesUnshared(t interface {
	Helper()
	Fatalf(format string, args ...any)
}, sim *proxmoxsim.Simulator) {
	t.Helper()
	for dev, ids := range sim.PCIDevicesInUse() {
		if len(ids) > 1 {
			t.Fatalf("device %s is held by VMs %v", dev, ids)
		}
	}
}

// deviceUse counts, per node and mapping, the devices the install's VMs
// hold by their config, running or not: what they take when they run.
func deviceUse(sim *proxmoxsim.Simulator) map[string]map[string]int {
	use := map[string]map[string]int{}
	for _, v := range sim.VMs() {
		if v.Template {
			continue
		}
		for _, m := range hostpciMappings(vmConfig(v.Config)) {
			if use[v.Node] == nil {
				use[v.Node] = map[string]int{}
			}
			use[v.Node][m]++
		}
	}
	return use
}

// fits reports whether a VM taking devices fits on some node beside use.
func fits(mappings map[string]map[string]int, use map[string]map[string]int, devices []string) bool {
	want := map[string]int{}
	for _, m := range devices {
		want[m]++
	}
	for _, n := range deviceNodes {
		ok := true
		for m, k := range want {
			ok = ok && use[n][m]+k <= mappings[m][n]
		}
		if ok {
			return true
		}
	}
	return false
}

// Feature: hyperfleet-operator, Property 30: PCI devices are placed as capacity and never shared
//
// For random PCI mappings over three nodes, batches of concurrent
// placements of VMs asking 0-2 devices of random mappings, deletions, VMs
// powered off, and provider restarts (a new Provider on the same cluster,
// its memory lost) between steps: no device is ever held by two running
// VMs, every VM placed fits (its node has a device of each mapping it
// asks for beside those the install's VMs hold there, running or not),
// every VM placed starts, and a placement is refused only when no node
// has the devices it asks for.
func TestDeviceAssignmentProperty(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		names := []string{"gpu", "nic"}
		mappings := map[string]map[string]int{}
		for _, m := range names {
			mappings[m] = map[string]int{}
			for _, n := range deviceNodes {
				mappings[m][n] = rapid.IntRange(0, 2).Draw(rt, m+" on "+n)
			}
		}
		e := newDeviceEnv(t, mappings)
		type placed struct {
			spec *provider.VMSpec
			prog provider.Progress
		}
		var live []placed
		next := 0
		steps := rapid.IntRange(1, 6).Draw(rt, "steps")
		for step := range steps {
			switch rapid.SampledFrom([]string{"place", "place", "delete", "restart", "power off"}).Draw(rt, fmt.Sprintf("step %d", step)) {
			case "place":
				k := rapid.IntRange(1, 3).Draw(rt, "batch")
				specs := make([]*provider.VMSpec, k)
				for i := range specs {
					n := rapid.IntRange(0, 2).Draw(rt, "devices")
					var devs []string
					for range n {
						devs = append(devs, rapid.SampledFrom(names).Draw(rt, "mapping"))
					}
					specs[i] = deviceSpec(next, devs...)
					next++
				}
				// The first calls, which place, run at once.
				results := make([]*provider.EnsureResult, k)
				errs := make([]error, k)
				var wg sync.WaitGroup
				for i, s := range specs {
					wg.Go(func() { results[i], errs[i] = e.p.EnsureVM(context.Background(), s, provider.Progress{}) })
				}
				wg.Wait()
				var refused [][]string
				for i, s := range specs {
					switch {
					case errors.Is(errs[i], provider.ErrNoCapacity):
						refused = append(refused, specDevices(s))
						continue
					case errs[i] != nil:
						rt.Fatalf("placing %v: %v", specDevices(s), errs[i])
					}
					prog, err := runDeviceVM(e, s, results[i])
					if err != nil {
						rt.Fatalf("VM asking %v: %v", specDevices(s), err)
					}
					live = append(live, placed{s, prog})
				}
				use := deviceUse(e.sim)
				for _, devs := range refused {
					if fits(mappings, use, devs) {
						rt.Fatalf("a VM asking %v was refused, and it fits beside %v in %v", devs, use, mappings)
					}
				}
			case "delete":
				if len(live) == 0 {
					continue
				}
				i := rapid.IntRange(0, len(live)-1).Draw(rt, "victim")
				e.remove(e.p, live[i].spec.Owner, live[i].prog, 60)
				live = slices.Delete(live, i, i+1)
			case "restart":
				e.p = e.newProvider(e.cfg)
			case "power off":
				if len(live) == 0 {
					continue
				}
				vmid := mustVMID(live[rapid.IntRange(0, len(live)-1).Draw(rt, "off")].prog.ID)
				_ = e.sim.GuestPowerOff(vmid) // already off: nothing to do
			}
			checkDevicesUnshared(rt, e.sim)
			for node, per := range deviceUse(e.sim) {
				for m, n := range per {
					if n > mappings[m][node] {
						rt.Fatalf("%d VMs on %s hold a device of mapping %s, which has %d there", n, node, m, mappings[m][node])
					}
				}
			}
		}
	})
}

// runDeviceVM drives a VM placed by its first EnsureVM call (res) to
// Running; a start Proxmox refuses (a device in use) fails it.
func runDeviceVM(e *env, spec *provider.VMSpec, res *provider.EnsureResult) (provider.Progress, error) {
	prog, last := res.Progress, res
	e.advance(res.RetryAfter)
	for range 100 {
		res, err := e.p.EnsureVM(context.Background(), spec, prog)
		if res != nil {
			last = res
		}
		switch {
		case err != nil && provider.Classify(err) == provider.ClassTransient:
			e.advance(time.Second)
			continue
		case err != nil:
			return prog, err
		}
		prog = res.Progress
		if res.Phase == provider.PhaseRunning {
			return prog, nil
		}
		e.advance(res.RetryAfter)
	}
	return prog, fmt.Errorf("not Running in 100 calls: %+v", last)
}

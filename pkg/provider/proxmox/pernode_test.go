package proxmox

import (
	"context"
	"fmt"
	"net/http"
	"reflect"
	"strings"
	"testing"
	"time"

	proxmoxsim "github.com/hyperfleet/hyperfleet/internal/testworld/simulator/proxmox"
	"github.com/hyperfleet/hyperfleet/pkg/provider"
)

// selectorTags is the selector of the per-node tests' template.
const selectorTags = "ci,debian12"

// perNodeEnv is three nodes whose VM disks go to each node's own
// local-lvm, with a copy of the template tagged ci and debian12 on pve1
// and pve2 and none on pve3, the node with the most memory (its template
// carries only ci). mem is each of pve1 and pve2's memory.
func perNodeEnv(t *testing.T, mem int64, more ...proxmoxsim.TemplateConfig) *env {
	return newEnv(t, func(sim *proxmoxsim.Config, _ *provider.ClusterConfig) {
		sim.Nodes = []proxmoxsim.NodeConfig{
			{Name: "pve1", CPUs: 16, Memory: proxmoxsim.ByteSize(mem), MemoryUsed: 2 << 30},
			{Name: "pve2", CPUs: 16, Memory: proxmoxsim.ByteSize(mem), MemoryUsed: 1 << 30},
			{Name: "pve3", CPUs: 16, Memory: 256 << 30, MemoryUsed: 1 << 30},
		}
		copyOn := func(vmid int, node, tags string) proxmoxsim.TemplateConfig {
			return proxmoxsim.TemplateConfig{VMID: vmid, Node: node, Name: "debian-12-ci", Storage: "local-lvm", DiskSize: 32 << 30,
				Cores: 2, MemoryMiB: 2048, Agent: true, CloudInitStorage: "local-lvm", Tags: tags}
		}
		sim.Templates = append([]proxmoxsim.TemplateConfig{
			copyOn(9001, "pve1", "CI;debian12"), copyOn(9002, "pve2", "debian12,ci,extra"), copyOn(9003, "pve3", "ci"),
		}, more...)
	})
}

// selectorSpec is testSpec cloning, linked, the template tagged
// selectorTags.
func selectorSpec(name, uid string) *provider.VMSpec {
	s := testSpec(name, uid)
	s.Source = provider.TemplateSource{Linked: true, Settings: TemplateRef{Selector: selectorTags}}
	return s
}

// TestTemplateCopyPerNode: under a selector VMs are placed on the nodes
// holding a copy, spread by free memory, each a linked clone of its own
// node's copy, never on the node without one however much memory it has;
// validation checks and names every copy.
func TestTemplateCopyPerNode(t *testing.T) {
	e := perNodeEnv(t, 64<<30)
	ctx := context.Background()
	info, err := e.p.ValidateTemplate(ctx, selectorSpec("v", "uid-v").Source)
	if err != nil {
		t.Fatalf("ValidateTemplate: %v", err)
	}
	if !reflect.DeepEqual(info.Nodes, []string{"pve1", "pve2"}) || info.ID != 9001 || !info.LinkedCloneSupported || !info.GuestFiles {
		t.Fatalf("ValidateTemplate = %+v, want copies on pve1 and pve2, the first 9001, linked clones and a guest agent", info)
	}
	placed := map[string]int{}
	var progs []provider.Progress
	var specs []*provider.VMSpec
	for i := range 8 {
		s := selectorSpec(fmt.Sprintf("runner-%d", i), fmt.Sprintf("uid-%d", i))
		res, err := e.p.EnsureVM(ctx, s, provider.Progress{})
		if err != nil {
			t.Fatalf("EnsureVM %d: %v", i, err)
		}
		placed[res.Progress.Node]++
		progs, specs = append(progs, res.Progress), append(specs, s)
	}
	if placed["pve1"] != 4 || placed["pve2"] != 4 {
		t.Fatalf("placement %v, want 4 on pve1 and 4 on pve2 (pve3 has no copy)", placed)
	}
	for i, s := range specs {
		d := e.ensure(e.p, s, progs[i], provider.PhaseRunning, 300)
		v := e.vm(mustVMID(d.prog.ID))
		if v == nil || v.Node != d.prog.Node {
			t.Fatalf("VM %+v, progress %+v", v, d.prog)
		}
		disk := parseDrive(v.Config["scsi0"]).file
		vol := e.volume(disk)
		if vol == nil || !vol.Linked || vol.Node != v.Node || !strings.HasPrefix(disk, "local-lvm:") {
			t.Errorf("VM %d on %s: disk %s is %+v, want a linked clone on its node's local-lvm", v.VMID, v.Node, disk, vol)
		}
	}
	copyOf := map[string]string{"pve1": "9001", "pve2": "9002"}
	clones := 0
	for _, task := range e.state().Tasks {
		if task.Type != "qmclone" {
			continue
		}
		clones++
		node := strings.Split(task.UPID, ":")[1]
		if copyOf[node] != task.ID || task.ExitStatus != "OK" {
			t.Errorf("clone task %s of template %s ended %q: want each node's own copy cloned", task.UPID, task.ID, task.ExitStatus)
		}
	}
	if clones != 8 {
		t.Errorf("%d clone tasks, want 8", clones)
	}
}

// TestTemplateCopyCapacity: with the nodes holding a copy full, the
// refusal names each one's shortage and the node that lacks a copy.
func TestTemplateCopyCapacity(t *testing.T) {
	e := perNodeEnv(t, 16<<30)
	ctx := context.Background()
	placed := map[string]int{}
	for i := range 6 {
		res, err := e.p.EnsureVM(ctx, selectorSpec(fmt.Sprintf("runner-%d", i), fmt.Sprintf("uid-%d", i)), provider.Progress{})
		if err != nil {
			t.Fatalf("EnsureVM %d: %v", i, err)
		}
		placed[res.Progress.Node]++
	}
	if placed["pve1"] != 3 || placed["pve2"] != 3 {
		t.Fatalf("placement %v, want 3 on pve1 and 3 on pve2", placed)
	}
	_, err := e.p.EnsureVM(ctx, selectorSpec("runner-x", "uid-x"), provider.Progress{})
	if reasonOf(err) != "InsufficientCapacity" || provider.Classify(err) != provider.ClassResource {
		t.Fatalf("EnsureVM on full nodes: %v, want InsufficientCapacity", err)
	}
	for _, want := range []string{"pve1: ", "pve2: ", "pve3: no template tagged ci,debian12"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("refusal %q does not name %q", err, want)
		}
	}
}

// TestTemplateCopyAmbiguous: a node holding two templates with every tag
// is refused, naming the node and both ids, at validation and placement.
func TestTemplateCopyAmbiguous(t *testing.T) {
	e := perNodeEnv(t, 64<<30, proxmoxsim.TemplateConfig{VMID: 9004, Node: "pve2", Name: "debian-12-old", Storage: "local-lvm", Tags: "ci;debian12"})
	ctx := context.Background()
	s := selectorSpec("runner-a", "uid-a")
	_, verr := e.p.ValidateTemplate(ctx, s.Source)
	_, perr := e.p.EnsureVM(ctx, s, provider.Progress{})
	for _, err := range []error{verr, perr} {
		if reasonOf(err) != "TemplateAmbiguous" || provider.Classify(err) != provider.ClassConfiguration ||
			!strings.Contains(err.Error(), "node pve2") || !strings.Contains(err.Error(), "9002, 9004") {
			t.Errorf("got %v, want TemplateAmbiguous naming pve2, 9002 and 9004", err)
		}
	}
	if e.nonTemplateVMs() != 0 {
		t.Errorf("a VM was made of an ambiguous selection")
	}
}

// TestTemplateCopyGone: a node whose copy is deleted is no longer chosen;
// with no copy left anywhere the selector is TemplateNotFound.
func TestTemplateCopyGone(t *testing.T) {
	e := perNodeEnv(t, 64<<30)
	ctx := context.Background()
	destroy := func(node string, vmid int) {
		t.Helper()
		upid, err := e.p.api.upid(ctx, http.MethodDelete, fmt.Sprintf("/nodes/%s/qemu/%d", node, vmid), nil, nil)
		if err != nil {
			t.Fatalf("delete template %d: %v", vmid, err)
		}
		for range 60 {
			if st, err := e.p.api.task(ctx, upid); err == nil && !st.running() {
				break
			}
			e.advance(time.Second)
		}
		e.advance(viewTTL)
	}
	// A VM placed first, on pve2 (the most free memory), not cloned yet:
	// the view and the copies are cached.
	first := selectorSpec("runner-0", "uid-0")
	res, err := e.p.EnsureVM(ctx, first, provider.Progress{})
	if err != nil || res.Progress.Node != "pve2" || res.Phase != provider.PhasePlaced {
		t.Fatalf("first VM: %+v, %v; want it placed on pve2", res, err)
	}
	destroy("pve2", 9002)
	// Its clone finds pve2's copy gone and places it again, on pve1.
	d := e.ensure(e.p, first, res.Progress, provider.PhaseRunning, 300)
	if v := e.vm(mustVMID(d.prog.ID)); v == nil || v.Node != "pve1" || d.prog.Node != "pve1" {
		t.Fatalf("first VM %+v at %+v, want it on pve1", v, d.prog)
	}
	for i := 1; i < 5; i++ {
		res, err := e.p.EnsureVM(ctx, selectorSpec(fmt.Sprintf("runner-%d", i), fmt.Sprintf("uid-%d", i)), provider.Progress{})
		if err != nil {
			t.Fatalf("EnsureVM %d: %v", i, err)
		}
		if res.Progress.Node != "pve1" {
			t.Fatalf("VM %d placed on %s after pve2's copy was deleted", i, res.Progress.Node)
		}
	}
	if info, err := e.p.ValidateTemplate(ctx, selectorSpec("v", "uid-v").Source); err != nil || !reflect.DeepEqual(info.Nodes, []string{"pve1"}) {
		t.Fatalf("ValidateTemplate = %+v, %v; want the copy on pve1 alone", info, err)
	}
	destroy("pve1", 9001)
	_, err = e.p.EnsureVM(ctx, selectorSpec("runner-x", "uid-x"), provider.Progress{})
	if reasonOf(err) != "TemplateNotFound" || !strings.Contains(err.Error(), "ci,debian12") {
		t.Fatalf("EnsureVM with no copy left: %v, want TemplateNotFound naming the tags", err)
	}
}

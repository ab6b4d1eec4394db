//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/testworld/devenv"
	proxmoxsim "github.com/hyperfleet/hyperfleet/internal/testworld/simulator/proxmox"
)

// TestTemplateOnEveryNode: a three-node cluster whose VM disks go to each
// node's own local-lvm (no shared storage), with a copy of the template
// tagged ci and debian12 on pve1 and pve2 and none on pve3, the node with
// the most memory. A pool whose template names the copies by their tags
// (source.proxmox.templateSelector) runs jobs: its VMs are linked clones
// of their own node's copy, on pve1 and on pve2, never on pve3, and every
// job runs. Before the selector such a pool could only place VMs on its
// template's one node.
func TestTemplateOnEveryNode(t *testing.T) {
	const (
		cluster = "pve-pernode"
		pool    = "pernode"
		jobs    = 6
	)
	w, _ := startWorld(t)
	ctx := context.Background()
	c, err := w.AddCluster(ctx, devenv.ClusterSpec{Name: cluster, VMIDs: hfv1.VMIDRange{Start: 6000, End: 6999},
		Configure: func(cfg *proxmoxsim.Config) {
			pve1 := cfg.Nodes[0]
			pve1.Memory, pve1.MemoryUsed = 64<<30, 2<<30
			pve2, pve3 := pve1, pve1
			pve2.Name, pve2.IP, pve2.MemoryUsed = "pve2", "192.0.2.12", 1<<30
			pve3.Name, pve3.IP, pve3.Memory = "pve3", "192.0.2.13", 512<<30
			cfg.Nodes = []proxmoxsim.NodeConfig{pve1, pve2, pve3}
			cfg.Templates[0].Tags = "ci;debian12"
			second := cfg.Templates[0]
			second.VMID, second.Node, second.Tags = 9100, "pve2", "debian12;ci;golden"
			cfg.Templates = append(cfg.Templates, second)
		}})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.AddPool(ctx, devenv.PoolSpec{Name: pool, Cluster: cluster, Label: pool, MaxReplicas: 4}); err != nil {
		t.Fatal(err)
	}
	var tmpl hfv1.HypervisorMachineTemplate
	if err := w.API.Client.Get(ctx, client.ObjectKey{Namespace: devenv.Namespace, Name: pool}, &tmpl); err != nil {
		t.Fatal(err)
	}
	before := tmpl.DeepCopy()
	tmpl.Spec.Source.Proxmox = hfv1.ProxmoxSource{TemplateSelector: &hfv1.TemplateSelector{MatchTags: []string{"ci", "debian12"}}, CloneMode: hfv1.CloneModeLinked}
	if err := w.API.Client.Patch(ctx, &tmpl, client.MergeFrom(before)); err != nil {
		t.Fatal(err)
	}
	eventually(t, 2*time.Minute, "the template Ready with its copies on pve1 and pve2", func() error {
		var got hfv1.HypervisorMachineTemplate
		if err := w.API.Client.Get(ctx, client.ObjectKey{Namespace: devenv.Namespace, Name: pool}, &got); err != nil {
			return err
		}
		ready := hfv1.FindCondition(got.Status.Conditions, hfv1.ReadyCondition)
		if got.Status.ObservedGeneration != got.Generation || ready == nil || ready.Status != "True" || !strings.Contains(ready.Message, "nodes pve1, pve2") {
			return fmt.Errorf("conditions %+v", got.Status.Conditions)
		}
		return nil
	})
	if _, err := w.EnqueueJobsFor(pool, jobs, jobDuration); err != nil {
		t.Fatal(err)
	}
	copyOn := map[string]int{"pve1": 9000, "pve2": 9100}
	seen := map[int]string{}
	eventually(t, 4*time.Minute, fmt.Sprintf("%d jobs run on VMs of both copies", jobs), func() error {
		st := c.Sim.State()
		linked := map[string]string{}
		for _, store := range st.Storages {
			for _, vol := range store.Volumes {
				if vol.Linked {
					linked[vol.VolID] = vol.Node
				}
			}
		}
		for _, vm := range st.VMs {
			if vm.Template || vm.VMID < 6000 || vm.VMID > 6999 || seen[vm.VMID] != "" {
				continue
			}
			if _, ok := copyOn[vm.Node]; !ok {
				return fmt.Errorf("VM %d is on %s, which holds no copy", vm.VMID, vm.Node)
			}
			disk, _, _ := strings.Cut(vm.Config["scsi0"], ",")
			if disk == "" {
				continue // still cloning
			}
			if node, ok := linked[disk]; !ok || node != vm.Node {
				return fmt.Errorf("VM %d on %s: disk %s is not a linked clone on its node's local-lvm", vm.VMID, vm.Node, disk)
			}
			seen[vm.VMID] = vm.Node
		}
		nodes := map[string]bool{}
		for _, n := range seen {
			nodes[n] = true
		}
		done := 0
		for _, j := range w.GitHub.Jobs() {
			if !j.CompletedAt.IsZero() && strings.Contains(strings.Join(j.Labels, ","), pool) {
				done++
			}
		}
		if done < jobs || !nodes["pve1"] || !nodes["pve2"] {
			return fmt.Errorf("%d of %d jobs done; VMs %v", done, jobs, seen)
		}
		return nil
	})
	// Every clone the cluster ran was of the copy on the node it ran on.
	clones := 0
	for _, task := range c.Sim.State().Tasks {
		if task.Type != "qmclone" {
			continue
		}
		clones++
		node := strings.Split(task.UPID, ":")[1]
		if copyOn[node] == 0 || task.ID != fmt.Sprint(copyOn[node]) || task.ExitStatus != "OK" {
			t.Errorf("clone task %s of VM %s: %s; want a clone of %s's own copy", task.UPID, task.ID, task.ExitStatus, node)
		}
	}
	if clones < jobs {
		t.Errorf("%d clone tasks, want at least %d", clones, jobs)
	}
}

package machineclaim

import (
	"net/http"
	"strings"
	"sync"
	"testing"

	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/utils/ptr"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/vmspec"
)

// TestTemplateEditDuringTheCloneNeverReachesTheVM performs, on the Proxmox
// simulator, the attack of a tenant that edits its template while its VM is
// cloned: everything a tenant chose for its VM is in the signed placement
// record, and a template edit after the claim was placed reaches none of
// it. The cluster's tenancy gives namespace team-a template 9000, storage
// local-lvm, pool ci, bridge vmbr0, VLANs 100-199, the kit and team-a's
// snippets and the domain team-a.ci.example.com. Each case places a claim,
// whose first clone request is lost (the operator stopped right after
// sending it, so the next pass clones again), edits one recorded field of
// the template to what the cluster refuses (another team's snippet, storage
// or domain among them), and runs the claim until its VM runs: every clone
// request, the VM's configuration and the claim's FQDN must hold the
// recorded value of every field. The version before the snippets, drive
// storage and domain were recorded gives the VM team-b's snippets, drive
// storage and domain.
func TestTemplateEditDuringTheCloneNeverReachesTheVM(t *testing.T) {
	for name, edit := range map[string]func(*hfv1.HypervisorMachineTemplate){
		"template": func(tm *hfv1.HypervisorMachineTemplate) {
			tm.Spec.Source.Proxmox.TemplateID = ptr.To[int32](refusedTemplate)
		},
		"clone mode": func(tm *hfv1.HypervisorMachineTemplate) {
			tm.Spec.Source.Proxmox.CloneMode, tm.Spec.Source.Proxmox.Storage, tm.Spec.Source.Proxmox.Format = hfv1.CloneModeLinked, "", ""
		},
		"storage":       func(tm *hfv1.HypervisorMachineTemplate) { tm.Spec.Source.Proxmox.Storage = refusedStorage },
		"format":        func(tm *hfv1.HypervisorMachineTemplate) { tm.Spec.Source.Proxmox.Format = "qcow2" },
		"resource pool": func(tm *hfv1.HypervisorMachineTemplate) { tm.Spec.Source.Proxmox.Pool = refusedPool },
		"bridge":        func(tm *hfv1.HypervisorMachineTemplate) { tm.Spec.Network.Bridge = refusedBridge },
		"vlan":          func(tm *hfv1.HypervisorMachineTemplate) { tm.Spec.Network.VLAN = ptr.To(refusedVLAN) },
		"nic model":     func(tm *hfv1.HypervisorMachineTemplate) { tm.Spec.Network.Model = "e1000" },
		"cpu":           func(tm *hfv1.HypervisorMachineTemplate) { tm.Spec.Resources.CPU = 8 },
		"memory":        func(tm *hfv1.HypervisorMachineTemplate) { tm.Spec.Resources.Memory = resource.MustParse("8Gi") },
		"disk":          func(tm *hfv1.HypervisorMachineTemplate) { tm.Spec.Resources.Disk = ptr.To(resource.MustParse("100Gi")) },
		"vendor snippet": func(tm *hfv1.HypervisorMachineTemplate) {
			tm.Spec.CloudInit.Proxmox.VendorSnippet = refusedVendor
		},
		"user snippet": func(tm *hfv1.HypervisorMachineTemplate) {
			tm.Spec.CloudInit.Proxmox.UserSnippet = refusedUserSnippet
		},
		"drive storage": func(tm *hfv1.HypervisorMachineTemplate) {
			tm.Spec.CloudInit.Proxmox.DriveStorage = refusedStorage
		},
		"dns domain": func(tm *hfv1.HypervisorMachineTemplate) { tm.Spec.Network.DNS.Domain = refusedDNSDomain },
	} {
		t.Run(name, func(t *testing.T) {
			w := newSimWorld(t, simOptions{})
			var once sync.Once
			w.drop = func(r *http.Request) bool {
				lost := false
				if r.Method == http.MethodPost && simClonePath.MatchString(r.URL.Path) {
					once.Do(func() { lost = true })
				}
				return lost
			}
			claim := w.newClaim("runner-1")
			placed := w.runUntil(claim, "a VM", func(c *hfv1.MachineClaim) bool { return c.Status.VMRef != nil })
			if n := len(w.clonesSent()); n != 0 || len(w.sim.VMs()) != 2 {
				t.Fatalf("%d clone requests reached the simulator before the edit: the edit would come too late", n)
			}
			rec := placed.Status.PlacementRecord
			if !strings.Contains(rec, `"signature":"p3.`) {
				t.Fatalf("placement record %q is not signed", rec)
			}
			w.editTemplate(edit)
			got := w.runUntil(claim, "a running VM", provisioned)
			w.expectAuthorized(got)
		})
	}
}

// expectAuthorized checks that every clone request, the VM's configuration
// and the claim's name hold what the cluster authorized.
func (w *simWorld) expectAuthorized(c *hfv1.MachineClaim) {
	t := w.t
	t.Helper()
	clones := w.clonesSent()
	if len(clones) == 0 {
		t.Fatal("no clone request reached the simulator")
	}
	for _, p := range clones {
		want := map[string]string{"source": "9000", "full": "1", "storage": authorizedStorage, "format": "raw", "pool": authorizedPool}
		for k, v := range want {
			if p[k] != v && (k != "full" || p[k] != "true") {
				t.Errorf("clone request %v has %s %q, want the authorized %q", p, k, p[k], v)
			}
		}
	}
	vm := w.vmOf(c)
	cfg := vm.Config
	host := vmspec.Hostname(c, hfv1.HostnameFromName)
	for key, want := range map[string]string{
		"cores":        "2",
		"memory":       "2048",
		"cicustom":     "vendor=" + authorizedVendorSnippet + ",user=" + authorizedUserSnippet,
		"searchdomain": authorizedDNSDomain,
	} {
		if got := cfg[key]; !sameCustom(got, want) {
			t.Errorf("VM %d has %s %q, want the authorized %q", vm.VMID, key, got, want)
		}
	}
	net := cfg["net0"]
	if !strings.HasPrefix(net, "virtio=") || !strings.Contains(net, "bridge="+authorizedBridge) || !strings.Contains(net, "tag=100") {
		t.Errorf("VM %d has net0 %q, want virtio on bridge %s, tag 100", vm.VMID, net, authorizedBridge)
	}
	if disk := cfg["scsi0"]; !strings.HasPrefix(disk, authorizedStorage+":") || !strings.Contains(disk, "size=40G") {
		t.Errorf("VM %d has scsi0 %q, want a 40G disk on %s", vm.VMID, disk, authorizedStorage)
	}
	// The cloud-init drive is detached once the guest is up: what it was
	// created on is in the configuration update that added it.
	drives := 0
	for _, update := range w.configsSent() {
		for _, k := range []string{"ide0", "ide1", "ide2", "ide3"} {
			if v := update[k]; strings.Contains(v, "cloudinit") {
				drives++
				if !strings.HasPrefix(v, authorizedStorage+":") {
					t.Errorf("VM %d got its cloud-init drive as %s %q, want it on %s", vm.VMID, k, v, authorizedStorage)
				}
			}
		}
	}
	if drives == 0 {
		t.Errorf("no configuration update of VM %d added a cloud-init drive", vm.VMID)
	}
	pooled := false
	for _, p := range w.sim.State().Pools {
		for _, m := range p.Members {
			if m == vm.VMID {
				pooled = pooled || p.ID == authorizedPool
				if p.ID != authorizedPool {
					t.Errorf("VM %d is in pool %s, want only %s", vm.VMID, p.ID, authorizedPool)
				}
			}
		}
	}
	if !pooled {
		t.Errorf("VM %d is not in pool %s", vm.VMID, authorizedPool)
	}
	if n := c.Status.Network; n == nil || n.FQDN != host+"."+authorizedDNSDomain {
		t.Errorf("the claim's status.network %+v, want fqdn %s.%s", n, host, authorizedDNSDomain)
	}
}

// sameCustom compares two Proxmox property strings, whose comma-separated
// parts may come in any order.
func sameCustom(got, want string) bool {
	g, w := strings.Split(got, ","), strings.Split(want, ",")
	if len(g) != len(w) {
		return false
	}
	for _, part := range w {
		found := false
		for _, p := range g {
			found = found || p == part
		}
		if !found {
			return false
		}
	}
	return true
}

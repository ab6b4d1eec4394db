package proxmoxsim

import (
	"context"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	proxmox "github.com/luthermonson/go-proxmox"
)

// newTLSClientEnv serves the simulator over TLS (HTTP/1.1 only, like
// pveproxy) on the real clock with zero latency, and returns a go-proxmox
// client using the root API token.
func newTLSClientEnv(t *testing.T, opts ...proxmox.Option) (*Simulator, *proxmox.Client) {
	t.Helper()
	sim, err := New(testConfig())
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(sim)
	srv.EnableHTTP2 = false
	srv.StartTLS()
	t.Cleanup(func() {
		srv.Close()
		_ = sim.Close()
	})
	// go-proxmox polls tasks every DefaultWaitInterval (1s); with zero
	// latency tasks finish at once, so poll quickly.
	proxmox.DefaultWaitInterval = 10 * time.Millisecond
	all := append([]proxmox.Option{proxmox.WithHTTPClient(srv.Client())}, opts...)
	if len(opts) == 0 {
		all = append(all, proxmox.WithAPIToken("root@pam!sim", "00000000-0000-0000-0000-000000000000"))
	}
	return sim, proxmox.NewClient(srv.URL+"/api2/json", all...)
}

func waitOK(ctx context.Context, t *testing.T, task *proxmox.Task) {
	t.Helper()
	if err := task.Wait(ctx, 10*time.Millisecond, 5*time.Second); err != nil {
		t.Fatalf("wait %s: %v", task.UPID, err)
	}
	if !task.IsSuccessful {
		t.Fatalf("task %s ended %q", task.UPID, task.ExitStatus)
	}
}

// TestGoProxmoxLifecycle drives a whole runner VM lifecycle through
// luthermonson/go-proxmox, the client the provider uses.
func TestGoProxmoxLifecycle(t *testing.T) {
	ctx := context.Background()
	sim, c := newTLSClientEnv(t)

	v, err := c.Version(ctx)
	if err != nil || v.Version == "" {
		t.Fatalf("version: %v %v", v, err)
	}
	nodes, err := c.Nodes(ctx)
	if err != nil || len(nodes) != 1 || len(nodes[0].SSLFingerprint) != 95 {
		t.Fatalf("nodes: %+v %v", nodes, err)
	}
	node, tmpl := templateOnPVE1(ctx, t, c)
	if !bool(tmpl.VirtualMachineConfig.Template) {
		t.Fatalf("9000 must be a template: %+v", tmpl.VirtualMachineConfig)
	}

	// Starting a template: the call succeeds, the task fails.
	st, err := tmpl.Start(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Wait(ctx, 10*time.Millisecond, 5*time.Second); err != nil || !st.IsFailed || st.ExitStatus != "you can't start a vm if it's a template" {
		t.Fatalf("template start: err=%v failed=%v exit=%q", err, st.IsFailed, st.ExitStatus)
	}

	newid, task, err := tmpl.Clone(ctx, &proxmox.VirtualMachineCloneOptions{Name: "ci-runner-1"})
	if err != nil {
		t.Fatal(err)
	}
	if newid != 100 || task.Type != "qmclone" || task.ID != "9000" {
		t.Fatalf("clone: newid %d task %+v", newid, task)
	}
	waitOK(ctx, t, task)

	vm, err := node.VirtualMachine(ctx, newid)
	if err != nil {
		t.Fatal(err)
	}
	task, err = vm.Config(ctx,
		proxmox.VirtualMachineOption{Name: "cores", Value: 4},
		proxmox.VirtualMachineOption{Name: "ipconfig0", Value: "ip=dhcp"},
		proxmox.VirtualMachineOption{Name: "sshkeys", Value: proxmox.EncodeSSHKeys("ssh-ed25519 AAAA runner")},
	)
	if err != nil {
		t.Fatal(err)
	}
	waitOK(ctx, t, task)
	if err := vm.ConfigSync(ctx, proxmox.VirtualMachineOption{Name: "description", Value: "hyperfleet: owned"}); err != nil {
		t.Fatal(err)
	}
	if err := vm.Ping(ctx); err != nil {
		t.Fatal(err)
	}

	userData := "#cloud-config\nruncmd: [echo hi]\n"
	if err := vm.CloudInit(ctx, "ide0", userData, "instance-id: ci-runner-1\n", "", "version: 2\n", proxmox.WithCloudInitStorage("local")); err != nil {
		t.Fatalf("CloudInit: %v", err)
	}
	if err := vm.Ping(ctx); err != nil {
		t.Fatal(err)
	}
	if got := vm.VirtualMachineConfig.IDEs["ide0"]; got != "local:iso/user-data-100.iso,media=cdrom" {
		t.Fatalf("ide0 = %q", got)
	}
	if !vm.HasTag(proxmox.MakeTag(proxmox.TagCloudInit)) || !vm.HasTag("template") {
		t.Fatalf("tags = %q", vm.VirtualMachineConfig.Tags)
	}
	iso := findVolume(sim.State(), "local:iso/user-data-100.iso")
	if iso == nil || iso.Files["user-data"] != userData || iso.Files["meta-data"] == "" || iso.Files["network-config"] == "" {
		if iso != nil {
			_, err := readISOFiles(iso.Data)
			t.Fatalf("uploaded NoCloud ISO not readable: files %v, err %v", iso.Files, err)
		}
		t.Fatal("uploaded NoCloud ISO missing")
	}

	task, err = vm.Start(ctx)
	if err != nil {
		t.Fatal(err)
	}
	waitOK(ctx, t, task)
	if err := vm.WaitForAgent(ctx, 5); err != nil {
		t.Fatalf("WaitForAgent: %v", err)
	}
	ifaces, err := vm.AgentGetNetworkIFaces(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(ifaces) != 1 || ifaces[0].IPAddresses[0].IPAddress != "10.99.0.10" {
		t.Fatalf("agent interfaces: %+v", ifaces[0])
	}

	// Deleting a running VM fails with the real message (go-proxmox turns
	// 500s into errors.New(res.Status)).
	if err := vm.Ping(ctx); err != nil {
		t.Fatal(err)
	}
	if err := c.Delete(ctx, "/nodes/pve1/qemu/100", nil); err == nil || err.Error() != "500 VM 100 is running - destroy failed" {
		t.Fatalf("delete running VM: %v", err)
	}

	task, err = vm.Stop(ctx)
	if err != nil {
		t.Fatal(err)
	}
	waitOK(ctx, t, task)
	if err := vm.Ping(ctx); err != nil || !vm.IsStopped() {
		t.Fatalf("after stop: %v %s", err, vm.Status)
	}
	task, err = vm.Delete(ctx, &proxmox.VirtualMachineDeleteOptions{Purge: true})
	if err != nil {
		t.Fatal(err)
	}
	waitOK(ctx, t, task)
	if findVolume(sim.State(), "local:iso/user-data-100.iso") != nil {
		t.Fatal("Delete must remove the cloud-init ISO")
	}
	if _, err := node.VirtualMachine(ctx, 100); err == nil || !strings.Contains(err.Error(), "500 Configuration file 'nodes/pve1/qemu-server/100.conf' does not exist") {
		t.Fatalf("deleted VM: %v", err)
	}
}

// TestGoProxmoxTicketSession logs in with a password (ticket + CSRF) and
// makes a non-GET call with it.
func TestGoProxmoxTicketSession(t *testing.T) {
	ctx := context.Background()
	_, c := newTLSClientEnv(t, proxmox.WithCredentials(&proxmox.Credentials{Username: "root@pam", Password: "root"}))
	if err := c.NewPool(ctx, "ci", "runners"); err != nil {
		t.Fatalf("NewPool with a ticket session: %v", err)
	}
	pools, err := c.Pools(ctx)
	if err != nil || len(pools) != 1 || pools[0].PoolID != "ci" {
		t.Fatalf("pools: %+v %v", pools, err)
	}
	_, bad := newTLSClientEnv(t, proxmox.WithCredentials(&proxmox.Credentials{Username: "root@pam", Password: "wrong"}))
	if _, err := bad.Version(ctx); err == nil || !proxmox.IsNotAuthorized(err) {
		t.Fatalf("wrong password: %v", err)
	}
}

func findVolume(st State, volid string) *VolumeState {
	for _, s := range st.Storages {
		for i := range s.Volumes {
			if s.Volumes[i].VolID == volid {
				return &s.Volumes[i]
			}
		}
	}
	return nil
}

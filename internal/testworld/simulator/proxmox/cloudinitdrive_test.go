package proxmoxsim

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/luthermonson/go-proxmox"
)

// TestProxmoxCloudInitFiles: the files of a cloud-init drive are what
// qemu-server's cloudinit_userdata and nocloud_network write, byte for
// byte (their indentation included: the subnets list sits at the level of
// its key), for the fields HyperFleet and users set.
func TestProxmoxCloudInitFiles(t *testing.T) {
	cases := []struct {
		name          string
		conf          map[string]string
		user, network string
	}{
		{
			name: "static address, DNS, user and keys",
			conf: map[string]string{
				"name": "runner-1", "net0": "virtio=BC:24:11:00:00:01,bridge=vmbr0", "net1": "virtio=BC:24:11:00:00:02,bridge=vmbr1",
				"ipconfig0": "ip=10.0.0.5/24,gw=10.0.0.1,ip6=fd00::5/64,gw6=fd00::1", "nameserver": "192.0.2.53 192.0.2.54",
				"searchdomain": "ci.example.com", "ciuser": "ci", "sshkeys": "ssh-ed25519%20AAAA%20a%40b%0Assh-rsa%20BBBB%0A", "ciupgrade": "0",
			},
			user: "#cloud-config\nhostname: runner-1\nmanage_etc_hosts: true\nfqdn: runner-1.ci.example.com\nuser: ci\n" +
				"ssh_authorized_keys:\n  - ssh-ed25519 AAAA a@b\n  - ssh-rsa BBBB\nchpasswd:\n  expire: False\nusers:\n  - default\n",
			// net1 has no ipconfig1: Proxmox leaves it out.
			network: "version: 1\nconfig:\n    - type: physical\n      name: eth0\n      mac_address: 'bc:24:11:00:00:01'\n      subnets:\n" +
				"      - type: static\n        address: '10.0.0.5'\n        netmask: '255.255.255.0'\n        gateway: '10.0.0.1'\n" +
				"      - type: static6\n        address: 'fd00::5/64'\n        gateway: 'fd00::1'\n" +
				"    - type: nameserver\n      address:\n      - '192.0.2.53'\n      - '192.0.2.54'\n      search:\n      - 'ci.example.com'\n",
		},
		{
			name: "dhcp, no name, root, upgrade by default",
			conf: map[string]string{"net0": "virtio=BC:24:11:00:00:01,bridge=vmbr0", "ipconfig0": "ip=dhcp,ip6=auto", "ciuser": "root"},
			user: "#cloud-config\nhostname: VM150\nmanage_etc_hosts: true\nfqdn: VM150\nuser: root\ndisable_root: False\nchpasswd:\n  expire: False\npackage_upgrade: true\n",
			// The nameserver entry is there even empty (on Proxmox the
			// node's resolv.conf fills it).
			network: "version: 1\nconfig:\n    - type: physical\n      name: eth0\n      mac_address: 'bc:24:11:00:00:01'\n      subnets:\n" +
				"      - type: dhcp4\n      - type: ipv6_slaac\n    - type: nameserver\n",
		},
		{
			name:    "dotted name is the FQDN",
			conf:    map[string]string{"name": "runner-2.lab.example.com", "ciupgrade": "0"},
			user:    "#cloud-config\nhostname: runner-2\nmanage_etc_hosts: true\nfqdn: runner-2.lab.example.com\nchpasswd:\n  expire: False\nusers:\n  - default\n",
			network: "version: 1\nconfig:\n    - type: nameserver\n",
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			v := &vm{vmid: 150, node: "pve1", conf: tc.conf}
			if got := proxmoxUserData(v); got != tc.user {
				t.Errorf("user-data:\n%s\nwant:\n%s", got, tc.user)
			}
			if got := proxmoxNetworkConfig(v.conf); got != tc.network {
				t.Errorf("network-config:\n%s\nwant:\n%s", got, tc.network)
			}
		})
	}
}

// TestCICustomSnippets: a cicustom snippet replaces the generated file,
// the others stay generated; a snippet that is missing, or a volume that is
// not a snippet, fails the start task with qemu-server's message, and the
// seed the guest reads is the drive's content.
func TestCICustomSnippets(t *testing.T) {
	ctx := context.Background()
	sim, c, _ := guestEnv(t, "hang")
	seeds := make(chan map[string]string, 1)
	if err := sim.SetGuestProgram(func(ctx context.Context, g Guest) error {
		files := map[string]string{}
		for _, name := range []string{"user-data", "meta-data", "network-config", "vendor-data"} {
			b, err := os.ReadFile(filepath.Join(g.SeedDir, name))
			if err != nil {
				return err
			}
			files[name] = string(b)
		}
		seeds <- files
		<-ctx.Done()
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	node, tmpl := templateOnPVE1(ctx, t, c)
	id, task, err := tmpl.Clone(ctx, &proxmox.VirtualMachineCloneOptions{NewID: 150, Name: "runner-1"})
	if err != nil {
		t.Fatal(err)
	}
	waitOK(ctx, t, task)
	vm, err := node.VirtualMachine(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	start := func(want string) {
		t.Helper()
		task, err := vm.Start(ctx)
		if err != nil {
			t.Fatal(err)
		}
		// Wait returns once the task stops, whatever its exit status.
		if err := task.Wait(ctx, 10*time.Millisecond, 5*time.Second); err != nil {
			t.Fatal(err)
		}
		if task.ExitStatus != want {
			t.Fatalf("start ended %q, want %q", task.ExitStatus, want)
		}
	}
	set := func(opts ...proxmox.VirtualMachineOption) {
		t.Helper()
		if err := vm.ConfigSync(ctx, opts...); err != nil {
			t.Fatal(err)
		}
	}
	set(proxmox.VirtualMachineOption{Name: "ipconfig0", Value: "ip=10.0.0.5/24,gw=10.0.0.1"},
		proxmox.VirtualMachineOption{Name: "nameserver", Value: "192.0.2.53"},
		proxmox.VirtualMachineOption{Name: "ciuser", Value: "ci"},
		proxmox.VirtualMachineOption{Name: "cicustom", Value: "user=local:snippets/runner.yaml"})
	start("can't open '/var/lib/vz/snippets/runner.yaml' - No such file or directory")

	set(proxmox.VirtualMachineOption{Name: "cicustom", Value: "user=local:iso/runner.iso"})
	start("local:iso/runner.iso is not in the snippets directory")

	if _, err := sim.PutSnippet("local-lvm", "pve1", "runner.yaml", []byte("#cloud-config\n")); err == nil || !strings.Contains(err.Error(), "snippets") {
		t.Errorf("a snippet on a block storage: %v", err)
	}
	userData := "#cloud-config\nruncmd: [[echo, from-snippet]]\n"
	volid, err := sim.PutSnippet("local", "pve1", "runner.yaml", []byte(userData))
	if err != nil || volid != "local:snippets/runner.yaml" {
		t.Fatalf("PutSnippet = %q, %v", volid, err)
	}
	set(proxmox.VirtualMachineOption{Name: "cicustom", Value: "user=" + volid})
	start("OK")
	seed := <-seeds
	if seed["user-data"] != userData {
		t.Errorf("user-data %q, want the snippet's %q: cicustom user= replaces Proxmox's", seed["user-data"], userData)
	}
	if !strings.Contains(seed["network-config"], "address: '10.0.0.5'") || !strings.Contains(seed["network-config"], "- '192.0.2.53'") {
		t.Errorf("network-config is not generated from ipconfig0 and nameserver:\n%s", seed["network-config"])
	}
	if !strings.HasPrefix(seed["meta-data"], "instance-id: ") || seed["vendor-data"] != "" {
		t.Errorf("meta-data %q, vendor-data %q: want a generated instance id and no vendor-data", seed["meta-data"], seed["vendor-data"])
	}
	// qm cloudinit dump shows the generated files, cicustom or not.
	for typ, want := range map[string]string{"user": "user: ci\n", "network": "address: '10.0.0.5'", "meta": "instance-id: "} {
		var got string
		if err := c.Get(ctx, "/nodes/pve1/qemu/150/cloudinit/dump?type="+typ, &got); err != nil {
			t.Fatalf("cloudinit/dump type %s: %v", typ, err)
		}
		if !strings.Contains(got, want) {
			t.Errorf("cloudinit/dump type %s = %q, want %q in it", typ, got, want)
		}
	}
}

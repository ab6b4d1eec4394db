package proxmox

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"

	proxmoxsim "github.com/hyperfleet/hyperfleet/internal/testworld/simulator/proxmox"
	"github.com/hyperfleet/hyperfleet/pkg/provider"
)

// neverRendered fails the test if the provider renders it: a native spec
// delivers nothing of its own.
type neverRendered struct{ t *testing.T }

func (n neverRendered) Render(context.Context) (provider.CloudInit, error) {
	n.t.Error("the provider rendered the NoCloud data of a native spec")
	return provider.CloudInit{}, fmt.Errorf("not to be rendered")
}

// nativeTestKey has the characters sshkeys must escape: spaces, '+', '/'
// and '='.
const nativeTestKey = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIG+/x= ci@example.com"

// nativeSpec is testSpec delivered by Proxmox's own cloud-init drive.
func nativeSpec(t *testing.T, name, uid, vendor string) *provider.VMSpec {
	spec := testSpec(name, uid)
	spec.CloudInit = neverRendered{t}
	spec.Native = &provider.NativeCloudInit{
		IPv4: "10.99.0.241/24", Gateway4: "10.99.0.2",
		Nameservers: []string{"10.99.0.3", "2001:db8::53"}, SearchDomains: []string{"ci.example.com", "example.com"},
		User: "ci", SSHAuthorizedKeys: []string{nativeTestKey, "ssh-rsa AAAAB3NzaC1yc2E second"},
		VendorData: vendor,
	}
	return spec
}

// dump is qm cloudinit dump: the file Proxmox generates for the VM.
func (e *env) dump(vmid int, typ string) string {
	e.t.Helper()
	var out string
	if err := e.p.api.call(context.Background(), http.MethodGet, fmt.Sprintf("/nodes/pve1/qemu/%d/cloudinit/dump", vmid),
		url.Values{"type": {typ}}, nil, &out); err != nil {
		e.t.Fatalf("cloudinit dump %s: %v", typ, err)
	}
	return out
}

// TestNativeCloudInitLifecycle drives a VM whose spec is Native through its
// whole life on the simulator, which checks every config field against
// Proxmox's API description and generates the drive's files as qemu-server
// does: the exact fields sent, the files the guest will read, no ISO ever
// uploaded, the drive detached once the guest is up (and a VM that has run
// never started again), the guest file placed, media removal and deletion
// that leave nothing behind.
func TestNativeCloudInitLifecycle(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	kit, err := e.sim.PutSnippet("local", "pve1", "hyperfleet-kit.yaml", []byte("#cloud-config\nruncmd: [[true]]\n"))
	if err != nil {
		t.Fatal(err)
	}
	spec := nativeSpec(t, "runner-n", "uid-nnnn", kit)
	d := e.ensure(e.p, spec, provider.Progress{}, provider.PhaseBooting, 50)
	vmid := mustVMID(d.prog.ID)
	v := e.vm(vmid)
	want := map[string]string{
		"citype":       "nocloud",
		"ciupgrade":    "0",
		"ipconfig0":    "ip=10.99.0.241/24,gw=10.99.0.2",
		"nameserver":   "10.99.0.3 2001:db8::53",
		"searchdomain": "ci.example.com", // one: it also makes the FQDN
		"ciuser":       "ci",
		"sshkeys":      "ssh-ed25519%20AAAAC3NzaC1lZDI1NTE5AAAAIG%2B%2Fx%3D%20ci%40example.com%0Assh-rsa%20AAAAB3NzaC1yc2E%20second",
		"cicustom":     "vendor=local:snippets/hyperfleet-kit.yaml",
	}
	for k, w := range want {
		if got := v.Config[k]; got != w {
			t.Errorf("%s = %q, want %q", k, got, w)
		}
	}
	// The template's own drive is kept (a clone copies it), on its storage.
	if got := v.Config["ide2"]; !strings.HasPrefix(got, fmt.Sprintf("local-lvm:vm-%d-cloudinit", vmid)) {
		t.Errorf("ide2 = %q, want the clone's cloud-init drive", got)
	}
	user := e.dump(vmid, "user")
	if strings.Contains(user, "package_upgrade") {
		t.Errorf("generated user-data upgrades packages:\n%s", user)
	}
	for _, w := range []string{"hostname: runner-n\n", "fqdn: runner-n.ci.example.com\n", "user: ci\n", "  - " + nativeTestKey + "\n", "  - ssh-rsa AAAAB3NzaC1yc2E second\n"} {
		if !strings.Contains(user, w) {
			t.Errorf("generated user-data lacks %q:\n%s", w, user)
		}
	}
	network := e.dump(vmid, "network")
	for _, w := range []string{"mac_address: '" + macFor("uid-nnnn") + "'", "address: '10.99.0.241'", "netmask: '255.255.255.0'", "gateway: '10.99.0.2'", "- '2001:db8::53'", "- 'ci.example.com'"} {
		if !strings.Contains(network, w) {
			t.Errorf("generated network-config lacks %q:\n%s", w, network)
		}
	}
	for _, s := range e.state().Storages {
		for _, vol := range s.Volumes {
			if strings.HasSuffix(vol.VolID, ".iso") {
				t.Errorf("an ISO was written for a native spec: %s", vol.VolID)
			}
		}
	}
	if n := e.obs.count("POST", "/nodes/{node}/storage/{storage}/upload"); n != 0 {
		t.Errorf("%d uploads for a native spec", n)
	}

	d = e.ensure(e.p, spec, d.prog, provider.PhaseRunning, 200)
	if len(d.res.Addresses) == 0 {
		t.Fatalf("running without an address: %+v", d.res)
	}
	if got, ok := e.vm(vmid).Config["ide2"]; ok {
		t.Errorf("ide2 = %q once the guest is up, want the drive removed", got)
	}
	if err := e.p.PlaceGuestFile(ctx, spec.Owner, provider.VMRef{ID: d.prog.ID, Node: "pve1"},
		provider.GuestFile{Path: "/run/hyperfleet/agent.json", Content: []byte(`{"version":1}`)}); err != nil {
		t.Fatalf("PlaceGuestFile: %v", err)
	}
	// After a restart (a new provider, the progress persisted) the VM is
	// still Running, and once its guest powers off it is Stopped and never
	// started again.
	p2 := e.newProvider(e.cfg)
	if res, err := p2.EnsureVM(ctx, spec, provider.Progress{ID: d.prog.ID, Node: d.prog.Node}); err != nil || res.Phase != provider.PhaseRunning {
		t.Fatalf("EnsureVM after a restart: %+v %v", res, err)
	}
	if err := e.sim.GuestPowerOff(vmid); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		res, err := p2.EnsureVM(ctx, spec, provider.Progress{ID: d.prog.ID, Node: d.prog.Node})
		if err != nil || res.Phase != provider.PhaseStopped {
			t.Fatalf("EnsureVM after power-off: %+v %v", res, err)
		}
	}
	if e.vm(vmid).Status != "stopped" {
		t.Fatal("a VM that has run was started again")
	}
	// A VM that never had an ISO has no media to remove.
	if res, err := p2.RemoveCloudInitMedia(ctx, spec.Owner, d.prog); err != nil || !res.Done {
		t.Fatalf("RemoveCloudInitMedia: %+v %v", res, err)
	}
	e.remove(p2, spec.Owner, d.prog, 30)
	for _, s := range e.state().Storages {
		for _, vol := range s.Volumes {
			if vol.VMID == vmid {
				t.Errorf("volume left behind: %+v", vol)
			}
		}
	}
	if e.volume(kit) == nil {
		t.Error("the platform team's snippet was deleted")
	}
}

// TestNativeCloudInitDrive covers the config a native spec sends on a
// template without a cloud-init drive (the drive is made on the boot disk's
// storage, or on the spec's) and with ci fields of its own (those the spec
// leaves empty are deleted, so the template's user never reaches the VM).
func TestNativeCloudInitDrive(t *testing.T) {
	e := newEnv(t, func(sim *proxmoxsim.Config, _ *provider.ClusterConfig) {
		tmpl := &sim.Templates[0]
		tmpl.CloudInitStorage = ""
		tmpl.Config = map[string]string{"ciuser": "admin", "cicustom": "user=local:snippets/old.yaml"}
	})
	spec := testSpec("runner-d", "uid-dddd")
	spec.CloudInit = neverRendered{t}
	spec.Native = &provider.NativeCloudInit{IPv4: "dhcp", Gateway4: "10.0.0.1", IPv6: "auto", Gateway6: "2001:db8::1"}
	d := e.ensure(e.p, spec, provider.Progress{}, provider.PhaseBooting, 50)
	v := e.vm(mustVMID(d.prog.ID))
	if got := v.Config["ipconfig0"]; got != "ip=dhcp,ip6=auto" {
		t.Errorf("ipconfig0 = %q: a gateway goes only with an address", got)
	}
	for _, k := range []string{"ciuser", "cicustom", "sshkeys", "nameserver", "searchdomain"} {
		if got, ok := v.Config[k]; ok {
			t.Errorf("%s = %q, want it deleted: the spec sets none", k, got)
		}
	}
	slot := vmConfig(v.Config).cloudInitSlot()
	if slot == "" || !strings.HasPrefix(v.Config[slot], "local-lvm:vm-") {
		t.Errorf("cloud-init drive %s = %q, want one on the boot disk's storage local-lvm", slot, v.Config[slot])
	}

	// A storage without images content is Proxmox's refusal, named for
	// the field to fix.
	spec2 := testSpec("runner-e", "uid-eeee")
	spec2.CloudInit = neverRendered{t}
	spec2.Native = &provider.NativeCloudInit{IPv4: "dhcp", Storage: "local"}
	var err error
	res := &provider.EnsureResult{}
	for range 20 {
		res, err = e.p.EnsureVM(context.Background(), spec2, res.Progress)
		if err != nil {
			break
		}
		e.advance(res.RetryAfter)
	}
	if err == nil || provider.Classify(err) != provider.ClassConfiguration || provider.ReasonOf(err) != "NoCloudInitStorage" || !strings.Contains(err.Error(), "spec.cloudInit.proxmox.driveStorage") {
		t.Errorf("a drive on a storage without images content: %v (class %s)", err, provider.Classify(err))
	}
}

// TestNativeSpecChecked: a native value Proxmox would reject, or that would
// smuggle options of its own into the config (a comma, a newline), is
// refused before any call, naming the field.
func TestNativeSpecChecked(t *testing.T) {
	e := newEnv(t)
	for field, n := range map[string]provider.NativeCloudInit{
		"spec.network (ipv4)":                      {IPv4: "10.0.0.5,gw=10.0.0.9"},
		"spec.network (gateway4)":                  {IPv4: "10.0.0.5/24", Gateway4: "10.0.0.1/24"},
		"spec.network (ipv6)":                      {IPv6: "slaac"},
		"spec.dns.servers":                         {Nameservers: []string{"ns1.example.com"}},
		"spec.dns.domain":                          {SearchDomains: []string{"a b"}},
		"spec.cloudInit.proxmox.user":              {User: "Admin"},
		"spec.cloudInit.proxmox.sshAuthorizedKeys": {SSHAuthorizedKeys: []string{"ssh-ed25519 AAAA a\nssh-rsa AAAA b"}},
		"spec.cloudInit.proxmox.vendorSnippet":     {VendorData: "local:iso/kit.yaml"},
		"spec.cloudInit.proxmox.userSnippet":       {UserData: "local:snippets/a.yaml,meta=local:snippets/b.yaml"},
	} {
		spec := testSpec("runner-x", "uid-xxxx")
		spec.Native = &n
		_, err := e.p.EnsureVM(context.Background(), spec, provider.Progress{})
		if provider.Classify(err) != provider.ClassConfiguration || !strings.Contains(fmt.Sprint(err), field+":") {
			t.Errorf("%+v: %v (class %s), want a configuration error naming %s", n, err, provider.Classify(err), field)
		}
	}
	if e.nonTemplateVMs() != 0 || e.obs.count("POST", "/nodes/{node}/qemu/{vmid}/clone") != 0 {
		t.Error("a refused spec cloned a VM")
	}
}

// TestValidateTemplateNativeFiles: a template whose VMs use Proxmox's own
// cloud-init is checked for what it names: the drive's storage takes VM
// disks, each snippet is on a storage with snippets content and exists.
func TestValidateTemplateNativeFiles(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	if _, err := e.sim.PutSnippet("local", "pve1", "kit.yaml", []byte("#cloud-config\n")); err != nil {
		t.Fatal(err)
	}
	src := provider.TemplateSource{Linked: true, Settings: TemplateRef{ID: 9000}}
	for _, tc := range []struct {
		native         provider.NativeFiles
		reason, saying string
	}{
		{provider.NativeFiles{VendorData: "local:snippets/kit.yaml", Storage: "local-lvm"}, "", ""},
		{provider.NativeFiles{VendorData: "local:snippets/missing.yaml"}, "SnippetNotFound", "spec.cloudInit.proxmox.vendorSnippet: local:snippets/missing.yaml does not exist on node pve1"},
		{provider.NativeFiles{UserData: "local-lvm:snippets/kit.yaml"}, "StorageNoSnippets", "spec.cloudInit.proxmox.userSnippet: storage \"local-lvm\" does not hold snippets"},
		{provider.NativeFiles{VendorData: "nas:snippets/kit.yaml"}, "StorageNotFound", "spec.cloudInit.proxmox.vendorSnippet: storage \"nas\""},
		{provider.NativeFiles{Storage: "local"}, "StorageNoImages", "spec.cloudInit.proxmox.driveStorage: storage \"local\" does not allow VM disks"},
		{provider.NativeFiles{Storage: "ceph"}, "StorageNotFound", "spec.cloudInit.proxmox.driveStorage"},
	} {
		src.Native = &tc.native
		_, err := e.p.ValidateTemplate(ctx, src)
		switch {
		case tc.reason == "" && err != nil:
			t.Errorf("%+v: %v", tc.native, err)
		case tc.reason != "" && (provider.Classify(err) != provider.ClassConfiguration || provider.ReasonOf(err) != tc.reason || !strings.Contains(fmt.Sprint(err), tc.saying)):
			t.Errorf("%+v: %v (reason %s), want %s saying %q", tc.native, err, provider.ReasonOf(err), tc.reason, tc.saying)
		}
	}
}

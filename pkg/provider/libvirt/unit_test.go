package libvirt

import (
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	golibvirt "github.com/digitalocean/go-libvirt"
	clocktesting "k8s.io/utils/clock/testing"
	"libvirt.org/go/libvirtxml"

	"github.com/hyperfleet/hyperfleet/pkg/provider"
)

func TestClassify(t *testing.T) {
	lv := func(code golibvirt.ErrorNumber, msg string) error {
		return fmt.Errorf("call: %w", golibvirt.Error{Code: uint32(code), Message: msg})
	}
	cases := []struct {
		name     string
		err      error
		class    provider.Class
		reason   string
		sentinel error
	}{
		{"no domain", lv(golibvirt.ErrNoDomain, "Domain not found: no domain with matching name 'x'"), provider.ClassTransient, "NotFound", provider.ErrNotFound},
		{"no volume is not the VM's absence", lv(golibvirt.ErrNoStorageVol, "Storage volume not found"), provider.ClassTransient, "MissingReference", nil},
		{"no pool is not the VM's absence", lv(golibvirt.ErrNoStoragePool, "Storage pool not found"), provider.ClassTransient, "MissingReference", nil},
		{"access denied", lv(golibvirt.ErrAccessDenied, "access denied"), provider.ClassConfiguration, "Unauthorized", provider.ErrUnauthorized},
		{"agent not answering", lv(golibvirt.ErrAgentUnresponsive, "Guest agent is not responding"), provider.ClassTransient, "GuestNotReady", provider.ErrGuestNotReady},
		{"name taken", lv(golibvirt.ErrOperationFailed, "domain 'x' already exists with uuid y"), provider.ClassTransient, "AlreadyExists", nil},
		{"pool full", lv(golibvirt.ErrInternalError, "Not enough space left in storage pool"), provider.ClassResource, "InsufficientCapacity", provider.ErrNoCapacity},
		{"bad XML", lv(golibvirt.ErrXMLError, "XML error"), provider.ClassConfiguration, "Unsupported", nil},
		{"connection lost", fmt.Errorf("call: %w", io.EOF), provider.ClassTransient, "Unreachable", provider.ErrUnreachable},
		{"refused", errors.New("dial unix /run/libvirt/libvirt-sock: connect: connection refused"), provider.ClassTransient, "Unreachable", provider.ErrUnreachable},
		{"other", lv(golibvirt.ErrInternalError, "something"), provider.ClassTransient, "LibvirtError", nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := classify(c.err)
			if got := provider.Classify(err); got != c.class {
				t.Errorf("class %s, want %s (%v)", got, c.class, err)
			}
			if got := provider.ReasonOf(err); got != c.reason {
				t.Errorf("reason %s, want %s", got, c.reason)
			}
			if c.sentinel != nil && !errors.Is(err, c.sentinel) {
				t.Errorf("%v does not wrap %v", err, c.sentinel)
			}
			if c.sentinel == nil && errors.Is(err, provider.ErrNotFound) {
				t.Errorf("%v wraps ErrNotFound", err)
			}
		})
	}
	if classify(nil) != nil {
		t.Error("classify(nil) is not nil")
	}
}

func TestChooseHost(t *testing.T) {
	hosts := []hostState{
		{name: "a", availableBytes: 8 << 30, template: true},
		{name: "b", availableBytes: 16 << 30, template: true},
		{name: "c", availableBytes: 64 << 30, template: false},
	}
	cases := []struct {
		name     string
		reserved map[string]int64
		memory   int64
		want     string
	}{
		{name: "most free memory among hosts with the template", memory: 1 << 30, want: "b"},
		{name: "reservations count", reserved: map[string]int64{"b": 12 << 30}, memory: 1 << 30, want: "a"},
		{name: "no room", reserved: map[string]int64{"a": 8 << 30, "b": 16 << 30}, memory: 1, want: ""},
		{name: "exact fit", memory: 16 << 30, want: "b"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, ok := chooseHost(hosts, c.reserved, c.memory)
			if got != c.want || ok != (c.want != "") {
				t.Errorf("chooseHost = %q, %v; want %q", got, ok, c.want)
			}
		})
	}
}

func TestFreeID(t *testing.T) {
	cases := []struct {
		used, reserved map[int]bool
		want           int
	}{
		{want: 100},
		{used: map[int]bool{100: true}, reserved: map[int]bool{101: true}, want: 102},
		{used: map[int]bool{100: true, 101: true, 102: true}, want: 0},
	}
	for _, c := range cases {
		if got := freeID(100, 102, c.used, c.reserved); got != c.want {
			t.Errorf("freeID(used %v, reserved %v) = %d, want %d", c.used, c.reserved, got, c.want)
		}
	}
}

func testProvider(t *testing.T, mutate func(*provider.ClusterConfig, *ClusterSettings)) *Provider {
	t.Helper()
	return testProviderWith(t, provider.Deps{}, mutate)
}

// testProviderWith is testProvider with deps (its Signer filled in), for
// a test's clock or Wake.
func testProviderWith(t *testing.T, deps provider.Deps, mutate func(*provider.ClusterConfig, *ClusterSettings)) *Provider {
	t.Helper()
	s := &ClusterSettings{Hosts: []Host{{Name: "h1", URI: "qemu:///system?socket=/nonexistent/sock"}, {Name: "h2", URI: "qemu:///system"}}, VolumePool: "vms"}
	cfg := provider.ClusterConfig{Name: "lab", VMIDStart: 100, VMIDEnd: 199, Settings: s}
	if mutate != nil {
		mutate(&cfg, s)
	}
	deps.Signer = testSigner(t)
	p, err := New(cfg, deps)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestReserve(t *testing.T) {
	p := testProvider(t, func(c *provider.ClusterConfig, _ *ClusterSettings) { c.MaxMachines = 2 })
	s := &clusterScan{hosts: []hostState{{name: "h1", availableBytes: 4 << 30, template: true}}, used: map[int]bool{100: true},
		machines: map[int]bool{100: true}}
	o1 := provider.Owner{UID: "u1"}
	r, err := p.reserve(s, o1, 1<<30, nil)
	if err != nil || r.vmid != 101 || r.host != "h1" {
		t.Fatalf("reserve: %+v, %v; want id 101 on h1", r, err)
	}
	if again, _ := p.reserve(s, o1, 1<<30, nil); again != r {
		t.Errorf("a second reservation for the same owner: %+v", again)
	}
	if got := p.reservedOn("h1"); got != 1<<30 {
		t.Errorf("reserved on h1: %d", got)
	}
	_, err = p.reserve(s, provider.Owner{UID: "u2"}, 1<<30, nil)
	if provider.ReasonOf(err) != "MaxMachinesReached" || provider.Classify(err) != provider.ClassResource {
		t.Errorf("third machine: %v, want MaxMachinesReached", err)
	}
	p.cfg.MaxMachines = 0
	_, err = p.reserve(s, provider.Owner{UID: "u3"}, 4<<30, nil)
	if !errors.Is(err, provider.ErrNoCapacity) {
		t.Errorf("no memory left: %v, want ErrNoCapacity", err)
	}
	p.forget(o1)
	if got := p.reservedOn("h1"); got != 0 {
		t.Errorf("reserved after forget: %d", got)
	}
}

// TestCloneSlots: ClonesPerNode bounds the clones in flight on a host;
// the owners that find no slot wait first come first served, and a freed
// slot wakes only the one it is free for.
func TestCloneSlots(t *testing.T) {
	var woken []string
	p := testProviderWith(t, provider.Deps{Wake: func(o provider.Owner) { woken = append(woken, o.UID) }},
		func(c *provider.ClusterConfig, _ *ClusterSettings) { c.ClonesPerNode = 1 })
	h := p.hostNamed("h1")
	a, b, d := provider.Owner{UID: "a"}, provider.Owner{UID: "b"}, provider.Owner{UID: "d"}
	if !p.takeSlot(h, "vms", 100, a) {
		t.Fatal("the first clone waits")
	}
	if !p.takeSlot(h, "vms", 100, a) {
		t.Error("the clone holding the slot waits for it")
	}
	if p.takeSlot(h, "other", 101, b) {
		t.Fatal("a second clone starts with ClonesPerNode 1")
	}
	if p.takeSlot(h, "vms", 103, d) {
		t.Fatal("a third clone starts with ClonesPerNode 1")
	}
	if !p.takeSlot(p.hostNamed("h2"), "vms", 102, provider.Owner{UID: "c"}) {
		t.Error("a clone on another host waits")
	}
	p.releaseSlot(100)
	if len(woken) != 1 || woken[0] != "b" {
		t.Errorf("woken %v, want [b]: the one slot freed is b's, who asked first", woken)
	}
	if p.takeSlot(h, "vms", 103, d) {
		t.Error("the owner queued second took the freed slot before the first")
	}
	if !p.takeSlot(h, "other", 101, b) {
		t.Error("the freed slot is not taken")
	}
}

// TestPlacementHoldsTheCloneSlot: a placement told its clone could begin
// now holds the slot, so that a VM placed after it is told it waits and
// the first begins its clone even when the second asks first; a hold no
// clone takes lapses after holdLimit.
func TestPlacementHoldsTheCloneSlot(t *testing.T) {
	clock := clocktesting.NewFakeClock(time.Date(2026, 11, 29, 6, 0, 0, 0, time.UTC))
	p := testProviderWith(t, provider.Deps{Clock: clock}, func(c *provider.ClusterConfig, _ *ClusterSettings) { c.ClonesPerNode = 1 })
	h := p.hostNamed("h1")
	a, b := provider.Owner{UID: "a"}, provider.Owner{UID: "b"}
	if !p.holdSlot(h, "vms", 100) {
		t.Fatal("the first VM placed is told it waits")
	}
	if !p.holdSlot(h, "vms", 100) {
		t.Error("placed again, the VM holding the slot is told it waits")
	}
	if p.holdSlot(h, "vms", 101) {
		t.Fatal("a second VM placed on the host, its one slot held, is told its clone begins now")
	}
	if p.takeSlot(h, "vms", 101, b) {
		t.Error("the second VM's clone took the slot held for the first")
	}
	if !p.takeSlot(h, "vms", 100, a) {
		t.Fatal("the first VM's clone waits for the slot its placement holds")
	}
	// Taken by its clone, the slot no longer lapses as a hold.
	clock.Step(holdLimit + time.Second)
	if p.takeSlot(h, "vms", 101, b) {
		t.Error("the slot of a clone in flight lapsed as a placement's hold")
	}
	p.releaseSlot(100)
	if !p.takeSlot(h, "vms", 101, b) {
		t.Fatal("the queued clone does not get the freed slot")
	}
	p.releaseSlot(101)

	if !p.holdSlot(h, "vms", 102) {
		t.Fatal("placing after the clones ended waits")
	}
	clock.Step(holdLimit + time.Second)
	if !p.holdSlot(h, "vms", 103) {
		t.Error("a hold no clone took still holds the slot after holdLimit")
	}
}

// TestCloneSlotsPerPool: spec.limits.clonesPerStorage bounds the clones in
// flight onto one pool of a host, beside clonesPerNode; another pool, or
// the same pool's name on another host, is other storage.
func TestCloneSlotsPerPool(t *testing.T) {
	p := testProvider(t, func(c *provider.ClusterConfig, _ *ClusterSettings) { c.ClonesPerNode, c.ClonesPerStorage = 3, 1 })
	h1, h2 := p.hostNamed("h1"), p.hostNamed("h2")
	if !p.takeSlot(h1, "vms", 100, provider.Owner{UID: "a"}) {
		t.Fatal("the first clone waits")
	}
	if p.takeSlot(h1, "vms", 101, provider.Owner{UID: "b"}) {
		t.Error("a second clone onto pool vms of h1 starts with ClonesPerStorage 1")
	}
	if !p.takeSlot(h1, "fast", 102, provider.Owner{UID: "c"}) {
		t.Error("a clone onto another pool of h1 waits")
	}
	if !p.takeSlot(h2, "vms", 103, provider.Owner{UID: "d"}) {
		t.Error("a clone onto h2's pool vms waits for h1's")
	}
	p.releaseSlot(100)
	if !p.takeSlot(h1, "vms", 101, provider.Owner{UID: "b"}) {
		t.Error("pool vms of h1 has no free slot after its clone ended")
	}
}

// TestCloneOwnerNeverBack: a clone whose owner does not come back to see
// its disk stops counting against the host's slots after cloneHoldLimit,
// unless a full copy of this process runs for it; its owner's return
// still finds its slot.
func TestCloneOwnerNeverBack(t *testing.T) {
	clock := clocktesting.NewFakeClock(time.Date(2026, 11, 29, 6, 0, 0, 0, time.UTC))
	p := testProviderWith(t, provider.Deps{Clock: clock}, func(c *provider.ClusterConfig, _ *ClusterSettings) { c.ClonesPerNode = 1 })
	h := p.hostNamed("h1")
	a, b, c := provider.Owner{UID: "a"}, provider.Owner{UID: "b"}, provider.Owner{UID: "c"}
	if !p.takeSlot(h, "vms", 100, a) {
		t.Fatal("the first clone waits")
	}
	clock.Step(cloneHoldLimit - time.Second)
	if p.takeSlot(h, "vms", 101, b) {
		t.Fatal("a clone took the slot of one in flight for less than cloneHoldLimit")
	}
	clock.Step(time.Second)
	if !p.takeSlot(h, "vms", 101, b) {
		t.Fatal("a clone whose owner never came back holds the slot after cloneHoldLimit")
	}
	if !p.takeSlot(h, "vms", 100, a) {
		t.Error("the owner coming back late lost its clone's slot")
	}
	p.releaseSlot(100)

	// A full copy keeps its slot counted however long it runs.
	p.slots.Watch(101, true)
	clock.Step(cloneHoldLimit + time.Second)
	if p.takeSlot(h, "vms", 102, c) {
		t.Error("a clone took the slot of a full copy running longer than cloneHoldLimit")
	}
}

func TestIDsAndCheckRef(t *testing.T) {
	p := testProvider(t, func(c *provider.ClusterConfig, _ *ClusterSettings) { c.Nodes = []string{"h1"} })
	if n, err := ParseID(FormatID(150)); err != nil || n != 150 {
		t.Errorf("round trip: %d, %v", n, err)
	}
	for _, c := range []struct {
		ref provider.VMRef
		ok  bool
	}{
		{provider.VMRef{ID: "libvirt://150", Node: "h1"}, true},
		{provider.VMRef{ID: "libvirt://150"}, true},
		{provider.VMRef{ID: "libvirt://99"}, false},
		{provider.VMRef{ID: "libvirt://0150"}, false},
		{provider.VMRef{ID: "proxmox://150"}, false},
		{provider.VMRef{ID: "libvirt://150", Node: "h2"}, false},
		{provider.VMRef{ID: "libvirt://150", Node: "elsewhere"}, false},
	} {
		err := p.CheckRef(c.ref)
		if (err == nil) != c.ok || err != nil && provider.Classify(err) != provider.ClassConfiguration {
			t.Errorf("CheckRef(%+v): %v", c.ref, err)
		}
	}
}

func TestISONames(t *testing.T) {
	p := testProvider(t, nil)
	name := p.isoName(123, "uid-1")
	vmid, digest, ok := p.parseISOName(name)
	if !ok || vmid != 123 || digest != provider.OwnerDigest("uid-1") {
		t.Errorf("parseISOName(%q) = %d, %q, %v", name, vmid, digest, ok)
	}
	for _, other := range []string{
		strings.Replace(name, "hf-unit-", "hf-other-", 1), p.nativeSeedName(123), p.diskName(123), "hf-unit-0-abcdefabcdef.iso", "x.iso",
	} {
		if _, _, ok := p.parseISOName(other); ok {
			t.Errorf("parseISOName(%q) accepts a name that is not the install's ISO", other)
		}
	}
}

func TestFactorySettings(t *testing.T) {
	cases := []struct {
		name    string
		mutate  func(*provider.ClusterConfig)
		wantErr string
	}{
		{name: "no settings", mutate: func(c *provider.ClusterConfig) { c.Settings = nil }, wantErr: "spec.libvirt"},
		{name: "wrong type", mutate: func(c *provider.ClusterConfig) { c.Settings = ClusterSettings{} }, wantErr: "spec.libvirt"},
		{name: "no hosts", mutate: func(c *provider.ClusterConfig) { c.Settings.(*ClusterSettings).Hosts = nil }, wantErr: "spec.libvirt.hosts"},
		{name: "no pool", mutate: func(c *provider.ClusterConfig) { c.Settings.(*ClusterSettings).VolumePool = "" }, wantErr: "spec.libvirt.volumePool"},
		{name: "not qemu", mutate: func(c *provider.ClusterConfig) { c.Settings.(*ClusterSettings).Hosts[0].URI = "xen:///system" }, wantErr: "uri"},
		{name: "tls without client certificate", mutate: func(c *provider.ClusterConfig) {
			c.Settings.(*ClusterSettings).Hosts[0].URI = "qemu+tls://kvm1.example.com/system"
		}, wantErr: "client certificate"},
		{name: "ssh without key", mutate: func(c *provider.ClusterConfig) {
			c.Settings.(*ClusterSettings).Hosts[0].URI = "qemu+ssh://root@kvm1.example.com/system"
		}, wantErr: "sshPrivateKey"},
		{name: "bad id range", mutate: func(c *provider.ClusterConfig) { c.VMIDStart = 0 }, wantErr: "VM id range"},
		{name: "fine", mutate: func(*provider.ClusterConfig) {}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cfg := provider.ClusterConfig{Name: "lab", VMIDStart: 1, VMIDEnd: 9, Settings: &ClusterSettings{
				Hosts: []Host{{Name: "h1", URI: "qemu:///system"}}, VolumePool: "vms"}}
			c.mutate(&cfg)
			_, err := Factory.New(cfg, provider.Deps{Signer: testSigner(t)})
			if c.wantErr == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), c.wantErr) || provider.Classify(err) != provider.ClassConfiguration {
				t.Errorf("New: %v, want a configuration error naming %q", err, c.wantErr)
			}
		})
	}
	for _, c := range []struct {
		src  provider.TemplateSource
		want string
	}{
		{provider.TemplateSource{Settings: &TemplateRef{Domain: "y"}}, "y"},
		{provider.TemplateSource{Settings: (&TemplateRef{}).FromRecord(provider.SourceRecord{Name: "x"})}, "x"},
		{provider.TemplateSource{Settings: (&TemplateRef{}).FromRecord(provider.SourceRecord{Number: 7})}, "with id 7"},
	} {
		if ref, err := templateRef(c.src); err != nil || ref.String() != c.want {
			t.Errorf("templateRef(%+v) = %v, %v; want %s", c.src, ref, err, c.want)
		}
	}
	for _, src := range []provider.TemplateSource{{}, {Settings: TemplateRef{Domain: "y"}}} {
		if _, err := templateRef(src); err == nil || !strings.Contains(err.Error(), "source.libvirt") || provider.Classify(err) != provider.ClassConfiguration {
			t.Errorf("templateRef(%+v): %v, want a configuration error naming source.libvirt", src, err)
		}
	}
}

func TestNativeSeed(t *testing.T) {
	spec := &provider.VMSpec{Name: "vm-1", Owner: provider.Owner{UID: "u"}, Network: provider.NetworkSpec{MACAddress: "02:00:00:00:00:01"},
		Native: &provider.NativeCloudInit{IPv4: "192.0.2.10/24", Gateway4: "192.0.2.1", IPv6: "auto", Nameservers: []string{"192.0.2.53"},
			SearchDomains: []string{"ci.example.com"}, User: "ci", SSHAuthorizedKeys: []string{"ssh-ed25519 AAAA key"}}}
	ci, err := nativeSeed(spec, 5)
	if err != nil {
		t.Fatal(err)
	}
	for what, want := range map[string][]string{
		string(ci.UserData):      {"#cloud-config", "name: ci", "ssh-ed25519 AAAA key"},
		string(ci.NetworkConfig): {"192.0.2.10/24", "gateway4: 192.0.2.1", "dhcp6: true", `macaddress: "02:00:00:00:00:01"`, "ci.example.com"},
		string(ci.MetaData):      {"local-hostname: vm-1", "instance-id: u-5"},
	} {
		for _, w := range want {
			if !strings.Contains(what, w) {
				t.Errorf("seed part %q lacks %q", what, w)
			}
		}
	}
}

func TestSummaryNames(t *testing.T) {
	p := testProvider(t, nil)
	h := p.hostNamed("h1")
	clone := &domain{host: h, dom: golibvirt.Domain{Name: p.signer.VMName(120)}, meta: vmMeta{ID: 120}, state: golibvirt.DomainShutoff}
	clone.xml, _ = parseDomain("<domain><name>" + clone.dom.Name + "</name></domain>")
	s := p.summary(clone)
	if !s.InstallNamed || s.OperatorTagged || s.Name != p.signer.VMName(120) || s.Power != provider.PowerStopped {
		t.Errorf("unconfigured clone: %+v", s)
	}
	clone.xml.Title, clone.meta.Tags, clone.state = "hf-ci-1", p.signer.Tags(), golibvirt.DomainRunning
	s = p.summary(clone)
	if s.InstallNamed || !s.OperatorTagged || s.Name != "hf-ci-1" || s.Power != provider.PowerRunning {
		t.Errorf("configured VM: %+v", s)
	}
	tmpl := &domain{host: h, dom: golibvirt.Domain{Name: "template", UUID: golibvirt.UUID{0x80, 0, 0, 0x2a}}, metaErr: errNoMeta, state: golibvirt.DomainShutoff}
	tmpl.xml, _ = parseDomain("<domain><name>template</name></domain>")
	if s := p.summary(tmpl); !s.Template || s.ID != FormatID(0x2b) || s.OperatorTagged || s.InstallNamed {
		t.Errorf("template: %+v, want a template at its UUID's number", s)
	}
	tmpl.state = golibvirt.DomainRunning
	if s := p.summary(tmpl); s.Template {
		t.Errorf("a running domain of no install: %+v, want no template", s)
	}
}

// TestHasRunSince: a shut-off domain has run when the events saw it stop
// (not a failed start), when libvirt's shut-off reason is one a run
// leaves, or when its seed was ejected (only done once it ran).
func TestHasRunSince(t *testing.T) {
	p := testProvider(t, nil)
	h := p.hostNamed("h1")
	attached, _ := parseDomain(`<domain><name>vm</name><devices><disk type='volume' device='cdrom'><source pool='media' volume='seed.iso'/><target dev='sda' bus='scsi'/></disk></devices></domain>`)
	ejected, _ := parseDomain(`<domain><name>vm</name><devices><disk type='file' device='cdrom'><target dev='sda' bus='scsi'/></disk></devices></domain>`)
	cases := []struct {
		name   string
		reason golibvirt.DomainShutoffReason
		xml    *libvirtxml.Domain
		event  *golibvirt.DomainEventStoppedDetailType
		want   bool
	}{
		{name: "defined, never started", reason: golibvirt.DomainShutoffUnknown, xml: attached},
		{name: "start failed", reason: golibvirt.DomainShutoffFailed, xml: attached},
		{name: "powered off from inside", reason: golibvirt.DomainShutoffShutdown, xml: attached, want: true},
		{name: "destroyed", reason: golibvirt.DomainShutoffDestroyed, xml: attached, want: true},
		{name: "seed ejected, reason lost in a libvirtd restart", reason: golibvirt.DomainShutoffUnknown, xml: ejected, want: true},
		{name: "stop event", reason: golibvirt.DomainShutoffUnknown, xml: attached, event: ptr(golibvirt.DomainEventStoppedShutdown), want: true},
		{name: "failed-start event", reason: golibvirt.DomainShutoffUnknown, xml: attached, event: ptr(golibvirt.DomainEventStoppedFailed)},
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			name := fmt.Sprintf("vm-%d", i)
			if c.event != nil {
				p.lifecycle("h1", name, golibvirt.DomainEventStopped, int32(*c.event))
			}
			d := &domain{host: h, dom: golibvirt.Domain{Name: name}, xml: c.xml, meta: vmMeta{ID: 1, Medium: "seed.iso"}, state: golibvirt.DomainShutoff, reason: int32(c.reason)}
			if got := p.hasRunSince(d); got != c.want {
				t.Errorf("hasRunSince = %v, want %v", got, c.want)
			}
		})
	}
}

func ptr[T any](v T) *T { return &v }

// TestKeptShutdown: a shutdown the guest agent did not take is issued
// again when the agent connects, once, unless the domain stopped, was
// undefined or was powered on or off by the provider in between.
func TestKeptShutdown(t *testing.T) {
	const key = "h1/vm"
	stopped := func(p *Provider) {
		p.lifecycle("h1", "vm", golibvirt.DomainEventStopped, int32(golibvirt.DomainEventStoppedShutdown))
	}
	cases := []struct {
		name    string
		between func(p *Provider)
		want    bool
	}{
		{name: "agent connects while running", between: func(*Provider) {}, want: true},
		{name: "domain stopped first", between: stopped},
		{name: "domain undefined first", between: func(p *Provider) { p.lifecycle("h1", "vm", golibvirt.DomainEventUndefined, 0) }},
		{name: "powered on or off by the provider", between: func(p *Provider) { p.keepShutdown(key, false) }},
		{name: "failed start keeps it", between: func(p *Provider) {
			p.lifecycle("h1", "vm", golibvirt.DomainEventStopped, int32(golibvirt.DomainEventStoppedFailed))
		}, want: true},
		{name: "another domain's events", between: func(p *Provider) {
			p.lifecycle("h1", "other", golibvirt.DomainEventStopped, int32(golibvirt.DomainEventStoppedShutdown))
			p.agentConnected("h2/vm")
		}, want: true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := testProvider(t, nil)
			if p.agentConnected(key) {
				t.Fatal("a shutdown is due that nobody asked for")
			}
			p.keepShutdown(key, true)
			c.between(p)
			if got := p.agentConnected(key); got != c.want {
				t.Errorf("shutdown due at the agent's connection: %v, want %v", got, c.want)
			}
			if p.agentConnected(key) {
				t.Error("a kept shutdown is issued a second time")
			}
		})
	}
}

// TestStorageKey: hosts that define the same network pool (an NFS export,
// a Ceph pool) share its free space, which the cluster's total counts
// once; a directory pool is each host's own.
func TestStorageKey(t *testing.T) {
	nfs := func(server, dir string) string {
		return `<pool type='netfs'><name>vms</name><source><host name='` + server + `'/><dir path='` + dir + `'/><format type='nfs'/></source><target><path>/var/lib/vms</path></target></pool>`
	}
	dir := `<pool type='dir'><name>vms</name><target><path>/var/lib/vms</path></target></pool>`
	rbd := `<pool type='rbd'><name>vms</name><source><name>ci-pool</name><host name='mon1' port='6789'/><host name='mon2' port='6789'/></source></pool>`
	rbdOtherOrder := `<pool type='rbd'><name>vms</name><source><name>ci-pool</name><host name='mon2' port='6789'/><host name='MON1' port='6789'/></source></pool>`
	same := [][2]string{
		{storageKey("h1", "vms", nfs("nas", "/export/vms")), storageKey("h2", "vms", nfs("nas", "/export/vms/"))},
		{storageKey("h1", "vms", rbd), storageKey("h2", "vms", rbdOtherOrder)},
	}
	for _, pair := range same {
		if pair[0] != pair[1] {
			t.Errorf("one shared storage, two keys: %q and %q", pair[0], pair[1])
		}
	}
	apart := [][2]string{
		{storageKey("h1", "vms", dir), storageKey("h2", "vms", dir)},
		{storageKey("h1", "vms", nfs("nas", "/export/a")), storageKey("h2", "vms", nfs("nas", "/export/b"))},
		{storageKey("h1", "vms", nfs("nas1", "/export/vms")), storageKey("h2", "vms", nfs("nas2", "/export/vms"))},
		{storageKey("h1", "vms", "not xml"), storageKey("h2", "vms", "not xml")},
	}
	for _, pair := range apart {
		if pair[0] == pair[1] {
			t.Errorf("two storages, one key: %q", pair[0])
		}
	}
}

package libvirt

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"libvirt.org/go/libvirtxml"

	"github.com/hyperfleet/hyperfleet/pkg/provider"
)

// cpuDomain is a template's definition whose CPU is cpu.
func cpuDomain(cpu *libvirtxml.DomainCPU) *libvirtxml.Domain {
	return &libvirtxml.Domain{Type: "kvm", Name: "t", CPU: cpu, Devices: &libvirtxml.DomainDeviceList{}}
}

func TestApplyCPU(t *testing.T) {
	intel := hostCPU{host: "kvm1", vendor: "Intel", models: []string{"Skylake-Client", "EPYC", "x86-64-v2"}}
	amd := hostCPU{host: "kvm2", vendor: "AMD", models: []string{"EPYC"}}
	topology := &libvirtxml.DomainCPU{Mode: "custom", Match: "exact", Model: &libvirtxml.DomainCPUModel{Value: "qemu64"},
		Topology: &libvirtxml.DomainCPUTopology{Sockets: 1, Dies: 1, Cores: 2, Threads: 1}}
	cases := []struct {
		name   string
		cpu    *libvirtxml.DomainCPU
		hw     provider.Hardware
		host   hostCPU
		want   []string // substrings of the <cpu> written
		absent []string
		reason string
	}{
		{name: "host passes the CPU through", cpu: topology, hw: provider.Hardware{CPUType: "host"}, host: intel,
			want: []string{`<cpu mode="host-passthrough">`, `cores="2"`}, absent: []string{"<model", "match="}},
		{name: "a model is exact", hw: provider.Hardware{CPUType: "Skylake-Client"}, host: intel,
			want: []string{`<cpu match="exact" mode="custom">`, `<model fallback="forbid">Skylake-Client</model>`}},
		{name: "an unknown model is refused", hw: provider.Hardware{CPUType: "Cray-1"}, host: intel, reason: reasonCPUTypeUnsupported,
			want: []string{"kvm1", `"Cray-1"`}},
		{name: "flags require and disable", hw: provider.Hardware{CPUType: "x86-64-v2", CPUFlags: []string{"+aes", "-hle"}}, host: intel,
			want: []string{`<feature policy="require" name="aes">`, `<feature policy="disable" name="hle">`}},
		{name: "a flag replaces the template's word on it", cpu: &libvirtxml.DomainCPU{Mode: "custom", Model: &libvirtxml.DomainCPUModel{Value: "EPYC"},
			Features: []libvirtxml.DomainCPUFeature{{Policy: "require", Name: "aes"}}}, hw: provider.Hardware{CPUFlags: []string{"-aes"}}, host: amd,
			want: []string{`<feature policy="disable" name="aes">`, ">EPYC<"}, absent: []string{`policy="require"`}},
		{name: "nested without a type passes through", hw: provider.Hardware{NestedVirtualization: true}, host: intel,
			want: []string{`mode="host-passthrough"`}, absent: []string{"vmx"}},
		{name: "nested on a model requires vmx on Intel", hw: provider.Hardware{CPUType: "EPYC", NestedVirtualization: true}, host: intel,
			want: []string{`<feature policy="require" name="vmx">`}},
		{name: "nested on a model requires svm on AMD", hw: provider.Hardware{CPUType: "EPYC", NestedVirtualization: true}, host: amd,
			want: []string{`<feature policy="require" name="svm">`}},
		{name: "nested on a model of an unknown vendor is refused", hw: provider.Hardware{CPUType: "EPYC", NestedVirtualization: true},
			host: hostCPU{host: "arm1", vendor: "ARM", models: []string{"EPYC"}}, reason: reasonCPUTypeUnsupported, want: []string{"arm1", "ARM"}},
		{name: "flags on a passed-through CPU", hw: provider.Hardware{CPUType: "host", CPUFlags: []string{"-svm"}}, host: amd,
			want: []string{`mode="host-passthrough"`, `<feature policy="disable" name="svm">`}},
		{name: "an unusable model is refused", hw: provider.Hardware{CPUType: "Skylake-Client", CPUFlags: []string{"-hle"}},
			host:   hostCPU{host: "kvm2", vendor: "AMD", models: []string{"Skylake-Client"}, blockers: map[string][]string{"Skylake-Client": {"hle", "rtm"}}},
			reason: reasonCPUTypeUnsupported, want: []string{"kvm2", "rtm"}},
		{name: "a model usable once its blockers are disabled", hw: provider.Hardware{CPUType: "Skylake-Client", CPUFlags: []string{"-hle", "-rtm"}},
			host: hostCPU{host: "kvm2", vendor: "AMD", models: []string{"Skylake-Client"}, blockers: map[string][]string{"Skylake-Client": {"hle", "rtm"}}},
			want: []string{">Skylake-Client<", `<feature policy="disable" name="rtm">`}},
		{name: "a model unusable for no listed reason is refused", hw: provider.Hardware{CPUType: "EPYC"},
			host:   hostCPU{host: "kvm1", vendor: "Intel", models: []string{"EPYC"}, blockers: map[string][]string{"EPYC": {}}},
			reason: reasonCPUTypeUnsupported, want: []string{"kvm1", "cannot run"}},
		{name: "flags alone need a model", hw: provider.Hardware{CPUFlags: []string{"+aes"}}, host: intel, reason: reasonCPUTypeUnsupported,
			want: []string{"kvm1", "+aes"}},
		{name: "flags alone on a host-model template", cpu: &libvirtxml.DomainCPU{Mode: "host-model"}, hw: provider.Hardware{CPUFlags: []string{"+pcid"}}, host: intel,
			want: []string{`mode="host-model"`, `name="pcid"`}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			d := cpuDomain(c.cpu)
			err := applyCPU(d, &c.hw, c.host)
			if c.reason != "" {
				if provider.ReasonOf(err) != c.reason || provider.Classify(err) != provider.ClassConfiguration {
					t.Fatalf("err %v, want ClassConfiguration %s", err, c.reason)
				}
				for _, w := range c.want {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("error %q does not name %s", err, w)
					}
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			doc, err := d.Marshal()
			if err != nil {
				t.Fatal(err)
			}
			xmlHolds(t, doc, c.want, c.absent)
			if c.cpu != nil && len(c.cpu.Features) > 0 && c.cpu.Features[0].Policy != "require" {
				t.Error("applyCPU wrote into the template's CPU")
			}
		})
	}
}

// xmlHolds checks that doc holds each of want and none of absent.
func xmlHolds(t *testing.T, doc string, want, absent []string) {
	t.Helper()
	for _, w := range want {
		if !strings.Contains(doc, w) {
			t.Errorf("XML lacks %s:\n%s", w, doc)
		}
	}
	for _, a := range absent {
		if strings.Contains(doc, a) {
			t.Errorf("XML holds %s:\n%s", a, doc)
		}
	}
}

func TestPCIAddress(t *testing.T) {
	for in, want := range map[string]string{"0000:01:00.0": "0000:01:00.0", "0000:AF:1f.7": "0000:af:1f.7"} {
		a, err := parsePCI(in)
		if err != nil || a.String() != want {
			t.Errorf("parsePCI(%s) = %s, %v; want %s", in, a, err, want)
		}
	}
	for _, bad := range []string{"", "01:00.0", "0000:01:00.8", "0000:01:00", "0000:01:00.0x", "zzzz:01:00.0"} {
		if _, err := parsePCI(bad); err == nil {
			t.Errorf("parsePCI(%q) accepted", bad)
		}
	}
}

func TestHostdevXML(t *testing.T) {
	d := cpuDomain(nil)
	if err := addHostdevs(d, []string{"0000:65:00.1"}); err != nil {
		t.Fatal(err)
	}
	doc, err := d.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	xmlHolds(t, doc, []string{`<hostdev mode="subsystem" type="pci" managed="yes">`, `<source>`,
		`<address domain="0x0000" bus="0x65" slot="0x00" function="0x1">`}, nil)
	back, err := parseDomain(doc)
	if err != nil {
		t.Fatal(err)
	}
	if held := heldDevices([]*libvirtxml.Domain{back}); len(held) != 1 || !held["0000:65:00.1"] {
		t.Errorf("held devices read back: %v", held)
	}
}

func TestCheckDevices(t *testing.T) {
	hosts := []Host{{Name: "h1"}, {Name: "h2"}}
	cases := []struct {
		name    string
		devices []Device
		bad     string
	}{
		{name: "good", devices: []Device{{"gpu", "h1", "0000:01:00.0"}, {"gpu", "h2", "0000:01:00.0"}}},
		{name: "unknown host", devices: []Device{{"gpu", "h3", "0000:01:00.0"}}, bad: "h3"},
		{name: "bad address", devices: []Device{{"gpu", "h1", "1:0.0"}}, bad: "1:0.0"},
		{name: "twice on a host", devices: []Device{{"gpu", "h1", "0000:01:00.0"}, {"nic", "h1", "0000:01:00.0"}}, bad: "twice"},
	}
	for _, c := range cases {
		err := checkDevices(c.devices, hosts)
		if (err != nil) != (c.bad != "") || err != nil && !strings.Contains(err.Error(), c.bad) {
			t.Errorf("%s: %v, want an error naming %q", c.name, err, c.bad)
		}
	}
}

// TestDeviceAssignment: placements never give one device to two VMs,
// whether the other holds it in a placement in flight or in a domain's
// definition, which is what a provider started anew reads; an unknown
// mapping is DeviceMappingNotFound, a mapping with no device left is
// capacity.
func TestDeviceAssignment(t *testing.T) {
	devices := []Device{{"gpu", "h1", "0000:01:00.0"}, {"gpu", "h1", "0000:02:00.0"}, {"gpu", "h2", "0000:01:00.0"}, {"nic", "h2", "0000:03:00.0"}}
	type claim struct {
		want []string
		// host and addrs are where it must go; empty host: refused with
		// reason.
		host   string
		addrs  []string
		reason string
	}
	cases := []struct {
		name string
		// before are devices the hosts' domains pass through already.
		before map[string][]string
		// claims are placed in order; restart starts a new provider
		// after claim i (reading what the claims before defined).
		claims  []claim
		restart int
	}{
		{name: "the hosts' devices in turn", restart: -1, claims: []claim{
			{want: []string{"gpu"}, host: "h1", addrs: []string{"0000:01:00.0"}},
			{want: []string{"gpu"}, host: "h2", addrs: []string{"0000:01:00.0"}}, // the most free memory
			{want: []string{"gpu"}, host: "h1", addrs: []string{"0000:02:00.0"}},
			{want: []string{"gpu"}, reason: "InsufficientCapacity"},
		}},
		{name: "two of a mapping on one host", restart: -1, claims: []claim{
			{want: []string{"gpu", "gpu"}, host: "h1", addrs: []string{"0000:01:00.0", "0000:02:00.0"}},
			{want: []string{"gpu", "gpu"}, reason: "InsufficientCapacity"},
			{want: []string{"gpu", "nic"}, host: "h2", addrs: []string{"0000:01:00.0", "0000:03:00.0"}},
		}},
		{name: "domains' devices are taken", before: map[string][]string{"h1": {"0000:01:00.0", "0000:02:00.0"}}, restart: -1, claims: []claim{
			{want: []string{"gpu"}, host: "h2", addrs: []string{"0000:01:00.0"}},
			{want: []string{"gpu"}, reason: "InsufficientCapacity"},
		}},
		{name: "an unknown mapping", restart: -1, claims: []claim{{want: []string{"gpu", "fpga"}, reason: reasonDeviceMappingNotFound}}},
		{name: "across a restart", restart: 1, claims: []claim{
			{want: []string{"gpu"}, host: "h1", addrs: []string{"0000:01:00.0"}},
			{want: []string{"gpu"}, host: "h2", addrs: []string{"0000:01:00.0"}}, // the most free memory
			{want: []string{"gpu"}, host: "h1", addrs: []string{"0000:02:00.0"}},
			{want: []string{"gpu"}, reason: "InsufficientCapacity"},
		}},
		{name: "a restart with placements in flight and none defined", restart: 0, claims: []claim{
			{want: []string{"gpu", "gpu"}, host: "h1", addrs: []string{"0000:01:00.0", "0000:02:00.0"}},
			{want: []string{"gpu"}, host: "h2", addrs: []string{"0000:01:00.0"}},
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			newProvider := func() *Provider {
				return testProvider(t, func(_ *provider.ClusterConfig, s *ClusterSettings) { s.Devices = devices })
			}
			p := newProvider()
			// defined are the domains' definitions by host, as a scan reads
			// them.
			defined := map[string][]*libvirtxml.Domain{}
			for h, addrs := range c.before {
				d := cpuDomain(nil)
				if err := addHostdevs(d, addrs); err != nil {
					t.Fatal(err)
				}
				defined[h] = append(defined[h], d)
			}
			given := map[string]string{} // host/address → claim
			for i, cl := range c.claims {
				s := &clusterScan{used: map[int]bool{}, machines: map[int]bool{}, unreachable: map[string]error{}, devices: map[string]map[string]bool{}}
				for _, h := range []string{"h1", "h2"} {
					s.hosts = append(s.hosts, hostState{name: h, availableBytes: 64 << 30, template: true})
					s.devices[h] = heldDevices(defined[h])
				}
				o := provider.Owner{UID: fmt.Sprintf("claim-%d", i)}
				err := p.checkMappings(cl.want)
				var r *reservation
				if err == nil {
					r, err = p.reserve(s, o, 1<<30, cl.want)
				}
				if cl.reason != "" {
					if provider.ReasonOf(err) != cl.reason {
						t.Fatalf("claim %d: %v, want reason %s", i, err, cl.reason)
					}
					if cl.reason == "InsufficientCapacity" && !errors.Is(err, provider.ErrNoCapacity) {
						t.Errorf("claim %d: %v is not ErrNoCapacity", i, err)
					}
					continue
				}
				if err != nil {
					t.Fatalf("claim %d: %v", i, err)
				}
				if r.host != cl.host || strings.Join(r.devices, " ") != strings.Join(cl.addrs, " ") {
					t.Errorf("claim %d: host %s devices %v, want %s %v", i, r.host, r.devices, cl.host, cl.addrs)
				}
				for _, a := range r.devices {
					if prev, ok := given[r.host+"/"+a]; ok {
						t.Errorf("claim %d got device %s/%s of %s", i, r.host, a, prev)
					}
					given[r.host+"/"+a] = o.UID
				}
				if i == c.restart {
					// The claims so far defined their domains; a new
					// provider knows only those.
					for _, rr := range p.reservations {
						d := cpuDomain(nil)
						if err := addHostdevs(d, rr.devices); err != nil {
							t.Fatal(err)
						}
						defined[rr.host] = append(defined[rr.host], d)
					}
					p = newProvider()
				}
			}
		})
	}
}

func TestExtraDisks(t *testing.T) {
	p := testProvider(t, nil)
	d := &libvirtxml.Domain{Devices: &libvirtxml.DomainDeviceList{Disks: []libvirtxml.DomainDisk{
		{Device: "disk", Source: &libvirtxml.DomainDiskSource{Volume: &libvirtxml.DomainDiskSourceVolume{Pool: "vms", Volume: p.diskName(7)}},
			Target: &libvirtxml.DomainDiskTarget{Dev: "vda", Bus: "virtio"}},
		{Device: "cdrom", Target: &libvirtxml.DomainDiskTarget{Dev: "vdb", Bus: "sata"}},
	}}}
	disks := []extraDisk{{pool: "vms", volume: p.extraDiskName(7, 1, "qcow2"), format: "qcow2"}, {pool: "lvm", volume: p.extraDiskName(7, 2, "raw"), format: "raw"}}
	if err := addExtraDisks(d, disks); err != nil {
		t.Fatal(err)
	}
	doc, err := d.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	xmlHolds(t, doc, []string{`<source pool="vms" volume="` + disks[0].volume + `">`, `<target dev="vdc" bus="virtio">`, `<driver name="qemu" type="raw">`,
		`<source pool="lvm" volume="` + disks[1].volume + `">`, `<target dev="vdd" bus="virtio">`}, nil)
	x, err := parseDomain(doc)
	if err != nil {
		t.Fatal(err)
	}
	dom := &domain{xml: x, meta: vmMeta{ID: 7}}
	if got := p.extraDisksOf(dom); len(got) != 2 || got[0] != disks[0] || got[1] != disks[1] {
		t.Errorf("extra disks read back: %+v", got)
	}
	if pool, vol := p.diskOf(dom); pool != "vms" || vol != p.diskName(7) {
		t.Errorf("boot disk beside extra disks: %s/%s", pool, vol)
	}
	for name, want := range map[string]int{p.extraDiskName(7, 12, "raw"): 12, p.extraDiskName(8, 1, "qcow2"): 0, p.diskName(7): 0,
		p.extraDiskPrefix(7) + "01.qcow2": 0, p.extraDiskPrefix(7) + "1": 0} {
		if got := p.extraDiskNumber(7, name); got != want {
			t.Errorf("extraDiskNumber(%s) = %d, want %d", name, got, want)
		}
	}
	for typ, want := range map[string]string{"dir": "qcow2", "netfs": "qcow2", "logical": "raw", "rbd": "raw", "zfs": "raw"} {
		if got := volumeFormat(typ); got != want {
			t.Errorf("volumeFormat(%s) = %s, want %s", typ, got, want)
		}
	}
}

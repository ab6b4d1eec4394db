package libvirt

import (
	"reflect"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/resource"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/pkg/provider"
)

func libvirtCluster() *hfv1.HypervisorCluster {
	c := &hfv1.HypervisorCluster{}
	c.Name = "lab"
	c.Spec.Provider = hfv1.ProviderLibvirt
	c.Spec.Libvirt = &hfv1.LibvirtClusterSettings{
		Hosts: []hfv1.LibvirtHost{
			{Name: "kvm1", URI: "qemu+tls://kvm1.example.com/system", ReservedMemory: ptr(resource.MustParse("4Gi"))},
			{Name: "kvm2", URI: "qemu+ssh://hf@kvm2.example.com/system"},
		},
		VolumePool: "vms", MediaPool: "seeds", Network: "ci", FullCopies: true,
		Devices: []hfv1.LibvirtDevice{{Name: "gpu", Host: "kvm2", Address: "0000:01:00.0"}},
		SSH: &hfv1.LibvirtSSH{
			PrivateKeyRef: hfv1.SecretKeySelector{Namespace: "hf", Name: "kvm-ssh", Key: "id_ed25519"},
			KnownHostsRef: hfv1.SecretKeySelector{Namespace: "hf", Name: "kvm-ssh", Key: "known_hosts"},
		},
	}
	return c
}

// TestKindReadsItsCluster: spec.libvirt becomes the provider's
// ClusterSettings, with the ssh Secrets handed back by field; the
// machine numbers are the default block.
func TestKindReadsItsCluster(t *testing.T) {
	c := libvirtCluster()
	cfg := provider.ClusterConfig{Name: c.Name, DefaultBridge: c.Spec.DefaultBridge}
	if err := Kind.ReadCluster(c, &cfg); err != nil {
		t.Fatal(err)
	}
	sk := Kind.(interface {
		SectionSecretRefs(*hfv1.HypervisorCluster) map[string]*hfv1.SecretKeySelector
		ReadSectionSecrets(*provider.ClusterConfig, map[string][]byte) error
	})
	refs := sk.SectionSecretRefs(c)
	if len(refs) != 2 || refs[fieldSSHPrivateKey].Key != "id_ed25519" || refs[fieldSSHKnownHosts].Key != "known_hosts" {
		t.Fatalf("SectionSecretRefs = %v", refs)
	}
	if err := sk.ReadSectionSecrets(&cfg, map[string][]byte{fieldSSHPrivateKey: []byte("KEY"), fieldSSHKnownHosts: []byte("HOSTS")}); err != nil {
		t.Fatal(err)
	}
	want := &ClusterSettings{
		Hosts: []Host{
			{Name: "kvm1", URI: "qemu+tls://kvm1.example.com/system", ReservedMemoryBytes: 4 << 30},
			{Name: "kvm2", URI: "qemu+ssh://hf@kvm2.example.com/system"},
		},
		VolumePool: "vms", MediaPool: "seeds", Network: "ci", FullCopies: true,
		Devices:       []Device{{Mapping: "gpu", Host: "kvm2", Address: "0000:01:00.0"}},
		SSHPrivateKey: []byte("KEY"), SSHKnownHosts: []byte("HOSTS"),
	}
	if !reflect.DeepEqual(cfg.Settings, want) {
		t.Fatalf("Settings = %+v, want %+v", cfg.Settings, want)
	}
	if cfg.VMIDStart != firstMachineNumber || cfg.VMIDEnd != lastMachineNumber {
		t.Fatalf("numbers %d-%d, want %d-%d", cfg.VMIDStart, cfg.VMIDEnd, firstMachineNumber, lastMachineNumber)
	}

	c.Spec.Libvirt.SSH = nil
	if refs := sk.SectionSecretRefs(c); len(refs) != 0 {
		t.Fatalf("a cluster without ssh references %v", refs)
	}
	if err := sk.ReadSectionSecrets(&provider.ClusterConfig{}, nil); err == nil {
		t.Fatal("Secrets read into a configuration ReadCluster did not fill were accepted")
	}
	c.Spec.Libvirt = nil
	if err := Kind.ReadCluster(c, &cfg); err == nil || !strings.Contains(err.Error(), "spec.libvirt") {
		t.Fatalf("ReadCluster without spec.libvirt = %v, want an error naming spec.libvirt", err)
	}
}

// TestKindBuildsProviders: what ReadCluster reads is what the Factory
// builds a provider from (a local socket needs no credentials).
func TestKindBuildsProviders(t *testing.T) {
	c := libvirtCluster()
	c.Spec.Libvirt.Hosts = []hfv1.LibvirtHost{{Name: "local", URI: "qemu:///system?socket=/run/libvirt/libvirt-sock"}}
	c.Spec.Libvirt.SSH = nil
	cfg := provider.ClusterConfig{Name: c.Name}
	if err := Kind.ReadCluster(c, &cfg); err != nil {
		t.Fatal(err)
	}
	if _, err := Kind.New(cfg, provider.Deps{Signer: testSigner(t)}); provider.ReasonOf(err) != "InvalidSettings" || !strings.Contains(err.Error(), "spec.libvirt.devices") {
		t.Fatalf("New with a device on a host the cluster lacks = %v, want InvalidSettings naming spec.libvirt.devices", err)
	}
	c.Spec.Libvirt.Devices[0].Host = "local"
	if err := Kind.ReadCluster(c, &cfg); err != nil {
		t.Fatal(err)
	}
	if _, err := Kind.New(cfg, provider.Deps{Signer: testSigner(t)}); err != nil {
		t.Fatalf("New(ReadCluster's configuration) = %v", err)
	}
}

// TestKindReadsItsSource: source.libvirt becomes a TemplateRef; a
// template without it is not libvirt's; the hash input is the section.
func TestKindReadsItsSource(t *testing.T) {
	tmpl := &hfv1.HypervisorMachineTemplate{}
	tmpl.Spec.Source.Proxmox.TemplateName = "debian"
	if Kind.ReadsTemplate(tmpl) {
		t.Fatal("a template with source.proxmox only is read as libvirt's")
	}
	tmpl.Spec.Source = hfv1.MachineSource{Libvirt: &hfv1.LibvirtSource{Domain: "debian-12", Host: "kvm1"}}
	src := Kind.ReadSource(tmpl)
	if !Kind.ReadsTemplate(tmpl) || !src.Linked || !reflect.DeepEqual(src.Settings, &TemplateRef{Domain: "debian-12", Host: "kvm1"}) {
		t.Fatalf("ReadSource = %+v", src)
	}
	if Kind.NativeCloudInit(tmpl) != nil {
		t.Fatal("libvirt has no cloud-init of its own")
	}
	source, native, err := Kind.HashInput(tmpl)
	if err != nil || string(source) != `{"domain":"debian-12","host":"kvm1"}` || native != nil {
		t.Fatalf("HashInput = %s, %s, %v", source, native, err)
	}
}

// TestKindTenancy: the rule's name entries are domains, its storages
// bound the cluster's pools and its bridges the cluster's network.
func TestKindTenancy(t *testing.T) {
	c := libvirtCluster()
	tmpl := &hfv1.HypervisorMachineTemplate{}
	tmpl.Spec.Source.Libvirt = &hfv1.LibvirtSource{Domain: "debian-12"}
	for _, tc := range []struct {
		name string
		rule hfv1.TenancyRule
		want []string
	}{
		{name: "allowed", rule: hfv1.TenancyRule{Templates: []hfv1.AllowedTemplate{{Name: "debian-12"}}}},
		{name: "allowed with its pools and network", rule: hfv1.TenancyRule{Templates: []hfv1.AllowedTemplate{{Name: "debian-12"}}, Storages: []string{"vms", "seeds"}, Bridges: []string{"ci"}}},
		{name: "another domain", rule: hfv1.TenancyRule{Templates: []hfv1.AllowedTemplate{{Name: "ubuntu"}, {ID: ptr(int32(9000))}}},
			want: []string{`spec.source.libvirt.domain "debian-12" is not allowed; allowed domains (tenancy templates name entries): ubuntu`}},
		{name: "ids only", rule: hfv1.TenancyRule{Templates: []hfv1.AllowedTemplate{{ID: ptr(int32(9000))}}},
			want: []string{`spec.source.libvirt.domain "debian-12" is not allowed; allowed domains (tenancy templates name entries): none`}},
		{name: "pools and network not listed", rule: hfv1.TenancyRule{Templates: []hfv1.AllowedTemplate{{Name: "debian-12"}}, Storages: []string{"vms"}, Bridges: []string{"br0"}},
			want: []string{
				"the cluster's spec.libvirt.mediaPool seeds is not allowed; allowed storages: vms",
				"the cluster's spec.libvirt.network ci is not allowed; allowed bridges and networks: br0",
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := Kind.TenancyViolations(tmpl, c, &tc.rule); !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("TenancyViolations = %q, want %q", got, tc.want)
			}
		})
	}
}

// TestKindSpeaksLibvirt: messages name the domain and host, the advice
// virsh, the guest agent's channel and qcow2 pools.
func TestKindSpeaksLibvirt(t *testing.T) {
	info := &provider.TemplateInfo{ID: 77, Name: "debian-12", Node: "kvm1", Storages: []string{"lvm"}}
	if got := Kind.DescribeTemplate(info); got != "debian-12 (on host kvm1)" {
		t.Fatalf("DescribeTemplate = %q", got)
	}
	for topic, want := range map[provider.AdviceTopic][]string{
		provider.AdviceGuestAgent:  {"virsh edit debian-12", "org.qemu.guest_agent.0", "qemu-guest-agent"},
		provider.AdviceLinkedClone: {"pool lvm", "qcow2", "spec.libvirt.fullCopies"},
		"Unknown":                  nil,
	} {
		got := Kind.Advice(topic, info)
		if (want == nil) != (got == "") {
			t.Fatalf("Advice(%s) = %q", topic, got)
		}
		for _, w := range want {
			if !strings.Contains(got, w) {
				t.Errorf("Advice(%s) = %q, want it to mention %q", topic, got, w)
			}
		}
	}
	if got, want := Kind.ResolvedTemplate(info), (hfv1.ResolvedTemplate{Node: "kvm1", Storage: "lvm"}); got != want {
		t.Fatalf("ResolvedTemplate = %+v, want %+v", got, want)
	}
	if got := Kind.MovedFields(libvirtCluster()); got != nil {
		t.Fatalf("MovedFields = %v", got)
	}
}

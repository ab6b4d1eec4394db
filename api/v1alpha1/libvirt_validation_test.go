package v1alpha1_test

import (
	"context"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
)

// validLibvirtCluster is a cluster of provider libvirt: no endpoint, no
// token, a TLS host with its client certificate and CA, an SSH host with
// its key and known hosts, and a local socket.
func validLibvirtCluster() *unstructured.Unstructured {
	return object("HypervisorCluster", "", map[string]any{
		"provider":    "libvirt",
		"credentials": map[string]any{"clientCert": map[string]any{"name": "kvm-client", "namespace": "hyperfleet-system"}},
		"tls":         map[string]any{"caBundleRef": secretRef("kvm-ca", "ca.crt")},
		"libvirt": map[string]any{
			"hosts": []any{
				map[string]any{"name": "kvm1", "uri": "qemu+tls://kvm1.example.com/system", "reservedMemory": "4Gi"},
				map[string]any{"name": "kvm2", "uri": "qemu+ssh://hyperfleet@kvm2.example.com:2222/system"},
				map[string]any{"name": "local", "uri": "qemu:///system?socket=/run/libvirt/libvirt-sock"},
			},
			"volumePool": "vms",
			"mediaPool":  "seeds",
			"network":    "ci",
			"ssh": map[string]any{
				"privateKeyRef": secretRef("kvm-ssh", "id_ed25519"),
				"knownHostsRef": secretRef("kvm-ssh", "known_hosts"),
			},
		},
	})
}

// validLibvirtTemplate is validGenericTemplate cloning a libvirt domain.
func validLibvirtTemplate() *unstructured.Unstructured {
	u := validGenericTemplate()
	set(map[string]any{"libvirt": map[string]any{"domain": "debian-12", "host": "kvm1"}}, "spec", "source")(u)
	return u
}

// TestLibvirtObjectsAreAccepted: a libvirt cluster and template are
// stored as written and decode strictly into the Go types, whose
// sections are what was written.
func TestLibvirtObjectsAreAccepted(t *testing.T) {
	ctx := context.Background()
	ns := newNamespace(t)
	cluster, tmpl := validLibvirtCluster(), validLibvirtTemplate()
	cluster.SetName("libvirt-accepted")
	tmpl.SetNamespace(ns)
	for _, obj := range []*unstructured.Unstructured{cluster, tmpl} {
		if err := env.Client.Create(ctx, obj, client.FieldValidation("Strict")); err != nil {
			t.Fatalf("the API server rejected the %s: %v", obj.GetKind(), err)
		}
		t.Cleanup(func() { _ = env.Client.Delete(ctx, obj) })
	}
	c := &hfv1.HypervisorCluster{}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructuredWithValidation(cluster.Object, c, true); err != nil {
		t.Fatal(err)
	}
	l := c.Spec.Libvirt
	if c.Spec.Provider != hfv1.ProviderLibvirt || l == nil || len(l.Hosts) != 3 || l.Hosts[0].ReservedMemory.Value() != 4<<30 || l.SSH.KnownHostsRef.Key != "known_hosts" || c.Spec.Endpoint != "" {
		t.Fatalf("stored spec %+v", c.Spec)
	}
	tp := &hfv1.HypervisorMachineTemplate{}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructuredWithValidation(tmpl.Object, tp, true); err != nil {
		t.Fatal(err)
	}
	if src := tp.Spec.Source; src.Libvirt == nil || src.Libvirt.Domain != "debian-12" || src.Libvirt.Host != "kvm1" || src.Proxmox != (hfv1.ProxmoxSource{}) {
		t.Fatalf("stored source %+v", src)
	}
	if _, found, _ := unstructured.NestedFieldNoCopy(tmpl.Object, "spec", "source", "proxmox"); found {
		t.Fatal("the schema defaulted a proxmox section into a libvirt template")
	}
}

// TestGoClientsWriteOneSection: a template and a cluster written from
// the Go types leave the sections they do not set out of the JSON (the
// omitzero proxmox source and credentials), so the one-of rules accept
// them.
func TestGoClientsWriteOneSection(t *testing.T) {
	ctx := context.Background()
	ns := newNamespace(t)
	cluster := &hfv1.HypervisorCluster{Spec: hfv1.HypervisorClusterSpec{
		Provider: hfv1.ProviderLibvirt,
		Libvirt:  &hfv1.LibvirtClusterSettings{Hosts: []hfv1.LibvirtHost{{Name: "local", URI: "qemu:///system?socket=/run/libvirt/libvirt-sock"}}, VolumePool: "default"},
	}}
	cluster.Name = "libvirt-typed"
	if err := env.Client.Create(ctx, cluster); err != nil {
		t.Fatalf("a typed libvirt cluster was rejected: %v", err)
	}
	t.Cleanup(func() { _ = env.Client.Delete(ctx, cluster) })
	u := validLibvirtTemplate()
	typed := &hfv1.HypervisorMachineTemplate{}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, typed); err != nil {
		t.Fatal(err)
	}
	typed.Namespace, typed.Name = ns, "libvirt-typed"
	if err := env.Client.Create(ctx, typed); err != nil {
		t.Fatalf("a typed libvirt template was rejected: %v", err)
	}
	t.Cleanup(func() { _ = env.Client.Delete(ctx, typed) })
}

// libvirtInvalidCases are the rows of TestInvalidObjectsAreRejected for
// the libvirt sections and what they changed (endpoint and credentials
// optional but still required for proxmox; the source a one-of): each
// breaks one rule, and the rejection names the field and the fix.
func libvirtInvalidCases() []invalidCase {
	hosts := []string{"spec", "libvirt", "hosts"}
	host := func(name, uri string) map[string]any { return map[string]any{"name": name, "uri": uri} }
	return []invalidCase{
		{name: "proxmox without endpoint", base: validCluster, mutate: del("spec", "endpoint"), want: "provider proxmox needs spec.endpoint"},
		{name: "proxmox without credentials", base: validCluster, mutate: del("spec", "credentials"), want: "provider proxmox needs spec.credentials: set exactly one credential pair"},
		{name: "proxmox with spec.libvirt", base: validCluster, mutate: set(map[string]any{"hosts": []any{host("a", "qemu:///system?socket=/s")}, "volumePool": "vms"}, "spec", "libvirt"),
			want: "spec.libvirt holds libvirt settings and is allowed only with provider libvirt"},
		{name: "libvirt without spec.libvirt", base: validLibvirtCluster, mutate: del("spec", "libvirt"), want: "provider libvirt needs spec.libvirt"},
		{name: "libvirt with spec.proxmox", base: validLibvirtCluster, mutate: set(map[string]any{"isoStorage": "local"}, "spec", "proxmox"), want: "spec.proxmox holds Proxmox VE settings"},
		{name: "libvirt with a token", base: validLibvirtCluster,
			mutate: all(set(secretRef("pve", "id"), "spec", "credentials", "tokenID"), set(secretRef("pve", "secret"), "spec", "credentials", "tokenSecret")),
			want:   "spec.credentials of a libvirt cluster holds only clientCert"},
		{name: "libvirt with half a pair", base: validLibvirtCluster, mutate: set(secretRef("pve", "pw"), "spec", "credentials", "password"), want: "set exactly one credential pair"},
		{name: "libvirt provider change", base: validLibvirtCluster, mutate: func(*unstructured.Unstructured) {}, update: set("proxmox", "spec", "provider"), want: "provider is immutable"},
		{name: "no hosts", base: validLibvirtCluster, mutate: all(set([]any{}, hosts...), del("spec", "libvirt", "ssh")), want: "spec.libvirt.hosts: Invalid value"},
		{name: "no volume pool", base: validLibvirtCluster, mutate: del("spec", "libvirt", "volumePool"), want: "spec.libvirt.volumePool: Required value"},
		{name: "host twice", base: validLibvirtCluster, mutate: set([]any{host("kvm1", "qemu+tls://a.example.com/system"), host("kvm1", "qemu+tls://b.example.com/system")}, hosts...),
			want: "spec.libvirt.hosts must not name a host twice"},
		{name: "host name not a DNS label", base: validLibvirtCluster, mutate: set([]any{host("KVM_1", "qemu+tls://a.example.com/system")}, hosts...), want: "spec.libvirt.hosts[0].name: Invalid value"},
		{name: "tls uri without a host", base: validLibvirtCluster, mutate: set([]any{host("a", "qemu+tls:///system")}, hosts...), want: "spec.libvirt.hosts uri must be qemu+tls://host[:port]/system"},
		{name: "session uri", base: validLibvirtCluster, mutate: set([]any{host("a", "qemu:///session")}, hosts...), want: "spec.libvirt.hosts uri must be"},
		{name: "another driver", base: validLibvirtCluster, mutate: set([]any{host("a", "xen+tls://a.example.com/system")}, hosts...), want: "spec.libvirt.hosts uri must be"},
		{name: "relative socket", base: validLibvirtCluster, mutate: set([]any{host("a", "qemu:///system?socket=run/sock")}, hosts...), want: "spec.libvirt.hosts uri must be"},
		{name: "ssh without an ssh host", base: validLibvirtCluster, mutate: set([]any{host("a", "qemu+tls://a.example.com/system")}, hosts...),
			want: "spec.libvirt.ssh is used only by qemu+ssh:// hosts"},
		{name: "ssh host without ssh", base: validLibvirtCluster, mutate: del("spec", "libvirt", "ssh"), want: "a qemu+ssh:// host needs spec.libvirt.ssh"},
		{name: "ssh without known hosts", base: validLibvirtCluster, mutate: del("spec", "libvirt", "ssh", "knownHostsRef"), want: "spec.libvirt.ssh.knownHostsRef: Required value"},
		{name: "known hosts without a key", base: validLibvirtCluster, mutate: del("spec", "libvirt", "ssh", "knownHostsRef", "key"), want: "spec.libvirt.ssh.knownHostsRef.key: Required value"},
		{name: "template with no source", base: validLibvirtTemplate, mutate: set(map[string]any{}, "spec", "source"), want: "set exactly one of source.proxmox and source.libvirt"},
		{name: "template with both sources", base: validLibvirtTemplate, mutate: set(map[string]any{"templateID": int64(9000)}, "spec", "source", "proxmox"),
			want: "set exactly one of source.proxmox and source.libvirt"},
		{name: "template without domain", base: validLibvirtTemplate, mutate: del("spec", "source", "libvirt", "domain"), want: "spec.source.libvirt.domain: Required value"},
		{name: "template domain with a slash", base: validLibvirtTemplate, mutate: set("a/b", "spec", "source", "libvirt", "domain"), want: "spec.source.libvirt.domain: Invalid value"},
	}
}

package clusterconfig

import (
	"context"
	"errors"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/secretref"
	"github.com/hyperfleet/hyperfleet/pkg/provider"
	"github.com/hyperfleet/hyperfleet/pkg/provider/libvirt"
)

// The libvirt tests' clusters are libvirt's: its kind reads spec.libvirt,
// and its section's Secrets come through SectionSecrets.
func init() { provider.Register(hfv1.ProviderLibvirt, libvirt.Kind) }

var _ SectionSecrets = libvirt.Kind.(SectionSecrets)

// TestLibvirtCluster: a libvirt cluster, which has no endpoint and no
// token, resolves; its ssh Secrets reach the kind's settings and are
// among SecretRefs (so that a changed key reconnects the cluster); a
// missing one is an ErrMissing naming the field.
func TestLibvirtCluster(t *testing.T) {
	scheme := runtime.NewScheme()
	if err := corev1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	reader := fake.NewClientBuilder().WithScheme(scheme).WithObjects(
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "hf", Name: "kvm-ssh"}, Data: map[string][]byte{"id_ed25519": []byte("KEY"), "known_hosts": []byte("HOSTS")}},
	).Build()
	key := hfv1.SecretKeySelector{Namespace: "hf", Name: "kvm-ssh", Key: "id_ed25519"}
	known := hfv1.SecretKeySelector{Namespace: "hf", Name: "kvm-ssh", Key: "known_hosts"}
	cluster := &hfv1.HypervisorCluster{ObjectMeta: metav1.ObjectMeta{Name: "kvm"}, Spec: hfv1.HypervisorClusterSpec{
		Provider: hfv1.ProviderLibvirt,
		Libvirt: &hfv1.LibvirtClusterSettings{
			Hosts:      []hfv1.LibvirtHost{{Name: "kvm1", URI: "qemu+ssh://hf@kvm1.example.com/system"}},
			VolumePool: "vms",
			SSH:        &hfv1.LibvirtSSH{PrivateKeyRef: key, KnownHostsRef: known},
		},
	}}
	cfg, err := Resolve(context.Background(), reader, cluster)
	if err != nil {
		t.Fatal(err)
	}
	s, ok := cfg.Settings.(*libvirt.ClusterSettings)
	if !ok || string(s.SSHPrivateKey) != "KEY" || string(s.SSHKnownHosts) != "HOSTS" || s.VolumePool != "vms" || cfg.Endpoint != "" || cfg.TokenID != "" {
		t.Fatalf("Resolve = %+v with settings %+v", cfg, cfg.Settings)
	}
	refs := map[hfv1.SecretKeySelector]bool{}
	for _, r := range SecretRefs(cluster) {
		refs[*r] = true
	}
	if !refs[key] || !refs[known] || len(refs) != 2 {
		t.Fatalf("SecretRefs = %v, want the ssh key and known hosts", refs)
	}

	cluster.Spec.Libvirt.SSH.KnownHostsRef.Key = "nope"
	if _, err := Resolve(context.Background(), reader, cluster); !errors.Is(err, secretref.ErrMissing) || !strings.Contains(err.Error(), "spec.libvirt.ssh.knownHostsRef") {
		t.Fatalf("Resolve with a missing key = %v, want ErrMissing naming spec.libvirt.ssh.knownHostsRef", err)
	}
}

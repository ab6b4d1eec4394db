package controller_test

import (
	"context"
	"fmt"
	"net/netip"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	golibvirt "github.com/digitalocean/go-libvirt"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/testworld/libvirtd"
	"github.com/hyperfleet/hyperfleet/internal/testworld/tinyguest"
	"github.com/hyperfleet/hyperfleet/pkg/provider"
	"github.com/hyperfleet/hyperfleet/pkg/provider/libvirt"
)

// Registered as the operator binary's main registers it.
func init() { provider.Register(hfv1.ProviderLibvirt, libvirt.Kind) }

// Names of the libvirt world's resources.
const (
	libvirtTemplateDomain = "tiny-template"
	libvirtVolumePool     = "images"
	libvirtMediaPool      = "media"
	libvirtNetwork        = "ci"
)

// TestLibvirtClusterRunsAClaim: a HypervisorCluster of provider libvirt
// (no endpoint, no token: a host whose uri is a private libvirtd's socket)
// and a template with source.libvirt, read by the libvirt kind alone: the
// operator, wired as the binary wires it, connects the cluster, validates
// the template domain (and refuses a template naming a Proxmox VE
// template), and provisions a claim whose VM runs on the real
// libvirtd; deleting the claim undefines the domain and deletes its
// volumes (the overlay and the cloud-init ISO).
func TestLibvirtClusterRunsAClaim(t *testing.T) {
	ctx := context.Background()
	d, conn := startLibvirtWorld(t)
	startOperator(t, operatorOptions{})

	ns := "libvirt-claim"
	mustCreate(t, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns, Labels: map[string]string{"hyperfleet.io/tenant": "yes"}}})
	mustCreate(t, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "github"}, StringData: map[string]string{"token": "ghp_longLivedPATthatMustNeverLeaveTheOperator"}})
	cluster := &hfv1.HypervisorCluster{
		ObjectMeta: metav1.ObjectMeta{Name: "kvm-" + ns},
		Spec: hfv1.HypervisorClusterSpec{
			Provider: hfv1.ProviderLibvirt,
			Libvirt: &hfv1.LibvirtClusterSettings{
				Hosts:      []hfv1.LibvirtHost{{Name: "kvm1", URI: d.URI()}},
				VolumePool: libvirtVolumePool, MediaPool: libvirtMediaPool, Network: libvirtNetwork,
			},
			PollInterval: &metav1.Duration{Duration: time.Second},
		},
	}
	mustCreate(t, cluster)
	t.Cleanup(func() { deleteAndWait(t, cluster) })
	tmpl := &hfv1.HypervisorMachineTemplate{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "tiny"},
		Spec: hfv1.HypervisorMachineTemplateSpec{
			HypervisorClusterRef: hfv1.ObjectName{Name: cluster.Name},
			Source:               hfv1.MachineSource{Libvirt: &hfv1.LibvirtSource{Domain: libvirtTemplateDomain}},
			// The least the API allows; the tiny guest boots in less.
			Resources: hfv1.MachineResources{CPU: 1, Memory: resource.MustParse("256Mi")},
			Bootstrap: hfv1.Bootstrap{GitHub: &hfv1.GitHubBootstrap{
				Owner: "octo-org", Organization: "octo-org",
				Credentials: hfv1.GitHubCredentials{PAT: &hfv1.LocalSecretKeySelector{Name: "github", Key: "token"}},
			}},
		},
	}
	mustCreate(t, tmpl)
	// A template naming a Proxmox VE template on this libvirt cluster is
	// refused, naming the section to set.
	wrong := &hfv1.HypervisorMachineTemplate{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "wrong-kind"}, Spec: *tmpl.Spec.DeepCopy()}
	wrong.Spec.Source = hfv1.MachineSource{Proxmox: hfv1.ProxmoxSource{TemplateID: ptr.To[int32](9000)}}
	mustCreate(t, wrong)
	if c := hfv1.FindCondition(waitTemplate(t, wrong, metav1.ConditionFalse, string(hfv1.TemplateInvalidReason)).Status.Conditions,
		hfv1.HypervisorMachineTemplateValidCondition); !strings.Contains(c.Message, "sets no spec.source.libvirt") {
		t.Errorf("the proxmox template on a libvirt cluster is refused with %q, want it to name spec.source.libvirt", c.Message)
	}
	claim := &hfv1.MachineClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "runner-1"},
		Spec:       hfv1.MachineClaimSpec{TemplateRef: hfv1.ObjectName{Name: tmpl.Name}},
	}
	mustCreate(t, claim)
	t.Cleanup(func() { deleteAndWait(t, claim) })

	var got *hfv1.MachineClaim
	eventually(t, 3*time.Minute, "the claim's VM running on libvirtd", func() error {
		var err error
		if got, err = getClaim(t, claim); err != nil {
			return err
		}
		if !meta.IsStatusConditionTrue(got.Status.Conditions, string(hfv1.MachineClaimProvisionedCondition)) || got.Status.VMRef == nil {
			return fmt.Errorf("phase %q, conditions %+v", got.Status.Phase, got.Status.Conditions)
		}
		return nil
	})
	if r := got.Status.VMRef; r.HypervisorCluster != cluster.Name || r.Node != "kvm1" {
		t.Errorf("vmRef = %+v, want host kvm1 of %s", r, cluster.Name)
	}
	clones := operatorDomains(t, conn)
	if len(clones) != 1 {
		t.Fatalf("domains besides the template: %v, want the claim's one", clones)
	}
	dom, err := conn.DomainLookupByName(clones[0])
	if err != nil {
		t.Fatal(err)
	}
	if state, _, err := conn.DomainGetState(dom, 0); err != nil || golibvirt.DomainState(state) != golibvirt.DomainRunning {
		t.Fatalf("the claim's domain %s is in state %d (%v), want running", clones[0], state, err)
	}

	if err := env.Client.Delete(ctx, got); err != nil {
		t.Fatal(err)
	}
	eventually(t, time.Minute, "claim gone", func() error {
		if _, err := getClaim(t, claim); !apierrors.IsNotFound(err) {
			return fmt.Errorf("claim still there: %w", err)
		}
		return nil
	})
	if left := operatorDomains(t, conn); len(left) != 0 {
		t.Errorf("domains left after the claim was deleted: %v", left)
	}
	for pool, want := range map[string][]string{libvirtVolumePool: {"template.qcow2"}, libvirtMediaPool: nil} {
		if vols := poolVolumes(t, conn, pool); !slices.Equal(vols, want) {
			t.Errorf("pool %s holds %v after the claim was deleted, want %v", pool, vols, want)
		}
	}
}

// startLibvirtWorld starts a private libvirtd with an isolated network, a
// volume pool holding the tiny guest's template disk, a media pool and
// the template domain, as the libvirt provider's contract suite does.
func startLibvirtWorld(t *testing.T) (*libvirtd.Daemon, *golibvirt.Libvirt) {
	t.Helper()
	img := tinyguest.Build(t)
	d := libvirtd.Start(t)
	d.DefineNetwork(t, libvirtNetwork, netip.MustParsePrefix("10.78.0.0/24"))
	images := d.DefinePool(t, libvirtVolumePool, filepath.Join(d.Dir(), libvirtVolumePool))
	d.DefinePool(t, libvirtMediaPool, filepath.Join(d.Dir(), libvirtMediaPool))
	conn := d.Dial(t)
	base := filepath.Join(d.Dir(), libvirtVolumePool, "template.qcow2")
	if out, err := exec.Command("qemu-img", "create", "-q", "-f", "qcow2", base, "64M").CombinedOutput(); err != nil {
		t.Fatalf("qemu-img: %v: %s", err, out)
	}
	if err := conn.StoragePoolRefresh(images, 0); err != nil {
		t.Fatal(err)
	}
	doc, err := tinyguest.Template(tinyguest.Options{Name: libvirtTemplateDomain, Image: img, Disk: base, Network: libvirtNetwork}).Marshal()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.DomainDefineXML(doc); err != nil {
		t.Fatalf("define the template: %v", err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("libvirtd:\n%s", d.Logs())
		}
	})
	return d, conn
}

// operatorDomains lists the domains other than the template.
func operatorDomains(t *testing.T, conn *golibvirt.Libvirt) []string {
	t.Helper()
	doms, _, err := conn.ConnectListAllDomains(1, 0)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, dom := range doms {
		if dom.Name != libvirtTemplateDomain {
			out = append(out, dom.Name)
		}
	}
	return out
}

// poolVolumes lists the names of pool's volumes, sorted.
func poolVolumes(t *testing.T, conn *golibvirt.Libvirt, pool string) []string {
	t.Helper()
	p, err := conn.StoragePoolLookupByName(pool)
	if err != nil {
		t.Fatal(err)
	}
	if err := conn.StoragePoolRefresh(p, 0); err != nil {
		t.Fatal(err)
	}
	vols, _, err := conn.StoragePoolListAllVolumes(p, 1, 0)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, v := range vols {
		out = append(out, v.Name)
	}
	slices.Sort(out)
	return out
}

// mustCreate creates obj in the test API server.
func mustCreate(t *testing.T, obj client.Object) {
	t.Helper()
	if err := env.Client.Create(context.Background(), obj); err != nil {
		t.Fatalf("create %T %s: %v", obj, obj.GetName(), err)
	}
}

// deleteAndWait deletes obj and waits until its finalizers ran, so that
// the operator, stopped after the test's cleanups, leaves nothing behind.
func deleteAndWait(t *testing.T, obj client.Object) {
	t.Helper()
	ctx := context.Background()
	if err := env.Client.Delete(ctx, obj); err != nil && !apierrors.IsNotFound(err) {
		t.Errorf("delete %T %s: %v", obj, obj.GetName(), err)
		return
	}
	eventually(t, time.Minute, fmt.Sprintf("%T %s finalized", obj, obj.GetName()), func() error {
		err := env.Client.Get(ctx, client.ObjectKeyFromObject(obj), obj)
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("still there: %w", err)
	})
}

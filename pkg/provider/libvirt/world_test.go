package libvirt

import (
	"bytes"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	golibvirt "github.com/digitalocean/go-libvirt"

	"github.com/hyperfleet/hyperfleet/internal/testworld/libvirtd"
	"github.com/hyperfleet/hyperfleet/internal/testworld/tinyguest"
	"github.com/hyperfleet/hyperfleet/pkg/ownership"
	"github.com/hyperfleet/hyperfleet/pkg/provider"
)

// advanceSlice is the most real time one Advance lets pass: the suite asks
// for minutes where it lets a backend settle, and polls anyway.
const advanceSlice = 200 * time.Millisecond

// Names of the test world's resources.
const (
	worldNetwork  = "tiny"
	worldImages   = "images" // the template's disk and the VMs' disks
	worldMedia    = "media"  // the cloud-init ISOs
	worldTemplate = "template"
	worldHost     = "kvm1"
)

// world is one private libvirtd with the tiny guest's template, and the
// provider configuration that reaches it.
type world struct {
	d      *libvirtd.Daemon
	conn   *golibvirt.Libvirt
	cfg    provider.ClusterConfig
	signer *ownership.Signer
	source provider.TemplateSource
}

// guestImage is the tiny guest, hard-linked (or copied) once per test
// binary into a directory of its own: the shared cache it is built in may
// be rebuilt by another test binary while this one runs.
var guestImage struct {
	once sync.Once
	dir  string
	img  tinyguest.Image
}

func TestMain(m *testing.M) {
	code := m.Run()
	if guestImage.dir != "" {
		_ = os.RemoveAll(guestImage.dir)
	}
	os.Exit(code)
}

// privateImage links img's files into a directory of this process.
func privateImage(t testing.TB, img tinyguest.Image) (string, tinyguest.Image) {
	t.Helper()
	dir, err := os.MkdirTemp("", "hf-libvirt-guest-")
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []*string{&img.Kernel, &img.Initrd} {
		dst := filepath.Join(dir, filepath.Base(*f))
		if err := os.Link(*f, dst); err != nil {
			raw, rerr := os.ReadFile(*f)
			if rerr != nil {
				t.Fatal(rerr)
			}
			if err := os.WriteFile(dst, raw, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		*f = dst
	}
	return dir, img
}

// newWorld starts a libvirtd with the tiny guest's template on a qcow2
// disk of the images pool, a media pool and a DHCP network.
func newWorld(t testing.TB) *world {
	t.Helper()
	guestImage.once.Do(func() { guestImage.dir, guestImage.img = privateImage(t, tinyguest.Build(t)) })
	d := libvirtd.Start(t)
	d.DefineNetwork(t, worldNetwork, netip.MustParsePrefix("10.77.0.0/24"))
	images := d.DefinePool(t, worldImages, filepath.Join(d.Dir(), worldImages))
	d.DefinePool(t, worldMedia, filepath.Join(d.Dir(), worldMedia))
	conn := d.Dial(t)
	base := filepath.Join(d.Dir(), worldImages, "template.qcow2")
	if out, err := exec.Command("qemu-img", "create", "-q", "-f", "qcow2", base, "64M").CombinedOutput(); err != nil {
		t.Fatalf("qemu-img: %v: %s", err, out)
	}
	if err := conn.StoragePoolRefresh(images, 0); err != nil {
		t.Fatal(err)
	}
	doc, err := tinyguest.Template(tinyguest.Options{Name: worldTemplate, Image: guestImage.img, Disk: base, Network: worldNetwork}).Marshal()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.DomainDefineXML(doc); err != nil {
		t.Fatalf("define the template: %v", err)
	}
	signer, err := ownership.NewSigner("contract", bytes.Repeat([]byte{7}, ownership.MinKeyLength))
	if err != nil {
		t.Fatal(err)
	}
	w := &world{d: d, conn: conn, signer: signer.ForCluster(ownership.ClusterIdentity{Name: "contract-cluster"})}
	w.cfg = provider.ClusterConfig{Name: "contract-cluster", VMIDStart: 100, VMIDEnd: 199, ClonesPerNode: 4,
		Settings: &ClusterSettings{Hosts: []Host{{Name: worldHost, URI: d.URI()}}, VolumePool: worldImages, MediaPool: worldMedia, Network: worldNetwork}}
	w.source = provider.TemplateSource{Linked: true, Settings: &TemplateRef{Domain: worldTemplate}}
	return w
}

// provider connects a new Provider with cfg; it is closed when the test
// ends.
func (w *world) provider(t testing.TB, cfg provider.ClusterConfig) *Provider {
	t.Helper()
	p, err := New(cfg, provider.Deps{Signer: w.signer})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

// domainOf returns the domain of VM id, read through the admin connection.
func (w *world) domainOf(t testing.TB, id provider.ID) golibvirt.Domain {
	t.Helper()
	vmid, err := ParseID(id)
	if err != nil {
		t.Fatal(err)
	}
	doms, _, err := w.conn.ConnectListAllDomains(1, 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, dom := range doms {
		doc, err := w.conn.DomainGetXMLDesc(dom, 0)
		if err != nil {
			continue
		}
		x, err := parseDomain(doc)
		if err != nil {
			t.Fatal(err)
		}
		if m, err := parseMeta(x.Metadata); err == nil && m.ID == vmid {
			return dom
		}
	}
	t.Fatalf("VM %s has no domain", id)
	return golibvirt.Domain{}
}

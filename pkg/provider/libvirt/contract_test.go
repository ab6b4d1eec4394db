package libvirt

import (
	"bytes"
	"io/fs"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	golibvirt "github.com/digitalocean/go-libvirt"

	"github.com/hyperfleet/hyperfleet/internal/testworld/libvirtd"
	"github.com/hyperfleet/hyperfleet/internal/testworld/tinyguest"
	"github.com/hyperfleet/hyperfleet/pkg/ownership"
	"github.com/hyperfleet/hyperfleet/pkg/provider"
	"github.com/hyperfleet/hyperfleet/pkg/provider/providertest"
)

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
	w.source = provider.TemplateSource{Name: worldTemplate, Linked: true, Settings: &TemplateRef{Domain: worldTemplate}}
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

// rewriteMeta changes the metadata of VM id as an admin would.
func (w *world) rewriteMeta(t testing.TB, id provider.ID, change func(*vmMeta)) {
	t.Helper()
	dom := w.domainOf(t, id)
	doc, err := w.conn.DomainGetXMLDesc(dom, 0)
	if err != nil {
		t.Fatal(err)
	}
	x, err := parseDomain(doc)
	if err != nil {
		t.Fatal(err)
	}
	m, err := parseMeta(x.Metadata)
	if err != nil {
		t.Fatal(err)
	}
	change(&m)
	state, _, err := w.conn.DomainGetState(dom, 0)
	if err != nil {
		t.Fatal(err)
	}
	d := &domain{host: &host{Host: Host{Name: worldHost}, conn: w.conn}, dom: dom, state: golibvirt.DomainState(state)}
	if err := d.setMetadata(m); err != nil {
		t.Fatal(err)
	}
}

// TestContract runs the provider contract suite against a real libvirtd
// with the tiny guest (internal/testworld/tinyguest): every VM really
// boots under TCG. Hypervisor time is real time: Advance lets up to
// advanceSlice of it pass, the suite's loops poll conditions.
func TestContract(t *testing.T) {
	providertest.Run(t, contractHarness)
}

// advanceSlice is the most real time one Advance lets pass: the suite asks
// for minutes where it lets a backend settle, and polls anyway.
const advanceSlice = 200 * time.Millisecond

func contractHarness(t testing.TB) *providertest.Harness {
	w := newWorld(t)
	p := w.provider(t, w.cfg)
	return &providertest.Harness{
		Provider: p,
		NewProvider: func(t *testing.T, configure func(*provider.ClusterConfig)) provider.Provider {
			cfg := w.cfg
			if configure != nil {
				configure(&cfg)
			}
			return w.provider(t, cfg)
		},
		Signer:   w.signer,
		Template: w.source,
		Advance:  func(d time.Duration) { time.Sleep(min(d, advanceSlice)) },
		VMID: func(t *testing.T, id provider.ID) int {
			n, err := ParseID(id)
			if err != nil || n == 0 {
				t.Fatalf("%q is no VM id: %v", id, err)
			}
			return n
		},
		ID: FormatID,
		GuestPowerOff: func(t *testing.T, id provider.ID) {
			if err := tinyguest.PowerOffFromInside(w.conn, w.domainOf(t, id)); err != nil {
				t.Fatal(err)
			}
		},
		CreateForeignVM: func(t *testing.T, vmid int, description string, tags []string) provider.ID {
			return w.createForeignVM(t, vmid, description, tags)
		},
		SetDescription: func(t *testing.T, id provider.ID, description string) {
			w.rewriteMeta(t, id, func(m *vmMeta) { m.Description = description })
		},
		CloudInitOf: func(t *testing.T, id provider.ID) provider.CloudInit {
			s := tinyguest.SeenCloudInit(w.conn, w.domainOf(t, id))
			return provider.CloudInit{UserData: s.UserData, MetaData: s.MetaData, NetworkConfig: s.NetworkConfig}
		},
		StoredData: w.storedData,
		GuestFileOf: func(t *testing.T, id provider.ID, path string) ([]byte, bool) {
			return tinyguest.GuestFile(w.conn, w.domainOf(t, id), path)
		},
		RemoveGuestAgent: func(t *testing.T, id provider.ID) { w.removeGuestAgent(t, id) },
		FailDestroysOtherMissing: func(t *testing.T) func() {
			// The VMs' pool stopped: a deletion finds the VM but not its
			// disk's pool.
			pool, err := w.conn.StoragePoolLookupByName(worldImages)
			if err != nil {
				t.Fatal(err)
			}
			if err := w.conn.StoragePoolDestroy(pool); err != nil {
				t.Fatal(err)
			}
			return func() {
				if err := w.conn.StoragePoolCreate(pool, 0); err != nil {
					t.Fatal(err)
				}
			}
		},
	}
}

// createForeignVM defines, as an admin would, a domain with the
// provider's metadata for vmid (or an id outside the range) holding
// exactly description and tags, never started.
func (w *world) createForeignVM(t *testing.T, vmid int, description string, tags []string) provider.ID {
	t.Helper()
	if vmid == 0 {
		vmid = 5000
		for ; ; vmid++ {
			if _, err := w.conn.DomainLookupByName("foreign-" + strconv.Itoa(vmid)); err != nil {
				break
			}
		}
	}
	x := tinyguest.Template(tinyguest.Options{Name: "foreign-" + strconv.Itoa(vmid), Image: guestImage.img,
		Disk: filepath.Join(w.d.Dir(), worldImages, "template.qcow2"), Network: worldNetwork})
	if err := setMeta(x, vmMeta{ID: vmid, Description: description, Tags: tags}); err != nil {
		t.Fatal(err)
	}
	doc, err := x.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.conn.DomainDefineXML(doc); err != nil {
		t.Fatalf("define foreign VM %d: %v", vmid, err)
	}
	return FormatID(vmid)
}

// removeGuestAgent takes the agent's channel away from the domain, live
// and in its definition.
func (w *world) removeGuestAgent(t *testing.T, id provider.ID) {
	t.Helper()
	dom := w.domainOf(t, id)
	// The live channel and the defined one differ (the live one has its
	// socket path): each is detached as its side lists it.
	for _, flags := range []golibvirt.DomainXMLFlags{0, golibvirt.DomainXMLInactive} {
		doc, err := w.conn.DomainGetXMLDesc(dom, flags)
		if err != nil {
			t.Fatal(err)
		}
		x, err := parseDomain(doc)
		if err != nil {
			t.Fatal(err)
		}
		modify := golibvirt.DomainDeviceModifyLive
		if flags == golibvirt.DomainXMLInactive {
			modify = golibvirt.DomainDeviceModifyConfig
		}
		for _, c := range x.Devices.Channels {
			if c.Target == nil || c.Target.VirtIO == nil || c.Target.VirtIO.Name != agentChannel {
				continue
			}
			ch, err := c.Marshal()
			if err != nil {
				t.Fatal(err)
			}
			if err := w.conn.DomainDetachDeviceFlags(dom, ch, uint32(modify)); err != nil {
				t.Fatalf("detach the guest agent channel of VM %s (%v): %v", id, modify, err)
			}
		}
	}
}

// storedData is every file of the daemon's scratch directory (the pools'
// volumes) and every domain's definition, live and inactive.
func (w *world) storedData(t *testing.T) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(w.d.Dir(), func(path string, e fs.DirEntry, err error) error {
		if err != nil || e.IsDir() || !e.Type().IsRegular() {
			return err
		}
		raw, err := os.ReadFile(path)
		if err == nil {
			out = append(out, string(raw))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	doms, _, err := w.conn.ConnectListAllDomains(1, 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, dom := range doms {
		for _, flags := range []golibvirt.DomainXMLFlags{0, golibvirt.DomainXMLInactive} {
			if doc, err := w.conn.DomainGetXMLDesc(dom, flags); err == nil {
				out = append(out, doc)
			}
		}
	}
	return out
}

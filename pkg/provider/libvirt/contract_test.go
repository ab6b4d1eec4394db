//go:build libvirtcontract

package libvirt

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	golibvirt "github.com/digitalocean/go-libvirt"

	"github.com/hyperfleet/hyperfleet/internal/testworld/tinyguest"
	"github.com/hyperfleet/hyperfleet/pkg/provider"
	"github.com/hyperfleet/hyperfleet/pkg/provider/providertest"
)

// TestContract runs the provider contract suite against a real libvirtd
// with the tiny guest (internal/testworld/tinyguest): every VM really
// boots under TCG. Hypervisor time is real time: Advance lets up to
// advanceSlice of it pass, the suite's loops poll conditions.
//
// It boots about 50 guests: measured on the project's 2-core machine
// (shared, load about 5), 7 minutes and 265 CPU-s (QEMU included, counted
// in a cpuacct cgroup): the worlds 253 (each boot 3-3.5, its guest idling
// 0.05 a second, each daemon 0.2), the test process 12, and 2 more to
// build the test binary. Too much for every CI run; hence the build tag:
//
//	go test -tags libvirtcontract -run TestContract ./pkg/provider/libvirt
func TestContract(t *testing.T) {
	providertest.Run(t, contractHarness)
}

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
		Source: func(r providertest.TemplateRef) provider.TemplateSource {
			return provider.TemplateSource{Settings: (&TemplateRef{}).FromRecord(provider.SourceRecord{Number: r.Number, Name: r.Name, Storage: r.Storage})}
		},
		Advance: func(d time.Duration) { time.Sleep(min(d, advanceSlice)) },
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
// volumes) and of its managed save images (suspended guests' memory), and
// every domain's definition, live and inactive.
func (w *world) storedData(t *testing.T) []string {
	t.Helper()
	var out []string
	for _, dir := range []string{w.d.Dir(), w.d.SaveDir()} {
		err := filepath.WalkDir(dir, func(path string, e fs.DirEntry, err error) error {
			if errors.Is(err, fs.ErrNotExist) && path == dir {
				return fs.SkipDir // no domain was ever saved
			}
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

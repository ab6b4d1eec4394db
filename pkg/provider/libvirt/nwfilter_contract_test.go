//go:build libvirtcontract

package libvirt

import (
	"strings"
	"testing"

	golibvirt "github.com/digitalocean/go-libvirt"
	"libvirt.org/go/libvirtxml"

	"github.com/hyperfleet/hyperfleet/pkg/provider"
)

// isolatedSpec is a small VM of the world's template for owner uid under
// iso, MAC ending in n.
func (w *world) isolatedSpec(uid string, n byte, iso *provider.Isolation) *provider.VMSpec {
	spec := w.faultSpec()
	spec.Owner.UID, spec.Owner.Name = uid, "claim-"+uid[len(uid)-2:]
	spec.Name = "hf-isolated-" + uid[len(uid)-2:]
	spec.Network.MACAddress = "02:48:46:ff:01:" + string("0123456789abcdef"[n>>4]) + string("0123456789abcdef"[n&15])
	spec.Isolation = iso
	return spec
}

// configured drives spec's VM until its domain is configured (defined
// with its filterref), short of starting it.
func configured(t *testing.T, p provider.Provider, spec *provider.VMSpec) provider.Progress {
	t.Helper()
	var prog provider.Progress
	if _, err := drive(t, p, spec, &prog, func(r *provider.EnsureResult) bool {
		return r.Progress.Task != nil && r.Progress.Task.Operation == opConfigure
	}); err != nil {
		t.Fatalf("EnsureVM(%s): %v", spec.Name, err)
	}
	return prog
}

// deleted drives DeleteVM of owner's VM until it is Done.
func deleted(t *testing.T, p provider.Provider, owner provider.Owner, prog provider.Progress) {
	t.Helper()
	for i := 0; ; i++ {
		res, err := p.DeleteVM(t.Context(), owner, prog)
		if err != nil {
			t.Fatalf("DeleteVM: %v", err)
		}
		if res.Done {
			return
		}
		if i > 20 {
			t.Fatal("DeleteVM never Done")
		}
		prog = res.Progress
	}
}

// filterNames lists the daemon's network filters.
func (w *world) filterNames(t *testing.T) []string {
	t.Helper()
	filters, _, err := w.conn.ConnectListAllNwfilters(1, 0)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, f := range filters {
		names = append(names, f.Name)
	}
	return names
}

// TestIsolationFilter: a VM under an isolation policy is defined with the
// filterref of the policy's filter, which libvirtd holds with the rules
// the provider wrote (read back and compared rule by rule); a second VM
// under the same rules shares it; it goes when the last VM using it is
// deleted, and filters of other installs (and of no install) stay. No
// guest boots: the domains are deleted once configured.
func TestIsolationFilter(t *testing.T) {
	w := newWorld(t)
	p := w.provider(t, w.cfg)
	// Another install's filter, and a filter whose name only starts like
	// this install's.
	foreign := []string{"hf-other-0123456789ab", "hf-contract-hand-made"}
	for _, name := range foreign {
		doc, err := (&libvirtxml.NWFilter{Name: name, Chain: "root",
			Entries: []libvirtxml.NWFilterEntry{{Ref: &libvirtxml.NWFilterRef{Filter: cleanTraffic}}}}).Marshal()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := w.conn.NwfilterDefineXML(doc); err != nil {
			t.Fatalf("define filter %s: %v (is libvirt's clean-traffic there?)", name, err)
		}
	}
	iso := testIsolation()
	first := w.isolatedSpec("7d0f5b0e-0000-4000-8000-0000000001a1", 0xa1, iso)
	second := w.isolatedSpec("7d0f5b0e-0000-4000-8000-0000000001a2", 0xa2, testIsolation())
	progFirst, progSecond := configured(t, p, first), configured(t, p, second)

	name := p.filterName(iso)
	for _, id := range []provider.ID{progFirst.ID, progSecond.ID} {
		doc, err := w.conn.DomainGetXMLDesc(w.domainOf(t, id), golibvirt.DomainXMLInactive)
		if err != nil {
			t.Fatal(err)
		}
		x, err := parseDomain(doc)
		if err != nil {
			t.Fatal(err)
		}
		ref := x.Devices.Interfaces[0].FilterRef
		if ref == nil || ref.Filter != name || len(ref.Parameters) != 1 || ref.Parameters[0].Name != "CTRL_IP_LEARNING" || ref.Parameters[0].Value != "dhcp" {
			t.Errorf("VM %s: interface filterref %+v, want %s learning from DHCP", id, ref, name)
		}
	}
	var own []string
	for _, n := range w.filterNames(t) {
		if strings.HasPrefix(n, "hf-contract-") && n != "hf-contract-hand-made" {
			own = append(own, n)
		}
	}
	if len(own) != 1 || own[0] != name {
		t.Fatalf("the install's filters %v, want %s alone (shared by both VMs)", own, name)
	}
	f, err := w.conn.NwfilterLookupByName(name)
	if err != nil {
		t.Fatal(err)
	}
	doc, err := w.conn.NwfilterGetXMLDesc(f, 0)
	if err != nil {
		t.Fatal(err)
	}
	var stored libvirtxml.NWFilter
	if err := stored.Unmarshal(doc); err != nil {
		t.Fatal(err)
	}
	written, err := filterXML(name, iso)
	if err != nil {
		t.Fatal(err)
	}
	gotRefs, got, gotPrio := rulesOf(&stored)
	wantRefs, want, wantPrio := rulesOf(written)
	if strings.Join(gotRefs, ",") != strings.Join(wantRefs, ",") || strings.Join(got, "\n") != strings.Join(want, "\n") ||
		len(gotPrio) != len(wantPrio) {
		t.Errorf("libvirtd holds filter %s as\n%s\nwant\n%s", name, doc, strings.Join(want, "\n"))
	}
	for i := range min(len(gotPrio), len(wantPrio)) {
		if gotPrio[i] != wantPrio[i] {
			t.Errorf("rule %d (%s): priority %d in libvirtd, %d written", i, got[i], gotPrio[i], wantPrio[i])
		}
	}

	deleted(t, p, first.Owner, progFirst)
	if _, err := w.conn.NwfilterLookupByName(name); err != nil {
		t.Errorf("filter %s went with the first VM while the second uses it: %v", name, err)
	}
	deleted(t, p, second.Owner, progSecond)
	if _, err := w.conn.NwfilterLookupByName(name); !isCode(err, golibvirt.ErrNoNwfilter) {
		t.Errorf("filter %s is still there after its last VM was deleted: %v", name, err)
	}
	for _, n := range foreign {
		if _, err := w.conn.NwfilterLookupByName(n); err != nil {
			t.Errorf("filter %s, not this install's, was touched: %v", n, err)
		}
	}
}

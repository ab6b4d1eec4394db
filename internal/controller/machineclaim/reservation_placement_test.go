package machineclaim

import (
	"bytes"
	"context"
	"encoding/json"
	"slices"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8stypes "k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"
	"k8s.io/utils/ptr"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/vmspec"
	"github.com/hyperfleet/hyperfleet/pkg/ownership"
	"github.com/hyperfleet/hyperfleet/pkg/provider"
	"github.com/hyperfleet/hyperfleet/pkg/provider/proxmox"
)

func testPlacementSigner(t *testing.T, key byte) *ownership.Signer {
	t.Helper()
	s, err := ownership.NewSigner("test", bytes.Repeat([]byte{key}, ownership.MinKeyLength))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// authorizedSpec is a VM spec as the claim controller builds it from a
// template the cluster's allow-lists admitted.
func authorizedSpec() *provider.VMSpec {
	return &provider.VMSpec{
		Name:   "runner-1",
		Source: provider.TemplateSource{Linked: false, Settings: proxmox.TemplateRef{ID: 9000, Storage: "local-lvm", Format: "raw", ResourcePool: "ci"}},
		Network: provider.NetworkSpec{
			Bridge: "vmbr0", VLAN: 100, Model: "virtio", MACAddress: "02:00:00:00:00:01",
		},
		CPUCores: 2, MemoryBytes: 2 << 30, DiskBytes: 40 << 30, MemoryHint: 2 << 30,
		Native: &provider.NativeCloudInit{IPv4: "dhcp", User: "ci", VendorData: "local:snippets/kit.yaml", UserData: "local:snippets/team-a.yaml", Storage: "local-lvm"},
	}
}

// authorizedDomain is the DNS domain the authorized spec's VM was placed
// under.
const authorizedDomain = "team-a.ci.example.com"

// placedClaim is a claim whose VM 1100 is on cluster pve-a.
func placedClaim(uid string) *hfv1.MachineClaim {
	return &hfv1.MachineClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "runner-1", UID: k8stypes.UID("uid-" + uid)},
		Status:     hfv1.MachineClaimStatus{VMRef: hfv1.NewVMReference("pve-a", "proxmox://1100", "pve1")},
	}
}

// TestPlacementRecordRoundTrip: what RecordPlacement writes, Placement
// returns for the claim, and applying it to a spec built from an edited
// template gives back every authorized value (source, storage, pool,
// bridge, VLAN, NIC model, resources, the native cloud-init's snippets and
// drive storage) while the per-claim values stay; the record holds the
// DNS domain.
func TestPlacementRecordRoundTrip(t *testing.T) {
	signer := testPlacementSigner(t, 1)
	claim := placedClaim("1")
	RecordPlacement(claim, signer, "pve-a", authorizedSpec(), authorizedDomain)
	r := &Reconciler{Signer: signer, Recorder: record.NewFakeRecorder(8)}
	p, err := r.reservations().verifiedPlacement(context.Background(), &claimScope{claim: claim, claimEnv: r.env()})
	if err != nil {
		t.Fatalf("the operator's own record is refused: %v", err)
	}
	// The template now says what the cluster refuses.
	edited := authorizedSpec()
	edited.Source = provider.TemplateSource{Linked: true, Settings: proxmox.TemplateRef{ID: 9001, Storage: "local", ResourcePool: "infra"}}
	edited.Network.Bridge, edited.Network.VLAN, edited.Network.Model = "vmbr9", 4000, "e1000"
	edited.CPUCores, edited.MemoryBytes, edited.DiskBytes, edited.MemoryHint = 64, 256<<30, 4<<40, 256<<30
	edited.Native.VendorData, edited.Native.UserData, edited.Native.Storage = "local:snippets/team-b-kit.yaml", "local:snippets/team-b.yaml", "team-b-storage"
	if err := ApplyPlacement(edited, p); err != nil {
		t.Fatal(err)
	}
	want := authorizedSpec()
	if edited.Source != want.Source || edited.Network != want.Network || edited.CPUCores != want.CPUCores ||
		edited.MemoryBytes != want.MemoryBytes || edited.DiskBytes != want.DiskBytes || edited.MemoryHint != want.MemoryHint || edited.Name != want.Name {
		t.Fatalf("applied record gives %+v, want %+v", edited, want)
	}
	if got, want := *edited.Native, *want.Native; got.VendorData != want.VendorData || got.UserData != want.UserData || got.Storage != want.Storage || got.User != want.User {
		t.Fatalf("applied record gives native cloud-init %+v, want %+v", got, want)
	}
	if p.DNSDomain != authorizedDomain {
		t.Fatalf("recorded DNS domain %q, want %q", p.DNSDomain, authorizedDomain)
	}
	// A template that left native delivery since gets no snippet: its VM's
	// NoCloud seed is the tenant's own cloud-init.
	iso := authorizedSpec()
	iso.Native = nil
	if err := ApplyPlacement(iso, p); err != nil {
		t.Fatal(err)
	}
	if iso.Native != nil {
		t.Fatalf("a spec without native cloud-init got %+v", iso.Native)
	}
}

// legacyRecordByID and legacyRecordByName are what the operator before
// the opaque template reference wrote (signature p2) for placedClaim("1")
// with testPlacementSigner(t, 1), placing authorizedSpec and
// authorizedDomain on pve-a; the second with the template named
// debian-12-ci instead of 9000.
const (
	legacyRecordByID = `{"cluster":"pve-a","templateId":9000,"storage":"local-lvm","format":"raw","resourcePool":"ci","bridge":"vmbr0","vlan":100,` +
		`"nicModel":"virtio","cpuCores":2,"memoryBytes":2147483648,"diskBytes":42949672960,"vendorSnippet":"local:snippets/kit.yaml",` +
		`"userSnippet":"local:snippets/team-a.yaml","driveStorage":"local-lvm","dnsDomain":"team-a.ci.example.com","signature":"p2.1.nvuurpQiMTwwAAn_FvflehuLyQ2j7jnnhg3AM8DIbak"}`
	legacyRecordByName = `{"cluster":"pve-a","templateName":"debian-12-ci","storage":"local-lvm","format":"raw","resourcePool":"ci","bridge":"vmbr0","vlan":100,` +
		`"nicModel":"virtio","cpuCores":2,"memoryBytes":2147483648,"diskBytes":42949672960,"vendorSnippet":"local:snippets/kit.yaml",` +
		`"userSnippet":"local:snippets/team-a.yaml","driveStorage":"local-lvm","dnsDomain":"team-a.ci.example.com","signature":"p2.1.mVGm8DVqFjseAu7maW7citSFIOfmrQqQXmop0buIEl8"}`
)

// TestLegacyPlacementRecord: a claim placed by the operator before the
// opaque template reference keeps building its VM after an upgrade: its
// record, in status or in the annotation, verifies, and applying it gives
// the template it named, by id or by name, with every other authorized
// value. (Edits of such a record are refused in
// TestPlacementRecordRefusals.)
func TestLegacyPlacementRecord(t *testing.T) {
	signer := testPlacementSigner(t, 1)
	for name, tc := range map[string]struct {
		record string
		want   proxmox.TemplateRef
	}{
		"by id":   {legacyRecordByID, proxmox.TemplateRef{ID: 9000, Storage: "local-lvm", Format: "raw", ResourcePool: "ci"}},
		"by name": {legacyRecordByName, proxmox.TemplateRef{Name: "debian-12-ci", Storage: "local-lvm", Format: "raw", ResourcePool: "ci"}},
	} {
		for _, annotated := range []bool{false, true} {
			claim := placedClaim("1")
			if annotated {
				claim.Annotations = map[string]string{hfv1.PlacementAnnotation: tc.record}
			} else {
				claim.Status.PlacementRecord = tc.record
			}
			r := &Reconciler{Signer: signer, Recorder: record.NewFakeRecorder(8)}
			p, err := r.reservations().verifiedPlacement(context.Background(), &claimScope{claim: claim, claimEnv: r.env()})
			if err != nil {
				t.Fatalf("%s (annotation %v): the earlier operator's record is refused: %v", name, annotated, err)
			}
			spec := authorizedSpec()
			spec.Source = provider.TemplateSource{Linked: true, Settings: proxmox.TemplateRef{ID: 9001, Storage: "local", ResourcePool: "infra"}}
			spec.Network.Bridge = "vmbr9"
			if err := ApplyPlacement(spec, p); err != nil {
				t.Fatal(err)
			}
			if want := (provider.TemplateSource{Settings: tc.want}); spec.Source != want || spec.Network != authorizedSpec().Network || p.DNSDomain != authorizedDomain {
				t.Errorf("%s (annotation %v): applied record gives source %+v, network %+v, domain %q; want %+v, the authorized network and %q",
					name, annotated, spec.Source, spec.Network, p.DNSDomain, want, authorizedDomain)
			}
		}
	}
}

// signedPlacement is p as RecordPlacement writes it, signed by signer.
func signedPlacement(signer *ownership.Signer, p ownership.Placement) string {
	raw, err := json.Marshal(placementRecord{Placement: p, Signature: signer.SignPlacement(p)})
	if err != nil {
		panic(err)
	}
	return string(raw)
}

// TestPlacementRecordRefusals: a record that is missing, unreadable, made
// up, edited (any authorized value changed, signature kept), copied from
// another claim, pointed at another cluster or signed by another install
// is refused, each with a warning event naming the field it was read
// from: status.placementRecord, or the annotation of a claim placed by an
// earlier operator.
func TestPlacementRecordRefusals(t *testing.T) {
	signer := testPlacementSigner(t, 1)
	other := placedClaim("2")
	RecordPlacement(other, signer, "pve-a", authorizedSpec(), authorizedDomain)
	foreign := placedClaim("1")
	RecordPlacement(foreign, testPlacementSigner(t, 2), "pve-a", authorizedSpec(), authorizedDomain)
	own := placedClaim("1")
	RecordPlacement(own, signer, "pve-a", authorizedSpec(), authorizedDomain)
	signed := own.Status.PlacementRecord
	edit := func(from, to string) string {
		t.Helper()
		if !strings.Contains(signed, from) {
			t.Fatalf("record %s does not contain %s", signed, from)
		}
		return strings.Replace(signed, from, to, 1)
	}
	cases := map[string]struct {
		value   *string
		reason  string
		cluster string
	}{
		"missing":         {reason: "no placement record"},
		"garbage":         {value: ptr.To("pve-a/pve1/1100/r1.1.abc"), reason: "not a placement record"},
		"unknown field":   {value: ptr.To(edit(`"signature"`, `"extra":1,"signature"`)), reason: "not a placement record"},
		"trailing data":   {value: ptr.To(signed + `{}`), reason: "not a placement record"},
		"unsigned":        {value: ptr.To(`{"cluster":"pve-a","templateId":9000,"bridge":"vmbr0"}`), reason: "signature missing"},
		"made up":         {value: ptr.To(edit(`"signature":"p3.1.`, `"signature":"p3.1.AAAA`)), reason: "does not verify"},
		"bridge edited":   {value: ptr.To(edit(`"bridge":"vmbr0"`, `"bridge":"vmbr9"`)), reason: "does not verify"},
		"vlan edited":     {value: ptr.To(edit(`"vlan":100`, `"vlan":4000`)), reason: "does not verify"},
		"template":        {value: ptr.To(edit(`"template":"9000"`, `"template":"9001"`)), reason: "does not verify"},
		"template as p2":  {value: ptr.To(edit(`"template":"9000"`, `"templateId":9000`)), reason: "does not verify"},
		"storage":         {value: ptr.To(edit(`"storage":"local-lvm"`, `"storage":"local"`)), reason: "does not verify"},
		"pool":            {value: ptr.To(edit(`"resourcePool":"ci"`, `"resourcePool":"infra"`)), reason: "does not verify"},
		"cores":           {value: ptr.To(edit(`"cpuCores":2`, `"cpuCores":64`)), reason: "does not verify"},
		"linked added":    {value: ptr.To(edit(`"cluster"`, `"linkedClone":true,"cluster"`)), reason: "does not verify"},
		"vendor snippet":  {value: ptr.To(edit(`"vendorSnippet":"local:snippets/kit.yaml"`, `"vendorSnippet":"local:snippets/team-b-kit.yaml"`)), reason: "does not verify"},
		"user snippet":    {value: ptr.To(edit(`"userSnippet":"local:snippets/team-a.yaml"`, `"userSnippet":"local:snippets/team-b.yaml"`)), reason: "does not verify"},
		"drive storage":   {value: ptr.To(edit(`"driveStorage":"local-lvm"`, `"driveStorage":"team-b-storage"`)), reason: "does not verify"},
		"dns domain":      {value: ptr.To(edit(`"dnsDomain":"team-a.ci.example.com"`, `"dnsDomain":"team-b.ci.example.com"`)), reason: "does not verify"},
		"earlier version": {value: ptr.To(edit(`"signature":"p3.`, `"signature":"p1.`)), reason: "earlier HyperFleet version"},
		"p2 relabelled":   {value: ptr.To(edit(`"signature":"p3.`, `"signature":"p2.`)), reason: "does not verify"},
		"other claim":     {value: ptr.To(other.Status.PlacementRecord), reason: "does not verify"},
		"other install":   {value: ptr.To(foreign.Status.PlacementRecord), reason: "does not verify"},
		"other cluster":   {value: ptr.To(edit(`"cluster":"pve-a"`, `"cluster":"pve-b"`)), reason: "names HypervisorCluster pve-b"},
		"VM moved":        {value: ptr.To(signed), cluster: "pve-b", reason: "names HypervisorCluster pve-a"},
		"reservation id":  {value: ptr.To(strings.Replace(signed, `"p3.1.`, `"r2.1.`, 1)), reason: "does not verify"},
		"p2 edited":       {value: ptr.To(strings.Replace(legacyRecordByID, `"templateId":9000`, `"templateId":9001`, 1)), reason: "does not verify"},
		"p2 and p3":       {value: ptr.To(strings.Replace(legacyRecordByID, `"templateId":9000`, `"templateId":9000,"template":"9000"`, 1)), reason: "does not verify"},
		"p2 as p3":        {value: ptr.To(strings.Replace(legacyRecordByID, `"templateId":9000`, `"template":"9000"`, 1)), reason: "does not verify"},
		"bad template":    {value: ptr.To(signedPlacement(signer, ownership.Placement{ClaimUID: "uid-1", Cluster: "pve-a", Template: "09000"})), reason: "its template"},
	}
	for name, tc := range cases {
		for _, field := range []string{"status.placementRecord", "annotation " + hfv1.PlacementAnnotation} {
			t.Run(name+" in "+field, func(t *testing.T) {
				claim := placedClaim("1")
				switch {
				case tc.value == nil:
					field = "status.placementRecord"
				case field == "status.placementRecord":
					claim.Status.PlacementRecord = *tc.value
				default:
					claim.Annotations = map[string]string{hfv1.PlacementAnnotation: *tc.value}
				}
				if tc.cluster != "" {
					claim.Status.VMRef.HypervisorCluster = tc.cluster
				}
				rec := record.NewFakeRecorder(8)
				_, err := (&Reconciler{Signer: signer, Recorder: rec}).reservations().verifiedPlacement(context.Background(), &claimScope{claim: claim})
				if err == nil {
					t.Fatal("refused record accepted")
				}
				if !strings.Contains(err.Error(), tc.reason) || !strings.Contains(err.Error(), field+" refused") {
					t.Errorf("error %q does not name %s and %q", err, field, tc.reason)
				}
				select {
				case e := <-rec.Events:
					if !strings.HasPrefix(e, "Warning "+string(hfv1.PlacementRecordRejectedReason)) {
						t.Errorf("event %q", e)
					}
				default:
					t.Error("no event")
				}
			})
		}
	}
}

// TestWithPlacedDomain: a placed claim's VM is named under the recorded
// DNS domain whatever the template and the cluster say now: a domain the
// template moved to, or one the cluster gained since a claim placed
// without any; the objects themselves are never changed.
func TestWithPlacedDomain(t *testing.T) {
	cluster := &hfv1.HypervisorCluster{}
	cluster.Spec.DNS = &hfv1.ClusterDNSSettings{DNSSettings: hfv1.DNSSettings{Domain: "ci.example.com", Servers: []string{"192.0.2.53"}}}
	moved := &hfv1.HypervisorMachineTemplate{}
	moved.Spec.Network.DNS = &hfv1.DNSSettings{Domain: "team-b.ci.example.com", Search: []string{"example.com"}}
	plain := &hfv1.HypervisorMachineTemplate{}
	for _, tc := range []struct {
		name     string
		tmpl     *hfv1.HypervisorMachineTemplate
		recorded string
	}{
		{"the template moved to another domain", moved, authorizedDomain},
		{"placed without a domain, the cluster has one now", plain, ""},
		{"the cluster's domain, unchanged", plain, "ci.example.com"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tmplBefore, clusterBefore := tc.tmpl.DeepCopy(), cluster.DeepCopy()
			tmpl, c := withPlacedDomain(tc.tmpl, cluster, tc.recorded)
			got := vmspec.DNS(c, tmpl)
			if got.Domain != tc.recorded {
				t.Errorf("domain %q, want the recorded %q", got.Domain, tc.recorded)
			}
			if want := vmspec.DNS(cluster, tc.tmpl); !slices.Equal(got.Servers, want.Servers) || !slices.Equal(got.Search, want.Search) {
				t.Errorf("resolver %+v, want the objects' own %+v", got, want)
			}
			if !equality.Semantic.DeepEqual(tc.tmpl, tmplBefore) || !equality.Semantic.DeepEqual(cluster, clusterBefore) {
				t.Error("the template or cluster themselves were changed")
			}
		})
	}
}

// TestPlacementRecordKeepsIsolation: the isolation policy compiled at
// placement is what the VM is built with, whatever the cluster says later
// (another policy, none at all); the VM's static addresses are not part
// of the record; a record edited to drop the policy does not verify.
func TestPlacementRecordKeepsIsolation(t *testing.T) {
	signer := testPlacementSigner(t, 1)
	claim := placedClaim("iso")
	placedSpec := authorizedSpec()
	placedSpec.Isolation = &provider.Isolation{Policy: "web", DHCP: true, AddressSubnets: []string{"192.0.2.0/24"}, Addresses: []string{"192.0.2.10"},
		Egress: []provider.FirewallRule{{Action: provider.FirewallAccept, CIDR: "0.0.0.0/0", Protocol: provider.ProtocolTCP, Ports: []provider.PortRange{{From: 443, To: 443}}}}}
	RecordPlacement(claim, signer, "pve-a", placedSpec, authorizedDomain)
	if strings.Contains(claim.Status.PlacementRecord, "192.0.2.10") {
		t.Fatalf("the record holds the VM's static address: %s", claim.Status.PlacementRecord)
	}
	r := &Reconciler{Signer: signer, Recorder: record.NewFakeRecorder(8)}
	p, err := r.reservations().verifiedPlacement(context.Background(), &claimScope{claim: claim, claimEnv: r.env()})
	if err != nil {
		t.Fatalf("the operator's own record is refused: %v", err)
	}
	for _, now := range []*provider.Isolation{nil, {Policy: "open", Egress: []provider.FirewallRule{{Action: provider.FirewallAccept}}}} {
		spec := authorizedSpec()
		spec.Isolation = now
		if err := ApplyPlacement(spec, p); err != nil {
			t.Fatal(err)
		}
		want := *placedSpec.Isolation
		want.Addresses = nil
		if spec.Isolation == nil || spec.Isolation.Policy != "web" || spec.Isolation.RulesDigest() != want.RulesDigest() || len(spec.Isolation.Addresses) != 0 {
			t.Fatalf("with %+v now, the VM gets %+v; want the placed %+v", now, spec.Isolation, want)
		}
	}
	// A tenant who removes the policy from the record voids it.
	stripped := strings.Replace(claim.Status.PlacementRecord, `"isolation":`, `"isolationX":`, 1)
	claim.Status.PlacementRecord = stripped
	if _, err := r.reservations().verifiedPlacement(context.Background(), &claimScope{claim: claim, claimEnv: r.env()}); err == nil {
		t.Fatal("a record without its isolation policy verifies")
	}
}

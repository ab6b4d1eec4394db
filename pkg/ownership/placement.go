package ownership

import (
	"strconv"
	"strings"
)

// placementPurpose separates placement-record MACs from the reservation's,
// the ownership block's and every other MAC of the key ring.
const placementPurpose = "hyperfleet.io/placement"

// placementVersion prefixes placement signatures: "p3.<key id>.<MAC>".
// A p3 record names its template by one opaque reference (Template).
const placementVersion = "p3"

// legacyTemplateVersion prefixes the signatures of placement records
// written before the template reference was opaque: they name the template
// by a number and a name (LegacyTemplate), signed as two values where a p3
// record signs one, and are otherwise p3 records. Claims placed by such an
// operator keep building their VM after an upgrade, so they still verify.
const legacyTemplateVersion = "p2"

// LegacyPlacementVersion prefixes the signatures of placement records
// written before the snippets, drive storage and DNS domain were recorded:
// they leave those to the template's current values, so they are refused,
// and the claim controller says why.
const LegacyPlacementVersion = "p1"

// Placement is what a MachineClaim's VM was authorized to be when the claim
// was placed: the hypervisor template it is cloned from and how, where its
// disks and network go, and its resources. The cluster's allow-lists and
// defaults decide these values once, before the clone; every later step
// that builds the VM uses this record instead of the template's current
// values (docs/security.md, "The placement record"). The fields are
// hypervisor-neutral; zero values mean what they mean in a VM spec (the
// cluster's or the template's default), but for DNSDomain, where empty
// means no domain.
type Placement struct {
	// ClaimUID and Cluster bind the record to one claim's VM on one
	// HypervisorCluster; they are signed but not written out (the claim
	// and its status say them).
	ClaimUID string `json:"-"`
	Cluster  string `json:"cluster"`
	// Template names the hypervisor template: the kind's reference to it
	// (pkg/provider's SourceRecord.TemplateRef), opaque here.
	Template string `json:"template,omitempty"`
	// LegacyTemplate is the template as a record signed by an earlier
	// operator names it (signature p2), nil in every record of this
	// version. Its JSON fields are that record's own; SignPlacement does
	// not write them, VerifyPlacement checks them.
	*LegacyTemplate
	// LinkedClone, Storage and Format say how and where it is cloned;
	// ResourcePool is the hypervisor resource pool of the VM.
	LinkedClone  bool   `json:"linkedClone,omitempty"`
	Storage      string `json:"storage,omitempty"`
	Format       string `json:"format,omitempty"`
	ResourcePool string `json:"resourcePool,omitempty"`
	// Bridge, VLAN and NICModel are the first network interface's.
	Bridge   string `json:"bridge,omitempty"`
	VLAN     int    `json:"vlan,omitempty"`
	NICModel string `json:"nicModel,omitempty"`
	// CPUCores, MemoryBytes and DiskBytes are the VM's resources.
	CPUCores    int   `json:"cpuCores,omitempty"`
	MemoryBytes int64 `json:"memoryBytes,omitempty"`
	DiskBytes   int64 `json:"diskBytes,omitempty"`
	// VendorSnippet and UserSnippet are the files on the hypervisor the
	// hypervisor's own cloud-init gives the VM as vendor-data and
	// user-data, DriveStorage where it keeps the VM's seed; empty for none
	// (or, for DriveStorage, the boot disk's storage). A snippet is read
	// by the VM at its boot, so one a namespace may not use would hand it
	// another team's file.
	VendorSnippet string `json:"vendorSnippet,omitempty"`
	UserSnippet   string `json:"userSnippet,omitempty"`
	DriveStorage  string `json:"driveStorage,omitempty"`
	// DNSDomain is the domain the VM's host name is completed with, which
	// its name is registered in DNS and validated under.
	DNSDomain string `json:"dnsDomain,omitempty"`
	// Isolation is the network policy the VM is held to, as the operator
	// compiled it at placement (pkg/provider's Isolation, in JSON); empty
	// for none. It is signed only when set, so records written before it
	// existed verify as they were.
	Isolation string `json:"isolation,omitempty"`
	// Hardware is the VM's CPU model and flags, devices and extra disks
	// as authorized at placement (pkg/provider's Hardware, in JSON); empty
	// for none. Signed only when set, like Isolation.
	Hardware string `json:"hardware,omitempty"`
}

// LegacyTemplate is how a placement record signed by an earlier operator
// (signature p2) names its template: a number and a name, meaning what the
// hypervisor kind says (pkg/provider's SourceRecord.Number and Name), the
// other zero.
type LegacyTemplate struct {
	Number int    `json:"templateId,omitempty"`
	Name   string `json:"templateName,omitempty"`
}

// fields are the signed values of p, with template the signed form of its
// template: one value in a p3 record, two in a p2 one.
func (p Placement) fields(template ...string) []string {
	out := append([]string{p.ClaimUID, p.Cluster}, template...)
	out = append(out, strconv.FormatBool(p.LinkedClone), p.Storage, p.Format,
		p.ResourcePool, p.Bridge, strconv.Itoa(p.VLAN), p.NICModel, strconv.Itoa(p.CPUCores),
		strconv.FormatInt(p.MemoryBytes, 10), strconv.FormatInt(p.DiskBytes, 10),
		p.VendorSnippet, p.UserSnippet, p.DriveStorage, p.DNSDomain,
	)
	if p.Isolation != "" {
		// Length-prefixed like every field: a record cannot shed it and
		// keep its MAC.
		out = append(out, p.Isolation)
	}
	if p.Hardware != "" {
		// Tagged: a record with hardware and no isolation must not sign
		// as one with isolation of the same text.
		out = append(out, "hardware", p.Hardware)
	}
	return out
}

// SignPlacement returns the MAC that proves p was written by this install
// for the claim p.ClaimUID. The claim controller stores it with the record
// in the claim's status; a record whose MAC does not verify for the
// claim's own UID and its VM's cluster is never used. It covers
// p.Template; p.LegacyTemplate must be nil (a record that carries one
// never verifies with this version's MAC).
func (s *Signer) SignPlacement(p Placement) string {
	return s.signRecord(placementPurpose, placementVersion, p.fields(p.Template))
}

// VerifyPlacement reports whether sig is this install's MAC over p, made
// with any key of the ring, compared in constant time: a p3 MAC over a
// record naming its template by Template alone, or the p2 MAC of an
// earlier operator over one naming it by LegacyTemplate alone (a record
// with neither is verified in the form its signature says).
func (s *Signer) VerifyPlacement(p Placement, sig string) bool {
	if strings.HasPrefix(sig, legacyTemplateVersion+".") {
		if p.Template != "" {
			return false
		}
		var t LegacyTemplate
		if p.LegacyTemplate != nil {
			t = *p.LegacyTemplate
		}
		return s.verifyRecord(placementPurpose, legacyTemplateVersion, p.fields(strconv.Itoa(t.Number), t.Name), sig)
	}
	return p.LegacyTemplate == nil && s.verifyRecord(placementPurpose, placementVersion, p.fields(p.Template), sig)
}

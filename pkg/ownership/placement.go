package ownership

import "strconv"

// placementPurpose separates placement-record MACs from the reservation's,
// the ownership block's and every other MAC of the key ring.
const placementPurpose = "hyperfleet.io/placement"

// placementVersion prefixes placement signatures: "p2.<key id>.<MAC>".
// A p2 record also covers the cloud-init snippets, their drive's storage
// and the DNS domain; a p1 record (written before them) never verifies.
const placementVersion = "p2"

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
	// TemplateID or TemplateName names the hypervisor template.
	TemplateID   int    `json:"templateId,omitempty"`
	TemplateName string `json:"templateName,omitempty"`
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
}

func (p Placement) fields() []string {
	return []string{
		p.ClaimUID, p.Cluster, strconv.Itoa(p.TemplateID), p.TemplateName, strconv.FormatBool(p.LinkedClone), p.Storage, p.Format,
		p.ResourcePool, p.Bridge, strconv.Itoa(p.VLAN), p.NICModel, strconv.Itoa(p.CPUCores),
		strconv.FormatInt(p.MemoryBytes, 10), strconv.FormatInt(p.DiskBytes, 10),
		p.VendorSnippet, p.UserSnippet, p.DriveStorage, p.DNSDomain,
	}
}

// SignPlacement returns the MAC that proves p was written by this install
// for the claim p.ClaimUID. The claim controller stores it with the record
// in an annotation that tenants can write; a record whose MAC does not
// verify for the claim's own UID and its VM's cluster is never used.
func (s *Signer) SignPlacement(p Placement) string {
	return s.signRecord(placementPurpose, placementVersion, p.fields())
}

// VerifyPlacement reports whether sig is this install's MAC over p, made
// with any key of the ring, compared in constant time.
func (s *Signer) VerifyPlacement(p Placement, sig string) bool {
	return s.verifyRecord(placementPurpose, placementVersion, p.fields(), sig)
}

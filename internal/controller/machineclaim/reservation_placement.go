package machineclaim

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	ctrl "sigs.k8s.io/controller-runtime"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/conditions"
	"github.com/hyperfleet/hyperfleet/internal/metrics"
	"github.com/hyperfleet/hyperfleet/internal/vmspec"
	"github.com/hyperfleet/hyperfleet/pkg/ownership"
	"github.com/hyperfleet/hyperfleet/pkg/provider"
)

// placementRecord is the JSON of a PlacementAnnotation: the record and
// its signature.
type placementRecord struct {
	ownership.Placement
	Signature string `json:"signature"`
}

// RecordPlacement records in the claim's status.placementRecord (in
// memory; the caller writes it in the same write as the reservation) what spec's
// VM is made of on cluster and the DNS domain its name is completed with,
// the values the claim was authorized with, signed with the install's key
// over the claim's UID and cluster. spec and dnsDomain must be what the
// allow-lists were checked against in this pass, or a verified record
// already applied to them.
func RecordPlacement(claim *hfv1.MachineClaim, signer *ownership.Signer, cluster string, spec *provider.VMSpec, dnsDomain string) {
	p := placementOf(spec)
	p.ClaimUID, p.Cluster, p.DNSDomain = string(claim.UID), cluster, dnsDomain
	raw, err := json.Marshal(placementRecord{Placement: p, Signature: signer.SignPlacement(p)})
	if err != nil {
		// Strings, numbers and a bool: nothing json.Marshal refuses.
		panic(fmt.Sprintf("encode placement record: %v", err))
	}
	claim.Status.PlacementRecord = string(raw)
}

// placementOf is the part of spec the placement record holds: everything
// the cluster's allow-lists and defaults decide (the hypervisor files and
// storage of its native cloud-init among them), and the resources.
func placementOf(spec *provider.VMSpec) ownership.Placement {
	src := provider.RecordSource(spec.Source)
	p := ownership.Placement{
		Template: src.TemplateRef(), LinkedClone: spec.Source.Linked,
		Storage: src.Storage, Format: src.Format, ResourcePool: src.Pool,
		Bridge: spec.Network.Bridge, VLAN: spec.Network.VLAN, NICModel: spec.Network.Model,
		CPUCores: spec.CPUCores, MemoryBytes: spec.MemoryBytes, DiskBytes: spec.DiskBytes,
	}
	if n := spec.Native; n != nil {
		p.VendorSnippet, p.UserSnippet, p.DriveStorage = n.VendorData, n.UserData, n.Storage
	}
	if iso := spec.Isolation; iso != nil {
		// The policy as compiled now; the VM's static addresses are the
		// claim's own (status.staticAddresses), added at every build.
		rec := *iso
		rec.Addresses = nil
		raw, err := json.Marshal(rec)
		if err != nil {
			// Strings, numbers and bools: nothing json.Marshal refuses.
			panic(fmt.Sprintf("encode isolation policy: %v", err))
		}
		p.Isolation = string(raw)
	}
	if !spec.Hardware.IsZero() {
		raw, err := json.Marshal(spec.Hardware)
		if err != nil {
			// Strings, numbers and bools: nothing json.Marshal refuses.
			panic(fmt.Sprintf("encode hardware: %v", err))
		}
		p.Hardware = string(raw)
	}
	return p
}

// ApplyPlacement makes spec's VM what the record says, whatever its
// template says now: its source, network, resources and the hypervisor
// files and storage of its native cloud-init (a VM whose template has
// since left native delivery gets none: its NoCloud seed holds only what
// runs inside the tenant's own VM). The host name, MAC address and the
// rest of the cloud-init stay the spec's: the first two derive from the
// claim, the rest runs inside the tenant's own VM (the allow-lists do not
// cover it). The DNS domain is applied to the claim's template and cluster
// (withPlacedDomain), which the cloud-init and the claim's status read.
// p is a verified record (readPlacement): an error is a template
// reference no operator wrote.
func ApplyPlacement(spec *provider.VMSpec, p ownership.Placement) error {
	src, err := placedSource(p)
	if err != nil {
		return err
	}
	spec.Source = provider.TemplateSource{Linked: p.LinkedClone, Settings: provider.SourceFromRecord(spec.Source.Settings, src)}
	spec.Network.Bridge, spec.Network.VLAN, spec.Network.Model = p.Bridge, p.VLAN, p.NICModel
	spec.CPUCores, spec.MemoryBytes, spec.DiskBytes = p.CPUCores, p.MemoryBytes, p.DiskBytes
	spec.MemoryHint = p.MemoryBytes
	if n := spec.Native; n != nil {
		n.VendorData, n.UserData, n.Storage = p.VendorSnippet, p.UserSnippet, p.DriveStorage
	}
	// The policy of the placement, whatever the cluster and template say
	// now: an edit of either reaches only claims placed after it. The
	// caller adds the VM's static addresses.
	spec.Isolation = nil
	if p.Isolation != "" {
		var iso provider.Isolation
		if err := json.Unmarshal([]byte(p.Isolation), &iso); err != nil {
			return fmt.Errorf("its isolation policy: %w", err)
		}
		if err := iso.Check(); err != nil {
			return fmt.Errorf("its isolation policy: %w", err)
		}
		spec.Isolation = &iso
	}
	// The hardware of the placement: its devices and disks were counted
	// against capacity and quota as recorded.
	spec.Hardware = nil
	if p.Hardware != "" {
		hw, err := PlacedHardware(p)
		if err != nil {
			return err
		}
		spec.Hardware = hw
	}
	return nil
}

// PlacedHardware is the hardware a verified placement record p holds, nil
// when it holds none.
func PlacedHardware(p ownership.Placement) (*provider.Hardware, error) {
	if p.Hardware == "" {
		return nil, nil
	}
	var hw provider.Hardware
	dec := json.NewDecoder(strings.NewReader(p.Hardware))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&hw); err != nil {
		return nil, fmt.Errorf("its hardware: %w", err)
	}
	if err := hw.Check(); err != nil {
		return nil, fmt.Errorf("its hardware: %w", err)
	}
	return &hw, nil
}

// placedSource is the kind's record of the template source p holds: its
// template reference (ownership.Placement.Template) read back, with the
// full clone's storage and format and the pool.
func placedSource(p ownership.Placement) (provider.SourceRecord, error) {
	src, err := provider.SourceRecord{Storage: p.Storage, Format: p.Format, Pool: p.ResourcePool}.WithTemplateRef(p.Template)
	if err != nil {
		return src, fmt.Errorf("its template: %w", err)
	}
	return src, nil
}

// withPlacedDomain returns tmpl and cluster as a placed claim's VM is built
// from them: copies whose merged DNS domain (vmspec.DNS) is the recorded
// one, whatever the template or the cluster say now (themselves when they
// still say it). The domain completes the VM's host name in its cloud-init
// and in status.network.fqdn, the name its addresses are registered in DNS
// and validated under: an edit after placement must not move a VM into a
// domain its namespace may not use.
func withPlacedDomain(tmpl *hfv1.HypervisorMachineTemplate, cluster *hfv1.HypervisorCluster, domain string) (*hfv1.HypervisorMachineTemplate, *hfv1.HypervisorCluster) {
	if vmspec.DNS(cluster, tmpl).Domain == domain {
		return tmpl, cluster
	}
	tmpl, cluster = tmpl.DeepCopy(), cluster.DeepCopy()
	if tmpl.Spec.Network.DNS == nil {
		tmpl.Spec.Network.DNS = &hfv1.DNSSettings{}
	}
	tmpl.Spec.Network.DNS.Domain = domain
	if cluster.Spec.DNS != nil {
		// An empty recorded domain must not fall back to one the cluster
		// gained since.
		cluster.Spec.DNS.Domain = domain
	}
	return tmpl, cluster
}

// placementField names where the claim's placement record is read from,
// for messages: status.placementRecord, or the annotation of a claim
// placed by an earlier operator.
func placementField(claim *hfv1.MachineClaim) string {
	if _, legacy := claim.Annotations[hfv1.PlacementAnnotation]; legacy && claim.Status.PlacementRecord == "" {
		return "annotation " + hfv1.PlacementAnnotation
	}
	return "status.placementRecord"
}

// ParsePlacement reads a placement record (status.placementRecord, or a
// PlacementAnnotation value): the record and the
// signature that must verify before it is used. Unknown fields are
// refused: nothing this operator wrote has them.
func ParsePlacement(v string) (ownership.Placement, string, error) {
	dec := json.NewDecoder(bytes.NewReader([]byte(v)))
	dec.DisallowUnknownFields()
	var rec placementRecord
	if err := dec.Decode(&rec); err != nil {
		return ownership.Placement{}, "", fmt.Errorf("not a placement record: %w", err)
	}
	if dec.More() {
		return ownership.Placement{}, "", fmt.Errorf("not a placement record: data after the JSON object")
	}
	if rec.Signature == "" || rec.Cluster == "" {
		return ownership.Placement{}, "", fmt.Errorf("not a placement record: cluster or signature missing")
	}
	return rec.Placement, rec.Signature, nil
}

// verifiedPlacement returns the claim's placement record once it has a VM: the
// values its VM was authorized with, to build the VM from. A record that
// cannot be trusted is an error, reported with a warning event and a count
// first: missing, unreadable, or with a signature that does not verify for
// this claim's UID and its VM's cluster (written or edited by someone other
// than this operator, or copied from another claim). The claim must then
// not build its VM any further. The check reads nothing: an error is never
// transient.
func (rv reservations) verifiedPlacement(ctx context.Context, s *claimScope) (ownership.Placement, error) {
	claim := s.claim
	p, err := rv.readPlacement(claim)
	if err != nil {
		err = fmt.Errorf("%s refused: %w; the claim's VM is not built from unverified values", placementField(claim), err)
		ctrl.LoggerFrom(ctx).Info("Refused a placement record", "reason", err.Error())
		metrics.PlacementRecordsRejected.Inc()
		rv.recorder.Event(claim, corev1.EventTypeWarning, string(hfv1.PlacementRecordRejectedReason), conditions.Truncate(err.Error(), 1024))
		return ownership.Placement{}, err
	}
	return p, nil
}

// readPlacement reads the claim's placement record and checks its signature.
func (rv reservations) readPlacement(claim *hfv1.MachineClaim) (ownership.Placement, error) {
	ref := claim.Status.VMRef
	if ref == nil {
		return ownership.Placement{}, fmt.Errorf("the claim has no VM yet")
	}
	v, ok := claim.Status.PlacementRecord, claim.Status.PlacementRecord != ""
	if !ok {
		// Placed by an earlier operator, which wrote the record into an
		// annotation.
		v, ok = claim.Annotations[hfv1.PlacementAnnotation]
	}
	if !ok {
		return ownership.Placement{}, fmt.Errorf("the claim has VM %s but no placement record (removed, or placed by a HyperFleet version without placement records)", ref.ID())
	}
	p, sig, err := ParsePlacement(v)
	switch {
	case err != nil:
		return ownership.Placement{}, err
	case p.Cluster != ref.HypervisorCluster:
		return ownership.Placement{}, fmt.Errorf("it names HypervisorCluster %s but the claim's VM is on %s", p.Cluster, ref.HypervisorCluster)
	case strings.HasPrefix(sig, ownership.LegacyPlacementVersion+"."):
		return ownership.Placement{}, fmt.Errorf("it was written by an earlier HyperFleet version (signature %s...), whose record leaves the cloud-init snippets, their drive's storage and the DNS domain to the template's current values; a RunnerPool replaces the claim, a claim made by hand must be created again",
			ownership.LegacyPlacementVersion)
	}
	p.ClaimUID = string(claim.UID)
	if rv.signer == nil || !rv.signer.VerifyPlacement(p, sig) {
		return ownership.Placement{}, fmt.Errorf("its signature does not verify for this claim (written by someone other than this operator, edited, or copied from another claim)")
	}
	return withTemplateRef(p)
}

// withTemplateRef is a verified record p with its template in this
// version's form: a record an earlier operator wrote names it by a number
// and a name (ownership.LegacyTemplate), which become its template
// reference, as the kind recorded them then. An error is a template
// reference that does not read back.
func withTemplateRef(p ownership.Placement) (ownership.Placement, error) {
	if t := p.LegacyTemplate; t != nil {
		p.Template, p.LegacyTemplate = provider.SourceRecord{Number: t.Number, Name: t.Name}.TemplateRef(), nil
	}
	if _, err := placedSource(p); err != nil {
		return ownership.Placement{}, err
	}
	return p, nil
}

package machineclaim

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	ctrl "sigs.k8s.io/controller-runtime"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/conditions"
	"github.com/hyperfleet/hyperfleet/internal/metrics"
	"github.com/hyperfleet/hyperfleet/pkg/ownership"
	"github.com/hyperfleet/hyperfleet/pkg/provider"
)

// placementRecord is the JSON of a PlacementAnnotation: the record and
// its signature.
type placementRecord struct {
	ownership.Placement
	Signature string `json:"signature"`
}

// RecordPlacement records in the claim's placement annotation (in memory;
// the caller writes it in the same write as the reservation) what spec's
// VM is made of on cluster, the values the claim was authorized with, signed
// with the install's key over the claim's UID and cluster. spec must be
// what the allow-lists were checked against in this pass, or a verified
// record already applied to it.
func RecordPlacement(claim *hfv1.MachineClaim, signer *ownership.Signer, cluster string, spec *provider.VMSpec) {
	p := placementOf(spec)
	p.ClaimUID, p.Cluster = string(claim.UID), cluster
	raw, err := json.Marshal(placementRecord{Placement: p, Signature: signer.SignPlacement(p)})
	if err != nil {
		// Strings, numbers and a bool: nothing json.Marshal refuses.
		panic(fmt.Sprintf("encode placement record: %v", err))
	}
	if claim.Annotations == nil {
		claim.Annotations = map[string]string{}
	}
	claim.Annotations[hfv1.PlacementAnnotation] = string(raw)
}

// placementOf is the part of spec the placement record holds: everything
// the cluster's allow-lists and defaults decide, and the resources.
func placementOf(spec *provider.VMSpec) ownership.Placement {
	return ownership.Placement{
		TemplateID: spec.Source.ID, TemplateName: spec.Source.Name, LinkedClone: spec.Source.Linked,
		Storage: spec.Source.Storage, Format: spec.Source.Format, ResourcePool: spec.Source.ResourcePool,
		Bridge: spec.Network.Bridge, VLAN: spec.Network.VLAN, NICModel: spec.Network.Model,
		CPUCores: spec.CPUCores, MemoryBytes: spec.MemoryBytes, DiskBytes: spec.DiskBytes,
	}
}

// ApplyPlacement makes spec's VM what the record says, whatever its
// template says now. The host name, MAC address and cloud-init stay the
// spec's: the first two derive from the claim, and the cloud-init runs
// inside the tenant's own VM (the allow-lists do not cover it).
func ApplyPlacement(spec *provider.VMSpec, p ownership.Placement) {
	spec.Source = provider.TemplateSource{
		ID: p.TemplateID, Name: p.TemplateName, Linked: p.LinkedClone,
		Storage: p.Storage, Format: p.Format, ResourcePool: p.ResourcePool,
	}
	spec.Network.Bridge, spec.Network.VLAN, spec.Network.Model = p.Bridge, p.VLAN, p.NICModel
	spec.CPUCores, spec.MemoryBytes, spec.DiskBytes = p.CPUCores, p.MemoryBytes, p.DiskBytes
	spec.MemoryHint = p.MemoryBytes
}

// ParsePlacement reads a PlacementAnnotation value: the record and the
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
func (r *Reconciler) verifiedPlacement(ctx context.Context, s *claimScope) (ownership.Placement, error) {
	claim := s.claim
	p, err := r.readPlacement(claim)
	if err != nil {
		err = fmt.Errorf("annotation %s refused: %w; the claim's VM is not built from unverified values", hfv1.PlacementAnnotation, err)
		ctrl.LoggerFrom(ctx).Info("Refused a placement record", "reason", err.Error())
		metrics.PlacementRecordsRejected.Inc()
		r.Recorder.Event(claim, corev1.EventTypeWarning, string(hfv1.PlacementRecordRejectedReason), conditions.Truncate(err.Error(), 1024))
		return ownership.Placement{}, err
	}
	return p, nil
}

// readPlacement reads the claim's placement record and checks its signature.
func (r *Reconciler) readPlacement(claim *hfv1.MachineClaim) (ownership.Placement, error) {
	ref := claim.Status.VMRef
	if ref == nil {
		return ownership.Placement{}, fmt.Errorf("the claim has no VM yet")
	}
	v, ok := claim.Annotations[hfv1.PlacementAnnotation]
	if !ok {
		return ownership.Placement{}, fmt.Errorf("the claim has VM %s but no placement record (removed, or placed by a HyperFleet version without placement records)", ref.ID())
	}
	p, sig, err := ParsePlacement(v)
	switch {
	case err != nil:
		return ownership.Placement{}, err
	case p.Cluster != ref.HypervisorCluster:
		return ownership.Placement{}, fmt.Errorf("it names HypervisorCluster %s but the claim's VM is on %s", p.Cluster, ref.HypervisorCluster)
	}
	p.ClaimUID = string(claim.UID)
	if r.Signer == nil || !r.Signer.VerifyPlacement(p, sig) {
		return ownership.Placement{}, fmt.Errorf("its signature does not verify for this claim (written by someone other than this operator, edited, or copied from another claim)")
	}
	return p, nil
}

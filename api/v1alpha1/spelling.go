package v1alpha1

import (
	"encoding/json"

	utiljson "k8s.io/apimachinery/pkg/util/json"
)

// Every JSON field name of this API that ends in an id spells it ID
// (templateID, vmID, jobID), as Kubernetes does (providerID, podCIDR).
// Seventeen fields were first spelt ...Id; each keeps that spelling in the
// schema as a Deprecated<Field> field beside its Go field, so that:
//
//   - the API server does not prune what an earlier operator or user
//     stored under it;
//   - decoding folds it into the Go field when the new spelling is unset
//     (UnmarshalJSON below), so the code reads one field and never the
//     deprecated one;
//   - encoding writes the new spelling only (MarshalJSON below): every
//     write the operator makes moves a field it touches;
//   - the Deprecated<Field> field keeps what was read, for the schema's
//     refusal of the old spelling on new writes (a CEL rule naming both),
//     the DeprecatedField event of a spec that still uses it, and the
//     status writes that move it (OldStatusSpellings, internal/patch).
//
// An UnmarshalJSON on each struct was chosen over conversion code at every
// reader: no reader changes, a struct decoded by any client (the cache,
// kubectl-hyperfleet, tests) sees the value, and the deprecated fields
// disappear with this API version.

// OldSpelling is a JSON key an object was read with under its earlier
// spelling: Path is where the object holding it sits (from the root, such
// as status, vmRef), Old the key as stored and New its spelling now.
type OldSpelling struct {
	Path     []string
	Old, New string
}

// decodeCaseSensitive decodes as the API machinery does: keys match field
// names exactly (encoding/json would also match jobId to jobID).
func decodeCaseSensitive(data []byte, v any) error {
	return utiljson.Unmarshal(data, v)
}

// fold sets *cur to old when cur is unset and old is set, and reports
// whether old was set.
func fold[T comparable](cur *T, old T) bool {
	var zero T
	if *cur == zero {
		*cur = old
	}
	return old != zero
}

// foldRef is fold for a required struct held by value whose deprecated
// spelling is a pointer.
func foldRef(cur *LocalSecretKeySelector, old *LocalSecretKeySelector) bool {
	if old == nil {
		return false
	}
	if *cur == (LocalSecretKeySelector{}) {
		*cur = *old
	}
	return true
}

// renames lists (old, new) for each deprecated spelling that is set.
type renames []OldSpelling

func (r *renames) add(set bool, oldKey, newKey string) {
	if set {
		*r = append(*r, OldSpelling{Old: oldKey, New: newKey})
	}
}

func (r renames) at(path ...string) []OldSpelling {
	for i := range r {
		r[i].Path = path
	}
	return r
}

// UnmarshalJSON reads templateId as templateID.
func (s *ProxmoxSource) UnmarshalJSON(data []byte) error {
	type plain ProxmoxSource
	if err := decodeCaseSensitive(data, (*plain)(s)); err != nil {
		return err
	}
	fold(&s.TemplateID, s.DeprecatedTemplateID) //nolint:staticcheck // the one reader
	return nil
}

// MarshalJSON writes templateID only.
func (s ProxmoxSource) MarshalJSON() ([]byte, error) {
	type plain ProxmoxSource
	p := plain(s)
	p.DeprecatedTemplateID = nil
	return json.Marshal(p)
}

// UnmarshalJSON reads appId and installationId as appID and
// installationID.
func (s *GitHubAppCredentials) UnmarshalJSON(data []byte) error {
	type plain GitHubAppCredentials
	if err := decodeCaseSensitive(data, (*plain)(s)); err != nil {
		return err
	}
	foldRef(&s.AppID, s.DeprecatedAppID)                   //nolint:staticcheck // the one reader
	foldRef(&s.InstallationID, s.DeprecatedInstallationID) //nolint:staticcheck // the one reader
	return nil
}

// MarshalJSON writes appID and installationID only.
func (s GitHubAppCredentials) MarshalJSON() ([]byte, error) {
	type plain GitHubAppCredentials
	p := plain(s)
	p.DeprecatedAppID, p.DeprecatedInstallationID = nil, nil
	return json.Marshal(p)
}

// UnmarshalJSON reads vmId as vmID.
func (s *ResolvedTemplate) UnmarshalJSON(data []byte) error {
	type plain ResolvedTemplate
	if err := decodeCaseSensitive(data, (*plain)(s)); err != nil {
		return err
	}
	fold(&s.VMID, s.DeprecatedVMID) //nolint:staticcheck // the one reader
	return nil
}

// MarshalJSON writes vmID only.
func (s ResolvedTemplate) MarshalJSON() ([]byte, error) {
	type plain ResolvedTemplate
	p := plain(s)
	p.DeprecatedVMID = 0
	return json.Marshal(p)
}

// UnmarshalJSON reads tokenId as tokenID.
func (s *HypervisorCredentials) UnmarshalJSON(data []byte) error {
	type plain HypervisorCredentials
	if err := decodeCaseSensitive(data, (*plain)(s)); err != nil {
		return err
	}
	fold(&s.TokenID, s.DeprecatedTokenID) //nolint:staticcheck // the one reader
	return nil
}

// MarshalJSON writes tokenID only.
func (s HypervisorCredentials) MarshalJSON() ([]byte, error) {
	type plain HypervisorCredentials
	p := plain(s)
	p.DeprecatedTokenID = nil
	return json.Marshal(p)
}

// UnmarshalJSON reads jobId and runId as jobID and runID.
func (s *CIJobSpec) UnmarshalJSON(data []byte) error {
	type plain CIJobSpec
	if err := decodeCaseSensitive(data, (*plain)(s)); err != nil {
		return err
	}
	fold(&s.JobID, s.DeprecatedJobID) //nolint:staticcheck // the one reader
	fold(&s.RunID, s.DeprecatedRunID) //nolint:staticcheck // the one reader
	return nil
}

// MarshalJSON writes jobID and runID only.
func (s CIJobSpec) MarshalJSON() ([]byte, error) {
	type plain CIJobSpec
	p := plain(s)
	p.DeprecatedJobID, p.DeprecatedRunID = 0, 0
	return json.Marshal(p)
}

// UnmarshalJSON reads runnerId and lastDeliveryId as runnerID and
// lastDeliveryID.
func (s *CIJobStatus) UnmarshalJSON(data []byte) error {
	type plain CIJobStatus
	if err := decodeCaseSensitive(data, (*plain)(s)); err != nil {
		return err
	}
	fold(&s.RunnerID, s.DeprecatedRunnerID)             //nolint:staticcheck // the one reader
	fold(&s.LastDeliveryID, s.DeprecatedLastDeliveryID) //nolint:staticcheck // the one reader
	return nil
}

// MarshalJSON writes runnerID and lastDeliveryID only.
func (s CIJobStatus) MarshalJSON() ([]byte, error) {
	type plain CIJobStatus
	p := plain(s)
	p.DeprecatedRunnerID, p.DeprecatedLastDeliveryID = 0, ""
	return json.Marshal(p)
}

// UnmarshalJSON reads vmId as vmID.
func (s *VMReference) UnmarshalJSON(data []byte) error {
	type plain VMReference
	if err := decodeCaseSensitive(data, (*plain)(s)); err != nil {
		return err
	}
	fold(&s.VMID, s.DeprecatedVMID) //nolint:staticcheck // the one reader
	return nil
}

// MarshalJSON writes vmID only.
func (s VMReference) MarshalJSON() ([]byte, error) {
	type plain VMReference
	p := plain(s)
	p.DeprecatedVMID = 0
	return json.Marshal(p)
}

// UnmarshalJSON reads runnerId, spiffeId and jobId as runnerID, spiffeID
// and jobID.
func (s *BootstrapStatus) UnmarshalJSON(data []byte) error {
	type plain BootstrapStatus
	if err := decodeCaseSensitive(data, (*plain)(s)); err != nil {
		return err
	}
	fold(&s.RunnerID, s.DeprecatedRunnerID) //nolint:staticcheck // the one reader
	fold(&s.SPIFFEID, s.DeprecatedSPIFFEID) //nolint:staticcheck // the one reader
	fold(&s.JobID, s.DeprecatedJobID)       //nolint:staticcheck // the one reader
	return nil
}

// MarshalJSON writes runnerID, spiffeID and jobID only.
func (s BootstrapStatus) MarshalJSON() ([]byte, error) {
	type plain BootstrapStatus
	p := plain(s)
	p.DeprecatedRunnerID, p.DeprecatedSPIFFEID, p.DeprecatedJobID = 0, "", 0
	return json.Marshal(p)
}

// UnmarshalJSON reads spiffeId, nodeId, entryId and keyId as spiffeID,
// nodeID, entryID and keyID.
func (s *IdentityStatus) UnmarshalJSON(data []byte) error {
	type plain IdentityStatus
	if err := decodeCaseSensitive(data, (*plain)(s)); err != nil {
		return err
	}
	fold(&s.SPIFFEID, s.DeprecatedSPIFFEID) //nolint:staticcheck // the one reader
	fold(&s.NodeID, s.DeprecatedNodeID)     //nolint:staticcheck // the one reader
	fold(&s.EntryID, s.DeprecatedEntryID)   //nolint:staticcheck // the one reader
	fold(&s.KeyID, s.DeprecatedKeyID)       //nolint:staticcheck // the one reader
	return nil
}

// MarshalJSON writes spiffeID, nodeID, entryID and keyID only.
func (s IdentityStatus) MarshalJSON() ([]byte, error) {
	type plain IdentityStatus
	p := plain(s)
	p.DeprecatedSPIFFEID, p.DeprecatedNodeID, p.DeprecatedEntryID, p.DeprecatedKeyID = "", "", "", nil
	return json.Marshal(p)
}

// OldStatusSpellings lists the status keys the claim was read with under
// their earlier spelling; internal/patch moves them at the next status
// write.
func (c *MachineClaim) OldStatusSpellings() []OldSpelling {
	var out []OldSpelling
	st := &c.Status
	if r := st.VMRef; r != nil {
		var n renames
		n.add(r.DeprecatedVMID != 0, "vmId", "vmID") //nolint:staticcheck // reports the deprecated field
		out = append(out, n.at("status", "vmRef")...)
	}
	if b := st.Bootstrap; b != nil {
		var n renames
		n.add(b.DeprecatedRunnerID != 0, "runnerId", "runnerID")  //nolint:staticcheck // reports the deprecated field
		n.add(b.DeprecatedSPIFFEID != "", "spiffeId", "spiffeID") //nolint:staticcheck // reports the deprecated field
		n.add(b.DeprecatedJobID != 0, "jobId", "jobID")           //nolint:staticcheck // reports the deprecated field
		out = append(out, n.at("status", "bootstrap")...)
	}
	if id := st.Identity; id != nil {
		var n renames
		n.add(id.DeprecatedSPIFFEID != "", "spiffeId", "spiffeID") //nolint:staticcheck // reports the deprecated field
		n.add(id.DeprecatedNodeID != "", "nodeId", "nodeID")       //nolint:staticcheck // reports the deprecated field
		n.add(id.DeprecatedEntryID != "", "entryId", "entryID")    //nolint:staticcheck // reports the deprecated field
		n.add(id.DeprecatedKeyID != nil, "keyId", "keyID")         //nolint:staticcheck // reports the deprecated field
		out = append(out, n.at("status", "identity")...)
	}
	return out
}

// OldStatusSpellings lists the status keys the template was read with
// under their earlier spelling; internal/patch moves them at the next
// status write.
func (t *HypervisorMachineTemplate) OldStatusSpellings() []OldSpelling {
	r := t.Status.ResolvedTemplate
	if r == nil || r.DeprecatedVMID == 0 { //nolint:staticcheck // reports the deprecated field
		return nil
	}
	return []OldSpelling{{Path: []string{"status", "resolvedTemplate"}, Old: "vmId", New: "vmID"}}
}

// OldSpecSpellings lists the spec keys a user still writes under their
// earlier spelling, as full paths (old, then new), for the DeprecatedField
// event of the template's controller.
func (t *HypervisorMachineTemplate) OldSpecSpellings() []OldSpelling {
	var out []OldSpelling
	if t.Spec.Source.Proxmox.DeprecatedTemplateID != nil { //nolint:staticcheck // reports the deprecated field
		out = append(out, OldSpelling{Path: []string{"spec", "source", "proxmox"}, Old: "templateId", New: "templateID"})
	}
	if gh := t.Spec.Bootstrap.GitHub; gh != nil && gh.Credentials.App != nil {
		var n renames
		n.add(gh.Credentials.App.DeprecatedAppID != nil, "appId", "appID")                            //nolint:staticcheck // reports the deprecated field
		n.add(gh.Credentials.App.DeprecatedInstallationID != nil, "installationId", "installationID") //nolint:staticcheck // reports the deprecated field
		out = append(out, n.at("spec", "bootstrap", "github", "credentials", "app")...)
	}
	return out
}

package spire

import (
	"strings"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
)

// TPM DevID attestation (SPIRE's built-in tpm_devid node attestor,
// docs/identity.md "TPM"): the operator signs each VM's DevID certificate
// with the claim's DevIDCommonName as subject, and the VM's agent alias is
// a node entry selecting that name, so the agent that attests with the
// certificate gets the claim's alias and nothing else.
const (
	// TPMDevIDAttestor is the attestor's name, the type of its selectors.
	TPMDevIDAttestor = "tpm_devid"
	// aliasEntryIDPrefix starts the id of a TPM claim's alias entry
	// (within EntryIDPrefix, as every entry HyperFleet creates).
	aliasEntryIDPrefix = EntryIDPrefix + "node."
)

// DevIDCommonName is the subject common name of the DevID certificate of
// the claim with uid: hyperfleet.<uid> (47 characters, within X.509's 64).
func DevIDCommonName(uid string) string { return EntryIDPrefix + uid }

// DevIDSelector is the selector tpm_devid gives an agent whose DevID
// certificate has the claim's common name.
func DevIDSelector(uid string) Selector {
	return Selector{Type: TPMDevIDAttestor, Value: "subject:cn:" + DevIDCommonName(uid)}
}

// AliasEntryIDFor is the id of the alias entry of the TPM claim with uid.
func AliasEntryIDFor(uid string) string { return aliasEntryIDPrefix + uid }

// EntryClaimUID is the UID of the claim an entry id of HyperFleet's names
// (EntryIDFor or AliasEntryIDFor); ok is false for any other id.
func EntryClaimUID(id string) (uid string, ok bool) {
	rest, ok := strings.CutPrefix(id, EntryIDPrefix)
	if !ok {
		return "", false
	}
	rest = strings.TrimPrefix(rest, "node.")
	return rest, rest != "" && !strings.ContainsAny(rest, "./")
}

// DevIDAgentClaimUID is the UID of the claim whose DevID certificate agent
// a attested with (its subject:cn selector); ok is false for any other
// agent.
func DevIDAgentClaimUID(a Agent) (uid string, ok bool) {
	if a.AttestationType != TPMDevIDAttestor {
		return "", false
	}
	for _, s := range a.Selectors {
		if cn, found := strings.CutPrefix(s.Value, "subject:cn:"+EntryIDPrefix); found && (s.Type == "" || s.Type == TPMDevIDAttestor) {
			return cn, cn != "" && !strings.ContainsAny(cn, "./")
		}
	}
	return "", false
}

// DevIDAgentID is spiffe://<td>/spire/agent/tpm_devid/<fingerprint>, the id
// SPIRE gives the agent that attests with the DevID certificate whose DER
// has that SHA-1 fingerprint (hex).
func DevIDAgentID(td spiffeid.TrustDomain, fingerprint string) spiffeid.ID {
	id, _ := spiffeid.FromSegments(td, "spire", "agent", TPMDevIDAttestor, fingerprint)
	return id
}

package ownership

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"strconv"
	"strings"
)

// reservationPurpose separates reservation MACs from ownership-block MACs
// made with the same key: a signature taken from a VM's description can
// never stand in for a reservation, nor the other way round.
const reservationPurpose = "hyperfleet.io/vm-reservation"

// reservationVersion prefixes reservation signatures: "r2.<key id>.<MAC>".
// An r2 reservation signs the VM's provider ID.
const reservationVersion = "r2"

// legacyReservationVersion prefixes the signatures of reservations written
// before provider IDs, which signed the decimal Proxmox VM id instead; they
// still verify (VerifyLegacyReservation), so that a claim reserved just
// before an upgrade keeps its VM.
const legacyReservationVersion = "r1"

// Reservation is a VM the operator reserved for a MachineClaim before its
// clone request: which cluster, node and VM, and for which claim (UID).
type Reservation struct {
	ClaimUID string
	Cluster  string
	Node     string
	// VM is the VM's provider ID (pkg/provider.ID); in a legacy (r1)
	// reservation the decimal Proxmox VM id.
	VM string
}

func (r Reservation) fields() []string {
	return []string{r.ClaimUID, r.Cluster, r.Node, r.VM}
}

// SignReservation returns the MAC that proves r was written by this
// install. The claim controller stores it next to the reservation in an
// annotation that tenants can write (see docs/security.md, "The placement
// record"); only a value carrying a MAC that verifies for the claim's own
// UID is ever acted on.
func (s *Signer) SignReservation(r Reservation) string {
	return s.signRecord(reservationPurpose, reservationVersion, r.fields())
}

// VerifyReservation reports whether sig is this install's MAC over r, made
// with any key of the ring (a reservation signed just before a key
// rotation still verifies), compared in constant time.
func (s *Signer) VerifyReservation(r Reservation, sig string) bool {
	return s.verifyRecord(reservationPurpose, reservationVersion, r.fields(), sig)
}

// VerifyLegacyReservation is VerifyReservation for a reservation an
// earlier version wrote (signature "r1..."): r.VM is the decimal Proxmox
// VM id it named.
func (s *Signer) VerifyLegacyReservation(r Reservation, sig string) bool {
	return s.verifyRecord(reservationPurpose, legacyReservationVersion, r.fields(), sig)
}

// signRecord is "<version>.<key id>.<MAC>" over the operator id and fields,
// under the ring's signing key. The MAC starts with purpose, so records of
// different kinds made with one key never stand in for each other.
func (s *Signer) signRecord(purpose, version string, fields []string) string {
	return s.recordMAC(purpose, version, s.signingID, s.keys[s.signingID], fields)
}

func (s *Signer) recordMAC(purpose, version string, id int, key []byte, fields []string) string {
	mac := hmac.New(sha256.New, key)
	fmt.Fprintf(mac, "%s\n", purpose)
	for _, f := range append([]string{s.operatorID}, fields...) {
		// Length-prefixed, so moving characters between fields changes
		// the signed bytes.
		fmt.Fprintf(mac, "%d:%s\n", len(f), f)
	}
	return version + "." + strconv.Itoa(id) + "." + base64.RawURLEncoding.EncodeToString(mac.Sum(nil))
}

// verifyRecord reports whether sig is signRecord's result for fields under
// the key of the ring it names, compared in constant time.
func (s *Signer) verifyRecord(purpose, version string, fields []string, sig string) bool {
	v, rest, ok := strings.Cut(sig, ".")
	if !ok || v != version {
		return false
	}
	idText, _, ok := strings.Cut(rest, ".")
	if !ok {
		return false
	}
	id, err := strconv.Atoi(idText)
	if err != nil {
		return false
	}
	key, ok := s.keys[id]
	if !ok {
		return false
	}
	return hmac.Equal([]byte(s.recordMAC(purpose, version, id, key, fields)), []byte(sig))
}

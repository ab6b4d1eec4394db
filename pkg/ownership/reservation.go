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

// reservationVersion prefixes reservation signatures: "r1.<key id>.<MAC>".
const reservationVersion = "r1"

// Reservation is a VM the operator reserved for a MachineClaim before its
// clone request: which cluster, node and VM id, and for which claim (UID).
type Reservation struct {
	ClaimUID string
	Cluster  string
	Node     string
	VMID     int
}

// SignReservation returns the MAC that proves r was written by this
// install. The claim controller stores it next to the reservation in an
// annotation that tenants can write (see docs/security.md, "Forged
// reservations"); only a value carrying a MAC that verifies for the claim's
// own UID is ever acted on.
func (s *Signer) SignReservation(r Reservation) string {
	return s.reservationMAC(s.signingID, s.keys[s.signingID], r)
}

// reservationMAC is "v1.<key id>.<MAC>" with the ring's key id.
func (s *Signer) reservationMAC(id int, key []byte, r Reservation) string {
	mac := hmac.New(sha256.New, key)
	fmt.Fprintf(mac, "%s\n", reservationPurpose)
	for _, f := range []string{s.operatorID, r.ClaimUID, r.Cluster, r.Node, strconv.Itoa(r.VMID)} {
		// Length-prefixed, so moving characters between fields changes
		// the signed bytes.
		fmt.Fprintf(mac, "%d:%s\n", len(f), f)
	}
	return reservationVersion + "." + strconv.Itoa(id) + "." + base64.RawURLEncoding.EncodeToString(mac.Sum(nil))
}

// VerifyReservation reports whether sig is this install's MAC over r, made
// with any key of the ring (a reservation signed just before a key
// rotation still verifies), compared in constant time.
func (s *Signer) VerifyReservation(r Reservation, sig string) bool {
	version, rest, ok := strings.Cut(sig, ".")
	if !ok || version != reservationVersion {
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
	return hmac.Equal([]byte(s.reservationMAC(id, key, r)), []byte(sig))
}

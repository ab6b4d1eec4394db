// Package ownership marks hypervisor VMs as created by one HyperFleet
// install and proves it later (docs/security.md, "Ownership keys"): the
// signed ownership block in a VM's description, and the signed VM
// reservation and placement record of a claim. It is part of the hypervisor
// contract (a provider writes and verifies the block), hence public.
//
// Proxmox tags cannot carry key/value pairs such as hyperfleet.io/managed-by=x
// ('/', '=' and ':' are illegal), so a VM carries two marks:
//
//   - legal tags, "hyperfleet" and "hf-<operator id>", cheap to read in bulk
//     from /cluster/resources and used only to pick candidates;
//   - a structured block in the VM description naming the operator, the
//     HypervisorCluster and the hypervisor's own cluster name, the claim
//     (namespace, name, UID), the pool, the creation time and the id of the
//     key that signed it, with an HMAC-SHA256 over those fields AND the VM
//     id, keyed by a per-install secret.
//
// Only the block is trusted. Because the VM id is signed, a block copied to
// another VM (a clone copies its template's description) never verifies;
// because the cluster identity is signed and checked against the cluster the
// block is read from, a block copied to a VM of another cluster never
// verifies either; any edit to a field breaks the signature.
//
// A Signer holds a key ring: it signs with its newest key (the highest id)
// and verifies a block with the key the block names, so keys can be rotated
// while VMs signed with older keys still run.
package ownership

import (
	"bufio"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
)

const (
	// TagManaged is the tag every HyperFleet VM carries.
	TagManaged = "hyperfleet"
	// TagOperatorPrefix starts the tag naming the install: hf-<operator id>.
	TagOperatorPrefix = "hf-"

	blockBegin = "-----BEGIN HYPERFLEET OWNERSHIP-----"
	blockEnd   = "-----END HYPERFLEET OWNERSHIP-----"

	// signatureVersion prefixes the signature so the scheme can change
	// without old blocks verifying under new rules. v1 (no key id, no
	// cluster identity) is no longer accepted: see ErrLegacyBlock.
	signatureVersion = "v2"
	legacyVersion    = "v1"

	// MinKeyLength is the shortest accepted HMAC key (256 bits).
	MinKeyLength = 32
)

// Errors returned by Verify. A VM for which Verify returns any error must
// never be modified or destroyed.
var (
	// ErrNoMarker means the description holds no ownership block.
	ErrNoMarker = errors.New("no HyperFleet ownership block in the VM description")
	// ErrMalformed means a block exists but cannot be parsed.
	ErrMalformed = errors.New("malformed HyperFleet ownership block")
	// ErrForeign means the block names another operator install.
	ErrForeign = errors.New("ownership block belongs to another HyperFleet install")
	// ErrBadSignature means the block was edited, forged or copied from
	// another VM or another cluster.
	ErrBadSignature = errors.New("ownership block signature does not verify (edited, forged or copied from another VM)")
	// ErrOtherCluster means the block was written for a VM of another
	// cluster (it wraps ErrBadSignature: such a block is a copy).
	ErrOtherCluster = fmt.Errorf("%w: written for another cluster", ErrBadSignature)
	// ErrUnknownKey means the block names a key id the ring does not hold
	// (the key was removed from the ownership Secret, or never was in it).
	ErrUnknownKey = errors.New("ownership block is signed with a key id this install does not hold")
	// ErrNoSuchKey means a key was asked for by an id the ring does not
	// hold (DerivedKeyByID): it was removed from the ownership Secret.
	ErrNoSuchKey = errors.New("the ownership key ring holds no key of this id")
	// ErrLegacyBlock means the block was signed by a HyperFleet version
	// before key ids and cluster binding; such blocks are not trusted
	// because a copy to another cluster would verify (docs/security.md).
	ErrLegacyBlock = errors.New("ownership block uses the retired v1 signature (no key id, no cluster binding)")
)

var operatorIDPattern = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,29}$`)

// Record is what the ownership block states about a VM.
type Record struct {
	// OperatorID names the HyperFleet install that created the VM.
	OperatorID string
	// Cluster names the cluster the VM was created on.
	Cluster ClusterIdentity
	// Namespace, Name and UID identify the MachineClaim the VM belongs to.
	Namespace string
	Name      string
	UID       string
	// Pool is the RunnerPool of the claim, empty when it has none.
	Pool string
	// VMID is the hypervisor's id of the VM the block was written for.
	VMID int
	// CreatedAt is when the claim was created, at second precision; it is
	// stable across retries so a re-signed block is identical.
	CreatedAt time.Time
	// KeyID is the id of the ring key that signed the block.
	KeyID int
}

// ClusterIdentity names the cluster a block belongs to. Both names are
// signed, so a block copied to a VM of another cluster never verifies.
type ClusterIdentity struct {
	// Name is the HypervisorCluster's name.
	Name string
	// HypervisorName is the hypervisor's own cluster name (Proxmox: the
	// name in /cluster/status); empty when the hypervisor has none.
	HypervisorName string
}

// String renders the identity for messages.
func (c ClusterIdentity) String() string {
	if c.HypervisorName == "" {
		return fmt.Sprintf("%q", c.Name)
	}
	return fmt.Sprintf("%q (hypervisor cluster %q)", c.Name, c.HypervisorName)
}

// Key is one HMAC key of a ring.
type Key struct {
	// ID names the key in blocks; the highest ID of a ring signs.
	ID int
	// Secret is the HMAC key, at least MinKeyLength bytes.
	Secret []byte
}

// Signer writes and verifies ownership blocks for one operator install and,
// once bound with ForCluster, one cluster.
type Signer struct {
	operatorID string
	// keys by id; signing uses signingID, the highest.
	keys      map[int][]byte
	signingID int
	cluster   ClusterIdentity
}

// NewSigner returns a Signer for operatorID with a ring of one key, id 1.
// See NewKeyRing.
func NewSigner(operatorID string, key []byte) (*Signer, error) {
	return NewKeyRing(operatorID, []Key{{ID: 1, Secret: key}})
}

// NewKeyRing returns a Signer for operatorID (lower-case letters, digits
// and '-', at most 30 characters, so that "hf-<id>" is a legal Proxmox tag)
// with the given keys (ids >= 0, distinct; each at least MinKeyLength
// bytes). It signs with the key of the highest id and verifies with any.
func NewKeyRing(operatorID string, keys []Key) (*Signer, error) {
	if !operatorIDPattern.MatchString(operatorID) {
		return nil, fmt.Errorf("operator id %q: use 1-30 lower-case letters, digits and '-', starting with a letter or digit", operatorID)
	}
	if len(keys) == 0 {
		return nil, errors.New("the ownership key ring is empty; give at least one key")
	}
	s := &Signer{operatorID: operatorID, keys: make(map[int][]byte, len(keys)), signingID: -1}
	for _, k := range keys {
		if k.ID < 0 {
			return nil, fmt.Errorf("ownership key id %d: use a number >= 0", k.ID)
		}
		if len(k.Secret) < MinKeyLength {
			return nil, fmt.Errorf("ownership key %d is %d bytes; use at least %d random bytes", k.ID, len(k.Secret), MinKeyLength)
		}
		if _, dup := s.keys[k.ID]; dup {
			return nil, fmt.Errorf("ownership key id %d appears twice", k.ID)
		}
		s.keys[k.ID] = append([]byte(nil), k.Secret...)
		s.signingID = max(s.signingID, k.ID)
	}
	return s, nil
}

// ForCluster returns a copy of s bound to cluster: it writes cluster into
// every block and verifies only blocks written for it.
func (s *Signer) ForCluster(cluster ClusterIdentity) *Signer {
	c := *s
	c.cluster = cluster
	return &c
}

// Cluster returns the cluster s is bound to (zero when unbound).
func (s *Signer) Cluster() ClusterIdentity { return s.cluster }

// SigningKeyID returns the id of the key new blocks are signed with.
func (s *Signer) SigningKeyID() int { return s.signingID }

// KeyIDs returns the ids of the ring's keys, ascending.
func (s *Signer) KeyIDs() []int {
	return slices.Sorted(maps.Keys(s.keys))
}

// OperatorID returns the install's id.
func (s *Signer) OperatorID() string { return s.operatorID }

// OperatorTag returns "hf-<operator id>".
func (s *Signer) OperatorTag() string { return TagOperatorPrefix + s.operatorID }

// Tags returns the legal hypervisor tags every VM of this install carries.
func (s *Signer) Tags() []string { return []string{TagManaged, s.OperatorTag()} }

// HasOperatorTag reports whether tags (as the hypervisor lists them) include
// this install's tag. It only selects candidates; it proves nothing.
func (s *Signer) HasOperatorTag(tags []string) bool {
	want := s.OperatorTag()
	for _, t := range tags {
		if strings.EqualFold(strings.TrimSpace(t), want) {
			return true
		}
	}
	return false
}

// fields lists the block's lines in signing order.
func fields(r Record) [][2]string {
	return [][2]string{
		{"operator", r.OperatorID},
		{"cluster", r.Cluster.Name},
		{"hypervisor-cluster", r.Cluster.HypervisorName},
		{"namespace", r.Namespace},
		{"name", r.Name},
		{"uid", r.UID},
		{"pool", r.Pool},
		{"vmid", strconv.Itoa(r.VMID)},
		{"created", r.CreatedAt.UTC().Truncate(time.Second).Format(time.RFC3339)},
		{"key", strconv.Itoa(r.KeyID)},
	}
}

// sign returns the signature of r with key, or "" when the ring has no key
// r.KeyID.
func (s *Signer) sign(r Record) string {
	key, ok := s.keys[r.KeyID]
	if !ok {
		return ""
	}
	mac := hmac.New(sha256.New, key)
	for _, f := range fields(r) {
		// Length-prefix every value so that moving characters between
		// fields changes the signed bytes.
		fmt.Fprintf(mac, "%s:%d:%s\n", f[0], len(f[1]), f[1])
	}
	return signatureVersion + ":" + base64.RawURLEncoding.EncodeToString(mac.Sum(nil))
}

// Block returns the signed ownership block for r. The record's OperatorID,
// Cluster and KeyID are replaced by the signer's (its newest key).
func (s *Signer) Block(r Record) string {
	r.OperatorID, r.Cluster, r.KeyID = s.operatorID, s.cluster, s.signingID
	var b strings.Builder
	b.WriteString(blockBegin)
	b.WriteByte('\n')
	for _, f := range fields(r) {
		fmt.Fprintf(&b, "%s: %s\n", f[0], f[1])
	}
	fmt.Fprintf(&b, "signature: %s\n", s.sign(r))
	b.WriteString(blockEnd)
	return b.String()
}

// Description returns a VM description made of an optional human-readable
// text and the signed block for r. Any block already in text is dropped so a
// VM never carries two.
func (s *Signer) Description(text string, r Record) string {
	text = strings.TrimSpace(StripBlock(text))
	if text == "" {
		return s.Block(r)
	}
	return text + "\n\n" + s.Block(r)
}

// StripBlock removes every ownership block from a description.
func StripBlock(description string) string {
	for {
		start := strings.Index(description, blockBegin)
		if start < 0 {
			return description
		}
		end := strings.Index(description[start:], blockEnd)
		if end < 0 {
			return description[:start]
		}
		description = description[:start] + description[start+end+len(blockEnd):]
	}
}

// Parse extracts the record of the first ownership block in description
// without verifying it, together with its signature. Blocks of the retired
// v1 scheme parse (KeyID 0, no cluster) so that Verify can name them.
func Parse(description string) (Record, string, error) {
	start := strings.Index(description, blockBegin)
	if start < 0 {
		return Record{}, "", ErrNoMarker
	}
	rest := description[start+len(blockBegin):]
	end := strings.Index(rest, blockEnd)
	if end < 0 {
		return Record{}, "", fmt.Errorf("%w: no end line", ErrMalformed)
	}
	values := map[string]string{}
	sc := bufio.NewScanner(strings.NewReader(rest[:end]))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" {
			continue
		}
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			return Record{}, "", fmt.Errorf("%w: line %q has no ':'", ErrMalformed, line)
		}
		k = strings.TrimSpace(k)
		if _, dup := values[k]; dup {
			return Record{}, "", fmt.Errorf("%w: field %q appears twice", ErrMalformed, k)
		}
		values[k] = strings.TrimSpace(v)
	}
	for _, k := range []string{"operator", "namespace", "name", "uid", "vmid", "created", "signature"} {
		if _, ok := values[k]; !ok {
			return Record{}, "", fmt.Errorf("%w: field %q is missing", ErrMalformed, k)
		}
	}
	if strings.HasPrefix(values["signature"], signatureVersion+":") {
		// The fields v2 signs beyond v1 must be written out, not implied.
		for _, k := range []string{"cluster", "hypervisor-cluster", "key"} {
			if _, ok := values[k]; !ok {
				return Record{}, "", fmt.Errorf("%w: field %q is missing", ErrMalformed, k)
			}
		}
	}
	vmid, err := strconv.Atoi(values["vmid"])
	if err != nil {
		return Record{}, "", fmt.Errorf("%w: vmid %q is not a number", ErrMalformed, values["vmid"])
	}
	created, err := time.Parse(time.RFC3339, values["created"])
	if err != nil {
		return Record{}, "", fmt.Errorf("%w: created %q is not an RFC 3339 time", ErrMalformed, values["created"])
	}
	keyID := 0
	if v, ok := values["key"]; ok {
		if keyID, err = strconv.Atoi(v); err != nil || keyID < 0 {
			return Record{}, "", fmt.Errorf("%w: key %q is not a key id", ErrMalformed, v)
		}
	}
	r := Record{
		OperatorID: values["operator"],
		Cluster:    ClusterIdentity{Name: values["cluster"], HypervisorName: values["hypervisor-cluster"]},
		Namespace:  values["namespace"],
		Name:       values["name"],
		UID:        values["uid"],
		Pool:       values["pool"],
		VMID:       vmid,
		CreatedAt:  created.UTC(),
		KeyID:      keyID,
	}
	return r, values["signature"], nil
}

// Verify checks that description carries a block written by this install
// for the VM with id vmid on the cluster s is bound to, signed with a key of
// the ring, and returns its record. Any error means: do not touch the VM.
func (s *Signer) Verify(description string, vmid int) (Record, error) {
	r, sig, err := Parse(description)
	if err != nil {
		return Record{}, err
	}
	if r.OperatorID != s.operatorID {
		return Record{}, fmt.Errorf("%w (%q)", ErrForeign, r.OperatorID)
	}
	if strings.HasPrefix(sig, legacyVersion+":") {
		return Record{}, ErrLegacyBlock
	}
	if _, ok := s.keys[r.KeyID]; !ok {
		return Record{}, fmt.Errorf("%w (key %d; the ring holds %v)", ErrUnknownKey, r.KeyID, s.KeyIDs())
	}
	if r.Cluster != s.cluster {
		return Record{}, fmt.Errorf("%w: the block names cluster %s, this is cluster %s", ErrOtherCluster, r.Cluster, s.cluster)
	}
	// The signature is checked against the VM id and the cluster the
	// caller observed, not the ones written in the block: a block copied
	// to another VM or another cluster fails.
	want := r
	want.VMID = vmid
	want.Cluster = s.cluster
	if !hmac.Equal([]byte(sig), []byte(s.sign(want))) {
		return Record{}, ErrBadSignature
	}
	return r, nil
}

// vmNameMACLength is how many hex characters of the name HMAC a VM name
// carries: 48 bits, so guessing a name that verifies for a given VM id
// takes about 2^47 attempts, each one a VM the guesser must create.
const vmNameMACLength = 12

// VMName returns the name a VM of this install carries from its clone
// request until it is configured: "hf-<operator id>-<vmid>-<mac>", where
// mac is an HMAC, keyed by the install's secret, over the operator id and
// the VM id. The hypervisor writes the name with the clone itself, before
// any tag, so the sweeper can find a clone whose configuration never
// happened; the MAC makes the name a proof that this install cloned this
// VM id (docs/security.md, "Orphans: VMs, ISOs, runners"). The result is
// at most 56 characters, a legal DNS label.
func (s *Signer) VMName(vmid int) string {
	return s.vmNameWith(s.keys[s.signingID], vmid)
}

func (s *Signer) vmNameWith(key []byte, vmid int) string {
	return fmt.Sprintf("%s%s-%d-%s", TagOperatorPrefix, s.operatorID, vmid, s.nameMAC(key, vmid))
}

// VerifyVMName reports whether name is the name VMName gives the VM with
// id vmid. A name copied to another VM id, written by another install or
// guessed does not verify.
// Every key of the ring is tried, so a clone named just before a key
// rotation is still found.
func (s *Signer) VerifyVMName(name string, vmid int) bool {
	name = strings.ToLower(strings.TrimSpace(name))
	for _, key := range s.keys {
		if hmac.Equal([]byte(name), []byte(s.vmNameWith(key, vmid))) {
			return true
		}
	}
	return false
}

func (s *Signer) nameMAC(key []byte, vmid int) string {
	mac := hmac.New(sha256.New, key)
	// Domain-separated from the block signature, whose lines never start
	// with this prefix.
	fmt.Fprintf(mac, "vm-name\x00%s\x00%d", s.operatorID, vmid)
	return hex.EncodeToString(mac.Sum(nil))[:vmNameMACLength]
}

// Runner names.
const (
	// MaxRunnerNameLength is the longest runner name the CI platforms
	// accept (GitHub: 64).
	MaxRunnerNameLength = 64
	// runnerMACLength is how many hex characters of the runner-name HMAC
	// a name carries (40 bits).
	runnerMACLength = 10
	// RunnerMarkLength is how many characters RunnerName appends.
	RunnerMarkLength = runnerMACLength + 1
)

// RunnerName marks a runner name as this install's: base (shortened, and
// stripped of trailing '-', to fit) followed by '-' and an HMAC, keyed by
// the install's secret, over the operator id and the shortened base. The
// orphan sweep removes only runners whose name verifies, so a runner
// someone else registered, or named after this install's scheme without
// its key, is never touched (docs/security.md, "Orphans: VMs, ISOs,
// runners"). The same base always gives the same name.
func (s *Signer) RunnerName(base string) string {
	limit := MaxRunnerNameLength - RunnerMarkLength
	if len(base) > limit {
		base = base[:limit]
	}
	base = strings.TrimRight(base, "-")
	return base + "-" + s.runnerMAC(s.keys[s.signingID], base)
}

// VerifyRunnerName reports whether name is a RunnerName of this install,
// and returns its base.
func (s *Signer) VerifyRunnerName(name string) (string, bool) {
	i := strings.LastIndexByte(name, '-')
	if i <= 0 || len(name)-i-1 != runnerMACLength {
		return "", false
	}
	base := name[:i]
	// Every key of the ring is tried: a runner registered before a key
	// rotation is still this install's.
	for _, key := range s.keys {
		if hmac.Equal([]byte(name[i+1:]), []byte(s.runnerMAC(key, base))) {
			return base, true
		}
	}
	return "", false
}

func (s *Signer) runnerMAC(key []byte, base string) string {
	mac := hmac.New(sha256.New, key)
	fmt.Fprintf(mac, "runner-name\x00%s\x00%s", s.operatorID, base)
	return hex.EncodeToString(mac.Sum(nil))[:runnerMACLength]
}

// powerOffTokenBytes is the length of a power-off notice token's HMAC
// (the full SHA-256: it is a bearer credential, not a tag).
const powerOffTokenBytes = sha256.Size

// PowerOffToken is the bearer token a claim's VM presents when it tells the
// operator it is about to power off: an HMAC, keyed by the install's
// secret, over the claim's namespace, name and UID. Nothing is stored: any
// replica, before or after a restart, verifies it with the key ring. It
// authorizes nothing but one hint about that claim's VM
// (docs/architecture.md, "Power-off hints").
func (s *Signer) PowerOffToken(namespace, name, uid string) string {
	return s.powerOffMAC(s.keys[s.signingID], namespace, name, uid)
}

// VerifyPowerOffToken reports whether token is PowerOffToken of the claim,
// under any key of the ring (a VM created before a key rotation still
// verifies). The comparison takes constant time.
func (s *Signer) VerifyPowerOffToken(namespace, name, uid, token string) bool {
	if len(token) != 2*powerOffTokenBytes || uid == "" {
		return false
	}
	for _, key := range s.keys {
		if hmac.Equal([]byte(token), []byte(s.powerOffMAC(key, namespace, name, uid))) {
			return true
		}
	}
	return false
}

func (s *Signer) powerOffMAC(key []byte, namespace, name, uid string) string {
	mac := hmac.New(sha256.New, key)
	// Domain-separated from the block, VM-name and runner-name MACs.
	fmt.Fprintf(mac, "poweroff-notice\x00%s\x00%s\x00%s\x00%s", s.operatorID, namespace, name, uid)
	return hex.EncodeToString(mac.Sum(nil))
}

// DerivedKey is a key for another purpose (such as deriving SPIRE join
// tokens) derived from the signing key, so that an install keeps a single
// secret: HMAC-SHA256(signing key, "hyperfleet derived key\x00"+purpose).
// It changes when the ring gets a new signing key: what must be derived
// again later, such as a claim's join token after a key rotation, is
// derived with DerivedKeyByID and the key id recorded when it was first
// issued.
func (s *Signer) DerivedKey(purpose string) []byte {
	key, _ := s.DerivedKeyByID(s.signingID, purpose)
	return key
}

// DerivedKeyByID is DerivedKey with the ring's key id instead of the
// signing key, so that a secret derived before a rotation is derived the
// same after it, for as long as its key stays in the ring. A key id the
// ring does not hold is ErrNoSuchKey.
func (s *Signer) DerivedKeyByID(id int, purpose string) ([]byte, error) {
	key, ok := s.keys[id]
	if !ok {
		return nil, fmt.Errorf("%w: key %d, the ring holds %v (put the key back into the ownership Secret and restart, or let what it derived end)", ErrNoSuchKey, id, s.KeyIDs())
	}
	mac := hmac.New(sha256.New, key)
	mac.Write([]byte("hyperfleet derived key\x00" + purpose))
	return mac.Sum(nil), nil
}

package ownership

import (
	"bytes"
	"errors"
	"strings"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/hyperfleet/hyperfleet/internal/testworld/proptest"
)

// Generators of what the operator signs: Kubernetes names (a namespace is
// a DNS label, a claim or pool name a DNS subdomain), UUIDs, install ids
// the signer accepts, Proxmox VM ids and creation times at second
// precision.
var (
	dnsLabel  = rapid.StringMatching(`[a-z0-9]([a-z0-9-]{0,20}[a-z0-9])?`)
	subdomain = rapid.Custom(func(t *rapid.T) string {
		return strings.Join(rapid.SliceOfN(dnsLabel, 1, 3).Draw(t, "labels"), ".")
	})
	uuid        = rapid.StringMatching(`[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}`)
	operatorIDs = rapid.StringMatching(`[a-z0-9][a-z0-9-]{0,29}`)
	vmids       = rapid.IntRange(100, 999_999_999)
	keys        = rapid.Custom(func(t *rapid.T) []byte {
		return rapid.SliceOfN(rapid.Byte(), MinKeyLength, 2*MinKeyLength).Draw(t, "key")
	})
	clusters = rapid.Custom(func(t *rapid.T) ClusterIdentity {
		c := ClusterIdentity{Name: subdomain.Draw(t, "cluster")}
		if rapid.Bool().Draw(t, "hypervisor cluster name") {
			c.HypervisorName = dnsLabel.Draw(t, "hypervisor cluster")
		}
		return c
	})
	records = rapid.Custom(func(t *rapid.T) Record {
		r := Record{
			Namespace: dnsLabel.Draw(t, "namespace"),
			Name:      subdomain.Draw(t, "name"),
			UID:       uuid.Draw(t, "uid"),
			VMID:      vmids.Draw(t, "vmid"),
			CreatedAt: time.Unix(rapid.Int64Range(0, 4_102_444_800).Draw(t, "created"), 0).UTC(),
		}
		if rapid.Bool().Draw(t, "in a pool") {
			r.Pool = subdomain.Draw(t, "pool")
		}
		return r
	})
	// descriptionText is what a person may have written in a VM's
	// description before the operator added its block: lines, colons,
	// and a stale block of its own now and then.
	descriptionText = rapid.Custom(func(t *rapid.T) string {
		text := rapid.StringMatching(`[a-zA-Z0-9 :/.\n-]{0,80}`).Draw(t, "text")
		if rapid.IntRange(0, 4).Draw(t, "stale block") == 0 {
			text += "\n" + blockBegin + "\noperator: someone-else\n" + blockEnd + "\n"
		}
		return text
	})
)

func newPropertySigner(t *rapid.T, id string, key []byte, c ClusterIdentity) *Signer {
	s, err := NewSigner(id, key)
	if err != nil {
		t.Fatalf("NewSigner(%q): %v", id, err)
	}
	return s.ForCluster(c)
}

// Feature: hyperfleet-operator, Property 20: VM Tagging and Metadata
//
// TestOwnershipMetadataProperty: for every install id, key, cluster and
// claim (generated), the VM's ownership metadata is complete and reads
// back: the tags are legal Proxmox tags naming HyperFleet and the install
// (matched case-insensitively, as Proxmox compares them); the description
// keeps the person's text, carries exactly one block, and verifies to the
// claim's record with the install, cluster and signing key filled in; the
// VM name proves the install and the VM id.
func TestOwnershipMetadataProperty(t *testing.T) {
	proptest.Check(t, 1000, func(t *rapid.T) {
		id, key, cluster := operatorIDs.Draw(t, "operator"), keys.Draw(t, "key"), clusters.Draw(t, "cluster")
		s := newPropertySigner(t, id, key, cluster)
		rec, text := records.Draw(t, "record"), descriptionText.Draw(t, "text")

		tags := s.Tags()
		if len(tags) != 2 || tags[0] != TagManaged || tags[1] != TagOperatorPrefix+id {
			t.Fatalf("Tags() = %q, want [%s %s%s]", tags, TagManaged, TagOperatorPrefix, id)
		}
		for _, tag := range tags {
			for i, c := range tag {
				legal := c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_' || i > 0 && (c == '-' || c == '+' || c == '.')
				if !legal {
					t.Fatalf("tag %q has %q, which Proxmox refuses", tag, c)
				}
			}
		}
		if !s.HasOperatorTag([]string{"other", strings.ToUpper(s.OperatorTag())}) {
			t.Fatalf("HasOperatorTag misses its own tag in upper case")
		}

		desc := s.Description(text, rec)
		if n := strings.Count(desc, blockBegin); n != 1 {
			t.Fatalf("description carries %d blocks:\n%s", n, desc)
		}
		if kept := strings.TrimSpace(StripBlock(text)); kept != "" && !strings.HasPrefix(desc, kept+"\n\n") {
			t.Fatalf("the person's text %q is not kept first:\n%s", kept, desc)
		}
		got, err := s.Verify(desc, rec.VMID)
		if err != nil {
			t.Fatalf("Verify: %v\n%s", err, desc)
		}
		want := rec
		want.OperatorID, want.Cluster, want.KeyID = id, cluster, s.SigningKeyID()
		if got != want {
			t.Fatalf("record read back = %+v, want %+v", got, want)
		}
		// Signing again (a retry) gives the same description.
		if again := s.Description(desc, rec); again != desc {
			t.Fatalf("re-signing changed the description:\n%s\nthen\n%s", desc, again)
		}
		if name := s.VMName(rec.VMID); !s.VerifyVMName(name, rec.VMID) || s.VerifyVMName(name, rec.VMID+1) {
			t.Fatalf("VM name %q does not prove exactly VM %d", name, rec.VMID)
		}
	})
}

// Feature: hyperfleet-operator, Property 26: VM Ownership and Isolation
//
// TestOwnershipIsolationProperty: a VM's description verifies for the
// install, cluster and VM it was written for and for nothing else. For a
// generated claim and a generated way the VM may not be this install's
// (never marked, another install's block, another key under the same id,
// another cluster, a copy to another VM, a field edited, a key retired
// from the ring, the block truncated), Verify refuses with the error that
// names it. The VM name and tag checks refuse other installs alike. That
// the operator validates these markers before every operation (status
// read, destroy, power-off, configuration, the orphan sweep) and acts on
// its own VMs only is internal/sweeper's TestOwnershipOperationsProperty.
func TestOwnershipIsolationProperty(t *testing.T) {
	var kinds [9]int
	proptest.Check(t, 1000, func(t *rapid.T) {
		id, key, cluster := operatorIDs.Draw(t, "operator"), keys.Draw(t, "key"), clusters.Draw(t, "cluster")
		s := newPropertySigner(t, id, key, cluster)
		rec := records.Draw(t, "record")
		good := s.Description("", rec)
		if _, err := s.Verify(good, rec.VMID); err != nil {
			t.Fatalf("own block refused: %v", err)
		}

		desc, vmid := good, rec.VMID
		var want error
		kind := rapid.IntRange(0, len(kinds)-1).Draw(t, "kind")
		kinds[kind]++
		switch kind {
		case 0: // made by hand, never marked
			desc, want = descriptionText.Filter(func(s string) bool { return !strings.Contains(s, blockBegin) }).Draw(t, "hand-made"), ErrNoMarker
		case 1: // another install
			other := operatorIDs.Filter(func(o string) bool { return o != id }).Draw(t, "other operator")
			desc, want = newPropertySigner(t, other, key, cluster).Description("", rec), ErrForeign
		case 2: // another key under the same install id
			otherKey := keys.Filter(func(k []byte) bool { return !bytes.Equal(k, key) }).Draw(t, "other key")
			desc, want = newPropertySigner(t, id, otherKey, cluster).Description("", rec), ErrBadSignature
		case 3: // written on another cluster
			other := clusters.Filter(func(c ClusterIdentity) bool { return c != cluster }).Draw(t, "other cluster")
			desc, want = newPropertySigner(t, id, key, other).Description("", rec), ErrOtherCluster
		case 4: // copied to another VM
			vmid, want = vmids.Filter(func(v int) bool { return v != rec.VMID }).Draw(t, "other vmid"), ErrBadSignature
		case 5: // one signed field edited to another valid value
			edited := rec
			switch rapid.IntRange(0, 4).Draw(t, "field") {
			case 0:
				edited.Namespace = dnsLabel.Filter(func(v string) bool { return v != rec.Namespace }).Draw(t, "namespace'")
			case 1:
				edited.Name = subdomain.Filter(func(v string) bool { return v != rec.Name }).Draw(t, "name'")
			case 2:
				edited.UID = uuid.Filter(func(v string) bool { return v != rec.UID }).Draw(t, "uid'")
			case 3:
				edited.Pool = subdomain.Filter(func(v string) bool { return v != rec.Pool }).Draw(t, "pool'")
			case 4:
				edited.CreatedAt = rec.CreatedAt.Add(time.Duration(rapid.IntRange(1, 86400).Draw(t, "seconds later")) * time.Second)
			}
			r, sig, err := Parse(good)
			if err != nil {
				t.Fatal(err)
			}
			edited.OperatorID, edited.Cluster, edited.KeyID = r.OperatorID, r.Cluster, r.KeyID
			desc, want = forgeBlock(edited, sig), ErrBadSignature
		case 6: // signed with a key the ring no longer holds
			ring, err := NewKeyRing(id, []Key{{ID: 1, Secret: key}, {ID: 2, Secret: keys.Draw(t, "newer key")}})
			if err != nil {
				t.Fatal(err)
			}
			desc, want = ring.ForCluster(cluster).Description("", rec), ErrUnknownKey
		case 7: // truncated
			cut := rapid.IntRange(len(blockBegin), len(good)-1).Draw(t, "cut at")
			desc, want = good[:cut], nil // malformed or, cut inside the signature, a bad signature
		case 8: // the retired v1 scheme
			desc, want = strings.Replace(good, "signature: "+signatureVersion+":", "signature: "+legacyVersion+":", 1), ErrLegacyBlock
		}
		_, err := s.Verify(desc, vmid)
		if err == nil {
			t.Fatalf("Verify accepted a VM that is not this install's (kind %d):\n%s", kind, desc)
		}
		if want != nil && !errors.Is(err, want) {
			t.Fatalf("Verify = %v, want %v (kind %d)", err, want, kind)
		}
		if kind == 7 && !errors.Is(err, ErrMalformed) && !errors.Is(err, ErrBadSignature) {
			t.Fatalf("truncated block: Verify = %v, want malformed or bad signature", err)
		}
		if kind == 1 {
			other, _, _ := Parse(desc)
			if s.HasOperatorTag([]string{TagManaged, TagOperatorPrefix + other.OperatorID}) {
				t.Fatalf("install %q claims the tag of install %q", id, other.OperatorID)
			}
			if theirs := newPropertySigner(t, other.OperatorID, key, cluster); s.VerifyVMName(theirs.VMName(vmid), vmid) {
				t.Fatalf("install %q accepts the VM name of install %q", id, other.OperatorID)
			}
		}
	})
	for kind, n := range kinds {
		if n == 0 {
			t.Errorf("kind %d never drawn", kind)
		}
	}
}

// forgeBlock writes a block for r with a signature taken from elsewhere, as
// someone editing a VM's description would.
func forgeBlock(r Record, sig string) string {
	var b strings.Builder
	b.WriteString(blockBegin + "\n")
	for _, f := range fields(r) {
		b.WriteString(f[0] + ": " + f[1] + "\n")
	}
	b.WriteString("signature: " + sig + "\n" + blockEnd)
	return b.String()
}

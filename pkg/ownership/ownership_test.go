package ownership

import (
	"bytes"
	"errors"
	"regexp"
	"strings"
	"testing"
	"time"
)

func testSigner(t *testing.T, id string, keyByte byte) *Signer {
	t.Helper()
	s, err := NewSigner(id, bytes.Repeat([]byte{keyByte}, MinKeyLength))
	if err != nil {
		t.Fatal(err)
	}
	return s.ForCluster(testCluster)
}

var testCluster = ClusterIdentity{Name: "pve-a", HypervisorName: "lab"}

func sampleRecord() Record {
	return Record{
		Namespace: "ci", Name: "runner-abc", UID: "6f1c9a2e-0000-4000-8000-000000000001",
		Pool: "linux", VMID: 1234, CreatedAt: time.Date(2026, 11, 21, 10, 0, 0, 0, time.UTC),
	}
}

func TestNewSignerRejectsBadInput(t *testing.T) {
	key := bytes.Repeat([]byte{1}, MinKeyLength)
	for _, id := range []string{"", "UPPER", "has/slash", "has=eq", "-lead", strings.Repeat("a", 31)} {
		if _, err := NewSigner(id, key); err == nil {
			t.Errorf("operator id %q accepted", id)
		}
	}
	if _, err := NewSigner("ok", key[:MinKeyLength-1]); err == nil || !strings.Contains(err.Error(), "at least 32") {
		t.Errorf("short key: got %v", err)
	}
	for name, keys := range map[string][]Key{
		"empty ring":    nil,
		"duplicate id":  {{ID: 1, Secret: key}, {ID: 1, Secret: key}},
		"negative id":   {{ID: -1, Secret: key}},
		"one key short": {{ID: 1, Secret: key}, {ID: 2, Secret: key[:5]}},
	} {
		if _, err := NewKeyRing("ok", keys); err == nil {
			t.Errorf("%s accepted", name)
		}
	}
}

func TestTagsAreLegalProxmoxTags(t *testing.T) {
	s := testSigner(t, "prod-1", 7)
	for _, tag := range s.Tags() {
		for i, c := range tag {
			legal := c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_' ||
				i > 0 && (c == '-' || c == '+' || c == '.')
			if !legal {
				t.Errorf("tag %q has character %q that Proxmox rejects", tag, c)
			}
		}
	}
	if !s.HasOperatorTag([]string{"other", "HF-PROD-1"}) {
		t.Error("HasOperatorTag must compare case-insensitively like Proxmox")
	}
	if s.HasOperatorTag([]string{"hyperfleet", "hf-prod-2"}) {
		t.Error("HasOperatorTag matched another install's tag")
	}
}

func TestVerifyRoundTrip(t *testing.T) {
	s := testSigner(t, "prod-1", 7)
	rec := sampleRecord()
	desc := s.Description("Runner VM for ci/runner-abc", rec)
	got, err := s.Verify(desc, rec.VMID)
	if err != nil {
		t.Fatalf("Verify: %v\n%s", err, desc)
	}
	rec.OperatorID, rec.Cluster, rec.KeyID = "prod-1", testCluster, 1
	if got != rec {
		t.Errorf("record = %+v, want %+v", got, rec)
	}
	if !strings.HasPrefix(desc, "Runner VM for ci/runner-abc\n\n") {
		t.Errorf("free text lost: %q", desc)
	}
}

func TestVerifySurvivesHypervisorWhitespace(t *testing.T) {
	// Proxmox stores the description as comment lines; trailing spaces and
	// CRLF line ends must not break verification.
	s := testSigner(t, "prod-1", 7)
	rec := sampleRecord()
	desc := strings.ReplaceAll(s.Description("", rec), "\n", " \r\n")
	if _, err := s.Verify(desc, rec.VMID); err != nil {
		t.Fatal(err)
	}
}

func TestVerifyRejects(t *testing.T) {
	s := testSigner(t, "prod-1", 7)
	rec := sampleRecord()
	good := s.Block(rec)
	cases := []struct {
		name string
		desc string
		vmid int
		want error
	}{
		{"no block", "a template made by hand", rec.VMID, ErrNoMarker},
		{"copied to a clone", good, rec.VMID + 1, ErrBadSignature},
		{"edited name", strings.Replace(good, "name: runner-abc", "name: runner-abd", 1), rec.VMID, ErrBadSignature},
		{"edited vmid line", strings.Replace(good, "vmid: 1234", "vmid: 1235", 1), 1235, ErrBadSignature},
		{"edited created", strings.Replace(good, "2026-11-21T10:00:00Z", "2026-11-21T10:00:01Z", 1), rec.VMID, ErrBadSignature},
		{"field moved between values", strings.Replace(strings.Replace(good, "namespace: ci", "namespace: cir", 1), "name: runner-abc", "name: unner-abc", 1), rec.VMID, ErrBadSignature},
		{"other install's key", testSigner(t, "prod-1", 8).Block(rec), rec.VMID, ErrBadSignature},
		{"other install's id", testSigner(t, "prod-2", 7).Block(rec), rec.VMID, ErrForeign},
		{"truncated", strings.TrimSuffix(good, blockEnd), rec.VMID, ErrMalformed},
		{"missing signature", strings.Replace(good, "signature:", "signatur:", 1), rec.VMID, ErrMalformed},
		{"duplicate field", strings.Replace(good, "pool: linux", "pool: linux\npool: other", 1), rec.VMID, ErrMalformed},
		{"bad vmid", strings.Replace(good, "vmid: 1234", "vmid: x", 1), rec.VMID, ErrMalformed},
		{"key line dropped", strings.Replace(good, "key: 1\n", "", 1), rec.VMID, ErrMalformed},
		{"cluster line dropped", strings.Replace(good, "cluster: pve-a\n", "", 1), rec.VMID, ErrMalformed},
		{"bad key id", strings.Replace(good, "key: 1\n", "key: -1\n", 1), rec.VMID, ErrMalformed},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := s.Verify(tc.desc, tc.vmid); !errors.Is(err, tc.want) {
				t.Errorf("Verify = %v, want %v", err, tc.want)
			}
		})
	}
}

func TestKeyRingSignsWithNewestAndVerifiesWithEvery(t *testing.T) {
	oldKey, newKey := bytes.Repeat([]byte{1}, MinKeyLength), bytes.Repeat([]byte{2}, MinKeyLength)
	before, err := NewKeyRing("prod-1", []Key{{ID: 3, Secret: oldKey}})
	if err != nil {
		t.Fatal(err)
	}
	before = before.ForCluster(testCluster)
	rotated, err := NewKeyRing("prod-1", []Key{{ID: 4, Secret: newKey}, {ID: 3, Secret: oldKey}})
	if err != nil {
		t.Fatal(err)
	}
	rotated = rotated.ForCluster(testCluster)
	rec := sampleRecord()

	// A VM signed before the rotation still verifies after it.
	old := before.Block(rec)
	got, err := rotated.Verify(old, rec.VMID)
	if err != nil || got.KeyID != 3 {
		t.Fatalf("block of key 3 after rotation: record %+v, error %v", got, err)
	}
	// New blocks name and use the newest key: the old ring cannot verify them.
	fresh := rotated.Block(rec)
	if !strings.Contains(fresh, "\nkey: 4\n") {
		t.Errorf("new block does not name key 4:\n%s", fresh)
	}
	if _, err := rotated.Verify(fresh, rec.VMID); err != nil {
		t.Fatalf("new block: %v", err)
	}
	if _, err := before.Verify(fresh, rec.VMID); !errors.Is(err, ErrUnknownKey) {
		t.Errorf("ring without key 4 verifying a key-4 block: %v, want %v", err, ErrUnknownKey)
	}
	// Relabelling a block with another key id of the ring breaks it.
	relabelled := strings.Replace(fresh, "key: 4", "key: 3", 1)
	if _, err := rotated.Verify(relabelled, rec.VMID); !errors.Is(err, ErrBadSignature) {
		t.Errorf("block relabelled to key 3: %v, want %v", err, ErrBadSignature)
	}
}

// TestDerivedKeyByID: a key derived with a ring's key id is the same
// after a rotation (DerivedKey then derives from the new signing key), is
// another for another purpose or key, and a key id the ring no longer
// holds is ErrNoSuchKey, not some other key.
func TestDerivedKeyByID(t *testing.T) {
	oldKey, newKey := bytes.Repeat([]byte{1}, MinKeyLength), bytes.Repeat([]byte{2}, MinKeyLength)
	before, err := NewKeyRing("prod-1", []Key{{ID: 3, Secret: oldKey}})
	if err != nil {
		t.Fatal(err)
	}
	rotated, err := NewKeyRing("prod-1", []Key{{ID: 4, Secret: newKey}, {ID: 3, Secret: oldKey}})
	if err != nil {
		t.Fatal(err)
	}
	issued := before.DerivedKey("broker proof")
	again, err := rotated.DerivedKeyByID(3, "broker proof")
	if err != nil || !bytes.Equal(again, issued) {
		t.Fatalf("key 3 derived after the rotation: %x, %v; want %x", again, err, issued)
	}
	if bytes.Equal(rotated.DerivedKey("broker proof"), issued) {
		t.Error("DerivedKey after the rotation still derives from key 3")
	}
	if other, _ := rotated.DerivedKeyByID(3, "spire join token"); bytes.Equal(other, issued) {
		t.Error("two purposes derive the same key")
	}
	if k, err := before.DerivedKeyByID(4, "broker proof"); !errors.Is(err, ErrNoSuchKey) || k != nil {
		t.Errorf("a key id the ring does not hold: %x, %v; want %v", k, err, ErrNoSuchKey)
	}
}

func TestBlockCopiedToAnotherClusterNeverVerifies(t *testing.T) {
	base := testSigner(t, "prod-1", 7)
	rec := sampleRecord()
	block := base.Block(rec)
	for name, other := range map[string]ClusterIdentity{
		"other HypervisorCluster": {Name: "pve-b", HypervisorName: testCluster.HypervisorName},
		"other Proxmox cluster":   {Name: testCluster.Name, HypervisorName: "prod"},
		"unbound signer":          {},
	} {
		t.Run(name, func(t *testing.T) {
			// Same install, same key, same VM id: only the cluster differs.
			if _, err := base.ForCluster(other).Verify(block, rec.VMID); !errors.Is(err, ErrBadSignature) || !errors.Is(err, ErrOtherCluster) {
				t.Errorf("Verify on %+v = %v, want %v", other, err, ErrOtherCluster)
			}
			// Rewriting the cluster lines to the target's does not help.
			forged := strings.Replace(strings.Replace(block,
				"cluster: "+testCluster.Name+"\n", "cluster: "+other.Name+"\n", 1),
				"hypervisor-cluster: "+testCluster.HypervisorName+"\n", "hypervisor-cluster: "+other.HypervisorName+"\n", 1)
			if _, err := base.ForCluster(other).Verify(forged, rec.VMID); !errors.Is(err, ErrBadSignature) {
				t.Errorf("block with rewritten cluster lines on %+v = %v, want %v", other, err, ErrBadSignature)
			}
		})
	}
	if _, err := base.Verify(block, rec.VMID); err != nil {
		t.Fatalf("own cluster: %v", err)
	}
}

func TestLegacyBlocksAreRejected(t *testing.T) {
	s := testSigner(t, "prod-1", 7)
	rec := sampleRecord()
	// The v1 layout: no cluster lines, no key line, a v1 signature.
	var legacy []string
	for _, line := range strings.Split(s.Block(rec), "\n") {
		if strings.HasPrefix(line, "cluster:") || strings.HasPrefix(line, "hypervisor-cluster:") || strings.HasPrefix(line, "key:") {
			continue
		}
		legacy = append(legacy, strings.Replace(line, "signature: v2:", "signature: v1:", 1))
	}
	if _, err := s.Verify(strings.Join(legacy, "\n"), rec.VMID); !errors.Is(err, ErrLegacyBlock) {
		t.Errorf("v1 block: %v, want %v", err, ErrLegacyBlock)
	}
}

func TestDescriptionReplacesExistingBlock(t *testing.T) {
	// A clone inherits the template's description, block included; the
	// operator's description must carry exactly one block, its own.
	s := testSigner(t, "prod-1", 7)
	tmpl := sampleRecord()
	tmpl.VMID = 9000
	inherited := s.Description("Debian 13 runner template", tmpl)
	rec := sampleRecord()
	desc := s.Description(inherited, rec)
	if n := strings.Count(desc, blockBegin); n != 1 {
		t.Fatalf("description has %d blocks:\n%s", n, desc)
	}
	if _, err := s.Verify(desc, rec.VMID); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(desc, "Debian 13 runner template") {
		t.Errorf("free text lost: %q", desc)
	}
}

func FuzzVerify(f *testing.F) {
	s, err := NewSigner("prod-1", bytes.Repeat([]byte{7}, MinKeyLength))
	if err != nil {
		f.Fatal(err)
	}
	s = s.ForCluster(testCluster)
	rec := sampleRecord()
	f.Add(s.Block(rec), rec.VMID)
	f.Add("", 100)
	f.Add(blockBegin+"\nvmid: 1\n"+blockEnd, 1)
	f.Fuzz(func(t *testing.T, desc string, vmid int) {
		got, err := s.Verify(desc, vmid)
		if err != nil {
			return
		}
		// Anything that verifies must re-sign to the same block for the
		// VM id it was checked against.
		got.VMID = vmid
		if _, err := s.Verify(s.Block(got), vmid); err != nil {
			t.Fatalf("re-signed block does not verify: %v", err)
		}
		if got.OperatorID != "prod-1" {
			t.Fatalf("verified foreign operator %q", got.OperatorID)
		}
	})
}

// TestVMNameProvesTheInstallAndTheVMID: the clone name verifies only for
// the VM id and the install (id and key) it was made for, and is a legal
// DNS label even for the longest operator id and VM id.
func TestVMNameProvesTheInstallAndTheVMID(t *testing.T) {
	s := testSigner(t, "prod-1", 7)
	name := s.VMName(1234)
	if !strings.HasPrefix(name, "hf-prod-1-1234-") {
		t.Errorf("name %q does not start with the install's prefix and the VM id", name)
	}
	if !s.VerifyVMName(name, 1234) {
		t.Fatalf("own name %q does not verify", name)
	}
	if !s.VerifyVMName(strings.ToUpper(name), 1234) {
		t.Errorf("name in upper case does not verify (the hypervisor may change case)")
	}
	sameIDOtherKey := testSigner(t, "prod-1", 8)
	otherID := testSigner(t, "prod-2", 7)
	cases := map[string]struct {
		signer *Signer
		name   string
		vmid   int
	}{
		"copied to another VM id":   {s, name, 1235},
		"other key, same id":        {sameIDOtherKey, name, 1234},
		"other install id":          {otherID, name, 1234},
		"prefix without MAC":        {s, "hf-prod-1-1234", 1234},
		"MAC changed":               {s, name[:len(name)-1] + string("0123456789abcdef"[(strings.IndexByte("0123456789abcdef", name[len(name)-1])+1)%16]), 1234},
		"a claim's hostname":        {s, "runner-abc", 1234},
		"forged by another key":     {s, sameIDOtherKey.VMName(1234), 1234},
		"other install's own clone": {s, otherID.VMName(1234), 1234},
	}
	for what, c := range cases {
		if c.signer.VerifyVMName(c.name, c.vmid) {
			t.Errorf("%s: %q verifies for VM %d", what, c.name, c.vmid)
		}
	}
	long := testSigner(t, strings.Repeat("a", 30), 7).VMName(999999999)
	if len(long) > 63 || !regexpDNSLabel.MatchString(long) {
		t.Errorf("longest name %q (%d characters) is not a DNS label", long, len(long))
	}
}

var regexpDNSLabel = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)

// TestRunnerNameProvesTheInstall: a marked runner name verifies only with
// the install's id and key, keeps within the platform's length limit, and
// an edited, forged or unmarked name does not verify.
func TestRunnerNameProvesTheInstall(t *testing.T) {
	s := testSigner(t, "prod-1", 7)
	name := s.RunnerName("runner-abc-6f1c9a2e")
	if !strings.HasPrefix(name, "runner-abc-6f1c9a2e-") || len(name) > MaxRunnerNameLength {
		t.Errorf("name %q", name)
	}
	if name != s.RunnerName("runner-abc-6f1c9a2e") {
		t.Error("the same base gives another name")
	}
	if base, ok := s.VerifyRunnerName(name); !ok || base != "runner-abc-6f1c9a2e" {
		t.Fatalf("own name %q: base %q, verified %v", name, base, ok)
	}
	long := s.RunnerName(strings.Repeat("a", 60) + "-" + strings.Repeat("b", 20))
	if len(long) > MaxRunnerNameLength {
		t.Errorf("long name %q has %d characters", long, len(long))
	}
	if _, ok := s.VerifyRunnerName(long); !ok {
		t.Errorf("shortened name %q does not verify", long)
	}
	for what, c := range map[string]struct {
		signer *Signer
		name   string
	}{
		"other key":        {testSigner(t, "prod-1", 8), name},
		"other install id": {testSigner(t, "prod-2", 7), name},
		"base edited":      {s, strings.Replace(name, "abc", "abd", 1)},
		"unmarked":         {s, "runner-abc-6f1c9a2e"},
		"no base":          {s, name[strings.LastIndexByte(name, '-'):]},
		"forged":           {s, testSigner(t, "prod-1", 8).RunnerName("runner-abc-6f1c9a2e")},
	} {
		if _, ok := c.signer.VerifyRunnerName(c.name); ok {
			t.Errorf("%s: %q verifies", what, c.name)
		}
	}
}

// TestPowerOffToken: the token verifies for its claim only, under a ring
// that still holds the key, and never for another install, claim or UID.
func TestPowerOffToken(t *testing.T) {
	s1, err := NewSigner("abc", []byte("0123456789abcdef0123456789abcdef"))
	if err != nil {
		t.Fatal(err)
	}
	tok := s1.PowerOffToken("ci", "claim-1", "uid-1")
	if len(tok) != 64 || !s1.VerifyPowerOffToken("ci", "claim-1", "uid-1", tok) {
		t.Fatalf("own token %q does not verify", tok)
	}
	for _, c := range [][3]string{{"ci", "claim-1", "uid-2"}, {"ci", "claim-2", "uid-1"}, {"other", "claim-1", "uid-1"}, {"ci", "claim-1", ""}} {
		if s1.VerifyPowerOffToken(c[0], c[1], c[2], tok) {
			t.Errorf("token verifies for %v", c)
		}
	}
	edited := tok[:63] + map[bool]string{true: "1", false: "0"}[tok[63] == '0']
	if s1.VerifyPowerOffToken("ci", "claim-1", "uid-1", edited) || s1.VerifyPowerOffToken("ci", "claim-1", "uid-1", "") {
		t.Error("an edited or empty token verifies")
	}
	other, err := NewSigner("xyz", []byte("0123456789abcdef0123456789abcdef"))
	if err != nil {
		t.Fatal(err)
	}
	if other.VerifyPowerOffToken("ci", "claim-1", "uid-1", tok) {
		t.Error("another install's signer verifies the token")
	}
	rotated, err := NewKeyRing("abc", []Key{{ID: 1, Secret: []byte("0123456789abcdef0123456789abcdef")}, {ID: 2, Secret: []byte("fedcba9876543210fedcba9876543210")}})
	if err != nil {
		t.Fatal(err)
	}
	if !rotated.VerifyPowerOffToken("ci", "claim-1", "uid-1", tok) || rotated.PowerOffToken("ci", "claim-1", "uid-1") == tok {
		t.Error("after a rotation the old token must verify and new tokens use the new key")
	}
}

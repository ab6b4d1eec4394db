package ownership

import (
	"strings"
	"testing"
	"time"
)

// TestReleasedDescription: a released VM's description keeps the people's
// text, loses every ownership block and gains a note that Released
// recognises for exactly this install, claim and VM; the note verifies as
// nobody's block.
func TestReleasedDescription(t *testing.T) {
	s := testSigner(t, "prod-1", 7)
	r := sampleRecord()
	at := time.Date(2026, 12, 1, 9, 30, 0, 0, time.UTC)
	owned := s.Description("CI runner for octo-org", r)
	released := s.ReleasedDescription(owned, r, at)

	if strings.Contains(released, blockBegin) || strings.Contains(released, "signature:") {
		t.Fatalf("the released description still holds a block:\n%s", released)
	}
	if !strings.HasPrefix(released, "CI runner for octo-org\n\n") {
		t.Errorf("the people's text is lost:\n%s", released)
	}
	for _, want := range []string{"install=prod-1", "claim=ci/runner-abc", "uid=" + r.UID, "vmid=1234", "at=2026-12-01T09:30:00Z"} {
		if !strings.Contains(released, want) {
			t.Errorf("the note does not say %q:\n%s", want, released)
		}
	}
	if _, err := s.Verify(released, r.VMID); err == nil {
		t.Error("a released description still verifies as the install's")
	}
	if again := s.ReleasedDescription(released, r, at.Add(time.Hour)); strings.Count(again, releasePrefix) != 1 {
		t.Errorf("released twice, the description holds %d notes:\n%s", strings.Count(again, releasePrefix), again)
	}
	if got := s.ReleasedDescription("", r, at); strings.HasPrefix(got, "\n") || !strings.HasPrefix(got, releasePrefix) {
		t.Errorf("a description of the block alone became %q, want the note alone", got)
	}

	other := testSigner(t, "prod-2", 7)
	for _, c := range []struct {
		name        string
		signer      *Signer
		description string
		uid         string
		vmid        int
		want        bool
	}{
		{"the release it wrote", s, released, r.UID, r.VMID, true},
		{"released again", s, s.ReleasedDescription(released, r, at.Add(time.Hour)), r.UID, r.VMID, true},
		{"another claim", s, released, "another-uid", r.VMID, false},
		{"another VM", s, released, r.UID, r.VMID + 1, false},
		{"another install", other, released, r.UID, r.VMID, false},
		{"still owned", s, owned, r.UID, r.VMID, false},
		{"a note next to a block", s, released + "\n" + s.Block(r), r.UID, r.VMID, false},
		{"no note", s, "made by hand", r.UID, r.VMID, false},
	} {
		if got := c.signer.Released(c.description, c.uid, c.vmid); got != c.want {
			t.Errorf("%s: Released = %v, want %v", c.name, got, c.want)
		}
	}
}

package providertest

import (
	"bytes"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/hyperfleet/hyperfleet/pkg/provider"
)

// guestPath is where the suite places its files: /run exists in every
// guest (a tmpfs), the directory of a secret of HyperFleet's own.
const guestPath = "/run/hf-contract-secret"

// guestSecret is a secret-like content for owner i's guest file, unique
// so that the suite can look for it at rest.
func guestSecret(i int, n int) []byte {
	return []byte(fmt.Sprintf("hf-guest-secret-%d-%d-7c41d0a9", i, n))
}

// expectNoGuestFile fails the test when vmid's guest holds the suite's
// file.
func expectNoGuestFile(t *testing.T, h *Harness, vmid provider.ID, what string) {
	t.Helper()
	if got, ok := h.GuestFileOf(t, vmid, guestPath); ok {
		t.Errorf("%s: the guest of VM %s holds %s = %q", what, vmid, guestPath, got)
	}
}

func testGuestFileWritten(t *testing.T, h *Harness) {
	s := spec(h.Template, 1)
	res := newDrive(t, h, h.Provider, s).toPhase(provider.PhaseRunning)
	ref := res.Progress.VMRef()
	for n := 1; n <= 2; n++ {
		// The second write replaces the first; writing again is harmless.
		want := guestSecret(1, n)
		if err := h.Provider.PlaceGuestFile(t.Context(), s.Owner, ref, provider.GuestFile{Path: guestPath, Content: want}); err != nil {
			t.Fatalf("PlaceGuestFile #%v into the running VM %v: %v", n, ref.ID, err)
		}
		got, ok := h.GuestFileOf(t, ref.ID, guestPath)
		if !ok || !bytes.Equal(got, want) {
			t.Fatalf("after PlaceGuestFile #%d the guest holds %q (present %v), want %q", n, got, ok, want)
		}
		// A secret placed in the guest rests on no storage.
		if storedContains(t, h, string(want)) {
			t.Errorf("the guest file's content is stored on the backend")
		}
	}
	// The node may be left out: the provider finds the VM.
	if err := h.Provider.PlaceGuestFile(t.Context(), s.Owner, provider.VMRef{ID: ref.ID}, provider.GuestFile{Path: guestPath, Content: guestSecret(1, 3)}); err != nil {
		t.Fatalf("PlaceGuestFile without the node: %v", err)
	}
	if got, _ := h.GuestFileOf(t, ref.ID, guestPath); !bytes.Equal(got, guestSecret(1, 3)) {
		t.Errorf("without the node the guest holds %q", got)
	}
}

func testGuestFileNotReady(t *testing.T, h *Harness) {
	s := spec(h.Template, 1)
	d := newDrive(t, h, h.Provider, s)
	file := provider.GuestFile{Path: guestPath, Content: guestSecret(1, 1)}
	expectNotReady := func(what string) {
		t.Helper()
		err := h.Provider.PlaceGuestFile(t.Context(), s.Owner, d.prog.VMRef(), file)
		if !errors.Is(err, provider.ErrGuestNotReady) || provider.Classify(err) != provider.ClassTransient {
			t.Fatalf("PlaceGuestFile %s: %v (class %s), want ErrGuestNotReady, transient", what, err, provider.Classify(err))
		}
		expectNoGuestFile(t, h, d.prog.ID, what)
	}
	d.until("a created VM not started yet", func(r *provider.EnsureResult) bool {
		return r.Phase == provider.PhaseConfiguring || r.Phase == provider.PhaseStarting
	})
	if !vmExists(t, h, d.prog.ID) {
		// Configuring may be reported before the clone shows; go on to a
		// VM that is there.
		d.until("a started VM", func(r *provider.EnsureResult) bool {
			return r.Phase == provider.PhaseStarting || r.Phase == provider.PhaseBooting
		})
	}
	if phaseOrder[d.last.Phase] < phaseOrder[provider.PhaseBooting] {
		expectNotReady("into a VM that has not started")
	}
	running := d.toPhase(provider.PhaseRunning)
	h.GuestPowerOff(t, running.Progress.ID)
	d.until("after the guest powered off", func(r *provider.EnsureResult) bool { return r.Phase == provider.PhaseStopped })
	expectNotReady("into a stopped VM")
}

// vmExists reports whether vmid is a VM on the backend.
func vmExists(t *testing.T, h *Harness, vmid provider.ID) bool {
	t.Helper()
	_, err := h.Provider.GetVM(t.Context(), provider.VMRef{ID: vmid})
	return err == nil
}

func testGuestFileNoAgent(t *testing.T, h *Harness) {
	s := spec(h.Template, 1)
	res := newDrive(t, h, h.Provider, s).toPhase(provider.PhaseRunning)
	h.RemoveGuestAgent(t, res.Progress.ID)
	err := h.Provider.PlaceGuestFile(t.Context(), s.Owner, res.Progress.VMRef(), provider.GuestFile{Path: guestPath, Content: guestSecret(1, 1)})
	if provider.Classify(err) != provider.ClassConfiguration || provider.ReasonOf(err) != "NoGuestAgent" || errors.Is(err, provider.ErrNotFound) {
		t.Fatalf("PlaceGuestFile into a VM without a guest agent: %v (class %s, reason %s), want ClassConfiguration NoGuestAgent",
			err, provider.Classify(err), provider.ReasonOf(err))
	}
	expectNoGuestFile(t, h, res.Progress.ID, "without a guest agent")
}

func testGuestFileNotOwned(t *testing.T, h *Harness) {
	s := spec(h.Template, 1)
	res := newDrive(t, h, h.Provider, s).toPhase(provider.PhaseRunning)
	ref := res.Progress.VMRef()
	file := provider.GuestFile{Path: guestPath, Content: guestSecret(1, 1)}
	// Another claim whose reservation names this VM id (an id reused, a
	// stale record) is refused, and so is the owner once the marker no
	// longer verifies.
	if err := h.Provider.PlaceGuestFile(t.Context(), owner(2), ref, file); !errors.Is(err, provider.ErrNotOwned) {
		t.Fatalf("PlaceGuestFile for another owner: %v, want ErrNotOwned", err)
	}
	expectNoGuestFile(t, h, ref.ID, "for another owner")
	h.SetDescription(t, ref.ID, "an admin replaced the description")
	if err := h.Provider.PlaceGuestFile(t.Context(), s.Owner, ref, file); !errors.Is(err, provider.ErrNotOwned) {
		t.Fatalf("PlaceGuestFile into a VM whose marker does not verify: %v, want ErrNotOwned", err)
	}
	expectNoGuestFile(t, h, ref.ID, "with a marker that does not verify")
	// A foreign VM, running or not, is never written to.
	foreign := h.CreateForeignVM(t, 0, "made by hand", h.Signer.Tags())
	if err := h.Provider.PlaceGuestFile(t.Context(), s.Owner, provider.VMRef{ID: foreign}, file); !errors.Is(err, provider.ErrNotOwned) {
		t.Fatalf("PlaceGuestFile into a foreign VM: %v, want ErrNotOwned", err)
	}
}

func testGuestFileRefused(t *testing.T, h *Harness) {
	s := spec(h.Template, 1)
	res := newDrive(t, h, h.Provider, s).toPhase(provider.PhaseRunning)
	ref := res.Progress.VMRef()
	for _, f := range []provider.GuestFile{
		{Path: "run/relative", Content: []byte("x")},
		{Path: "/run/../etc/shadow", Content: []byte("x")},
		{Path: guestPath, Content: bytes.Repeat([]byte("x"), provider.MaxGuestFileBytes+1)},
	} {
		err := h.Provider.PlaceGuestFile(t.Context(), s.Owner, ref, f)
		if provider.Classify(err) != provider.ClassConfiguration || provider.ReasonOf(err) != "InvalidGuestFile" {
			t.Errorf("PlaceGuestFile(%q, %d bytes): %v, want ClassConfiguration InvalidGuestFile", f.Path, len(f.Content), err)
		}
	}
	expectNoGuestFile(t, h, ref.ID, "refused files")
	// The largest file allowed goes through.
	largest := bytes.Repeat([]byte("y"), provider.MaxGuestFileBytes)
	if err := h.Provider.PlaceGuestFile(t.Context(), s.Owner, ref, provider.GuestFile{Path: guestPath, Content: largest}); err != nil {
		t.Fatalf("PlaceGuestFile of MaxGuestFileBytes: %v", err)
	}
	if got, _ := h.GuestFileOf(t, ref.ID, guestPath); !bytes.Equal(got, largest) {
		t.Errorf("the guest holds %d bytes, want %d", len(got), len(largest))
	}
	// A VM that is gone is ErrNotFound.
	deleteUntilDone(t, h, h.Provider, s.Owner, res.Progress)
	err := h.Provider.PlaceGuestFile(t.Context(), s.Owner, ref, provider.GuestFile{Path: guestPath, Content: []byte("x")})
	if !errors.Is(err, provider.ErrNotFound) {
		t.Errorf("PlaceGuestFile into a deleted VM: %v, want ErrNotFound", err)
	}
	if err != nil && strings.Contains(err.Error(), "yyyy") {
		t.Error("an error quotes the file's content")
	}
}

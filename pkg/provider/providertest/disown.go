package providertest

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/hyperfleet/hyperfleet/pkg/ownership"
	"github.com/hyperfleet/hyperfleet/pkg/provider"
)

// testDisownVM: a VM released with DisownVM (after RemoveCloudInitMedia,
// as the contract asks) keeps its power state, its other tags and its
// spec name, loses the install's tags, ownership block and clone name, and
// is foreign from then on: GetVM names no owner, ListVMs shows it neither
// tagged nor install-named (what the orphan sweep selects by), every call
// that modifies or destroys a VM refuses it with ErrNotOwned, and EnsureVM
// for its former owner places a new VM instead of touching it. Another
// owner's DisownVM touches nothing; a second DisownVM, also from a
// restarted instance, is Done with nothing removed.
func testDisownVM(t *testing.T, h *Harness) {
	cases := []struct {
		name string
		at   func(*provider.EnsureResult) bool
		// configured: the VM got its tags and spec name before the
		// release; otherwise it still has the install's clone name.
		configured bool
		powerOff   bool
	}{
		{name: "running", at: atPhase(provider.PhaseRunning), configured: true},
		{name: "stopped by its guest", at: atPhase(provider.PhaseRunning), configured: true, powerOff: true},
		{name: "cloned, not configured", at: atPhase(provider.PhaseConfiguring)},
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			n := 80 + i
			s := spec(h.Template, n)
			d := newDrive(t, h, h.Provider, s)
			res := d.until("drive to the release's starting state", c.at)
			if c.powerOff {
				h.GuestPowerOff(t, res.Progress.ID)
				d.until("after the guest powered off", atPhase(provider.PhaseStopped))
			}
			ref := d.prog.VMRef()
			removeMediaUntilDone(t, h, s.Owner, d.prog)
			h.Advance(settleTime)
			before, err := h.Provider.GetVM(t.Context(), ref)
			if err != nil {
				t.Fatalf("GetVM before: %v", err)
			}
			if !c.configured && !before.InstallNamed {
				t.Fatalf("the unconfigured clone %v does not carry the install's clone name (%q)", ref.ID, before.Name)
			}

			intruder := owner(n + 100)
			if _, err := h.Provider.DisownVM(t.Context(), intruder, ref); !errors.Is(err, provider.ErrNotOwned) || provider.Classify(err) != provider.ClassPermanent {
				t.Errorf("DisownVM by another owner: %v (class %s), want ErrNotOwned of class %s", err, provider.Classify(err), provider.ClassPermanent)
			}
			if vm, err := h.Provider.GetVM(t.Context(), ref); err != nil || vm.Owner == nil || vm.Owner.UID != s.Owner.UID {
				t.Fatalf("another owner's DisownVM changed the VM: %+v, %v", vm, err)
			}

			released := disownUntilDone(t, h, h.Provider, s.Owner, ref)
			if len(released.Removed) == 0 {
				t.Errorf("DisownVM is Done without saying what it removed (%s)", released.Message)
			}
			h.Advance(settleTime)
			after, err := h.Provider.GetVM(t.Context(), ref)
			if err != nil {
				t.Fatalf("GetVM after DisownVM: %v", err)
			}
			if after.Owner != nil || !errors.Is(after.OwnershipError, ownership.ErrNoMarker) {
				t.Errorf("VM %v after DisownVM: owner %+v, ownership error %v; want no owner and %v", ref.ID, after.Owner, after.OwnershipError, ownership.ErrNoMarker)
			}
			if after.OperatorTagged || after.InstallNamed || hasTag(after.Tags, ownership.TagManaged) {
				t.Errorf("VM %v after DisownVM: tags %v, name %q (tagged %v, install-named %v); want none of the install's marks",
					ref.ID, after.Tags, after.Name, after.OperatorTagged, after.InstallNamed)
			}
			if after.Power != before.Power {
				t.Errorf("VM %v: power %s before DisownVM, %s after; it must not change", ref.ID, before.Power, after.Power)
			}
			if c.configured && (after.Name != s.Name || !hasTag(after.Tags, "contract-test")) {
				t.Errorf("VM %v after DisownVM: name %q, tags %v; want its name %q and its other tag contract-test kept", ref.ID, after.Name, after.Tags, s.Name)
			}
			for _, p := range []provider.Provider{h.Provider, h.NewProvider(t, nil)} {
				for _, v := range listVMs(t, p) {
					if v.ID == ref.ID && (v.OperatorTagged || v.InstallNamed) {
						t.Errorf("ListVMs shows the released VM %v as the install's (tagged %v, install-named %v)", v.ID, v.OperatorTagged, v.InstallNamed)
					}
				}
				again, err := p.DisownVM(t.Context(), s.Owner, ref)
				if err != nil || !again.Done || len(again.Removed) != 0 {
					t.Errorf("DisownVM again: %+v, %v; want Done at once with nothing removed", again, err)
				}
			}

			expectForeign(t, h, s, d.prog)
			h.Advance(settleTime)
			last, err := h.Provider.GetVM(t.Context(), ref)
			if err != nil {
				t.Fatalf("the released VM is gone after the refused calls: %v", err)
			}
			if last.Power != before.Power || last.Name != after.Name || last.Owner != nil {
				t.Errorf("VM %v changed after the refused calls: power %s, name %q, owner %+v; it was %s, %q", ref.ID, last.Power, last.Name, last.Owner, before.Power, after.Name)
			}
		})
	}

	t.Run("gone", func(t *testing.T) {
		s := spec(h.Template, 90)
		d := newDrive(t, h, h.Provider, s)
		d.toPhase(provider.PhaseRunning)
		deleteUntilDone(t, h, h.Provider, s.Owner, d.prog)
		if _, err := h.Provider.DisownVM(t.Context(), s.Owner, d.prog.VMRef()); !errors.Is(err, provider.ErrNotFound) {
			t.Errorf("DisownVM of a deleted VM: %v, want %v", err, provider.ErrNotFound)
		}
	})
}

// expectForeign checks that every call that modifies or destroys a VM
// refuses the released VM of s at prog, and that EnsureVM of s places a
// new VM rather than driving it.
func expectForeign(t *testing.T, h *Harness, s *provider.VMSpec, prog provider.Progress) {
	t.Helper()
	ref := prog.VMRef()
	refused := func(what string, err error) {
		t.Helper()
		if !errors.Is(err, provider.ErrNotOwned) {
			t.Errorf("%s of the released VM: %v, want %v", what, err, provider.ErrNotOwned)
		}
	}
	_, err := h.Provider.DeleteVM(t.Context(), s.Owner, persist(t, prog))
	refused("DeleteVM", err)
	_, err = h.Provider.RemoveCloudInitMedia(t.Context(), s.Owner, persist(t, prog))
	refused("RemoveCloudInitMedia", err)
	for _, action := range []provider.PowerAction{provider.PowerOff, provider.PowerOn} {
		_, err = h.Provider.SetPower(t.Context(), s.Owner, ref, action)
		refused("SetPower "+string(action), err)
	}
	refused("PlaceGuestFile", h.Provider.PlaceGuestFile(t.Context(), s.Owner, ref, provider.GuestFile{Path: "/run/contract/file", Content: []byte("x")}))
	res, err := h.Provider.EnsureVM(t.Context(), s, persist(t, prog))
	if err != nil {
		t.Fatalf("EnsureVM of the released VM's former owner: %v", err)
	}
	if res.Progress.ID == prog.ID {
		t.Errorf("EnsureVM of the released VM's former owner goes on with it (%s)", describe(res))
	}
}

// disownUntilDone calls DisownVM, honouring RetryAfter, until Done.
func disownUntilDone(t *testing.T, h *Harness, p provider.Provider, o provider.Owner, ref provider.VMRef) *provider.DisownResult {
	t.Helper()
	var elapsed time.Duration
	var retries transientRetries
	for i := 0; i < maxSteps && elapsed <= maxSimulated; i++ {
		res, err := p.DisownVM(t.Context(), o, ref)
		if retries.retry(t, h, &elapsed, err, fmt.Sprintf("DisownVM(%s/%s, %v)", o.Namespace, o.Name, ref.ID)) {
			continue
		}
		if res == nil {
			t.Fatalf("DisownVM(%s/%s, %v) returned neither a result nor an error", o.Namespace, o.Name, ref.ID)
		}
		if res.RetryAfter < 0 {
			t.Errorf("DisownVM: negative RetryAfter %s", res.RetryAfter)
		}
		if res.Done {
			if strings.TrimSpace(res.Message) == "" {
				t.Errorf("DisownVM: Done without a message")
			}
			return res
		}
		h.Advance(max(res.RetryAfter, time.Millisecond))
		elapsed += res.RetryAfter
	}
	t.Fatalf("DisownVM(%s/%s, %v): not Done after %d calls and %s", o.Namespace, o.Name, ref.ID, maxSteps, elapsed)
	return nil
}

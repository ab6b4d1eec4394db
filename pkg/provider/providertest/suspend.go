package providertest

import (
	"bytes"
	"errors"
	"testing"

	"github.com/hyperfleet/hyperfleet/pkg/provider"
)

// standbyMark is what testSuspendResume leaves in a guest before it
// suspends it: no secret (a standby VM holds none), only proof that the
// guest resumed is the one suspended, not a new boot.
var standbyMark = []byte("hf-contract-standby-mark-5d2e91c7")

// testSuspendResume: a running VM suspended to disk holds no process (its
// power reads suspended in GetVM and ListVMs), EnsureVM leaves it so, also
// from a provider that did not suspend it (an operator restarted), and
// resuming brings back the same guest, which EnsureVM then reports Running
// again. Asking for the state a VM is in is no task; a VM that does not run
// cannot be suspended, one that was not suspended cannot be resumed.
func testSuspendResume(t *testing.T, h *Harness) {
	s := spec(h.Template, 70)
	d := newDrive(t, h, h.Provider, s)
	d.toPhase(provider.PhaseRunning)
	ref := d.prog.VMRef()
	if err := h.Provider.PlaceGuestFile(t.Context(), s.Owner, ref, provider.GuestFile{Path: guestPath, Content: standbyMark}); err != nil {
		t.Fatalf("PlaceGuestFile into the running VM %v: %v", ref.ID, err)
	}

	setPower(t, h.Provider, s.Owner, ref, provider.PowerSuspend, true)
	waitPower(t, h, h.Provider, ref, provider.PowerSuspended)
	expectListedPower(t, h.Provider, ref.ID, provider.PowerSuspended)
	for _, a := range []provider.PowerAction{provider.PowerSuspend, provider.PowerOff, provider.PowerShutdown} {
		setPower(t, h.Provider, s.Owner, ref, a, false)
		waitPower(t, h, h.Provider, ref, provider.PowerSuspended)
	}

	// EnsureVM reports the suspended VM as such and changes nothing, also
	// when a new provider (a restarted operator) reads it with a progress
	// that lost its task.
	for i, p := range []provider.Provider{h.Provider, h.NewProvider(t, nil)} {
		prev := d.prog
		prev.Task = nil
		for range 2 {
			res, err := p.EnsureVM(t.Context(), s, prev)
			if err != nil {
				t.Fatalf("provider %d: EnsureVM of the suspended VM: %v", i, err)
			}
			if res.Phase != provider.PhaseSuspended || res.Progress.Task != nil {
				t.Fatalf("provider %d: EnsureVM of the suspended VM: %s, want %s with no task", i, describe(res), provider.PhaseSuspended)
			}
			prev = persist(t, res.Progress)
		}
		waitPower(t, h, p, ref, provider.PowerSuspended)
	}

	setPower(t, h.Provider, s.Owner, ref, provider.PowerResume, true)
	waitPower(t, h, h.Provider, ref, provider.PowerRunning)
	setPower(t, h.Provider, s.Owner, ref, provider.PowerResume, false)
	res := d.toPhase(provider.PhaseRunning)
	if len(res.Addresses) == 0 {
		t.Errorf("EnsureVM after the resume: Running with no address")
	}
	if got, ok := h.GuestFileOf(t, ref.ID, guestPath); !ok || !bytes.Equal(got, standbyMark) {
		t.Errorf("the resumed guest holds %q (present %v) at %s, want %q: not the guest that was suspended", got, ok, guestPath, standbyMark)
	}

	// Suspended again, it is deleted with its saved state.
	setPower(t, h.Provider, s.Owner, ref, provider.PowerSuspend, true)
	waitPower(t, h, h.Provider, ref, provider.PowerSuspended)
	deleteUntilDone(t, h, h.Provider, s.Owner, d.prog)
	expectNoVM(t, h, h.Provider, s.Owner)
	if storedContains(t, h, string(standbyMark)) {
		t.Errorf("the suspended guest's memory is still stored on the backend after DeleteVM is Done")
	}
}

// testSuspendRefused: a VM that does not run has no state to save, and a
// stopped VM with none is not booted by a resume.
func testSuspendRefused(t *testing.T, h *Harness) {
	s := spec(h.Template, 71)
	d := newDrive(t, h, h.Provider, s)
	d.toPhase(provider.PhaseRunning)
	ref := d.prog.VMRef()
	setPower(t, h.Provider, s.Owner, ref, provider.PowerOff, true)
	waitPower(t, h, h.Provider, ref, provider.PowerStopped)
	for _, c := range []struct {
		action provider.PowerAction
		reason string
	}{
		{provider.PowerSuspend, "NotRunning"},
		{provider.PowerResume, "NotSuspended"},
	} {
		task, err := h.Provider.SetPower(t.Context(), s.Owner, ref, c.action)
		if err == nil || provider.Classify(err) != provider.ClassPermanent || provider.ReasonOf(err) != c.reason {
			t.Errorf("SetPower(%s) of a stopped VM: task %+v, error %v (class %s, reason %q); want a %s error with reason %s",
				c.action, task, err, provider.Classify(err), provider.ReasonOf(err), provider.ClassPermanent, c.reason)
		}
		waitPower(t, h, h.Provider, ref, provider.PowerStopped)
	}
	// Another owner suspends nothing.
	setPower(t, h.Provider, s.Owner, ref, provider.PowerOn, true)
	waitPower(t, h, h.Provider, ref, provider.PowerRunning)
	if _, err := h.Provider.SetPower(t.Context(), owner(72), ref, provider.PowerSuspend); !errors.Is(err, provider.ErrNotOwned) {
		t.Errorf("SetPower(suspend) by another owner: %v, want %v", err, provider.ErrNotOwned)
	}
	waitPower(t, h, h.Provider, ref, provider.PowerRunning)
}

// setPower asks p for action on the owner's VM at ref and fails the test
// unless it answers with a task exactly when wantTask says so.
func setPower(t *testing.T, p provider.Provider, o provider.Owner, ref provider.VMRef, action provider.PowerAction, wantTask bool) {
	t.Helper()
	task, err := p.SetPower(t.Context(), o, ref, action)
	if err != nil {
		t.Fatalf("SetPower(%s) of VM %v: %v", action, ref.ID, err)
	}
	if (task != nil) != wantTask {
		t.Fatalf("SetPower(%s) of VM %v returned task %+v; want a task: %v", action, ref.ID, task, wantTask)
	}
	if task != nil && (task.ID == "" || task.Operation == "") {
		t.Errorf("SetPower(%s): task %+v lacks an id or an operation", action, *task)
	}
}

// expectListedPower fails the test unless ListVMs shows VM id with power
// want.
func expectListedPower(t *testing.T, p provider.Provider, id provider.ID, want provider.PowerState) {
	t.Helper()
	for _, v := range listVMs(t, p) {
		if v.ID == id {
			if v.Power != want {
				t.Errorf("ListVMs shows VM %v with power %s, want %s", id, v.Power, want)
			}
			return
		}
	}
	t.Errorf("ListVMs does not show VM %v", id)
}

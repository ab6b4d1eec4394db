//go:build libvirtcontract

package libvirt

import (
	"bytes"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/hyperfleet/hyperfleet/internal/testworld/tinyguest"
	"github.com/hyperfleet/hyperfleet/pkg/ownership"
	"github.com/hyperfleet/hyperfleet/pkg/provider"
)

// TestSuspendedVMAcrossRestartAndDisown: what the contract suite does not
// reach of a suspended VM. Its memory is in the managed save image, which
// the contract's StoredData sees (so the suite's check that DeleteVM
// leaves none of it is not vacuous). After a libvirtd restart, a new
// provider still reads it suspended. DisownVM releases the image's copy
// of the ownership block too, one call ahead of the definition's, so that
// the guest an admin resumes afterwards is foreign, not the owner's again.
// One boot (about 5 CPU-s with the save and the restore).
func TestSuspendedVMAcrossRestartAndDisown(t *testing.T) {
	w := newWorld(t)
	p := w.provider(t, w.cfg)
	spec := w.faultSpec()
	spec.MemoryBytes = tinyguest.DefaultMemoryMiB << 20
	var prog provider.Progress
	if _, err := drive(t, p, spec, &prog, phaseIs(provider.PhaseRunning)); err != nil {
		t.Fatal(err)
	}
	ref := prog.VMRef()
	mark := []byte("hf-libvirt-suspended-mark-3f61a0d4")
	if err := p.PlaceGuestFile(t.Context(), faultOwner, ref, provider.GuestFile{Path: "/run/mark", Content: mark}); err != nil {
		t.Fatal(err)
	}
	if task, err := p.SetPower(t.Context(), faultOwner, ref, provider.PowerSuspend); err != nil || task == nil {
		t.Fatalf("SetPower(suspend): task %+v, %v", task, err)
	}
	waitPowerOf(t, p, ref, provider.PowerSuspended)
	if !storedHolds(w.storedData(t), mark) {
		t.Error("the suspended guest's memory is nowhere in the stored data the contract suite searches")
	}

	w.d.Restart(t)
	w.conn = w.d.Dial(t)
	p = w.provider(t, w.cfg)
	waitPowerOf(t, p, ref, provider.PowerSuspended)
	prog.Task = nil
	if res, err := p.EnsureVM(t.Context(), spec, prog); err != nil || res.Phase != provider.PhaseSuspended {
		t.Fatalf("EnsureVM after a libvirtd restart: %+v, %v; want %s", res, err, provider.PhaseSuspended)
	}

	var results []*provider.DisownResult
	for len(results) < 4 {
		res, err := p.DisownVM(t.Context(), faultOwner, ref)
		if err != nil {
			t.Fatalf("DisownVM: %v", err)
		}
		results = append(results, res)
		if res.Done {
			break
		}
	}
	if len(results) != 2 || !results[1].Done || !strings.Contains(strings.Join(results[0].Removed, ","), "saved state") {
		t.Errorf("DisownVM of a suspended VM: %+v; want the saved state released, then the definition", results)
	}
	dom := w.domainOf(t, ref.ID)
	doc, err := w.conn.DomainManagedSaveGetXMLDesc(dom, 0)
	if err != nil {
		t.Fatal(err)
	}
	x, err := parseDomain(doc)
	if err != nil {
		t.Fatal(err)
	}
	if m, err := parseMeta(x.Metadata); err != nil || !errors.Is(verifyErr(p.signer, m), ownership.ErrNoMarker) || p.signer.HasOperatorTag(m.Tags) {
		t.Errorf("the saved state after DisownVM: metadata %+v (%v); want the release note and none of the install's tags", m, err)
	}
	if vm, err := p.GetVM(t.Context(), ref); err != nil || vm.Power != provider.PowerSuspended || vm.Owner != nil {
		t.Errorf("GetVM after DisownVM: %+v, %v; want it suspended and foreign", vm, err)
	}

	// An admin resumes the kept VM: the guest is the one suspended, and
	// foreign.
	if err := w.conn.DomainCreate(dom); err != nil {
		t.Fatal(err)
	}
	vm, err := p.GetVM(t.Context(), ref)
	if err != nil || vm.Power != provider.PowerRunning || vm.Owner != nil || !errors.Is(vm.OwnershipError, ownership.ErrNoMarker) {
		t.Errorf("GetVM of the resumed VM: %+v, %v; want it running and foreign", vm, err)
	}
	if _, err := p.SetPower(t.Context(), faultOwner, ref, provider.PowerSuspend); !errors.Is(err, provider.ErrNotOwned) {
		t.Errorf("SetPower(suspend) of the resumed, disowned VM: %v, want %v", err, provider.ErrNotOwned)
	}
	if err := tinyguest.WaitAgent(w.conn, dom, time.Minute); err != nil {
		t.Fatal(err)
	}
	if got, ok := tinyguest.GuestFile(w.conn, dom, "/run/mark"); !ok || !bytes.Equal(got, mark) {
		t.Errorf("the resumed guest holds %q (present %v), want %q", got, ok, mark)
	}
}

// waitPowerOf polls GetVM until the VM at ref has power want.
func waitPowerOf(t *testing.T, p provider.Provider, ref provider.VMRef, want provider.PowerState) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		vm, err := p.GetVM(t.Context(), ref)
		if err == nil && vm.Power == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("VM %v never got power %s: %+v, %v", ref.ID, want, vm, err)
		}
		time.Sleep(advanceSlice)
	}
}

// storedHolds says whether any of data contains s.
func storedHolds(data []string, s []byte) bool {
	for _, d := range data {
		if strings.Contains(d, string(s)) {
			return true
		}
	}
	return false
}

// verifyErr is why m's description does not verify as an ownership block.
func verifyErr(s *ownership.Signer, m vmMeta) error {
	_, err := s.Verify(m.Description, m.ID)
	return err
}

package providertest

import (
	"errors"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/hyperfleet/hyperfleet/internal/testworld/proptest"
	"github.com/hyperfleet/hyperfleet/pkg/provider"
)

// Property checks the contract as a state machine over generated
// sequences of calls (Feature: hyperfleet-operator, Property 24: Provider
// Interface Implementation; every implementation's test calls it beside
// Run). Each case builds a fresh backend with newHarness and runs a
// sequence of: one EnsureVM step of one of three claims (continuing from
// its persisted Progress), a DeleteVM of one to completion, a guest
// powering its VM off, a VM created by hand (with or without the
// operator's tags), a claim's DeleteVM and SetPower aimed at such a VM, an
// operator restart (a new Provider on the same backend) and hypervisor
// time passing. After every call: no claim has two VMs, a deleted claim
// has none, a claim's phase never goes back, every VM made by hand is
// still there, untouched and nobody's, and every error is one the
// contract allows for the call.
func Property(t *testing.T, newHarness func(t testing.TB) *Harness) {
	proptest.Check(t, proptest.Minimum, func(rt *rapid.T) {
		// Each case's backend goes when the case ends (proptest.Case).
		world := proptest.NewCase(t)
		defer world.Close()
		h := newHarness(world)
		checkHarness(t, h)
		m := &machine{t: t, h: h, p: h.Provider, foreign: map[provider.ID]provider.PowerState{}}
		for i := range 3 {
			m.claims = append(m.claims, &claim{spec: spec(h.Template, 60+i)})
		}
		rt.Repeat(map[string]func(*rapid.T){
			"":              m.check,
			"ensure":        m.ensure,
			"delete":        m.delete,
			"guestPowerOff": m.guestPowerOff,
			"foreignVM":     m.foreignVM,
			"touchForeign":  m.touchForeign,
			"restart": func(rt *rapid.T) {
				m.p = h.NewProvider(t, nil)
				// The operator persists where each VM is and whether its
				// build is the claim's (Progress.Building), not the task
				// in flight (internal/controller/machineclaim/vm_progress.go):
				// a restart loses the tasks, unless an older operator
				// wrote them.
				if !rapid.Bool().Draw(rt, "tasks persisted by an older operator") {
					for _, c := range m.claims {
						c.prog.Task = nil
					}
				}
			},
			"advance": func(rt *rapid.T) {
				h.Advance(time.Duration(rapid.IntRange(1, 300).Draw(rt, "seconds")) * time.Second)
			},
		})
	})
}

// claim is one owner's VM as the operator tracks it: its spec, the
// Progress it persisted and the last phase it saw.
type claim struct {
	spec    *provider.VMSpec
	prog    provider.Progress
	phase   provider.Phase
	started bool
	// deleted: DeleteVM reported Done; the claim is gone for good.
	deleted bool
}

type machine struct {
	t      *testing.T
	h      *Harness
	p      provider.Provider
	claims []*claim
	// foreign are the VMs made by hand, with the power they had.
	foreign map[provider.ID]provider.PowerState
}

func (m *machine) live(rt *rapid.T) *claim {
	var live []*claim
	for _, c := range m.claims {
		if !c.deleted {
			live = append(live, c)
		}
	}
	if len(live) == 0 {
		rt.Skip("every claim is deleted")
	}
	return rapid.SampledFrom(live).Draw(rt, "claim")
}

func (m *machine) ensure(rt *rapid.T) {
	c := m.live(rt)
	res, err := m.p.EnsureVM(m.t.Context(), c.spec, persist(m.t, c.prog))
	if err != nil {
		if provider.Classify(err) != provider.ClassTransient {
			rt.Fatalf("EnsureVM of %s: %s error: %v", c.spec.Owner.Name, provider.Classify(err), err)
		}
		return
	}
	// An id may change only before the claim's own clone made a VM
	// there: a restarted provider forgot the reservation and another
	// claim took the id (the contract's TakenVMIDIsPlacedAgain). The
	// claim then starts over at Placed; that is the one way back.
	moved := c.started && c.prog.ID != "" && res.Progress.ID != c.prog.ID
	if moved && phaseOrder[c.phase] > phaseOrder[provider.PhaseQueued] {
		rt.Fatalf("EnsureVM of %s: VM id changed from %v to %v after %s", c.spec.Owner.Name, c.prog.ID, res.Progress.ID, c.phase)
	}
	if c.started && phaseOrder[res.Phase] < phaseOrder[c.phase] && (!moved || res.Phase != provider.PhasePlaced) {
		rt.Fatalf("EnsureVM of %s: phase went back from %s to %s", c.spec.Owner.Name, c.phase, res.Phase)
	}
	c.prog, c.phase, c.started = res.Progress, res.Phase, true
	m.h.Advance(min(res.RetryAfter, time.Minute))
}

func (m *machine) delete(rt *rapid.T) {
	c := m.live(rt)
	for range maxSteps {
		res, err := m.p.DeleteVM(m.t.Context(), c.spec.Owner, persist(m.t, c.prog))
		if errors.Is(err, provider.ErrNotOwned) {
			// Allowed only while another claim's VM stands at the id the
			// claim's Progress names (its reservation was lost in a
			// restart and the id taken): the operator then keeps the claim
			// for an admin rather than assume what is gone.
			vm, gerr := m.p.GetVM(m.t.Context(), c.prog.VMRef())
			if gerr != nil || vm.Owner == nil || vm.Owner.UID == c.spec.Owner.UID {
				rt.Fatalf("DeleteVM of %s: %v, but VM %v is %+v (%v)", c.spec.Owner.Name, err, c.prog.ID, vm, gerr)
			}
			return
		}
		if err != nil {
			if provider.Classify(err) != provider.ClassTransient {
				rt.Fatalf("DeleteVM of %s: %s error: %v", c.spec.Owner.Name, provider.Classify(err), err)
			}
			m.h.Advance(time.Second)
			continue
		}
		c.prog = res.Progress
		if res.Done {
			c.deleted = true
			return
		}
		m.h.Advance(max(res.RetryAfter, time.Second))
	}
	rt.Fatalf("DeleteVM of %s not done in %d calls", c.spec.Owner.Name, maxSteps)
}

func (m *machine) guestPowerOff(rt *rapid.T) {
	c := m.live(rt)
	if c.phase != provider.PhaseRunning {
		rt.Skip("the claim's VM is not running")
	}
	// The phase is the last EnsureVM's: a guest that powered off since,
	// with no EnsureVM after, is still Running to the claim.
	if vm, err := m.p.GetVM(m.t.Context(), c.prog.VMRef()); err != nil || vm.Power != provider.PowerRunning {
		rt.Skip("the claim's VM is not running")
	}
	m.h.GuestPowerOff(m.t, c.prog.ID)
}

func (m *machine) foreignVM(rt *rapid.T) {
	if len(m.foreign) >= 3 {
		rt.Skip("enough VMs made by hand")
	}
	var tags []string
	if rapid.Bool().Draw(rt, "with the operator's tags") {
		tags = m.h.Signer.Tags()
	}
	id := m.h.CreateForeignVM(m.t, 0, "made by hand", tags)
	vm, err := m.p.GetVM(m.t.Context(), provider.VMRef{ID: id})
	if err != nil {
		rt.Fatalf("GetVM of the VM made by hand: %v", err)
	}
	m.foreign[id] = vm.Power
}

func (m *machine) touchForeign(rt *rapid.T) {
	if len(m.foreign) == 0 {
		rt.Skip("no VM made by hand yet")
	}
	ids := make([]provider.ID, 0, len(m.foreign))
	for id := range m.foreign {
		ids = append(ids, id)
	}
	id := rapid.SampledFrom(ids).Draw(rt, "foreign VM")
	c := rapid.SampledFrom(m.claims).Draw(rt, "as claim")
	var err error
	if rapid.Bool().Draw(rt, "delete") {
		_, err = m.p.DeleteVM(m.t.Context(), c.spec.Owner, provider.Progress{ID: id})
	} else {
		action := rapid.SampledFrom([]provider.PowerAction{provider.PowerOff, provider.PowerShutdown, provider.PowerOn}).Draw(rt, "action")
		_, err = m.p.SetPower(m.t.Context(), c.spec.Owner, provider.VMRef{ID: id}, action)
	}
	if !errors.Is(err, provider.ErrNotOwned) || provider.Classify(err) != provider.ClassPermanent {
		rt.Fatalf("a claim's call on VM %v made by hand: %v (class %s), want ErrNotOwned", id, err, provider.Classify(err))
	}
}

// check is the invariant after every call.
func (m *machine) check(rt *rapid.T) {
	list, err := m.p.ListVMs(m.t.Context())
	if err != nil {
		if provider.Classify(err) == provider.ClassTransient {
			return
		}
		rt.Fatalf("ListVMs: %v", err)
	}
	perOwner := map[string][]provider.ID{}
	listed := map[provider.ID]bool{}
	for _, s := range list {
		listed[s.ID] = true
		if s.Template {
			continue
		}
		vm, err := m.p.GetVM(m.t.Context(), provider.VMRef{ID: s.ID, Node: s.Node})
		if err != nil {
			if errors.Is(err, provider.ErrNotFound) {
				continue // destroyed since the listing
			}
			rt.Fatalf("GetVM(%v): %v", s.ID, err)
		}
		if _, made := m.foreign[s.ID]; made {
			if vm.Owner != nil {
				rt.Fatalf("VM %v made by hand is owned by %+v", s.ID, *vm.Owner)
			}
			if vm.Power != m.foreign[s.ID] {
				rt.Fatalf("VM %v made by hand: power went from %s to %s", s.ID, m.foreign[s.ID], vm.Power)
			}
			continue
		}
		if vm.Owner != nil {
			perOwner[vm.Owner.UID] = append(perOwner[vm.Owner.UID], s.ID)
		}
	}
	for id := range m.foreign {
		if !listed[id] {
			rt.Fatalf("VM %v made by hand is gone", id)
		}
	}
	for _, c := range m.claims {
		ids := perOwner[c.spec.Owner.UID]
		switch {
		case len(ids) > 1:
			rt.Fatalf("claim %s has %d VMs: %v", c.spec.Owner.Name, len(ids), ids)
		case c.deleted && len(ids) > 0:
			rt.Fatalf("claim %s was deleted but VM %v remains", c.spec.Owner.Name, ids[0])
		}
	}
}

package sweeper

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"pgregory.net/rapid"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/testworld/proptest"
	"github.com/hyperfleet/hyperfleet/pkg/ownership"
	"github.com/hyperfleet/hyperfleet/pkg/provider"
	fakeprovider "github.com/hyperfleet/hyperfleet/pkg/provider/fake"
)

// The kinds of VM TestOwnershipOperationsProperty puts on the hypervisor,
// and whether this install may act on it.
const (
	vmOursLive    = "ours, its claim lives"
	vmOursOrphan  = "ours, its claim deleted"
	vmOursStale   = "ours, its claim recreated under another UID"
	vmOtherInst   = "another install's"
	vmForgedCopy  = "our tag and a block copied from another of our VMs"
	vmForgedEdit  = "our tag and our block with a field edited"
	vmNoMarker    = "our tag and no ownership block"
	vmOurName     = "our clone name and no ownership block"
	vmHandMade    = "made by hand, no tag, no block"
	vmRetiredKey  = "our tag and a block signed with a key the ring no longer holds"
	vmOtherKeySig = "our tag and a block under our id signed with another key"
)

var ownershipKinds = []string{vmOursLive, vmOursOrphan, vmOursStale, vmOtherInst, vmForgedCopy, vmForgedEdit, vmNoMarker, vmOurName, vmHandMade, vmRetiredKey, vmOtherKeySig}

// ownershipVM is a generated VM and what the test knows of it.
type ownershipVM struct {
	kind  string
	vmid  int
	owner provider.Owner // the claim it was made for (ours and the other install's)
	// before is the VM as the hypervisor held it once the world was built.
	before fakeprovider.VMState
}

// ours reports whether the kind is this install's VM (its block verifies).
func (v ownershipVM) ours() bool {
	return v.kind == vmOursLive || v.kind == vmOursOrphan || v.kind == vmOursStale
}

// Feature: hyperfleet-operator, Property 26: VM Ownership and Isolation
//
// TestOwnershipOperationsProperty puts two to six generated VMs on one
// in-memory hypervisor (pkg/provider/fake): this install's (its claim
// living, deleted, or recreated under another UID: a stale marker),
// another install's made through that install's own provider, and VMs
// whose markers are forged (a block copied from another of our VMs, a
// signed field edited, our id with another key, a key retired from the
// ring), missing (our tag or our clone name only) or absent altogether.
// Then every operation this install has on a VM runs against each one:
//   - the status read (GetVM) names the owning claim for our VMs only, and
//     for every other VM reports why it is not ours;
//   - destroy (DeleteVM), power-off (SetPower) and a guest file
//     (PlaceGuestFile) on a VM that is not ours, or on ours for another
//     claim, are refused with provider.ErrNotOwned; a creation resumed at
//     it (EnsureVM) goes elsewhere; none changes the VM;
//   - the orphan sweeper (Sweeper.SweepAll, many sweeps past the grace
//     period) destroys exactly our VMs whose claim is gone or is another
//     claim now (deleted, or recreated under another UID), and leaves
//     every other VM as it was: same description, tags and power.
//
// Mutation: the sweeper not comparing the claim's UID with the block's
// (candidate, sweeper.go: `err == nil && string(claim.UID) == vm.Owner.UID`
// reduced to `err == nil`) fails this test (the VM of a claim recreated
// under another UID was never destroyed); the old test, over the
// signature functions alone, passed it.
// Mutation: the fake provider's ownedLocked (pkg/provider/fake/fake.go)
// accepting any VM whose block verifies, whatever claim it names, fails
// this test (a VM of one of our claims was powered off for another); the
// old test passed it.
func TestOwnershipOperationsProperty(t *testing.T) {
	seen := map[string]int{}
	proptest.Check(t, proptest.Minimum, func(rt *rapid.T) {
		w := newWorld(t, false)
		otherSigner, err := ownership.NewSigner("other-install", bytes.Repeat([]byte{5}, ownership.MinKeyLength))
		if err != nil {
			rt.Fatalf("signer: %v", err)
		}
		other, err := w.hv.NewProvider(w.cfg, provider.Deps{Signer: otherSigner, Clock: w.clock})
		if err != nil {
			rt.Fatalf("other install's provider: %v", err)
		}
		var vms []*ownershipVM
		// ourVM makes one of our VMs for a new claim.
		n := 0
		ourVM := func() (provider.Owner, int) {
			n++
			o := w.claim(fmt.Sprintf("claim-%d", n))
			prog, phase := w.ensure(o, 40)
			if phase != provider.PhaseRunning {
				rt.Fatalf("our VM for %s is %s after 40 calls", o.Name, phase)
			}
			w.setVMRef(o, prog)
			return o, fakeVMID(prog.ID)
		}
		count := rapid.IntRange(2, 6).Draw(rt, "vms")
		for i := range count {
			kind := rapid.SampledFrom(ownershipKinds).Draw(rt, fmt.Sprintf("vm %d", i))
			seen[kind]++
			v := &ownershipVM{kind: kind}
			switch kind {
			case vmOursLive:
				v.owner, v.vmid = ourVM()
			case vmOursOrphan:
				v.owner, v.vmid = ourVM()
				w.deleteClaim(v.owner)
			case vmOursStale:
				v.owner, v.vmid = ourVM()
				w.deleteClaim(v.owner)
				again := &hfv1.MachineClaim{ObjectMeta: metav1.ObjectMeta{Namespace: v.owner.Namespace, Name: v.owner.Name, UID: types.UID("recreated-" + v.owner.Name)}}
				if err := w.kube.Create(context.Background(), again); err != nil {
					rt.Fatalf("recreate claim: %v", err)
				}
			case vmOtherInst:
				n++
				v.owner = provider.Owner{Namespace: "ci", Name: fmt.Sprintf("claim-%d", n), UID: fmt.Sprintf("uid-claim-%d", n), CreatedAt: start}
				// The other install's claim is not in our API server, as
				// another install's claims are not: only the block says so.
				var prog provider.Progress
				for range 40 {
					res, err := other.EnsureVM(context.Background(), w.spec(v.owner), prog)
					if err != nil {
						rt.Fatalf("the other install's EnsureVM: %v", err)
					}
					if prog = res.Progress; res.Phase == provider.PhaseRunning {
						break
					}
					w.clock.Step(res.RetryAfter)
				}
				v.vmid = fakeVMID(prog.ID)
			default:
				v.vmid = w.addForged(rt, kind, vms)
			}
			vms = append(vms, v)
		}
		for _, v := range vms {
			st, ok := w.hv.VM(v.vmid)
			if !ok {
				rt.Fatalf("VM %d (%s) does not exist", v.vmid, v.kind)
			}
			v.before = st
		}

		// Every operation, on every VM, as each of our claims.
		ctx := context.Background()
		var ourOwners []provider.Owner
		for _, v := range vms {
			if v.ours() {
				ourOwners = append(ourOwners, v.owner)
			}
		}
		someone := provider.Owner{Namespace: "ci", Name: "intruder", UID: "uid-intruder", CreatedAt: start}
		for _, v := range vms {
			ref := provider.VMRef{ID: fakeprovider.FormatID(v.vmid), Node: v.before.Node}
			got, err := w.p.GetVM(ctx, ref)
			if err != nil {
				rt.Fatalf("GetVM %d (%s): %v", v.vmid, v.kind, err)
			}
			switch {
			case v.ours() && (got.Owner == nil || got.Owner.UID != v.owner.UID):
				rt.Fatalf("VM %d (%s): status read names owner %+v (%v), want claim %s", v.vmid, v.kind, got.Owner, got.OwnershipError, v.owner.UID)
			case !v.ours() && (got.Owner != nil || got.OwnershipError == nil):
				rt.Fatalf("VM %d (%s): status read names owner %+v, error %v; want no owner and the reason", v.vmid, v.kind, got.Owner, got.OwnershipError)
			}
			for _, as := range append(slices.Clone(ourOwners), someone) {
				if v.ours() && as.UID == v.owner.UID {
					continue // its own claim may act on it
				}
				what := fmt.Sprintf("VM %d (%s) as claim %s", v.vmid, v.kind, as.Name)
				refused := func(op string, err error) {
					if !errors.Is(err, provider.ErrNotOwned) {
						rt.Fatalf("%s: %s = %v, want refused (provider.ErrNotOwned)", what, op, err)
					}
				}
				_, err := w.p.SetPower(ctx, as, ref, provider.PowerOff)
				refused("power-off", err)
				err = w.p.PlaceGuestFile(ctx, as, ref, provider.GuestFile{Path: "/etc/hyperfleet/x", Content: []byte("x")})
				refused("guest file", err)
				_, err = w.p.DeleteVM(ctx, as, provider.Progress{ID: ref.ID, Node: ref.Node})
				refused("destroy", err)
				// Resuming a creation at a VM the claim does not own places
				// the claim's VM anew (pkg/provider/provider.go, EnsureVM),
				// never at that VM.
				res, err := w.p.EnsureVM(ctx, w.spec(as), provider.Progress{ID: ref.ID, Node: ref.Node})
				if err != nil && !errors.Is(err, provider.ErrNotOwned) {
					rt.Fatalf("%s: configure = %v", what, err)
				}
				if err == nil && res.Progress.ID == ref.ID {
					rt.Fatalf("%s: configure went on at the VM: %+v", what, res)
				}
			}
			if st, _ := w.hv.VM(v.vmid); !sameVM(st, v.before) {
				rt.Fatalf("VM %d (%s) changed under refused operations: %+v, was %+v", v.vmid, v.kind, st, v.before)
			}
		}

		// The orphan sweeper, past its grace period and the destruction
		// (a stop, then a destroy, an operation time each).
		w.sweepFor(grace + 6*round)
		for _, v := range vms {
			st, exists := w.hv.VM(v.vmid)
			switch gone := v.kind == vmOursOrphan || v.kind == vmOursStale; {
			case gone && exists:
				rt.Fatalf("VM %d (%s) was not destroyed by the sweeper", v.vmid, v.kind)
			case !gone && !exists:
				rt.Fatalf("the sweeper destroyed VM %d (%s)", v.vmid, v.kind)
			case !gone && !sameVM(st, v.before):
				rt.Fatalf("the sweeper changed VM %d (%s): %+v, was %+v", v.vmid, v.kind, st, v.before)
			}
		}
	})
	// Every kind of VM must have been drawn (not under -short, where rapid
	// runs a fifth of the cases).
	if testing.Short() {
		return
	}
	for _, k := range ownershipKinds {
		if seen[k] == 0 {
			t.Errorf("no VM was %s (%v)", k, seen)
		}
	}
}

// sameVM reports whether a VM is as it was: what the sweeper or a refused
// operation must not change.
func sameVM(a, b fakeprovider.VMState) bool {
	return a.Name == b.Name && a.Description == b.Description && slices.Equal(a.Tags, b.Tags) && a.Power == b.Power
}

// addForged adds a VM of a forged, missing or absent marker kind and
// returns its id; ours are the VMs made so far (a copied block comes from
// one, or from a VM made for the purpose).
func (w *world) addForged(rt *rapid.T, kind string, ours []*ownershipVM) int {
	rec := ownership.Record{Namespace: "ci", Name: "forged", UID: "uid-forged", Pool: "pool", CreatedAt: start}
	f := fakeprovider.ForeignVM{Name: "vm-by-hand"}
	switch kind {
	case vmForgedCopy:
		// A block copied from one of our VMs: it proves that VM, not this
		// one.
		src := w.signer.ForCluster(w.clusterIdentity()).Description("", ownership.Record{Namespace: "ci", Name: "copied", UID: "uid-copied", CreatedAt: start, VMID: 4242})
		for _, v := range ours {
			if v.ours() {
				src = v.before.Description
				break
			}
		}
		f.Description, f.Tags = src, w.signer.Tags()
	case vmForgedEdit:
		good := w.signer.ForCluster(w.clusterIdentity()).Description("", rec)
		f.Description, f.Tags = strings.Replace(good, "name: forged", "name: victim", 1), w.signer.Tags()
	case vmNoMarker:
		f.Tags = w.signer.Tags()
	case vmOurName:
		// Named as this install names its clones, for the id it gets.
		f.VMID = 150 + rapid.IntRange(0, 40).Draw(rt, "our-name vmid")
		for {
			if _, taken := w.hv.VM(f.VMID); !taken {
				break
			}
			f.VMID++
		}
		f.Name = w.signer.VMName(f.VMID)
	case vmHandMade:
	case vmRetiredKey:
		ring, err := ownership.NewKeyRing(w.signer.OperatorID(), []ownership.Key{{ID: 7, Secret: bytes.Repeat([]byte{9}, ownership.MinKeyLength)}})
		if err != nil {
			rt.Fatalf("ring: %v", err)
		}
		f.Description, f.Tags = ring.ForCluster(w.clusterIdentity()).Description("", rec), w.signer.Tags()
	case vmOtherKeySig:
		s, err := ownership.NewSigner(w.signer.OperatorID(), bytes.Repeat([]byte{8}, ownership.MinKeyLength))
		if err != nil {
			rt.Fatalf("signer: %v", err)
		}
		f.Description, f.Tags = s.ForCluster(w.clusterIdentity()).Description("", rec), w.signer.Tags()
	}
	vmid, err := w.hv.AddForeignVM(f)
	if err != nil {
		rt.Fatalf("add VM (%s): %v", kind, err)
	}
	if kind == vmForgedEdit || kind == vmRetiredKey || kind == vmOtherKeySig {
		// The block names the VM id it was written for: this one, so that
		// only the forgery itself is refused.
		rec.VMID = vmid
		var desc string
		switch kind {
		case vmForgedEdit:
			desc = strings.Replace(w.signer.ForCluster(w.clusterIdentity()).Description("", rec), "name: forged", "name: victim", 1)
		case vmRetiredKey:
			ring, _ := ownership.NewKeyRing(w.signer.OperatorID(), []ownership.Key{{ID: 7, Secret: bytes.Repeat([]byte{9}, ownership.MinKeyLength)}})
			desc = ring.ForCluster(w.clusterIdentity()).Description("", rec)
		case vmOtherKeySig:
			s, _ := ownership.NewSigner(w.signer.OperatorID(), bytes.Repeat([]byte{8}, ownership.MinKeyLength))
			desc = s.ForCluster(w.clusterIdentity()).Description("", rec)
		}
		if err := w.hv.SetDescription(vmid, desc); err != nil {
			rt.Fatalf("describe VM %d: %v", vmid, err)
		}
	}
	return vmid
}

// clusterIdentity is the identity the world's providers sign for.
func (w *world) clusterIdentity() ownership.ClusterIdentity {
	return ownership.ClusterIdentity{Name: w.cluster}
}

package sweeper

import (
	"context"
	"encoding/json"
	"slices"
	"testing"
	"time"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/pkg/provider"
)

// isolationHypervisor is a provider whose isolation objects the test
// holds: a fake cluster's provider plus a list of objects by id.
type isolationHypervisor struct {
	provider.Provider
	objects []provider.IsolationObject
	inUse   map[string]bool
}

func (h *isolationHypervisor) ListIsolationObjects(context.Context) ([]provider.IsolationObject, error) {
	return slices.Clone(h.objects), nil
}

func (h *isolationHypervisor) DeleteIsolationObject(_ context.Context, o provider.IsolationObject) error {
	if h.inUse[o.ID] {
		return provider.ErrInUse
	}
	h.objects = slices.DeleteFunc(h.objects, func(x provider.IsolationObject) bool { return x.ID == o.ID })
	return nil
}

// placedWith is a claim whose placement record holds iso.
func placedWith(t *testing.T, iso *provider.Isolation) hfv1.MachineClaim {
	t.Helper()
	raw, err := json.Marshal(iso)
	if err != nil {
		t.Fatal(err)
	}
	rec, err := json.Marshal(map[string]string{"cluster": "pve", "isolation": string(raw), "signature": "p3.1.x"})
	if err != nil {
		t.Fatal(err)
	}
	var c hfv1.MachineClaim
	c.Status.PlacementRecord = string(rec)
	return c
}

// TestSweepIsolationObjects: an object a claim's placement record needs
// stays; one no claim needs goes after the grace period, not before, and
// not while the claims read from the API server (a claim placed since the
// cache was read) need it; one the provider sees in use waits another
// grace period; dry-run removes nothing.
func TestSweepIsolationObjects(t *testing.T) {
	live := &provider.Isolation{Policy: "web", Egress: []provider.FirewallRule{{Action: provider.FirewallAccept, Protocol: provider.ProtocolTCP}}}
	old := &provider.Isolation{Policy: "web", Egress: []provider.FirewallRule{{Action: provider.FirewallDrop}}}
	fresh := &provider.Isolation{Policy: "build"}
	obj := func(iso *provider.Isolation) provider.IsolationObject {
		return provider.IsolationObject{ID: "hf000000" + iso.RulesDigest()[:10], Digest: iso.RulesDigest()[:10]}
	}
	for _, dryRun := range []bool{false, true} {
		w := newWorld(t, dryRun)
		h := &isolationHypervisor{Provider: w.p, objects: []provider.IsolationObject{obj(live), obj(old), obj(fresh)}, inUse: map[string]bool{}}
		cached := []hfv1.MachineClaim{placedWith(t, live)}
		// On the API server, a claim placed after the cache was read.
		onServer := append(slices.Clone(cached), placedWith(t, fresh))
		confirm := func() ([]hfv1.MachineClaim, error) { return onServer, nil }
		s := w.sweeper
		s.defaults()
		sweep := func() {
			t.Helper()
			if err := s.sweepIsolation(context.Background(), w.cluster, h, isolationDigests(cached), confirm); err != nil {
				t.Fatal(err)
			}
		}
		ids := func() []string {
			var out []string
			for _, o := range h.objects {
				out = append(out, o.ID)
			}
			return out
		}
		all := ids()
		sweep()
		w.clock.Step(grace / 2)
		sweep()
		if !slices.Equal(ids(), all) {
			t.Fatalf("dry-run %v: objects went before the grace period: %v", dryRun, ids())
		}
		h.inUse[obj(old).ID] = true
		w.clock.Step(grace)
		sweep()
		if !slices.Equal(ids(), all) {
			t.Fatalf("dry-run %v: an object in use went: %v", dryRun, ids())
		}
		h.inUse = map[string]bool{}
		w.clock.Step(grace / 2)
		sweep()
		if !slices.Equal(ids(), all) {
			t.Fatalf("dry-run %v: an object the provider saw in use went before another grace period: %v", dryRun, ids())
		}
		w.clock.Step(grace + time.Second)
		sweep()
		want := []string{obj(live).ID, obj(fresh).ID}
		if dryRun {
			want = all
		}
		if !slices.Equal(ids(), want) {
			t.Errorf("dry-run %v: objects left %v, want %v", dryRun, ids(), want)
		}
	}
}

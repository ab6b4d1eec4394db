package hypervisors

import (
	"errors"
	"sync/atomic"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	"github.com/hyperfleet/hyperfleet/pkg/provider"
)

// stubProvider is only compared by identity; Registry never calls it.
type stubProvider struct {
	provider.Provider
	id int
}

func TestConnectRebuildsOnlyWhenConfigChanges(t *testing.T) {
	r := NewRegistry()
	builds := 0
	build := func() (provider.Provider, error) {
		builds++
		return &stubProvider{id: builds}, nil
	}
	cfg := provider.ClusterConfig{Name: "a", Endpoint: "https://pve:8006/api2/json", TokenSecret: "s1"}
	p1, _ := r.Connect("a", cfg, build)
	p2, _ := r.Connect("a", cfg, build)
	if p1 != p2 || builds != 1 {
		t.Fatalf("same config rebuilt the provider (%d builds)", builds)
	}
	cfg.TokenSecret = "s2" // a rotated Secret
	p3, _ := r.Connect("a", cfg, build)
	if p3 == p1 || builds != 2 {
		t.Fatalf("changed config kept the old provider (%d builds)", builds)
	}
	if _, err := r.Connect("b", cfg, func() (provider.Provider, error) { return nil, errors.New("bad CA") }); err == nil {
		t.Fatal("build error swallowed")
	}
	if _, _, ok := r.Provider("b"); ok {
		t.Fatal("a failed build left a provider behind")
	}
}

func TestHealthAndFailures(t *testing.T) {
	r := NewRegistry()
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	if h := r.Health("x"); h.Ready || h.Reason != "NotConnected" {
		t.Fatalf("unknown cluster health = %+v", h)
	}
	r.SetHealth("x", Health{Ready: true}, t0)
	if n := r.RecordFailure("x"); n != 1 || !r.Health("x").Ready {
		t.Fatalf("RecordFailure = %d, health %+v: one failure must not mark the cluster down", n, r.Health("x"))
	}
	if n := r.RecordFailure("x"); n != 2 {
		t.Fatalf("RecordFailure = %d, want 2", n)
	}
	// The probe that marks a Ready cluster down is the first of its
	// backoff, whatever it absorbed before.
	if n := r.SetHealth("x", Health{Reason: "Unreachable"}, t0.Add(time.Minute)); n != 1 {
		t.Fatalf("failures at the mark down = %d, want 1", n)
	}
	if h := r.Health("x"); h.Ready || !h.Since.Equal(t0.Add(time.Minute)) {
		t.Fatalf("health = %+v", h)
	}
	if n := r.SetHealth("x", Health{Reason: "Unreachable"}, t0.Add(2*time.Minute)); n != 2 {
		t.Fatalf("failures at the second probe of a down cluster = %d, want 2", n)
	}
	if h := r.Health("x"); !h.Since.Equal(t0.Add(time.Minute)) {
		t.Fatalf("Since moved without a change of readiness: %+v", h)
	}
	if n := r.SetHealth("x", Health{Ready: true}, t0.Add(3*time.Minute)); n != 0 {
		t.Fatalf("failures after success = %d", n)
	}
}

func TestListing(t *testing.T) {
	r := NewRegistry()
	if r.Listing("x") != nil {
		t.Fatal("listing before the first poll")
	}
	var nilListing *Listing
	if _, ok := nilListing.VM("vm://1"); ok {
		t.Fatal("nil listing found a VM")
	}
	at := time.Now()
	prev := r.SetListing("x", []provider.VMSummary{{ID: "vm://100", Power: provider.PowerRunning}, {ID: "vm://101"}}, at)
	if prev != nil {
		t.Fatal("first listing had a predecessor")
	}
	prev = r.SetListing("x", []provider.VMSummary{{ID: "vm://101", Power: provider.PowerStopped}}, at.Add(time.Second))
	if vm, ok := prev.VM("vm://100"); !ok || vm.Power != provider.PowerRunning {
		t.Fatalf("previous listing lost VM 100: %+v", vm)
	}
	l := r.Listing("x")
	if _, ok := l.VM("vm://100"); ok {
		t.Fatal("VM 100 still listed")
	}
	if vm, ok := l.VM("vm://101"); !ok || vm.Power != provider.PowerStopped || !l.At.Equal(at.Add(time.Second)) {
		t.Fatalf("VM 101 = %+v at %v", vm, l.At)
	}
	r.Remove("x")
	if r.Listing("x") != nil || len(r.Names()) != 0 {
		t.Fatal("Remove kept the cluster")
	}
}

// closingProvider counts its closes.
type closingProvider struct {
	provider.Provider
	closes atomic.Int32
}

func (p *closingProvider) Close() { p.closes.Add(1) }

// TestReplacedAndRemovedProvidersAreClosed: a provider that holds
// connections (libvirt's hosts, with their event subscriptions) is closed
// once a new configuration replaced it or its cluster was removed, after
// CloseGrace (calls in flight on it end first), and never while it is the
// cluster's provider; before, each Secret rotation or deletion of a
// libvirt cluster left its connections open for good.
func TestReplacedAndRemovedProvidersAreClosed(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	r := NewRegistry()
	r.Clock = clk
	var built []*closingProvider
	build := func() (provider.Provider, error) {
		p := &closingProvider{}
		built = append(built, p)
		return p, nil
	}
	cfg := provider.ClusterConfig{Name: "a", Endpoint: "qemu+tls://kvm1/system", TokenSecret: "s1"}
	if _, err := r.Connect("a", cfg, build); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Connect("a", cfg, build); err != nil {
		t.Fatal(err)
	}
	cfg.TokenSecret = "s2"
	if _, err := r.Connect("a", cfg, build); err != nil {
		t.Fatal(err)
	}
	if len(built) != 2 {
		t.Fatalf("%d providers built, want 2", len(built))
	}
	if n := built[0].closes.Load(); n != 0 {
		t.Fatalf("the replaced provider was closed at once (%d closes): a pass may still be calling it", n)
	}
	clk.Step(DefaultCloseGrace)
	if n := built[0].closes.Load(); n != 1 {
		t.Fatalf("the replaced provider was closed %d times after CloseGrace, want 1", n)
	}
	if n := built[1].closes.Load(); n != 0 {
		t.Fatalf("the cluster's current provider was closed (%d)", n)
	}
	r.Remove("a")
	clk.Step(DefaultCloseGrace)
	if n := built[1].closes.Load(); n != 1 {
		t.Fatalf("the removed cluster's provider was closed %d times, want 1", n)
	}
	// A provider without connections (no Close) is simply dropped.
	r.Remove("never-connected")
	if _, err := r.Connect("b", cfg, func() (provider.Provider, error) { return &stubProvider{}, nil }); err != nil {
		t.Fatal(err)
	}
	r.Remove("b")
	clk.Step(DefaultCloseGrace)
}

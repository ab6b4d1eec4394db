package controller_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"pgregory.net/rapid"
	"sigs.k8s.io/controller-runtime/pkg/client"
	crmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/testworld/proptest"
	proxmoxsim "github.com/hyperfleet/hyperfleet/internal/testworld/simulator/proxmox"
)

// counters reads the operator's counters from its registry (what its
// /metrics endpoint serves), by metric name and label values.
func counters(t cheapT, names ...string) map[string]float64 {
	t.Helper()
	families, err := crmetrics.Registry.Gather()
	if err != nil {
		t.Fatalf("gather metrics: %v", err)
	}
	out := map[string]float64{}
	for _, f := range families {
		if !slices.Contains(names, f.GetName()) {
			continue
		}
		for _, m := range f.GetMetric() {
			key := f.GetName()
			for _, l := range m.GetLabel() {
				key += fmt.Sprintf(",%s=%s", l.GetName(), l.GetValue())
			}
			out[key] = m.GetCounter().GetValue()
		}
	}
	return out
}

// moved is what moved between two readings of counters.
func moved(before, after map[string]float64) map[string]float64 {
	out := map[string]float64{}
	for k, v := range after {
		if d := v - before[k]; d != 0 {
			out[k] = d
		}
	}
	return out
}

// claimEvents are the events recorded for the claim with uid, by reason
// (each event's count: the recorder folds repeats into one).
func claimEvents(ctx context.Context, namespace, uid string) (map[string]int, error) {
	var list corev1.EventList
	if err := env.Client.List(ctx, &list, client.InNamespace(namespace)); err != nil {
		return nil, fmt.Errorf("list events: %w", err)
	}
	out := map[string]int{}
	for _, e := range list.Items {
		if string(e.InvolvedObject.UID) == uid {
			out[e.Reason] += max(int(e.Count), 1)
		}
	}
	return out, nil
}

// responseLog counts the simulator's answers to provisioning writes, by
// class and status code.
type responseLog struct {
	mu    sync.Mutex
	codes map[string]int
}

func (l *responseLog) record(r *http.Request, code int) {
	if c := writeClass(r); c != "" {
		// The simulator writes its errors on the connection it takes over
		// (the status line carries Proxmox's message): code 0. This test
		// drops no connection, so those are its failed answers.
		what := "ok"
		if code == 0 || code >= 400 {
			what = "failed"
		}
		l.mu.Lock()
		l.codes[c+" "+what]++
		l.mu.Unlock()
	}
}

func (l *responseLog) take() map[string]int {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := l.codes
	l.codes = map[string]int{}
	return out
}

// lifecyclePhases orders the phases a claim of this world goes through.
var lifecyclePhases = []string{
	string(hfv1.MachineClaimPending), string(hfv1.MachineClaimProvisioning), string(hfv1.MachineClaimBootstrapping),
	string(hfv1.MachineClaimTerminating), string(hfv1.MachineClaimFailed), string(hfv1.MachineClaimFinished),
}

// traceMatches checks a claim's trace against what happened to it:
// events by reason, the counters that moved, the hypervisor's answers to
// its writes by class, the phases it was seen in.
func traceMatches(events map[string]int, d map[string]float64, answers map[string]int, fault, class string, didRun bool, seen map[string]bool) error {
	gotErrors, transitions := map[string]float64{}, map[string]float64{}
	for k, v := range d {
		if phase, ok := strings.CutPrefix(k, "hyperfleet_machineclaim_transitions_total,phase="); ok {
			transitions[phase] = v
		}
		if strings.HasPrefix(k, "hyperfleet_machineclaim_errors_total,") {
			gotErrors[k] = v
		}
	}
	// Every phase the claim went through moved the transitions counter,
	// once; only the Failed phase, which a person acts on, is an event
	// too (a Warning): the routine phases are the claim's status, the log
	// and the counter, not a POST each to the API server.
	for _, p := range lifecyclePhases {
		if transitions[p] > 1 {
			return fmt.Errorf("entered %s %v times", p, transitions[p])
		}
		want := 0
		if p == string(hfv1.MachineClaimFailed) {
			want = int(transitions[p])
		}
		if events[p] != want {
			return fmt.Errorf("phase %s: %d events, want %d (transitions counter moved %v)", p, events[p], want, transitions[p])
		}
	}
	for p := range seen {
		if transitions[p] == 0 {
			return fmt.Errorf("seen %s but the transitions counter did not count it", p)
		}
	}
	wantErrors := map[string]float64{}
	if n := answers[class+" failed"]; n > 0 && fault == "503" {
		wantErrors["hyperfleet_machineclaim_errors_total,class=Transient,reason=Unreachable"] = float64(n)
	}
	if n := answers[class+" failed"]; n > 0 && fault == "template gone" {
		wantErrors["hyperfleet_machineclaim_errors_total,class=Permanent,reason=NotFound"] = float64(n)
	}
	if !mapsEqual(gotErrors, wantErrors) {
		return fmt.Errorf("errors counter moved %v, the hypervisor's failed answers say %v", gotErrors, wantErrors)
	}
	retried := fault == "503" && answers[class+" failed"] > 0
	if retried != (events["FailedProvision"] > 0) {
		return fmt.Errorf("%d FailedProvision events after %d failed %s answers", events["FailedProvision"], answers[class+" failed"], class)
	}
	delivered := d["hyperfleet_guest_secrets_delivered_total,content=runner-credential"]
	if events["Provisioned"] != 0 || events["CredentialDelivered"] != 0 || (didRun && delivered != 1) || (!didRun && delivered != 0) {
		return fmt.Errorf("ran %v: %d Provisioned and %d CredentialDelivered events (routine steps: none), %v credentials counted delivered",
			didRun, events["Provisioned"], events["CredentialDelivered"], delivered)
	}
	if transitions[string(hfv1.MachineClaimTerminating)]+transitions[string(hfv1.MachineClaimFailed)] == 0 {
		return errors.New("ended without the transitions counter counting Terminating or Failed")
	}
	return nil
}

// observabilityFault is the simulator's fault for a generated fault kind
// on a request class: 503s, or the template gone (which only a clone
// meets, so the class becomes clone).
func observabilityFault(fault, class string) (proxmoxsim.FaultSpec, string) {
	switch fault {
	case "503":
		return proxmoxsim.FaultSpec{ErrorRate: 1, ErrorCode: http.StatusServiceUnavailable}, class
	case "template gone":
		return proxmoxsim.FaultSpec{ErrorRate: 1, Errors: []string{"Configuration file 'nodes/{node}/qemu-server/{vmid}.conf' does not exist"}}, "clone"
	}
	return proxmoxsim.FaultSpec{}, class
}

// Feature: hyperfleet-operator, Property 18: Observability and Events
//
// TestObservabilityProperty, in the cheap world (cheapworld_test.go: the
// events are those the reconcilers record, one per call, before any
// folding; the counters are read from the operator's registry): a claim
// through a generated lifecycle (its clone, configuration, ISO upload or
// start failing with 503s for a generated stretch of fake time, or its
// template gone from the hypervisor; then, if it runs, deleted or powered
// off from inside its guest) leaves a trace that matches what happened:
// each phase it went through (every phase it was seen in after any round
// of the operator) moved hyperfleet_machineclaim_transitions_total once,
// and only the phase a person acts on, Failed, is an event too (a
// Warning): a routine phase is the claim's status, the log and the
// counter, not a POST to the API server each (machineclaim/events.go);
// hyperfleet_machineclaim_errors_total moved by exactly the hypervisor's
// failed answers, under their class and reason, with a FailedProvision
// event for a failure the claim retried; a claim that ran has exactly one
// runner credential counted delivered and no CredentialDelivered event
// (which VM got a credential is the log's and status.bootstrap's, not a
// POST to the API server), and a claim that did not has none; every
// claim's end is counted, as Terminating or Failed.
//
// Mutations: the claim controller recording no event for the Failed phase
// (machineclaim/status.go's RecordPhase) fails this test in a case whose
// template is gone; recording an event for every phase again, as before
// the write diet, fails it in its first case; recording the
// CredentialDelivered event again (machineclaim/guestsecrets.go's
// delivered) fails it in any case whose claim ran. The envtest test caught the
// first only after 70 s.
func TestObservabilityProperty(t *testing.T) {
	w := newCheapWorld(t, cheapOptions{minRetryDelay: retryFirst, maxRetryDelay: retryCap})
	sim := w.StartSim(nil)
	cluster := w.AddCluster("pve", sim)
	w.Create(cheapTemplate("debian", cluster.Name))
	log := &responseLog{codes: map[string]int{}}
	hook := log.record
	sim.onResponse.Store(&hook)
	metricNames := []string{"hyperfleet_machineclaim_transitions_total", "hyperfleet_machineclaim_errors_total", "hyperfleet_guest_secrets_delivered_total"}
	var ran, failed, faulted, poweredOff, n int
	proptest.Check(t, proptest.Minimum, func(rt *rapid.T) {
		defer w.Case(rt)()
		n++
		name := fmt.Sprintf("p18-%d", n)
		fault := rapid.SampledFrom([]string{"none", "503", "template gone"}).Draw(rt, "fault")
		class := rapid.SampledFrom([]string{"clone", "config", "upload", "power"}).Draw(rt, "class")
		window := time.Duration(rapid.IntRange(50, 3000).Draw(rt, "fault ms")) * time.Millisecond
		spec, class := observabilityFault(fault, class)
		before := counters(rt, metricNames...)
		log.take()
		if fault != "none" {
			if err := sim.SetFaults(proxmoxsim.Faults{Classes: map[string]proxmoxsim.FaultSpec{class: spec}}); err != nil {
				rt.Fatal(err)
			}
		}
		defer func() { _ = sim.SetFaults(proxmoxsim.Faults{}) }()
		claim := cheapClaim(name, "debian")
		w.Create(claim)
		seen := map[string]bool{}
		watch := func() error {
			if w.Get(claim) && claim.Status.Phase != "" {
				seen[string(claim.Status.Phase)] = true
			}
			return nil
		}
		w.RunFor(window, "claim "+name+" under its fault", watch)
		if fault == "503" {
			if err := sim.SetFaults(proxmoxsim.Faults{}); err != nil {
				rt.Fatal(err)
			}
		}
		// Runs (or fails for good), then ends as generated.
		w.RunUntil(10*time.Minute, "claim "+name+" running or failed", func() error {
			_ = watch()
			if claim.HasFailed() {
				return nil
			}
			if b := claim.Status.Bootstrap; claim.Status.Phase != hfv1.MachineClaimBootstrapping || b == nil || b.CredentialDeliveredAt == nil {
				return fmt.Errorf("phase %s, conditions %v", claim.Status.Phase, claim.Status.Conditions)
			}
			return nil
		})
		uid := claim.UID
		didRun := !claim.HasFailed()
		if didRun && rapid.Bool().Draw(rt, "powered off from inside") {
			poweredOff++
			if err := sim.GuestPowerOff(int(claim.Status.VMRef.VMID)); err != nil {
				rt.Fatal(err)
			}
		} else {
			w.Delete(claim)
		}
		w.RunUntil(30*time.Minute, "claim "+name+" gone", func() error {
			if !w.Get(claim) {
				return nil
			}
			_ = watch()
			if claim.DeletionTimestamp.IsZero() && (claim.Ended() && (claim.Status.End.Failed || claim.IsFinished())) {
				// A failed claim stays until deleted (no pool keeps it).
				w.Delete(claim)
			}
			return fmt.Errorf("still there: phase %s", claim.Status.Phase)
		})
		answers := log.take()
		events := w.Events.of(uid)
		d := moved(before, counters(rt, metricNames...))
		if err := traceMatches(events, d, answers, fault, class, didRun, seen); err != nil {
			rt.Fatalf("claim %s (%s on %s for %s): %v; events %v, counters moved %v, hypervisor answered %v, phases seen %v",
				name, fault, class, window, err, events, d, answers, seen)
		}
		switch {
		case !didRun:
			failed++
		case fault != "none":
			faulted++
			ran++
		default:
			ran++
		}
	})
	t.Logf("claims: %d ran (%d through faults, %d powered off from inside), %d failed; %d reconciles", ran, faulted, poweredOff, failed, w.Reconciles)
	// The shares need the full count of cases: under -short (the race run)
	// rapid runs a fifth of them, which need not draw every kind.
	if cases := ran + failed; !testing.Short() && (failed*20 < cases || faulted*10 < cases || poweredOff == 0) {
		t.Errorf("the generator made %d claims that ran (%d through faults, %d powered off) and %d that failed; want a tenth through faults, one powered off and a twentieth failed at least", ran, faulted, poweredOff, failed)
	}
}

// TestObservabilityScenarios drives property 18 through the whole operator
// against the real API server (its event recorder, which folds repeats
// into counts, and the metrics registry it serves): fixed lifecycles, a
// claim through each (its
// clone, configuration, ISO upload or start failing with 503s for a
// generated time, or its template gone from the hypervisor; then, if it
// runs, deleted or powered off from inside its guest) leaves a trace that
// matches what happened: each phase it went through (every phase it was
// seen in included) has its event, once, and
// hyperfleet_machineclaim_transitions_total moved by exactly those
// events; hyperfleet_machineclaim_errors_total moved by exactly the
// hypervisor's failed answers, under their class and reason, with a
// FailedProvision event for a failure the claim retried; a claim that ran
// has exactly one runner credential counted delivered and no routine
// event, and a claim that did not has none; every claim's end is
// counted (traceMatches).
func TestObservabilityScenarios(t *testing.T) {
	longScenario(t)
	sim := startSim(t, func(c *proxmoxsim.Config) {
		c.Latency = propertyLatency()
		c.RefreshInterval = proxmoxsim.Duration(100 * time.Millisecond)
	})
	log := &responseLog{codes: map[string]int{}}
	hook := log.record
	sim.onResponse.Store(&hook)
	op := startOperator(t, operatorOptions{minRetryDelay: retryFirst, maxRetryDelay: retryCap})
	w := &propertyWorld{sim: sim, op: op, f: newFixture(t, sim, nil)}
	ctx := context.Background()
	metricNames := []string{"hyperfleet_machineclaim_transitions_total", "hyperfleet_machineclaim_errors_total", "hyperfleet_guest_secrets_delivered_total"}
	var ran, failed, faulted int
	for _, sc := range []struct {
		fault, class string
		window       time.Duration
		powerOff     bool
	}{
		{fault: "none", class: "clone", window: 50 * time.Millisecond},
		{fault: "503", class: "config", window: 400 * time.Millisecond, powerOff: true},
		{fault: "template gone", class: "clone", window: 200 * time.Millisecond},
	} {
		rt := t
		w.n++
		name := fmt.Sprintf("p18-%d", w.n)
		fault, class, window := sc.fault, sc.class, sc.window
		spec, class := observabilityFault(fault, class)
		before := counters(rt, metricNames...)
		log.take()
		if fault != "none" {
			if err := sim.SetFaults(proxmoxsim.Faults{Classes: map[string]proxmoxsim.FaultSpec{class: spec}}); err != nil {
				rt.Fatal(err)
			}
		}
		claim := w.f.newClaim(name)
		seen := map[string]bool{}
		watch := func(c *hfv1.MachineClaim) {
			if c.Status.Phase != "" {
				seen[string(c.Status.Phase)] = true
			}
		}
		start := time.Now()
		for time.Since(start) < window {
			if c, err := getClaim(w.f.t, claim); err == nil {
				watch(c)
			}
			time.Sleep(10 * time.Millisecond)
		}
		if fault == "503" {
			if err := sim.SetFaults(proxmoxsim.Faults{}); err != nil {
				rt.Fatal(err)
			}
		}
		// Runs (or fails for good), then ends as generated.
		var got *hfv1.MachineClaim
		eventually(rt, 30*time.Second, "claim "+name+" running or failed", func() error {
			c, err := getClaim(w.f.t, claim)
			if err != nil {
				return err
			}
			watch(c)
			got = c
			if c.HasFailed() {
				return nil
			}
			if b := c.Status.Bootstrap; c.Status.Phase != hfv1.MachineClaimBootstrapping || b == nil || b.CredentialDeliveredAt == nil {
				return fmt.Errorf("phase %s, conditions %v", c.Status.Phase, c.Status.Conditions)
			}
			return nil
		})
		didRun := !got.HasFailed()
		if didRun && sc.powerOff {
			if err := sim.GuestPowerOff(int(got.Status.VMRef.VMID)); err != nil {
				rt.Fatal(err)
			}
		} else if err := env.Client.Delete(ctx, got); err != nil && !apierrors.IsNotFound(err) {
			rt.Fatal(err)
		}
		eventually(rt, 60*time.Second, "claim "+name+" gone", func() error {
			c, err := getClaim(w.f.t, claim)
			if apierrors.IsNotFound(err) {
				return nil
			}
			if err != nil {
				return err
			}
			watch(c)
			if c.DeletionTimestamp.IsZero() && (c.Ended() && (c.Status.End.Failed || c.IsFinished())) {
				// A failed claim stays until deleted (no pool keeps it).
				_ = env.Client.Delete(ctx, c)
			}
			return fmt.Errorf("still there: phase %s", c.Status.Phase)
		})
		answers := log.take()

		// What the hypervisor answered, as the errors counter must say.
		wantErrors := map[string]float64{}
		if n := answers[class+" failed"]; n > 0 && fault == "503" {
			wantErrors["hyperfleet_machineclaim_errors_total,class=Transient,reason=Unreachable"] = float64(n)
		}
		if n := answers[class+" failed"]; n > 0 && fault == "template gone" {
			wantErrors["hyperfleet_machineclaim_errors_total,class=Permanent,reason=NotFound"] = float64(n)
		}
		var lastDiff string
		check := func() error {
			events, err := claimEvents(ctx, w.f.namespace, string(claim.UID))
			if err != nil {
				return err
			}
			d := moved(before, counters(rt, metricNames...))
			lastDiff = fmt.Sprintf("events %v, counters moved %v, hypervisor answered %v, phases seen %v", events, d, answers, seen)
			return traceMatches(events, d, answers, fault, class, didRun, seen)
		}
		eventually(rt, 15*time.Second, "claim "+name+"'s events recorded", func() error {
			if err := check(); err != nil {
				return fmt.Errorf("%w (%s)", err, lastDiff)
			}
			return nil
		})
		switch {
		case !didRun:
			failed++
		case fault != "none":
			faulted++
			ran++
		default:
			ran++
		}
		_ = sim.SetFaults(proxmoxsim.Faults{})
	}
	t.Logf("claims: %d ran (%d through faults), %d failed", ran, faulted, failed)
}

func mapsEqual(a, b map[string]float64) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

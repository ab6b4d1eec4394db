//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/testworld/devenv"
)

// genericScript records, per claim, what a generic VM's script saw into
// dir (outside the simulated guests' roots), then exits: the agent then
// powers the VM off.
func genericScript(dir, extra string) string {
	return `set -eu
out="` + dir + `/$HYPERFLEET_CLAIM_UID"
printf '%s\n%s\n%s\n%s\n' "$HYPERFLEET_CLAIM" "$HYPERFLEET_CLAIM_UID" "$HYPERFLEET_DEADLINE" "$(pwd)" >"$out.tmp"
` + extra + `
mv "$out.tmp" "$out"
`
}

// scriptRuns are the runs genericScript recorded, by claim uid.
func scriptRuns(t *testing.T, dir string) map[string][]string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]string{}
	for _, e := range entries {
		if strings.HasSuffix(e.Name(), ".tmp") {
			continue
		}
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		out[e.Name()] = strings.Split(strings.TrimSpace(string(b)), "\n")
	}
	return out
}

// TestGenericPoolRunsScripts: a generic pool of two keeps two VMs, each of
// which runs the template's script once through the real agent with its
// claim's environment and powers off; the pool replaces them, and once it
// is deleted nothing is left.
func TestGenericPoolRunsScripts(t *testing.T) {
	w, watch := startWorld(t)
	ctx := context.Background()
	dir := t.TempDir()
	if err := w.AddGenericPool(ctx, devenv.GenericPoolSpec{Name: "batch", Script: genericScript(dir, "sleep 1"), MinReplicas: 2}); err != nil {
		t.Fatal(err)
	}
	// Four runs: the first two VMs and at least two replacements. Every
	// claim is seen while it lives (finished claims are deleted: the
	// pool keeps no history), with the most advanced state seen.
	byUID := map[string]hfv1.MachineClaim{}
	eventually(t, 5*time.Minute, "four scripts ran", func() error {
		var claims hfv1.MachineClaimList
		if err := w.API.Client.List(ctx, &claims, client.InNamespace(devenv.Namespace), client.MatchingLabels{hfv1.RunnerPoolLabel: "batch"}); err != nil {
			return err
		}
		for _, c := range claims.Items {
			if old, ok := byUID[string(c.UID)]; !ok || !old.Ended() {
				byUID[string(c.UID)] = c
			}
		}
		if n := len(scriptRuns(t, dir)); n < 4 {
			return fmt.Errorf("%d scripts ran", n)
		}
		return nil
	})
	for uid, run := range scriptRuns(t, dir) {
		if len(run) != 4 || run[1] != uid || !strings.HasPrefix(run[0], devenv.Namespace+"/batch-") || !strings.HasSuffix(run[3], "/var/lib/hyperfleet/work") {
			t.Errorf("script of claim %s saw %q; want its claim, uid, deadline and work directory", uid, run)
			continue
		}
		deadline, err := time.Parse(time.RFC3339, run[2])
		if err != nil {
			t.Errorf("HYPERFLEET_DEADLINE %q: %v", run[2], err)
			continue
		}
		c, ok := byUID[uid]
		if !ok {
			t.Errorf("a script ran for claim uid %s, which was never seen in the pool", uid)
			continue
		}
		if c.Spec.WorkloadConfig == nil || c.Spec.WorkloadConfig.Type != hfv1.WorkloadGeneric {
			t.Errorf("claim %s: workloadConfig %+v, want type generic", c.Name, c.Spec.WorkloadConfig)
		}
		if want := c.CreationTimestamp.Add(time.Hour); !deadline.Equal(want) {
			t.Errorf("claim %s: deadline %s, want its creation plus the default ttl, %s", c.Name, deadline, want)
		}
		if run[0] != c.Namespace+"/"+c.Name {
			t.Errorf("claim %s: HYPERFLEET_CLAIM %q", c.Name, run[0])
		}
	}
	// Every claim whose script ran and whose VM is gone ended by its
	// power-off.
	for uid := range scriptRuns(t, dir) {
		if c, ok := byUID[uid]; ok && c.Ended() && c.EndReason() != hfv1.EndPoweredOff {
			t.Errorf("claim %s ended %s (%s), want powered_off", c.Name, c.EndReason(), c.Status.TerminationReason)
		}
	}

	var pool hfv1.RunnerPool
	if err := w.API.Client.Get(ctx, client.ObjectKey{Namespace: devenv.Namespace, Name: "batch"}, &pool); err != nil {
		t.Fatal(err)
	}
	if err := w.API.Client.Delete(ctx, &pool); err != nil {
		t.Fatal(err)
	}
	eventually(t, 3*time.Minute, "the generic pool's VMs and claims gone", func() error {
		snap, err := w.Snapshot(ctx)
		if err != nil {
			return err
		}
		var left []string
		for _, c := range snap.Claims {
			if c.Spec.RunnerPoolRef != nil && c.Spec.RunnerPoolRef.Name == "batch" {
				left = append(left, c.Name)
			}
		}
		if len(left) > 0 || len(snap.VMs) > 0 {
			return fmt.Errorf("claims %v, %d VMs", left, len(snap.VMs))
		}
		return nil
	})
	watch.stop()
}

// TestGenericTTLEndsAHangingScript: a generic VM whose script hangs, and
// ignores the agent's stop signals so that the agent's own deadline (a
// second line) cannot end it first, is ended by the operator at its
// template's ttl (one minute, the least the API takes): the claim ends
// with max_lifetime (its MaxLifetime event), no earlier than its creation
// plus the ttl, and its VM is destroyed and the claim deleted.
func TestGenericTTLEndsAHangingScript(t *testing.T) {
	w, watch := startWorld(t)
	ctx := context.Background()
	dir := t.TempDir()
	const ttl = time.Minute
	hang := `trap '' INT TERM
: >"` + dir + `/$HYPERFLEET_CLAIM_UID.started"
while :; do sleep 1; done`
	if err := w.AddGenericPool(ctx, devenv.GenericPoolSpec{Name: "hang", Script: hang, TTL: ttl, MinReplicas: 1}); err != nil {
		t.Fatal(err)
	}
	// The claims as last seen: a claim's routine end is not written to
	// its status (it is deleted once its VM is gone), so the end is told
	// by its MaxLifetime event and the claim's VM and the claim going.
	seen := map[types.UID]hfv1.MachineClaim{}
	var ended hfv1.MachineClaim
	var endedAt time.Time
	eventually(t, 4*time.Minute, "a hanging script's claim ended at its ttl", func() error {
		var claims hfv1.MachineClaimList
		if err := w.API.Client.List(ctx, &claims, client.InNamespace(devenv.Namespace), client.MatchingLabels{hfv1.RunnerPoolLabel: "hang"}); err != nil {
			return err
		}
		for _, c := range claims.Items {
			if c.Status.VMRef != nil {
				seen[c.UID] = c
			}
		}
		var events corev1.EventList
		if err := w.API.Client.List(ctx, &events, client.InNamespace(devenv.Namespace)); err != nil {
			return err
		}
		for _, e := range events.Items {
			c, ok := seen[e.InvolvedObject.UID]
			if ok && e.Reason == string(hfv1.MaxLifetimeReason) && strings.Contains(e.Message, "spec.bootstrap.generic.ttl") {
				ended, endedAt = c, e.FirstTimestamp.Time
				return nil
			}
		}
		return fmt.Errorf("%d claims, no MaxLifetime event naming spec.bootstrap.generic.ttl on one", len(claims.Items))
	})
	if _, err := os.Stat(filepath.Join(dir, string(ended.UID)+".started")); err != nil {
		t.Errorf("the script of claim %s never started: %v", ended.Name, err)
	}
	if endedAt.Before(ended.CreationTimestamp.Add(ttl)) {
		t.Errorf("claim %s created %s began to end at %s, before its ttl %s", ended.Name, ended.CreationTimestamp, endedAt, ttl)
	}
	vmid := int(ended.Status.VMRef.VMID)
	eventually(t, time.Minute, "the ended claim's VM destroyed", func() error {
		snap, err := w.Snapshot(ctx)
		if err != nil {
			return err
		}
		for _, vm := range snap.VMs {
			if vm.VMID == vmid {
				return fmt.Errorf("VM %d still there (%s)", vmid, vm.Status)
			}
		}
		return nil
	})
	eventually(t, time.Minute, "the ended claim gone", func() error {
		var c hfv1.MachineClaim
		if err := w.API.Client.Get(ctx, client.ObjectKey{Namespace: ended.Namespace, Name: ended.Name}, &c); err == nil && c.UID == ended.UID {
			return fmt.Errorf("claim %s is still there (%s)", c.Name, c.Status.Phase)
		}
		return nil
	})

	var pool hfv1.RunnerPool
	if err := w.API.Client.Get(ctx, client.ObjectKey{Namespace: devenv.Namespace, Name: "hang"}, &pool); err != nil {
		t.Fatal(err)
	}
	if err := w.API.Client.Delete(ctx, &pool); err != nil {
		t.Fatal(err)
	}
	eventually(t, 3*time.Minute, "the pool's VMs gone", func() error {
		snap, err := w.Snapshot(ctx)
		if err != nil {
			return err
		}
		if len(snap.VMs) > 0 {
			return fmt.Errorf("%d VMs", len(snap.VMs))
		}
		return nil
	})
	watch.stop()
}

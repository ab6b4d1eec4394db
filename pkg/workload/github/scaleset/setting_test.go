package scaleset_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"testing"

	"github.com/hyperfleet/hyperfleet/pkg/workload/github/scaleset"
)

// runnerFileDisableUpdate is the disableUpdate of the .runner file a JIT
// configuration carries (false when the file leaves it out).
func runnerFileDisableUpdate(t *testing.T, jit *scaleset.JITConfig) bool {
	t.Helper()
	outer, err := base64.StdEncoding.DecodeString(jit.EncodedJITConfig)
	if err != nil {
		t.Fatalf("JIT config is not base64: %v", err)
	}
	var files map[string]string
	if err := json.Unmarshal(outer, &files); err != nil {
		t.Fatalf("JIT config: %v", err)
	}
	raw, err := base64.StdEncoding.DecodeString(files[".runner"])
	if err != nil {
		t.Fatalf(".runner is not base64: %v", err)
	}
	var runner struct {
		DisableUpdate bool `json:"disableUpdate"`
	}
	if err := json.Unmarshal(raw, &runner); err != nil {
		t.Fatalf(".runner: %v\n%s", err, raw)
	}
	return runner.DisableUpdate
}

// TestScaleSetRunnersDisableUpdate: HyperFleet's scale sets
// (EnsureScaleSet) are created with RunnerSetting.disableUpdate, so their
// JIT runners do not update themselves at the start of a job; a scale set
// made without it gives runners that may (the simulator writes what the
// setting says), EnsureScaleSet adopting such a scale set sets it, and an
// update that does not name the setting keeps it.
//
// Mutation: EnsureScaleSet creating the scale set without RunnerSetting
// fails this test (the runner's .runner says disableUpdate false); so does
// EnsureScaleSet adopting a scale set whose labels match without checking
// its setting, and the simulator writing "disableUpdate": true for every
// runner again (the scale set made without it), and the simulator
// resetting the setting on an update that does not name it. The old
// tests passed all four.
func TestScaleSetRunnersDisableUpdate(t *testing.T) {
	gs, c := start(t)
	ctx := context.Background()
	labels := []string{"hf-pinned"}

	ours, err := c.EnsureScaleSet(ctx, "hyperfleet", "hf-pinned", labels)
	if err != nil {
		t.Fatal(err)
	}
	if ours.RunnerSetting == nil || !ours.RunnerSetting.DisableUpdate {
		t.Fatalf("created scale set's RunnerSetting = %+v, want disableUpdate", ours.RunnerSetting)
	}
	jit, err := c.GenerateJITConfig(ctx, ours.ID, "hf-pinned-1", "")
	if err != nil {
		t.Fatal(err)
	}
	if !runnerFileDisableUpdate(t, jit) {
		t.Fatal("a runner of HyperFleet's scale set may update itself")
	}

	// A scale set made without the setting (another tool, or HyperFleet
	// before it sent one): its runners may update themselves.
	plain, err := c.CreateScaleSet(ctx, scaleset.ScaleSet{Name: "hf-plain", RunnerGroupID: 2, Labels: []scaleset.Label{{Name: "hf-plain"}}})
	if err != nil {
		t.Fatal(err)
	}
	if plain.RunnerSetting != nil && plain.RunnerSetting.DisableUpdate {
		t.Fatalf("scale set created without a setting has %+v", plain.RunnerSetting)
	}
	jit, err = c.GenerateJITConfig(ctx, plain.ID, "hf-plain-1", "")
	if err != nil {
		t.Fatal(err)
	}
	if runnerFileDisableUpdate(t, jit) {
		t.Fatal("the simulator disabled self-update for a scale set that did not ask for it")
	}

	// EnsureScaleSet adopts it (same labels) and sets it right.
	adopted, err := c.EnsureScaleSet(ctx, "hyperfleet", "hf-plain", []string{"hf-plain"})
	if err != nil {
		t.Fatal(err)
	}
	if adopted.ID != plain.ID || adopted.RunnerSetting == nil || !adopted.RunnerSetting.DisableUpdate {
		t.Fatalf("adopted scale set = %+v (setting %+v)", adopted, adopted.RunnerSetting)
	}
	got, err := c.ScaleSetByID(ctx, plain.ID)
	if err != nil || got.RunnerSetting == nil || !got.RunnerSetting.DisableUpdate || len(got.Labels) != 1 {
		t.Fatalf("scale set after adoption = %+v, %v", got, err)
	}
	jit, err = c.GenerateJITConfig(ctx, plain.ID, "hf-plain-2", "")
	if err != nil {
		t.Fatal(err)
	}
	if !runnerFileDisableUpdate(t, jit) {
		t.Fatal("a runner of the adopted scale set may update itself")
	}
	// An update that names no setting keeps it.
	relabelled, err := c.UpdateScaleSet(ctx, plain.ID, scaleset.ScaleSet{Labels: []scaleset.Label{{Name: "hf-plain"}, {Name: "linux"}}})
	if err != nil || len(relabelled.Labels) != 2 || relabelled.RunnerSetting == nil || !relabelled.RunnerSetting.DisableUpdate {
		t.Fatalf("after a labels-only update: %+v, %v", relabelled, err)
	}
	for _, s := range gs.Sim.ScaleSets() {
		if !s.DisableUpdate {
			t.Fatalf("simulator's scale set %+v: self-update not disabled", s)
		}
	}
}

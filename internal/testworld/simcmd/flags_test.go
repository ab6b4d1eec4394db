package simcmd

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/hyperfleet/hyperfleet/internal/testworld/simulator/simclock"
)

type world struct{ Name string }

// TestWorldIsTheDefaultWithoutConfig: without --config the command serves
// its default world, with one the file decoded into an empty world.
func TestWorldIsTheDefaultWithoutConfig(t *testing.T) {
	def := func() world { return world{Name: "default"} }
	load := Decode[world](json.Unmarshal)
	got, err := World(&Flags{}, def, load)
	if err != nil || got.Name != "default" {
		t.Fatalf("World without --config = %+v, %v; want the default", got, err)
	}
	path := filepath.Join(t.TempDir(), "world.json")
	if err := os.WriteFile(path, []byte(`{"Name":"from file"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	got, err = World(&Flags{Config: path}, def, load)
	if err != nil || got.Name != "from file" {
		t.Fatalf("World with --config = %+v, %v; want the file's", got, err)
	}
	if err := os.WriteFile(path, []byte(`not json`), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := World(&Flags{Config: path}, def, load); err == nil || !strings.Contains(err.Error(), path) {
		t.Fatalf("World with a config that does not decode: %v, want an error naming the file", err)
	}
	if _, err := World(&Flags{Config: filepath.Join(t.TempDir(), "missing")}, def, load); err == nil {
		t.Fatal("World with a missing config: no error")
	}
}

// TestClockOptionOnlyWithFakeClock: the simulator gets a fake clock only
// when --fake-clock is set.
func TestClockOptionOnlyWithFakeClock(t *testing.T) {
	with := func(c simclock.Clock) simclock.Clock { return c }
	if got := ClockOption(&Flags{}, with); len(got) != 0 {
		t.Fatalf("ClockOption without --fake-clock = %v, want none", got)
	}
	got := ClockOption(&Flags{FakeClock: true}, with)
	if len(got) != 1 {
		t.Fatalf("ClockOption with --fake-clock = %v, want one option", got)
	}
	if _, ok := got[0].(*simclock.FakeClock); !ok {
		t.Fatalf("ClockOption with --fake-clock gave a %T, want a *simclock.FakeClock", got[0])
	}
}

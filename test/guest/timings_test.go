//go:build guest

package guest

import (
	"encoding/json"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/hyperfleet/hyperfleet/internal/testworld/bench"
)

// TimingsEnv names a directory into which every scenario also writes its
// timings file, as <test name>.json (docs/testing.md, "Real-guest
// timings"): the performance report reads them from there.
const TimingsEnv = "HF_GUEST_TIMINGS_OUT"

// writeTimings writes the scenario's timings to dir/guest-timings.json
// and, with TimingsEnv set, into that directory.
func writeTimings(t *testing.T, tl *timeline, start time.Time, dir string) {
	t.Helper()
	out := bench.GuestTimings{Test: t.Name(), QueuedAt: start.UTC(), Milestones: milestones}
	for name, ms := range tl.vms {
		vm := bench.GuestVM{Name: name, VMID: tl.ids[name], At: map[string]float64{}}
		for m, at := range ms {
			vm.At[m] = at.Sub(start).Round(time.Millisecond).Seconds()
		}
		out.VMs = append(out.VMs, vm)
	}
	sort.Slice(out.VMs, func(i, j int) bool { return out.VMs[i].Name < out.VMs[j].Name })
	data, err := json.MarshalIndent(out, "", "  ")
	if err != nil {
		t.Errorf("timings: %v", err)
		return
	}
	paths := []string{filepath.Join(dir, "guest-timings.json")}
	if d := os.Getenv(TimingsEnv); d != "" {
		paths = append(paths, filepath.Join(d, strings.ReplaceAll(t.Name(), "/", "-")+".json"))
	}
	for _, p := range paths {
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Errorf("timings: %v", err)
			continue
		}
		// Written whole, then renamed into place: make bench reads the
		// directory, and CI runs it while these scenarios run.
		if err := os.WriteFile(p+".tmp", append(data, '\n'), 0o644); err != nil {
			t.Errorf("timings: %v", err)
			continue
		}
		if err := os.Rename(p+".tmp", p); err != nil {
			t.Errorf("timings: %v", err)
		}
	}
}

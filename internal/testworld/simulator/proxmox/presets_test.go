package proxmoxsim

import (
	"strings"
	"testing"
	"time"
)

// TestPresets: the realistic preset carries Proxmox's own periods (README.md,
// "Timing presets"), DefaultConfig uses it, fast keeps every step shorter,
// and an unknown name is refused with the known ones.
func TestPresets(t *testing.T) {
	realistic, err := Preset(PresetRealistic)
	if err != nil {
		t.Fatal(err)
	}
	if realistic.RefreshInterval.D() != 10*time.Second || realistic.StorageLockTimeout.D() != 10*time.Second ||
		realistic.Latency.Boot.D() != 20*time.Second || realistic.Latency.CloneBase.D() != 5*time.Second || realistic.Latency.ClonePerGiB.D() != time.Second ||
		realistic.Latency.SuspendPerGiB.D() != time.Second || realistic.Latency.ResumePerGiB.D() != time.Second {
		t.Errorf("realistic preset = %+v", realistic)
	}
	def := DefaultConfig()
	if def.TimingsOf() != realistic {
		t.Errorf("DefaultConfig timings %+v, want the realistic preset %+v", def.TimingsOf(), realistic)
	}
	fast, err := Preset(PresetFast)
	if err != nil {
		t.Fatal(err)
	}
	if fast.RefreshInterval >= realistic.RefreshInterval || fast.Latency.Boot >= realistic.Latency.Boot || fast.Latency.CloneBase >= realistic.Latency.CloneBase ||
		fast.Latency.Suspend >= realistic.Latency.Suspend || fast.Latency.Resume >= realistic.Latency.Resume || fast.Latency.SuspendPerGiB != 0 {
		t.Errorf("fast preset %+v is not faster than realistic", fast)
	}
	cfg := DefaultConfig()
	cfg.ApplyTimings(fast)
	if cfg.TimingsOf() != fast {
		t.Errorf("ApplyTimings: %+v", cfg.TimingsOf())
	}
	if _, err := Preset("slow"); err == nil || !strings.Contains(err.Error(), "fast, realistic") {
		t.Errorf("unknown preset: %v", err)
	}
}

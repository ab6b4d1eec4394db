package proxmoxsim

import (
	"fmt"
	"slices"
	"strings"
	"time"
)

// Timings is the simulator's whole timing model: how long tasks take, how
// often /cluster/resources is sampled, and how long a clone waits for a
// storage lock. A preset names one (README.md, "Timing presets").
type Timings struct {
	Latency Latency `json:"latency"`
	// RefreshInterval is the /cluster/resources sampling period.
	RefreshInterval Duration `json:"refreshInterval"`
	// StorageLockTimeout is how long a clone waits for a storage lock
	// before it fails with Proxmox's "got timeout".
	StorageLockTimeout Duration `json:"storageLockTimeout"`
}

// Preset names.
const (
	// PresetFast keeps every step but makes it short: what `make dev` and
	// the operator's envtest suites have always used (status sampled every
	// second, clone 1 s, boot 2 s).
	PresetFast = "fast"
	// PresetRealistic is what a small Proxmox VE host does, each number
	// sourced in README.md, "Timing presets": status sampled every 10 s
	// (pvestatd), linked clone 5 s plus 1 s per GiB for full clones, boot
	// to guest agent and to cloud-init running the agent 20 s, suspend to
	// disk and resume 1 s plus 1 s per GiB of memory, storage locks waited
	// for 10 s (cfs_lock).
	PresetRealistic = "realistic"
)

// ms is a duration in milliseconds.
func ms(n int) Duration { return Duration(time.Duration(n) * time.Millisecond) }

var presets = map[string]Timings{
	PresetFast: {
		Latency: Latency{
			CloneBase: ms(1000), Config: ms(20), Resize: ms(50), Start: ms(200), Boot: ms(2000),
			Stop: ms(100), Shutdown: ms(300), Destroy: ms(300), Upload: ms(50),
			// Every step of a suspend and a resume, none of their
			// per-GiB cost.
			Suspend: ms(300), Resume: ms(200),
		},
		RefreshInterval:    ms(1000),
		StorageLockTimeout: ms(10_000),
	},
	PresetRealistic: {
		Latency: Latency{
			// Linked clone: a thin snapshot or qcow2 overlay plus the
			// config write, a few seconds; a full clone copies the disk
			// (qemu-img convert) at ~1 GiB/s, a local NVMe's pace.
			CloneBase: ms(5000), ClonePerGiB: ms(1000),
			Config: ms(200), Resize: ms(1000),
			Start: ms(1000), Boot: ms(20_000), GuestStart: ms(20_000),
			Stop: ms(500), Shutdown: ms(5000),
			Destroy: ms(1000), Upload: ms(200),
			// A suspend to disk writes the guest's memory to the state
			// volume (RunState.pm vm_suspend: savevm-start, polled by
			// query-savevm every second), a resume reads it back (QEMU
			// started with -loadstate): both are the memory size over
			// the storage's throughput, taken as the ~1 GiB/s of a local
			// NVMe (ClonePerGiB's), per GiB of configured memory, an
			// upper bound since zero pages cost next to nothing. The
			// fixed parts: the state volume's allocation and the config
			// writes, then QEMU's quit (suspend); QEMU's start (resume,
			// Start's second).
			Suspend: ms(1000), SuspendPerGiB: ms(1000),
			Resume: ms(1000), ResumePerGiB: ms(1000),
		},
		// pvestatd's update loop ($updatetime = 10).
		RefreshInterval: ms(10_000),
		// cfs_lock's default acquire timeout ($timeout = 10).
		StorageLockTimeout: ms(10_000),
	},
}

// PresetNames are the known presets, sorted.
func PresetNames() []string {
	names := make([]string, 0, len(presets))
	for n := range presets {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// Preset returns the named timing model; the error lists the known names.
func Preset(name string) (Timings, error) {
	t, ok := presets[name]
	if !ok {
		return Timings{}, fmt.Errorf("unknown timing preset %q: use one of %s", name, strings.Join(PresetNames(), ", "))
	}
	return t, nil
}

// TimingsOf returns the configuration's timing model.
func (c *Config) TimingsOf() Timings {
	return Timings{Latency: c.Latency, RefreshInterval: c.RefreshInterval, StorageLockTimeout: c.StorageLockTimeout}
}

// ApplyTimings replaces the configuration's latency, status refresh period
// and storage lock wait with t's.
func (c *Config) ApplyTimings(t Timings) {
	c.Latency, c.RefreshInterval, c.StorageLockTimeout = t.Latency, t.RefreshInterval, t.StorageLockTimeout
}

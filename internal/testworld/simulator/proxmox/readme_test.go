package proxmoxsim

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestReadmeConfigLoads keeps the README's annotated configuration file
// true: it must load with LoadConfig's strict parsing and validation.
func TestReadmeConfigLoads(t *testing.T) {
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(readme), "```yaml\n")
	if !ok {
		t.Fatal("README.md has no ```yaml block")
	}
	example, _, ok := strings.Cut(rest, "```")
	if !ok {
		t.Fatal("README.md: the ```yaml block is not closed")
	}
	path := filepath.Join(t.TempDir(), "sim.yaml")
	if err := os.WriteFile(path, []byte(example), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := LoadConfig(path)
	if err != nil {
		t.Fatalf("the README's example configuration does not load: %v", err)
	}
	if len(cfg.Nodes) == 0 || len(cfg.Guest.Command) == 0 || !cfg.Guest.WriteFiles {
		t.Errorf("the example was not read as written: nodes %v, guest %+v", cfg.Nodes, cfg.Guest)
	}
	// The real guest example (the second block).
	_, rest, _ = strings.Cut(rest, "```yaml\n")
	example, _, ok = strings.Cut(rest, "```")
	if !ok {
		t.Fatal("README.md has no second ```yaml block (real guests)")
	}
	if err := os.WriteFile(path, []byte(example), 0o600); err != nil {
		t.Fatal(err)
	}
	if cfg, err = LoadConfig(path); err != nil {
		t.Fatalf("the README's real guest configuration does not load: %v", err)
	}
	if img := cfg.Templates[0].GuestImage; img == nil || img.Format != "raw" || cfg.Guest.QEMU.Accel != "tcg" {
		t.Errorf("the real guest example was not read as written: %+v, %+v", img, cfg.Guest.QEMU)
	}
}

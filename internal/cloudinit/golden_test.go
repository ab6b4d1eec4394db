package cloudinit

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

var update = flag.Bool("update", false, "rewrite the golden files under testdata/")

// goldenFiles maps a seed file name to its Output field.
var goldenFiles = []struct {
	name string
	get  func(*Output) []byte
}{
	{"user-data", func(o *Output) []byte { return o.UserData }},
	{"meta-data", func(o *Output) []byte { return o.MetaData }},
	{"network-config", func(o *Output) []byte { return o.NetworkConfig }},
}

func TestRenderGolden(t *testing.T) {
	cases := goldenCases()
	var names []string
	for _, tc := range cases {
		names = append(names, tc.name)
		t.Run(tc.name, func(t *testing.T) {
			out, err := Render(tc.in)
			if err != nil {
				t.Fatalf("Render: %v", err)
			}
			dir := filepath.Join("testdata", tc.name)
			for _, f := range goldenFiles {
				got := f.get(out)
				path := filepath.Join(dir, f.name)
				if *update {
					if err := os.MkdirAll(dir, 0o755); err != nil {
						t.Fatal(err)
					}
					if err := os.WriteFile(path, got, 0o644); err != nil {
						t.Fatal(err)
					}
					continue
				}
				want, err := os.ReadFile(path)
				if err != nil {
					t.Fatalf("%v (run go test ./internal/cloudinit/ -run TestRenderGolden -update to create it)", err)
				}
				if !bytes.Equal(got, want) {
					t.Errorf("%s differs from %s (rerun with -update if the change is intended):\n--- got\n%s\n--- want\n%s", f.name, path, got, want)
				}
			}
			// Rendering is deterministic.
			again, err := Render(tc.in)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(again.UserData, out.UserData) || !bytes.Equal(again.NetworkConfig, out.NetworkConfig) || !bytes.Equal(again.MetaData, out.MetaData) {
				t.Error("a second Render of the same input gave different bytes")
			}
		})
	}
	// No stale golden directories: every directory under testdata/ is a case
	// (the cloud-init validation test walks the directories).
	entries, err := os.ReadDir("testdata")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if e.IsDir() && !slices.Contains(names, e.Name()) && !*update {
			t.Errorf("testdata/%s is not a golden case any more; delete it", e.Name())
		}
	}
}

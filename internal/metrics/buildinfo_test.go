package metrics

import (
	"runtime"
	"runtime/debug"
	"slices"
	"testing"

	crmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
)

func TestBuildLabels(t *testing.T) {
	settings := func(kv ...string) []debug.BuildSetting {
		var out []debug.BuildSetting
		for i := 0; i+1 < len(kv); i += 2 {
			out = append(out, debug.BuildSetting{Key: kv[i], Value: kv[i+1]})
		}
		return out
	}
	for _, tc := range []struct {
		name string
		info *debug.BuildInfo
		want []string
	}{
		{"no build information", nil, []string{"v1", "unknown", runtime.Version()}},
		{"no VCS stamp", &debug.BuildInfo{GoVersion: "go1.99"}, []string{"v1", "unknown", "go1.99"}},
		{"clean", &debug.BuildInfo{GoVersion: "go1.99", Settings: settings("vcs.revision", "abc123", "vcs.modified", "false")},
			[]string{"v1", "abc123", "go1.99"}},
		{"dirty", &debug.BuildInfo{GoVersion: "go1.99", Settings: settings("vcs.modified", "true", "vcs.revision", "abc123")},
			[]string{"v1", "abc123-dirty", "go1.99"}},
		{"modified without revision", &debug.BuildInfo{Settings: settings("vcs.modified", "true")},
			[]string{"v1", "unknown", runtime.Version()}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := buildLabels("v1", tc.info); !slices.Equal(got, tc.want) {
				t.Errorf("buildLabels = %q, want %q", got, tc.want)
			}
		})
	}
}

// TestBuildInfoRegistered: the manager's registry serves exactly one
// hyperfleet_build_info series, of value 1, with this build's labels.
func TestBuildInfoRegistered(t *testing.T) {
	families, err := crmetrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != "hyperfleet_build_info" {
			continue
		}
		if len(f.GetMetric()) != 1 {
			t.Fatalf("%d hyperfleet_build_info series, want 1", len(f.GetMetric()))
		}
		m := f.GetMetric()[0]
		labels := map[string]string{}
		for _, l := range m.GetLabel() {
			labels[l.GetName()] = l.GetValue()
		}
		info, _ := debug.ReadBuildInfo()
		want := buildLabels(Version, info)
		if labels["version"] != "dev" || labels["version"] != want[0] || labels["revision"] != want[1] || labels["goversion"] != want[2] {
			t.Errorf("labels %v, want version dev, revision %s, goversion %s", labels, want[1], want[2])
		}
		if v := m.GetGauge().GetValue(); v != 1 {
			t.Errorf("value %v, want 1", v)
		}
		return
	}
	t.Fatal("hyperfleet_build_info is not registered on controller-runtime's registry")
}

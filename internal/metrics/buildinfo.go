package metrics

import (
	"runtime"
	"runtime/debug"
)

// Version is HyperFleet's release. Builds set it with
//
//	go build -ldflags "-X github.com/hyperfleet/hyperfleet/internal/metrics.Version=v1.2.3"
//
// and leave it "dev" otherwise.
var Version = "dev"

// BuildInfo is always 1; its labels say which build is running, so that
// dashboards can show it and alerts can tell a HyperFleet target from
// others (and notice when none answers).
var BuildInfo = NewGaugeVec("build_info",
	"Always 1; labelled with the running build's version (-ldflags -X), VCS revision and Go version.",
	"version", "revision", "goversion")

func init() {
	BuildInfo.WithLabelValues(Build()...).Set(1)
}

// Build returns the running build's version, VCS revision and Go version:
// BuildInfo's labels, which `hyperfleet version` prints.
func Build() []string {
	info, ok := debug.ReadBuildInfo()
	if !ok {
		info = nil
	}
	return buildLabels(Version, info)
}

// buildLabels returns BuildInfo's label values for version and the
// binary's build information (nil when the binary carries none): the
// revision is the VCS commit the go command stamped ("unknown" without
// one, as with -buildvcs=false or go run), suffixed "-dirty" when the
// work tree had changes.
func buildLabels(version string, info *debug.BuildInfo) []string {
	revision, dirty, goVersion := "unknown", false, runtime.Version()
	if info != nil {
		if info.GoVersion != "" {
			goVersion = info.GoVersion
		}
		for _, s := range info.Settings {
			switch s.Key {
			case "vcs.revision":
				revision = s.Value
			case "vcs.modified":
				dirty = s.Value == "true"
			}
		}
	}
	if dirty && revision != "unknown" {
		revision += "-dirty"
	}
	return []string{version, revision, goVersion}
}

// Package github is the GitHub Actions implementation of package workload:
// the Backend (backend.go: what a template, a pool and a claim say to
// GitHub, and the providers of a template's credentials), runner credentials
// (JIT configurations and registration tokens) through go-github with a
// personal access token or a GitHub App installation (ghinstallation),
// runner deregistration, queued-job resync, run cancellation, verified
// workflow_job webhooks, rate limits and the metrics of its API calls.
package github

import "github.com/hyperfleet/hyperfleet/pkg/workload"

// DefaultLabels are the labels GitHub gives a self-hosted runner for its
// operating system and architecture (Linux, X64 and so on), from the
// runner package names HyperFleet uses (linux|win|osx, x64|arm64|arm).
// A JIT runner gets exactly the labels it is created with, so HyperFleet
// adds these itself, as config.sh does for a registered runner.
func DefaultLabels(os, arch string) []string {
	var out []string
	for _, l := range []string{osLabels[os], archLabels[arch]} {
		if l != "" {
			out = append(out, l)
		}
	}
	return out
}

// osLabels and archLabels are DefaultLabels' labels by runner package
// name; the empty name is the default, linux and x64.
var (
	osLabels   = map[string]string{"linux": "Linux", "": "Linux", "win": "Windows", "osx": "macOS"}
	archLabels = map[string]string{"x64": "X64", "": "X64", "arm64": "ARM64", "arm": "ARM"}
)

// RunnerLabels is the full label set of a runner of a pool: self-hosted,
// the OS and architecture labels, hyperfleet, then the pool's labels.
func RunnerLabels(os, arch string, labels []string) []string {
	return workload.RunnerLabels(DefaultLabels(os, arch), labels)
}

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
	switch os {
	case "linux", "":
		out = append(out, "Linux")
	case "win":
		out = append(out, "Windows")
	case "osx":
		out = append(out, "macOS")
	}
	switch arch {
	case "x64", "":
		out = append(out, "X64")
	case "arm64":
		out = append(out, "ARM64")
	case "arm":
		out = append(out, "ARM")
	}
	return out
}

// RunnerLabels is the full label set of a runner of a pool: self-hosted,
// the OS and architecture labels, hyperfleet, then the pool's labels.
func RunnerLabels(os, arch string, labels []string) []string {
	return workload.RunnerLabels(DefaultLabels(os, arch), labels)
}

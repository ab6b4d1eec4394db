package github

import (
	"context"
	"fmt"
	"regexp"
	"strings"
	"time"

	gh "github.com/google/go-github/v88/github"

	"github.com/hyperfleet/hyperfleet/pkg/workload"
)

// The repository GitHub publishes the Actions runner in, on github.com and
// on GitHub Enterprise Server instances that mirror it.
const (
	runnerReleaseOwner = "actions"
	runnerReleaseRepo  = "runner"
)

// How long a resolved release is reused: a pinned version never changes;
// "latest" is looked up again after latestRunnerTTL, so a new runner
// release reaches new VMs within that time without an API call per VM.
const latestRunnerTTL = time.Hour

var _ workload.RunnerReleases = (*Provider)(nil)

// sha256Hex is a checksum as GitHub prints it.
var sha256Hex = regexp.MustCompile(`^[a-f0-9]{64}$`)

type cachedPackage struct {
	pkg     workload.RunnerPackage
	fetched time.Time
}

// RunnerPackage implements workload.RunnerReleases from the releases of
// actions/runner under the provider's API base URL (github.com, or a GitHub
// Enterprise Server that mirrors the repository). The asset is
// actions-runner-{os}-{arch}-{version}.tar.gz (.zip for Windows); its
// checksum is the asset's digest, else the release notes' SHA block for
// the platform, which actions/runner has published with every release.
func (p *Provider) RunnerPackage(ctx context.Context, version, os, arch string) (workload.RunnerPackage, error) {
	key := version + "/" + os + "/" + arch
	p.mu.Lock()
	c, ok := p.runnerPackages[key]
	p.mu.Unlock()
	if ok && (version != workload.LatestRunnerVersion || p.clock.Since(c.fetched) < latestRunnerTTL) {
		return c.pkg, nil
	}
	var (
		rel  *gh.RepositoryRelease
		resp *gh.Response
		err  error
	)
	if version == workload.LatestRunnerVersion {
		rel, resp, err = p.client.Repositories.GetLatestRelease(ctx, runnerReleaseOwner, runnerReleaseRepo)
	} else {
		rel, resp, err = p.client.Repositories.GetReleaseByTag(ctx, runnerReleaseOwner, runnerReleaseRepo, "v"+version)
	}
	if err != nil {
		return workload.RunnerPackage{}, p.mapErr(fmt.Sprintf("read release %s of %s/%s", version, runnerReleaseOwner, runnerReleaseRepo), resp, err)
	}
	pkg, err := runnerPackageOf(rel, os, arch)
	if err != nil {
		return workload.RunnerPackage{}, err
	}
	p.mu.Lock()
	p.runnerPackages[key] = cachedPackage{pkg: pkg, fetched: p.clock.Now()}
	p.mu.Unlock()
	return pkg, nil
}

// runnerPackageOf picks the platform's asset of a runner release and its
// checksum.
func runnerPackageOf(rel *gh.RepositoryRelease, os, arch string) (workload.RunnerPackage, error) {
	version := strings.TrimPrefix(rel.GetTagName(), "v")
	platform := os + "-" + arch
	ext := ".tar.gz"
	if os == "win" {
		ext = ".zip"
	}
	names := []string{"actions-runner-" + platform + "-" + version + ext, "actions-runner-" + platform + "-" + version + ".tar.gz"}
	for _, a := range rel.Assets {
		if a.GetName() != names[0] && a.GetName() != names[1] {
			continue
		}
		sum := strings.TrimPrefix(a.GetDigest(), "sha256:")
		if sum == "" || sum == a.GetDigest() {
			sum = checksumFromNotes(rel.GetBody(), platform)
		}
		if !sha256Hex.MatchString(sum) {
			return workload.RunnerPackage{}, fmt.Errorf("runner release %s publishes no SHA-256 for %s (asset digest %q); pin runner.downloadURL and runner.downloadSHA256 instead: %w",
				rel.GetTagName(), a.GetName(), a.GetDigest(), workload.ErrInvalidRequest)
		}
		url := a.GetBrowserDownloadURL()
		if !strings.HasPrefix(url, "https://") {
			return workload.RunnerPackage{}, fmt.Errorf("runner release %s: asset %s is served from %q, not https: %w", rel.GetTagName(), a.GetName(), url, workload.ErrInvalidRequest)
		}
		return workload.RunnerPackage{Version: version, URL: url, SHA256: sum}, nil
	}
	return workload.RunnerPackage{}, fmt.Errorf("runner release %s has no package for %s (looked for %s): %w", rel.GetTagName(), platform, names[0], workload.ErrNotFound)
}

// checksumFromNotes reads "<!-- BEGIN SHA {platform} -->hex<!-- END SHA
// {platform} -->" from a runner release's notes.
func checksumFromNotes(body, platform string) string {
	begin, end := "<!-- BEGIN SHA "+platform+" -->", "<!-- END SHA "+platform+" -->"
	i := strings.Index(body, begin)
	if i < 0 {
		return ""
	}
	rest := body[i+len(begin):]
	j := strings.Index(rest, end)
	if j < 0 {
		return ""
	}
	return strings.ToLower(strings.TrimSpace(rest[:j]))
}

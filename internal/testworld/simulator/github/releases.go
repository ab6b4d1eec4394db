package githubsim

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"
	"time"
)

// The runner's releases, as github.com publishes them in actions/runner:
// the latest release is the simulator's RunnerVersion, and one release
// before it exists so that a pinned older version can be resolved. Each
// release carries one asset per platform, named
// actions-runner-{os}-{arch}-{version}.tar.gz, with the asset's SHA-256 in
// its digest field and, like the real release notes, in the body between
// <!-- BEGIN SHA {os}-{arch} --> and <!-- END SHA {os}-{arch} --> markers.
const (
	runnerReleaseOwner  = "actions"
	runnerReleaseRepo   = "runner"
	runnerReleaseRepoID = 95548329
)

// runnerPlatforms are the platforms a release has assets for.
var runnerPlatforms = []string{"linux-x64", "linux-arm64", "linux-arm", "osx-x64", "osx-arm64", "win-x64", "win-arm64"}

// runnerReleaseVersions lists the versions released, newest first.
func (s *Simulator) runnerReleaseVersions() []string {
	latest := s.cfg.RunnerVersion
	versions := []string{latest}
	var major, minor, patch int
	if _, err := fmt.Sscanf(latest, "%d.%d.%d", &major, &minor, &patch); err == nil && minor > 0 {
		versions = append(versions, fmt.Sprintf("%d.%d.%d", major, minor-1, 0))
	}
	return versions
}

func (s *Simulator) handleLatestRelease(q *request) (int, any, error) {
	if !isRunnerRepo(q) {
		return 0, nil, errNotFound()
	}
	rel, err := s.runnerReleaseJSON(q, s.runnerReleaseVersions()[0], 0)
	return 200, rel, err
}

func (s *Simulator) handleReleaseByTag(q *request) (int, any, error) {
	if !isRunnerRepo(q) {
		return 0, nil, errNotFound()
	}
	for i, v := range s.runnerReleaseVersions() {
		if q.vars["tag"] == "v"+v {
			rel, err := s.runnerReleaseJSON(q, v, i)
			return 200, rel, err
		}
	}
	return 0, nil, errNotFound()
}

func isRunnerRepo(q *request) bool {
	return strings.EqualFold(q.vars["owner"], runnerReleaseOwner) && strings.EqualFold(q.vars["repo"], runnerReleaseRepo)
}

// runnerReleaseJSON is the release object of version (age: 0 for the
// newest, 1 for the one before).
func (s *Simulator) runnerReleaseJSON(q *request, version string, age int) (map[string]any, error) {
	pkg, err := RunnerPackage(s.caPEM) // handlers run under s.mu
	if err != nil {
		return nil, fmt.Errorf("build the runner package: %w", err)
	}
	sum := sha256.Sum256(pkg)
	digest := hex.EncodeToString(sum[:])
	api, html := s.apiBase(), s.htmlBase()
	releaseID := int64(200_000_000 + 1000*(len(s.runnerReleaseVersions())-age))
	published := time.Date(2025, 10, 1, 12, 0, 0, 0, time.UTC).AddDate(0, 0, -30*age).Format(time.RFC3339)
	repoURL := api + "/repos/" + runnerReleaseOwner + "/" + runnerReleaseRepo
	author := s.accountJSON(&owner{login: "github-actions[bot]", id: 41898282})
	author["type"] = "Bot"
	var body strings.Builder
	fmt.Fprintf(&body, "## What's Changed\n\nRunner %s.\n\n## SHA-256 Checksums\n\n", version)
	assets := make([]map[string]any, 0, len(runnerPlatforms))
	for i, platform := range runnerPlatforms {
		// github.com publishes .zip for Windows; the simulator serves one
		// tarball for every platform and names it as what it is.
		name := fmt.Sprintf("actions-runner-%s-%s.tar.gz", platform, version)
		fmt.Fprintf(&body, "- %s <!-- BEGIN SHA %s -->%s<!-- END SHA %s -->\n", name, platform, digest, platform)
		id := releaseID*100 + int64(i)
		assets = append(assets, map[string]any{
			"url":                  fmt.Sprintf("%s/releases/assets/%d", repoURL, id),
			"browser_download_url": q.base + runnerPkgPrefix + name,
			"id":                   id,
			"node_id":              nodeID("ReleaseAsset", id),
			"name":                 name,
			"label":                "",
			"state":                "uploaded",
			"content_type":         "application/gzip",
			"size":                 len(pkg),
			"digest":               "sha256:" + digest,
			"download_count":       1000 - 100*age,
			"created_at":           published,
			"updated_at":           published,
			"uploader":             author,
		})
	}
	tag := "v" + version
	return map[string]any{
		"url":              fmt.Sprintf("%s/releases/%d", repoURL, releaseID),
		"html_url":         html + "/" + runnerReleaseOwner + "/" + runnerReleaseRepo + "/releases/tag/" + tag,
		"assets_url":       fmt.Sprintf("%s/releases/%d/assets", repoURL, releaseID),
		"upload_url":       fmt.Sprintf("https://uploads.github.com/repos/%s/%s/releases/%d/assets{?name,label}", runnerReleaseOwner, runnerReleaseRepo, releaseID),
		"tarball_url":      repoURL + "/tarball/" + tag,
		"zipball_url":      repoURL + "/zipball/" + tag,
		"id":               releaseID,
		"node_id":          nodeID("Release", releaseID),
		"tag_name":         tag,
		"target_commitish": "main",
		"name":             tag,
		"body":             body.String(),
		"draft":            false,
		"prerelease":       false,
		"immutable":        false,
		"created_at":       published,
		"published_at":     published,
		"updated_at":       published,
		"author":           author,
		"assets":           assets,
	}, nil
}

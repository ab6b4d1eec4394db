package github

import (
	"errors"
	"strings"
	"testing"

	gh "github.com/google/go-github/v88/github"

	"github.com/hyperfleet/hyperfleet/pkg/workload"
)

// TestRunnerPackageOf: the asset's digest is the checksum; without one the
// release notes' SHA block for the platform is; with neither, or a plain
// http download, the release is refused rather than run unchecked.
func TestRunnerPackageOf(t *testing.T) {
	sum := strings.Repeat("ab", 32)
	other := strings.Repeat("cd", 32)
	asset := func(name, url, digest string) *gh.ReleaseAsset {
		return &gh.ReleaseAsset{Name: gh.Ptr(name), BrowserDownloadURL: gh.Ptr(url), Digest: gh.Ptr(digest)}
	}
	notes := "<!-- BEGIN SHA linux-arm64 -->" + other + "<!-- END SHA linux-arm64 -->\n<!-- BEGIN SHA linux-x64 --> " + strings.ToUpper(sum) + " <!-- END SHA linux-x64 -->"
	for _, tc := range []struct {
		name  string
		rel   *gh.RepositoryRelease
		os    string
		want  string
		isErr error
	}{
		{name: "digest", rel: &gh.RepositoryRelease{TagName: gh.Ptr("v2.1.0"), Assets: []*gh.ReleaseAsset{asset("actions-runner-linux-x64-2.1.0.tar.gz", "https://x/p.tgz", "sha256:"+sum)}}, os: "linux", want: sum},
		{name: "notes", rel: &gh.RepositoryRelease{TagName: gh.Ptr("v2.1.0"), Body: gh.Ptr(notes), Assets: []*gh.ReleaseAsset{asset("actions-runner-linux-x64-2.1.0.tar.gz", "https://x/p.tgz", "")}}, os: "linux", want: sum},
		{name: "windows zip", rel: &gh.RepositoryRelease{TagName: gh.Ptr("v2.1.0"), Assets: []*gh.ReleaseAsset{asset("actions-runner-win-x64-2.1.0.zip", "https://x/p.zip", "sha256:"+sum)}}, os: "win", want: sum},
		{name: "no checksum", rel: &gh.RepositoryRelease{TagName: gh.Ptr("v2.1.0"), Body: gh.Ptr("no sums"), Assets: []*gh.ReleaseAsset{asset("actions-runner-linux-x64-2.1.0.tar.gz", "https://x/p.tgz", "")}}, os: "linux", isErr: workload.ErrInvalidRequest},
		{name: "plain http", rel: &gh.RepositoryRelease{TagName: gh.Ptr("v2.1.0"), Assets: []*gh.ReleaseAsset{asset("actions-runner-linux-x64-2.1.0.tar.gz", "http://x/p.tgz", "sha256:"+sum)}}, os: "linux", isErr: workload.ErrInvalidRequest},
		{name: "no asset", rel: &gh.RepositoryRelease{TagName: gh.Ptr("v2.1.0"), Assets: []*gh.ReleaseAsset{asset("actions-runner-osx-x64-2.1.0.tar.gz", "https://x/p.tgz", "sha256:"+sum)}}, os: "linux", isErr: workload.ErrNotFound},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pkg, err := runnerPackageOf(tc.rel, tc.os, "x64")
			if tc.isErr != nil {
				if !errors.Is(err, tc.isErr) {
					t.Fatalf("got %+v, %v; want %v", pkg, err, tc.isErr)
				}
				return
			}
			if err != nil || pkg.SHA256 != tc.want || pkg.Version != "2.1.0" {
				t.Fatalf("got %+v, %v; want checksum %s", pkg, err, tc.want)
			}
		})
	}
}

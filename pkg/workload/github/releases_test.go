package github_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/hyperfleet/hyperfleet/internal/testworld/simulator/github/githubsimtest"
	"github.com/hyperfleet/hyperfleet/pkg/workload"
)

// TestRunnerPackageResolvesReleases: "latest" and a pinned version resolve
// from actions/runner's releases under the provider's API base URL (the
// simulator stands at a GitHub Enterprise Server's /api/v3); the package
// downloaded from the URL has exactly the published checksum; a resolved
// release is reused instead of asked for again; an unknown version is
// ErrNotFound.
func TestRunnerPackageResolvesReleases(t *testing.T) {
	gs := githubsimtest.Start(t, simConfig())
	count := &counting{next: gs.Transport}
	p := newProvider(t, gs.Sim, gs.URL, count, nil)
	ctx := context.Background()

	latest, err := p.RunnerPackage(ctx, workload.LatestRunnerVersion, "linux", "x64")
	if err != nil {
		t.Fatal(err)
	}
	if latest.Version != "2.329.0" || !strings.HasSuffix(latest.URL, "/actions-runner-linux-x64-2.329.0.tar.gz") || !strings.HasPrefix(latest.URL, "https://") {
		t.Fatalf("latest = %+v", latest)
	}
	resp, err := (&http.Client{Transport: gs.Transport}).Get(latest.URL)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if sum := sha256.Sum256(body); resp.StatusCode != 200 || hex.EncodeToString(sum[:]) != latest.SHA256 {
		t.Fatalf("download %d with SHA-256 %x, release says %s", resp.StatusCode, sum, latest.SHA256)
	}

	pinned, err := p.RunnerPackage(ctx, "2.328.0", "linux", "arm64")
	if err != nil {
		t.Fatal(err)
	}
	if pinned.Version != "2.328.0" || !strings.HasSuffix(pinned.URL, "/actions-runner-linux-arm64-2.328.0.tar.gz") {
		t.Fatalf("pinned = %+v", pinned)
	}

	before := count.total.Load()
	for range 3 {
		if _, err := p.RunnerPackage(ctx, workload.LatestRunnerVersion, "linux", "x64"); err != nil {
			t.Fatal(err)
		}
		if _, err := p.RunnerPackage(ctx, "2.328.0", "linux", "arm64"); err != nil {
			t.Fatal(err)
		}
	}
	if n := count.total.Load() - before; n != 0 {
		t.Fatalf("%d API calls for releases already resolved, want 0", n)
	}
	if _, err := p.RunnerPackage(ctx, "1.0.0", "linux", "x64"); !errors.Is(err, workload.ErrNotFound) {
		t.Fatalf("unknown version: %v, want ErrNotFound", err)
	}
}

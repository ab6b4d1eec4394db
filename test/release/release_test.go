//go:build release

// Package release runs make release (hack/release/release.sh) with a
// signing key the test generates and checks every artifact as a platform
// team would before trusting it: the image index names linux/amd64 and
// linux/arm64 and each holds the operator built for its architecture; each
// SBOM names the Go modules the binaries were built from; cosign verifies
// the image and every file, and refuses them under another key or once
// tampered with; the chart pins the image to the built digest; the binaries
// report the git describe version. Run it with make test-release.
package release

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"debug/elf"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

type descriptor struct {
	MediaType   string            `json:"mediaType"`
	Digest      string            `json:"digest"`
	Annotations map[string]string `json:"annotations"`
	Platform    *struct {
		OS           string `json:"os"`
		Architecture string `json:"architecture"`
	} `json:"platform"`
}

type index struct {
	MediaType string       `json:"mediaType"`
	Manifests []descriptor `json:"manifests"`
}

type manifest struct {
	Config descriptor   `json:"config"`
	Layers []descriptor `json:"layers"`
}

// release is one make release run, shared by the subtests.
type release struct {
	dist, tools, version string
	digest               string
}

func TestRelease(t *testing.T) {
	root := repoRoot(t)
	dist := filepath.Join(t.TempDir(), "dist")
	keys := t.TempDir()

	tools := strings.TrimSpace(run(t, root, nil, filepath.Join(root, "hack/release/build.sh")))
	cosign := filepath.Join(tools, "cosign")
	// The test's own key pair, password protected as a release key would be.
	env := []string{"COSIGN_PASSWORD=test-password"}
	run(t, keys, env, cosign, "generate-key-pair")

	version := gitVersion(t, root)
	out := run(t, root, append(env, "DIST="+dist, "COSIGN_KEY="+filepath.Join(keys, "cosign.key")), "make", "--no-print-directory", "release")
	t.Logf("make release:\n%s", out)

	r := release{dist: dist, tools: tools, version: version}
	r.digest = strings.TrimSpace(readFile(t, filepath.Join(dist, "image.digest")))
	if !strings.HasPrefix(r.digest, "sha256:") {
		t.Fatalf("image.digest = %q, want sha256:...", r.digest)
	}

	t.Run("the image index names both architectures, each with its own operator", func(t *testing.T) { r.checkImage(t) })
	t.Run("each SBOM names the Go modules", func(t *testing.T) { r.checkSBOMs(t) })
	t.Run("cosign verifies the image and every file under the test's key only", func(t *testing.T) { r.checkSignatures(t, keys) })
	t.Run("the chart runs the built digest", func(t *testing.T) { r.checkChart(t) })
	t.Run("the binaries report the git describe version", func(t *testing.T) { r.checkVersions(t) })
}

// checkImage reads the OCI layout: the signed index cosign's layout marks,
// its two platform manifests, and in each image's layers the operator's
// ELF binary for that architecture and the license.
func (r release) checkImage(t *testing.T) {
	layout := filepath.Join(r.dist, "image")
	var top index
	unmarshal(t, []byte(readFile(t, filepath.Join(layout, "index.json"))), &top)
	var idx *descriptor
	for i, m := range top.Manifests {
		if m.Annotations["kind"] == "dev.cosignproject.cosign/imageIndex" {
			idx = &top.Manifests[i]
		}
	}
	if idx == nil || idx.Digest != r.digest {
		t.Fatalf("index.json has no signed image index with digest %s: %+v", r.digest, top.Manifests)
	}
	var images index
	unmarshal(t, blob(t, layout, idx.Digest), &images)
	machines := map[string]elf.Machine{"amd64": elf.EM_X86_64, "arm64": elf.EM_AARCH64}
	seen := map[string]bool{}
	for _, m := range images.Manifests {
		if m.Platform == nil || m.Platform.OS != "linux" {
			t.Errorf("manifest %s: platform %+v, want linux", m.Digest, m.Platform)
			continue
		}
		arch := m.Platform.Architecture
		want, ok := machines[arch]
		if !ok {
			t.Errorf("manifest %s for unexpected architecture %q", m.Digest, arch)
			continue
		}
		seen[arch] = true
		var man manifest
		unmarshal(t, blob(t, layout, m.Digest), &man)
		var config struct {
			Architecture string `json:"architecture"`
			OS           string `json:"os"`
			Config       struct {
				Entrypoint []string `json:"Entrypoint"`
				User       string   `json:"User"`
			} `json:"config"`
		}
		unmarshal(t, blob(t, layout, man.Config.Digest), &config)
		if config.Architecture != arch || config.OS != "linux" {
			t.Errorf("%s image config says %s/%s", arch, config.OS, config.Architecture)
		}
		if strings.Join(config.Config.Entrypoint, " ") != "/hyperfleet" || config.Config.User != "65532:65532" {
			t.Errorf("%s image: entrypoint %v user %q, want /hyperfleet as 65532:65532", arch, config.Config.Entrypoint, config.Config.User)
		}
		files := layerFiles(t, layout, man.Layers)
		bin, ok := files["hyperfleet"]
		if !ok {
			t.Fatalf("%s image has no /hyperfleet", arch)
		}
		f, err := elf.NewFile(bytes.NewReader(bin))
		if err != nil {
			t.Fatalf("%s image's /hyperfleet: %v", arch, err)
		}
		if f.Machine != want {
			t.Errorf("%s image's /hyperfleet is built for %v, want %v", arch, f.Machine, want)
		}
		for _, name := range []string{"licenses/LICENSE", "licenses/NOTICE", "usr/share/hyperfleet/agent/hyperfleet-agent-linux-amd64", "usr/share/hyperfleet/agent/hyperfleet-agent-linux-arm64"} {
			if _, ok := files[name]; !ok {
				t.Errorf("%s image has no /%s", arch, name)
			}
		}
	}
	if !seen["amd64"] || !seen["arm64"] {
		t.Errorf("the index names %v, want amd64 and arm64", seen)
	}
}

// checkSBOMs reads each SPDX document: it describes the published image
// and lists the Go modules the operator is built from, with versions.
func (r release) checkSBOMs(t *testing.T) {
	for _, arch := range []string{"amd64", "arm64"} {
		var doc struct {
			SPDXVersion string `json:"spdxVersion"`
			Name        string `json:"name"`
			Packages    []struct {
				Name        string `json:"name"`
				VersionInfo string `json:"versionInfo"`
			} `json:"packages"`
		}
		unmarshal(t, []byte(readFile(t, filepath.Join(r.dist, "sbom", "hyperfleet-linux-"+arch+".spdx.json"))), &doc)
		if !strings.HasPrefix(doc.SPDXVersion, "SPDX-2.") || doc.Name != "ghcr.io/hyperfleet/hyperfleet" {
			t.Errorf("%s SBOM: spdxVersion %q name %q", arch, doc.SPDXVersion, doc.Name)
		}
		versions := map[string]string{}
		for _, p := range doc.Packages {
			versions[p.Name] = p.VersionInfo
		}
		for _, mod := range []string{"sigs.k8s.io/controller-runtime", "k8s.io/client-go", "github.com/prometheus/client_golang", "github.com/google/go-github/v88"} {
			if v, ok := versions[mod]; !ok || !strings.HasPrefix(v, "v") {
				t.Errorf("%s SBOM: Go module %s missing or without a version (%q); %d packages", arch, mod, v, len(doc.Packages))
			}
		}
		if _, ok := versions["stdlib"]; !ok {
			t.Errorf("%s SBOM does not name the Go standard library", arch)
		}
	}
}

// checkSignatures runs cosign verify on the image and verify-blob on every
// file with the published key, then shows that each check can fail: the
// image and a file under another key, a changed file under the right one.
func (r release) checkSignatures(t *testing.T, keys string) {
	cosign := filepath.Join(r.tools, "cosign")
	pub := filepath.Join(r.dist, "cosign.pub")
	if readFile(t, pub) != readFile(t, filepath.Join(keys, "cosign.pub")) {
		t.Fatal("dist/cosign.pub is not the test's public key")
	}
	verifyImage := func(key string) error {
		return try(r.dist, nil, cosign, "verify", "--local-image", filepath.Join(r.dist, "image"), "--key", key, "--insecure-ignore-tlog")
	}
	if err := verifyImage(pub); err != nil {
		t.Errorf("cosign verify of the image: %v", err)
	}
	sums := strings.Split(strings.TrimSpace(readFile(t, filepath.Join(r.dist, "SHA256SUMS"))), "\n")
	files := []string{"SHA256SUMS"}
	for _, line := range sums {
		fields := strings.Fields(line)
		files = append(files, fields[1])
		sum := sha256.Sum256([]byte(readFile(t, filepath.Join(r.dist, fields[1]))))
		if hex.EncodeToString(sum[:]) != fields[0] {
			t.Errorf("SHA256SUMS: %s does not match", fields[1])
		}
	}
	for _, want := range []string{"bin/hyperfleet-linux-amd64", "bin/hyperfleet-linux-arm64", "bin/hyperfleet-agent-linux-amd64", "bin/hyperfleet-agent-linux-arm64", "bin/hyperfleet-agent-windows-amd64.exe", "sbom/hyperfleet-linux-amd64.spdx.json", "sbom/hyperfleet-linux-arm64.spdx.json"} {
		if !contains(files, want) {
			t.Errorf("SHA256SUMS does not list %s", want)
		}
	}
	verifyBlob := func(key, file string) error {
		return try(r.dist, nil, cosign, "verify-blob", "--key", key, "--insecure-ignore-tlog", "--signature", file+".sig", file)
	}
	for _, f := range files {
		if err := verifyBlob(pub, filepath.Join(r.dist, f)); err != nil {
			t.Errorf("cosign verify-blob %s: %v", f, err)
		}
	}

	// Another key verifies nothing.
	other := t.TempDir()
	run(t, other, []string{"COSIGN_PASSWORD="}, cosign, "generate-key-pair")
	otherPub := filepath.Join(other, "cosign.pub")
	if verifyImage(otherPub) == nil {
		t.Error("cosign verify accepted the image under another key")
	}
	if verifyBlob(otherPub, filepath.Join(r.dist, "SHA256SUMS")) == nil {
		t.Error("cosign verify-blob accepted SHA256SUMS under another key")
	}
	// A changed chart does not verify under the right key.
	chart := chartPath(t, r.dist)
	tampered := filepath.Join(t.TempDir(), filepath.Base(chart))
	b := []byte(readFile(t, chart))
	b[len(b)/2] ^= 0xff
	if err := os.WriteFile(tampered, b, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(tampered+".sig", []byte(readFile(t, chart+".sig")), 0o600); err != nil {
		t.Fatal(err)
	}
	if verifyBlob(pub, tampered) == nil {
		t.Error("cosign verify-blob accepted a changed chart")
	}
}

// checkChart renders the packaged chart: its Deployment runs the image by
// the digest just built, and its version is the release's.
func (r release) checkChart(t *testing.T) {
	helm := os.Getenv("HELM")
	if helm == "" {
		helm = strings.TrimSpace(run(t, repoRoot(t), nil, filepath.Join(repoRoot(t), "hack/helm/build.sh")))
	}
	chart := chartPath(t, r.dist)
	if want := "hyperfleet-" + strings.TrimPrefix(r.version, "v") + ".tgz"; filepath.Base(chart) != want {
		t.Errorf("chart %s, want %s", filepath.Base(chart), want)
	}
	meta := run(t, r.dist, nil, helm, "show", "chart", chart)
	if !strings.Contains(meta, "appVersion: "+r.version) {
		t.Errorf("the chart's appVersion is not %s:\n%s", r.version, meta)
	}
	manifests := run(t, r.dist, nil, helm, "template", "hf", chart, "--namespace", "hyperfleet-system")
	want := "image: ghcr.io/hyperfleet/hyperfleet@" + r.digest
	if n := strings.Count(manifests, want); n != 1 {
		t.Errorf("the rendered chart names %q %d times, want once (the Deployment); images: %v", want, n, imageLines(manifests))
	}
	if lines := imageLines(manifests); len(lines) != 1 {
		t.Errorf("the rendered chart has other images: %v", lines)
	}
}

// checkVersions runs the binaries built for this machine and reads all
// four: the version is git describe's, in the variables
// hyperfleet_build_info and the agent's --version report, and the commit
// is stamped (hyperfleet_build_info{revision}).
func (r release) checkVersions(t *testing.T) {
	root := repoRoot(t)
	revision := strings.TrimSpace(run(t, root, nil, "git", "rev-parse", "HEAD"))
	if strings.HasSuffix(r.version, "-dirty") {
		revision += "-dirty"
	}
	if runtime.GOARCH == "amd64" || runtime.GOARCH == "arm64" {
		op := run(t, r.dist, nil, filepath.Join(r.dist, "bin", "hyperfleet-linux-"+runtime.GOARCH), "version")
		if want := "hyperfleet " + r.version + " (revision " + revision + ", "; !strings.HasPrefix(op, want) {
			t.Errorf("hyperfleet version printed %q, want %q...", op, want)
		}
		agent := run(t, r.dist, nil, filepath.Join(r.dist, "bin", "hyperfleet-agent-linux-"+runtime.GOARCH), "--version")
		if !strings.Contains(agent, r.version) {
			t.Errorf("hyperfleet-agent --version printed %q, want %s", agent, r.version)
		}
	}
	for _, b := range []string{"hyperfleet-linux-amd64", "hyperfleet-linux-arm64", "hyperfleet-agent-linux-amd64", "hyperfleet-agent-linux-arm64"} {
		path := filepath.Join(r.dist, "bin", b)
		if !strings.Contains(readFile(t, path), r.version) {
			t.Errorf("%s does not hold the version %s", b, r.version)
		}
		info := run(t, r.dist, nil, "go", "version", "-m", path)
		for _, want := range []string{"vcs.revision=" + strings.TrimSuffix(revision, "-dirty"), "CGO_ENABLED=0"} {
			if !strings.Contains(info, want) {
				t.Errorf("%s: build settings lack %s:\n%s", b, want, info)
			}
		}
	}
}

// layerFiles unpacks an image's gzipped layers into a map of path to
// content (later layers win).
func layerFiles(t *testing.T, layout string, layers []descriptor) map[string][]byte {
	t.Helper()
	files := map[string][]byte{}
	for _, l := range layers {
		zr, err := gzip.NewReader(bytes.NewReader(blob(t, layout, l.Digest)))
		if err != nil {
			t.Fatalf("layer %s (%s): %v", l.Digest, l.MediaType, err)
		}
		tr := tar.NewReader(zr)
		for {
			h, err := tr.Next()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatalf("layer %s: %v", l.Digest, err)
			}
			if h.Typeflag != tar.TypeReg {
				continue
			}
			b, err := io.ReadAll(tr)
			if err != nil {
				t.Fatalf("layer %s: %v", l.Digest, err)
			}
			files[strings.TrimPrefix(h.Name, "./")] = b
		}
	}
	return files
}

func blob(t *testing.T, layout, digest string) []byte {
	t.Helper()
	b := []byte(readFile(t, filepath.Join(layout, "blobs", strings.Replace(digest, ":", "/", 1))))
	sum := sha256.Sum256(b)
	if "sha256:"+hex.EncodeToString(sum[:]) != digest {
		t.Fatalf("blob %s does not hash to its name", digest)
	}
	return b
}

func chartPath(t *testing.T, dist string) string {
	t.Helper()
	m, err := filepath.Glob(filepath.Join(dist, "chart", "hyperfleet-*.tgz"))
	if err != nil || len(m) != 1 {
		t.Fatalf("want one chart in %s/chart, found %v (%v)", dist, m, err)
	}
	return m[0]
}

func imageLines(manifests string) []string {
	var lines []string
	for _, l := range strings.Split(manifests, "\n") {
		if strings.HasPrefix(strings.TrimSpace(l), "image:") {
			lines = append(lines, strings.TrimSpace(l))
		}
	}
	return lines
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// gitVersion is the version a release of root's work tree has: git
// describe's from the newest v* tag, or v0.0.0-g<commit> before the first.
func gitVersion(t *testing.T, root string) string {
	t.Helper()
	cmd := exec.Command("git", "describe", "--tags", "--match", "v[0-9]*", "--dirty")
	cmd.Dir = root
	if out, err := cmd.Output(); err == nil {
		return strings.TrimSpace(string(out))
	}
	v := "v0.0.0-g" + strings.TrimSpace(run(t, root, nil, "git", "rev-parse", "--short=12", "HEAD"))
	if strings.TrimSpace(run(t, root, nil, "git", "status", "--porcelain", "--untracked-files=no")) != "" {
		v += "-dirty"
	}
	return v
}

func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	return root
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func unmarshal(t *testing.T, b []byte, v any) {
	t.Helper()
	if err := json.Unmarshal(b, v); err != nil {
		t.Fatalf("%v in %.200s", err, b)
	}
}

func try(dir string, env []string, name string, args ...string) error {
	cmd := exec.Command(name, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %s: %w\n%s", filepath.Base(name), strings.Join(args, " "), err, out)
	}
	return nil
}

func run(t *testing.T, dir string, env []string, name string, args ...string) string {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("%s %s: %v\n%s%s", name, strings.Join(args, " "), err, stdout.String(), stderr.String())
	}
	return stdout.String()
}

// Command guest-image builds the Debian 12 guest that HyperFleet's guest
// tests boot in QEMU, following docs/templates.md: a base image stands in
// for Debian's cloud image (base.sh: debootstrap, cloud-init, the guest
// agent, a kernel for VMs), then the page's step 2 cloud-config runs in it
// at a first boot under QEMU, step 3 seals it through the guest agent, and
// the agent binary is copied in (the page's alternative to downloading it)
// for agentSource Image. Without --agent the result is the template for
// agentSource Operator. --spire-agent copies a spire-agent binary where the
// page's SPIFFE section installs the release (SPIFFE mode).
//
//	go run ./hack/guest-image [--agent FILE] [--spire-agent FILE] [--state] [--docs docs/templates.md] [--cache DIR]
//
// It prints the image as JSON, the shape of the Proxmox simulator's
// GuestImage. --state adds the image's saved state (state-<hash>, state.go):
// the image booted once to where it waits for its configuration, which
// the simulator's clones resume (docs/guest-snapshots.md). Everything is cached under <cache>/guest/<key>/ (cache:
// $HYPERFLEET_CACHE, else $XDG_CACHE_HOME/hyperfleet, else
// ~/.cache/hyperfleet), each key a hash of its inputs: base-<hash> of
// base.sh and the package list, template-<hash> of the base and the
// recipe, agent-<hash> of the template and the binaries copied in. A new agent
// costs a copy of the template (seconds); a recipe change one boot (minutes);
// only a base.sh or package change runs debootstrap again. Images unused
// for 3 days are removed. Needs root.
package main

import (
	"context"
	"crypto/sha256"
	_ "embed"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/hyperfleet/hyperfleet/internal/testworld/simulator/qemu"
)

//go:embed base.sh
var baseScript []byte

// image is the simulator's GuestImage.
type image struct {
	Disk   string `json:"disk"`
	Format string `json:"format"`
	Kernel string `json:"kernel"`
	Initrd string `json:"initrd"`
	Append string `json:"append"`
	// State is the image saved at the point where it waits for its
	// configuration (--state; state.go).
	State *guestState `json:"state,omitempty"`
}

func main() {
	agent := flag.String("agent", "", "hyperfleet-agent binary to install at /usr/local/bin (agentSource Image); none for agentSource Operator")
	spireAgent := flag.String("spire-agent", "", "spire-agent binary to install where docs/templates.md's SPIFFE section puts it (SPIFFE mode)")
	docs := flag.String("docs", "docs/templates.md", "the page holding the template recipe")
	cache := flag.String("cache", defaultCache(), "cache directory; images go to <cache>/guest")
	state := flag.Bool("state", false, "also boot the image once to where it waits for its configuration and save its state there, for clones to resume (docs/guest-snapshots.md)")
	flag.Parse()
	img, err := build(context.Background(), filepath.Join(*cache, "guest"), *docs, *agent, *spireAgent, *state)
	if err != nil {
		fmt.Fprintln(os.Stderr, "guest-image:", err)
		os.Exit(1)
	}
	enc := json.NewEncoder(os.Stdout)
	enc.SetIndent("", "  ")
	_ = enc.Encode(img)
}

func defaultCache() string {
	if d := os.Getenv("HYPERFLEET_CACHE"); d != "" {
		return d
	}
	if d := os.Getenv("XDG_CACHE_HOME"); d != "" {
		return filepath.Join(d, "hyperfleet")
	}
	home, _ := os.UserHomeDir()
	return filepath.Join(home, ".cache", "hyperfleet")
}

func progress(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "==> guest image: "+format+"\n", args...)
}

// build returns the cached image for the inputs, building what is missing.
func build(ctx context.Context, dir, docsPath, agent, spireAgent string, state bool) (image, error) {
	if os.Geteuid() != 0 {
		return image{}, errors.New("debootstrap and mounting the image need root")
	}
	r, err := readRecipe(docsPath)
	if err != nil {
		return image{}, err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return image{}, fmt.Errorf("cache: %w", err)
	}
	unlock, err := lock(filepath.Join(dir, ".lock"))
	if err != nil {
		return image{}, err
	}
	defer unlock()

	prune(dir)
	baseKey := "base-" + hash(baseScript, []byte(strings.Join(r.packages, "\n")))
	base := filepath.Join(dir, baseKey)
	if err := cached(base, func(out string) error { return buildBase(out, r.packages) }); err != nil {
		return image{}, err
	}
	tmplKey := "template-" + hash([]byte(baseKey), r.cloudConfig, []byte(r.seal))
	tmpl := filepath.Join(dir, tmplKey)
	if err := cached(tmpl, func(out string) error { return buildTemplate(ctx, out, base, r) }); err != nil {
		return image{}, err
	}
	img := image{Disk: filepath.Join(tmpl, "disk.raw"), Format: "raw", Kernel: filepath.Join(base, "vmlinuz"),
		Initrd: filepath.Join(base, "initrd.img"), Append: qemu.KernelArgs()}
	var files []installFile
	if agent != "" {
		files = append(files, installFile{src: agent, dst: "/usr/local/bin/hyperfleet-agent"})
	}
	if spireAgent != "" {
		files = append(files, installFile{src: spireAgent, dst: r.spireAgent})
	}
	if len(files) == 0 {
		err := addState(ctx, dir, &img, state)
		return img, err
	}
	// The key of the agent alone is the template's and its bytes, as
	// before spire-agent could be added.
	parts := [][]byte{[]byte(tmplKey)}
	for i, f := range files {
		bin, err := os.ReadFile(f.src)
		if err != nil {
			return image{}, fmt.Errorf("install %s: %w", f.dst, err)
		}
		if i > 0 || f.dst != "/usr/local/bin/hyperfleet-agent" {
			parts = append(parts, []byte(f.dst))
		}
		parts = append(parts, bin)
	}
	withFiles := filepath.Join(dir, "agent-"+hash(parts...))
	if err := cached(withFiles, func(out string) error { return injectFiles(out, img.Disk, files) }); err != nil {
		return image{}, err
	}
	img.Disk = filepath.Join(withFiles, "disk.raw")
	err = addState(ctx, dir, &img, state)
	return img, err
}

func addState(ctx context.Context, dir string, img *image, state bool) error {
	if !state {
		return nil
	}
	return withState(ctx, dir, img)
}

// unusedFor is how long an image may go unused before prune removes it,
// and kept how many of the agent images (agent-<hash>, one of about 800 MB
// for every agent build) prune keeps at most, the most recently used:
// on the CI machine every change to the agent adds one, and 25 of them
// (20 GB) had piled up inside unusedFor, with 20 GB of the disk left.
// Saved states (state-<hash>, about 200 MB each, one for every image
// saved) are kept the same way, counted apart.
const (
	unusedFor = 3 * 24 * time.Hour
	kept      = 6
)

// bounded are the kinds of cache entry of which prune keeps the kept most
// recently used: a new one for every agent build.
var bounded = []string{"agent-", "state-"}

// prune removes images no build has used for unusedFor (a reused image's
// time stamp is refreshed) and the agent images and saved states beyond
// the kept most recently used of each kind, so that images of old agents
// and recipes do not fill the disk, while those of parallel branches stay.
func prune(dir string) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return
	}
	type used struct {
		name string
		at   time.Time
	}
	byKind := map[string][]used{}
	for _, e := range entries {
		info, err := e.Info()
		if err != nil || !e.IsDir() {
			continue
		}
		if time.Since(info.ModTime()) >= unusedFor {
			progress("removing %s, unused since %s", e.Name(), info.ModTime().Format(time.DateTime))
			_ = os.RemoveAll(filepath.Join(dir, e.Name()))
			continue
		}
		for _, kind := range bounded {
			if strings.HasPrefix(e.Name(), kind) && !strings.HasSuffix(e.Name(), ".tmp") {
				byKind[kind] = append(byKind[kind], used{e.Name(), info.ModTime()})
			}
		}
	}
	for _, all := range byKind {
		slices.SortFunc(all, func(a, b used) int { return b.at.Compare(a.at) })
		for _, a := range all[min(kept, len(all)):] {
			progress("removing %s, last used %s: %d newer of its kind are kept", a.name, a.at.Format(time.DateTime), kept)
			_ = os.RemoveAll(filepath.Join(dir, a.name))
		}
	}
}

func hash(parts ...[]byte) string {
	h := sha256.New()
	for _, p := range parts {
		fmt.Fprintf(h, "%d:", len(p))
		h.Write(p)
	}
	return hex.EncodeToString(h.Sum(nil))[:16]
}

// lock serialises builds sharing the cache (parallel test runs).
func lock(path string) (func(), error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("cache lock: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("cache lock: %w", err)
	}
	return func() { _ = f.Close() }, nil
}

// cached runs build into a fresh directory and renames it to dir, unless
// dir exists: a half-built image is never found.
func cached(dir string, build func(out string) error) error {
	if _, err := os.Stat(dir); err == nil {
		progress("reusing %s", dir)
		// Its time stamp says it is in use (see prune).
		now := time.Now()
		return os.Chtimes(dir, now, now)
	}
	tmp := dir + ".tmp"
	_ = os.RemoveAll(tmp)
	start := time.Now()
	if err := build(tmp); err != nil {
		_ = os.RemoveAll(tmp)
		return err
	}
	if err := os.Rename(tmp, dir); err != nil {
		return fmt.Errorf("cache: %w", err)
	}
	progress("built %s in %s", dir, time.Since(start).Round(time.Second))
	return nil
}

func buildBase(out string, packages []string) error {
	progress("building the base image with debootstrap (about 2 minutes, once)")
	script, err := os.CreateTemp("", "guest-image-base-*.sh")
	if err != nil {
		return err
	}
	defer os.Remove(script.Name())
	if _, err := script.Write(baseScript); err != nil {
		return err
	}
	_ = script.Close()
	cmd := exec.Command("bash", append([]string{script.Name(), out}, packages...)...)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("base image (hack/guest-image/base.sh): %w", err)
	}
	return nil
}

// installFile is a binary the builder copies into the image.
type installFile struct {
	src string
	// dst is its absolute path in the image (mode 0755, owned by root).
	dst string
}

// injectFiles copies the template and writes files into it, mode 0755,
// owned by root, with e2fsprogs' debugfs (the image is not mounted).
func injectFiles(out, template string, files []installFile) error {
	if err := os.MkdirAll(out, 0o755); err != nil {
		return err
	}
	disk := filepath.Join(out, "disk.raw")
	if err := run("cp", "--sparse=always", template, disk); err != nil {
		return err
	}
	for _, f := range files {
		progress("installing %s as %s", f.src, f.dst)
		abs, err := filepath.Abs(f.src)
		if err != nil {
			return err
		}
		dir, name := filepath.Split(f.dst)
		// debugfs's mkdir fails on an existing directory, harmlessly:
		// -f goes on with the next command.
		var cmds []string
		parts := strings.Split(strings.Trim(dir, "/"), "/")
		for i := range parts {
			cmds = append(cmds, "mkdir /"+strings.Join(parts[:i+1], "/"))
		}
		cmds = append(cmds, "cd "+dir, "write "+abs+" "+name,
			"sif "+name+" mode 0100755", "sif "+name+" uid 0", "sif "+name+" gid 0")
		if err := runInput(strings.Join(cmds, "\n"), "debugfs", "-w", "-f", "-", disk); err != nil {
			return err
		}
		stat, err := exec.Command("debugfs", "-R", "stat "+f.dst, disk).CombinedOutput()
		if err != nil || !strings.Contains(string(stat), "Mode:  0755") {
			return fmt.Errorf("%s is not in the image after debugfs: %w\n%s", f.dst, err, stat)
		}
	}
	return nil
}

func run(name string, args ...string) error { return runInput("", name, args...) }

func runInput(stdin, name string, args ...string) error {
	cmd := exec.Command(name, args...)
	cmd.Stdin = strings.NewReader(stdin)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %s: %w\n%s", name, strings.Join(args, " "), err, out)
	}
	return nil
}

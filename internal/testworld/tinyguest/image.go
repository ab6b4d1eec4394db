package tinyguest

import (
	"bytes"
	"crypto/sha256"
	"debug/elf"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"testing"
)

// kernelMetaPackage is the Debian package whose dependency names the
// kernel: the cloud flavour, made for virtual machines (virtio drivers,
// no hardware zoo), boots quickest.
const kernelMetaPackage = "linux-image-cloud-amd64"

// guestModules are the kernel modules the guest loads, by name; their
// dependencies come along. virtio_pci finds the devices, virtio_console
// is the agent's port, virtio_net the NIC, virtio_scsi, sr_mod and isofs
// the NoCloud CD-ROM, button and evdev the ACPI power button.
var guestModules = []string{"virtio_pci", "virtio_console", "virtio_net", "virtio_scsi", "sr_mod", "isofs", "button", "evdev"}

// initPackage is the import path of the guest's /init.
const initPackage = "github.com/hyperfleet/hyperfleet/internal/testworld/tinyguest/guestinit"

// Image is a bootable guest: a kernel and an initramfs, for libvirt's
// direct kernel boot.
type Image struct {
	Kernel, Initrd string
	// KernelRelease is the kernel's version (uname -r).
	KernelRelease string
}

// CacheDir is where kernels and initramfs images are kept between runs.
func CacheDir() string {
	dir, err := os.UserCacheDir()
	if err != nil {
		dir = os.TempDir()
	}
	return filepath.Join(dir, "hyperfleet", "tinyguest")
}

// Build returns the guest image, building what the cache lacks: the
// kernel is unpacked from Debian's package once (apt-get download, which
// needs a current package list: apt-get update), the initramfs once per
// kernel and /init binary. Concurrent builds, in this or other test
// binaries, take turns on a lock.
func Build(t testing.TB) Image {
	t.Helper()
	img, err := build()
	if err != nil {
		t.Fatalf("tinyguest: %v", err)
	}
	return img
}

func build() (Image, error) {
	if err := os.MkdirAll(CacheDir(), 0o755); err != nil {
		return Image{}, err
	}
	unlock, err := lockFile(filepath.Join(CacheDir(), ".lock"))
	if err != nil {
		return Image{}, err
	}
	defer unlock()
	kdir, err := kernel()
	if err != nil {
		return Image{}, err
	}
	release, err := onlyEntry(filepath.Join(kdir, "lib", "modules"))
	if err != nil {
		return Image{}, err
	}
	initBin, err := buildInit()
	if err != nil {
		return Image{}, err
	}
	modules, err := moduleClosure(filepath.Join(kdir, "lib", "modules", release), guestModules)
	if err != nil {
		return Image{}, err
	}
	sum := sha256.New()
	fmt.Fprintf(sum, "%s\n%s\n", release, strings.Join(modules, "\n"))
	sum.Write(initBin)
	key := hex.EncodeToString(sum.Sum(nil))[:16]
	initrd := filepath.Join(kdir, "initrd-"+key+".cpio")
	img := Image{Kernel: bootKernel(kdir), Initrd: initrd, KernelRelease: release}
	if _, err := os.Stat(initrd); err == nil {
		return img, nil
	}
	if err := writeInitramfs(initrd, initBin, filepath.Join(kdir, "lib", "modules", release), modules); err != nil {
		return Image{}, err
	}
	return img, nil
}

// bootKernel returns the kernel to boot: the uncompressed vmlinux, made
// from vmlinuz on first use, or vmlinuz itself when it cannot be unpacked
// (a kernel compressed otherwise than with LZ4 still boots, only slower).
func bootKernel(kdir string) string {
	vmlinux := filepath.Join(kdir, "vmlinux")
	if _, err := os.Stat(vmlinux); err == nil {
		return vmlinux
	}
	bz, err := os.ReadFile(filepath.Join(kdir, "vmlinuz"))
	if err != nil {
		return filepath.Join(kdir, "vmlinuz")
	}
	raw, err := extractVmlinux(bz)
	if err != nil || writeAtomically(vmlinux, raw) != nil {
		return filepath.Join(kdir, "vmlinuz")
	}
	return vmlinux
}

// writeAtomically writes a file under a temporary name and renames it.
func writeAtomically(path string, data []byte) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), ".tmp-")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(data); err != nil {
		_ = tmp.Close()
		return err
	}
	if err := tmp.Chmod(0o644); err != nil {
		_ = tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}

// lockFile takes an exclusive flock on path.
func lockFile(path string) (func(), error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("locking %s: %w", path, err)
	}
	return func() { _ = f.Close() }, nil
}

// kernel returns the cache directory of the kernel (vmlinuz and
// lib/modules/<release>), unpacking it on first use. A kernel already
// kept is used without asking apt: the cache is the pin.
func kernel() (string, error) {
	kept, _ := filepath.Glob(filepath.Join(CacheDir(), "kernel-*", "vmlinuz"))
	if len(kept) > 0 {
		sort.Strings(kept)
		return filepath.Dir(kept[len(kept)-1]), nil
	}
	pkg, err := kernelPackage()
	if err != nil {
		return "", err
	}
	work, err := os.MkdirTemp(CacheDir(), ".unpack-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(work)
	if out, err := runIn(work, "apt-get", "download", pkg); err != nil {
		return "", fmt.Errorf("downloading %s (apt-get update first if the list is old): %w\n%s", pkg, err, out)
	}
	debs, _ := filepath.Glob(filepath.Join(work, "*.deb"))
	if len(debs) != 1 {
		return "", fmt.Errorf("apt-get download %s left %d packages", pkg, len(debs))
	}
	root := filepath.Join(work, "root")
	if out, err := runIn(work, "dpkg-deb", "-x", debs[0], root); err != nil {
		return "", fmt.Errorf("unpacking %s: %w\n%s", debs[0], err, out)
	}
	vmlinuz, _ := filepath.Glob(filepath.Join(root, "boot", "vmlinuz-*"))
	if len(vmlinuz) != 1 {
		return "", fmt.Errorf("%s has %d kernels in /boot", pkg, len(vmlinuz))
	}
	dest := filepath.Join(work, "kernel")
	if err := os.MkdirAll(filepath.Join(dest, "lib"), 0o755); err != nil {
		return "", err
	}
	if err := os.Rename(vmlinuz[0], filepath.Join(dest, "vmlinuz")); err != nil {
		return "", err
	}
	if err := os.Rename(filepath.Join(root, "lib", "modules"), filepath.Join(dest, "lib", "modules")); err != nil {
		return "", err
	}
	final := filepath.Join(CacheDir(), "kernel-"+strings.TrimPrefix(pkg, "linux-image-"))
	if err := os.Rename(dest, final); err != nil {
		return "", fmt.Errorf("keeping the kernel: %w", err)
	}
	return final, nil
}

// kernelPackage names the kernel package linux-image-cloud-amd64
// depends on.
func kernelPackage() (string, error) {
	out, err := runIn("", "apt-cache", "depends", kernelMetaPackage)
	if err != nil {
		return "", fmt.Errorf("apt-cache depends %s (run apt-get update first): %w\n%s", kernelMetaPackage, err, out)
	}
	for _, line := range strings.Split(string(out), "\n") {
		if dep, ok := strings.CutPrefix(strings.TrimSpace(line), "Depends: "); ok && strings.HasPrefix(dep, "linux-image-") {
			return dep, nil
		}
	}
	return "", fmt.Errorf("apt-cache knows no kernel behind %s: run apt-get update", kernelMetaPackage)
}

func runIn(dir string, args ...string) ([]byte, error) {
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Dir = dir
	return cmd.CombinedOutput()
}

// onlyEntry is the one entry of a directory.
func onlyEntry(dir string) (string, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return "", fmt.Errorf("kernel releases: %w", err)
	}
	if len(entries) != 1 {
		return "", fmt.Errorf("%s: want exactly one kernel release, found %d", dir, len(entries))
	}
	return entries[0].Name(), nil
}

// buildInit compiles the guest's /init: static (CGO_ENABLED=0), stripped,
// reproducible (the initramfs key hashes the binary). The go command runs
// in the test's package directory, inside this module.
func buildInit() ([]byte, error) {
	out, err := os.CreateTemp("", "tinyguest-init-")
	if err != nil {
		return nil, err
	}
	_ = out.Close()
	defer os.Remove(out.Name())
	cmd := exec.Command("go", "build", "-trimpath", "-buildvcs=false", "-ldflags=-s -w", "-o", out.Name(), initPackage)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH=amd64")
	if msg, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("building the guest's /init: %w\n%s", err, msg)
	}
	return os.ReadFile(out.Name())
}

// moduleClosure returns the module files (relative to modDir) that
// loading names needs, each after its dependencies. Dependencies come
// from each module's .modinfo "depends=" (the package ships no
// modules.dep: depmod makes it on install).
func moduleClosure(modDir string, names []string) ([]string, error) {
	byName := map[string]string{}
	err := filepath.WalkDir(modDir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".ko") {
			return err
		}
		rel, _ := filepath.Rel(modDir, path)
		byName[moduleName(filepath.Base(path))] = rel
		return nil
	})
	if err != nil {
		return nil, err
	}
	var order []string
	seen := map[string]bool{}
	var visit func(name string) error
	visit = func(name string) error {
		if seen[name] {
			return nil
		}
		seen[name] = true
		rel, ok := byName[name]
		if !ok {
			return fmt.Errorf("kernel module %s is not in %s (built in? then leave it out)", name, modDir)
		}
		deps, err := moduleDepends(filepath.Join(modDir, rel))
		if err != nil {
			return err
		}
		for _, dep := range deps {
			if err := visit(dep); err != nil {
				return err
			}
		}
		order = append(order, rel)
		return nil
	}
	for _, n := range names {
		if err := visit(n); err != nil {
			return nil, err
		}
	}
	return order, nil
}

// moduleName is the kernel's name of a module file: dashes become
// underscores.
func moduleName(file string) string {
	return strings.ReplaceAll(strings.TrimSuffix(file, ".ko"), "-", "_")
}

// moduleDepends reads "depends=" from a module's .modinfo section.
func moduleDepends(path string) ([]string, error) {
	f, err := elf.Open(path)
	if err != nil {
		return nil, fmt.Errorf("module %s: %w", path, err)
	}
	defer f.Close()
	sec := f.Section(".modinfo")
	if sec == nil {
		return nil, fmt.Errorf("module %s has no .modinfo", path)
	}
	raw, err := sec.Data()
	if err != nil {
		return nil, fmt.Errorf("module %s: %w", path, err)
	}
	for _, field := range bytes.Split(raw, []byte{0}) {
		if v, ok := bytes.CutPrefix(field, []byte("depends=")); ok {
			if len(v) == 0 {
				return nil, nil
			}
			return strings.Split(string(v), ","), nil
		}
	}
	return nil, nil
}

// writeInitramfs writes an uncompressed newc cpio archive (the kernel
// unpacks it without spending guest CPU on decompression): /init, the
// modules flat in /lib/modules with their load order in
// /lib/modules/order, and the directories /init mounts on.
func writeInitramfs(path string, initBin []byte, modDir string, modules []string) error {
	var archive bytes.Buffer
	w := newCpioWriter(&archive)
	for _, dir := range []string{"dev", "proc", "sys", "run", "tmp", "mnt", "lib", "lib/modules"} {
		w.dir(dir)
	}
	w.file("init", 0o755, initBin)
	var order []string
	for _, rel := range modules {
		raw, err := os.ReadFile(filepath.Join(modDir, rel))
		if err != nil {
			return err
		}
		w.file("lib/modules/"+filepath.Base(rel), 0o644, stripSignature(raw))
		order = append(order, filepath.Base(rel))
	}
	w.file("lib/modules/order", 0o644, []byte(strings.Join(order, "\n")+"\n"))
	if err := w.close(); err != nil {
		return fmt.Errorf("writing the initramfs: %w", err)
	}
	return writeAtomically(path, archive.Bytes())
}

// moduleSigMagic ends a signed kernel module.
const moduleSigMagic = "~Module signature appended~\n"

// stripSignature removes a module's appended signature: the kernel then
// loads it without checking one (Debian's kernel does not enforce
// signatures), which saves an RSA verification per module under TCG. The
// signature is a 12-byte struct module_signature, whose last four bytes
// are the big-endian length of the PKCS#7 blob before it, then the magic.
func stripSignature(mod []byte) []byte {
	if !bytes.HasSuffix(mod, []byte(moduleSigMagic)) {
		return mod
	}
	end := len(mod) - len(moduleSigMagic)
	if end < 12 {
		return mod
	}
	sigLen := int(binary.BigEndian.Uint32(mod[end-4 : end]))
	if sigLen > end-12 {
		return mod
	}
	return mod[:end-12-sigLen]
}

// cpioWriter writes a newc ("070701") archive; the first error sticks.
type cpioWriter struct {
	w     io.Writer
	n     int64
	inode int
	err   error
}

func newCpioWriter(w io.Writer) *cpioWriter { return &cpioWriter{w: w, inode: 1} }

func (c *cpioWriter) dir(name string) { c.entry(name, syscall.S_IFDIR|0o755, nil) }

func (c *cpioWriter) file(name string, perm uint32, data []byte) {
	c.entry(name, syscall.S_IFREG|perm, data)
}

func (c *cpioWriter) close() error {
	c.entry("TRAILER!!!", 0, nil)
	return c.err
}

func (c *cpioWriter) entry(name string, mode uint32, data []byte) {
	nlink := 1
	if mode&syscall.S_IFDIR != 0 {
		nlink = 2
	}
	hdr := fmt.Sprintf("070701%08x%08x%08x%08x%08x%08x%08x%08x%08x%08x%08x%08x%08x",
		c.inode, mode, 0, 0, nlink, 0, len(data), 0, 0, 0, 0, len(name)+1, 0)
	c.inode++
	c.write([]byte(hdr))
	c.write(append([]byte(name), 0))
	c.pad()
	c.write(data)
	c.pad()
}

func (c *cpioWriter) write(b []byte) {
	if c.err != nil {
		return
	}
	n, err := c.w.Write(b)
	c.n += int64(n)
	c.err = err
}

// pad aligns to 4 bytes, as newc requires after names and data.
func (c *cpioWriter) pad() {
	if r := c.n % 4; r != 0 {
		c.write(make([]byte, 4-r))
	}
}

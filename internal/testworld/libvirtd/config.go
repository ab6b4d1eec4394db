package libvirtd

import (
	"fmt"
	"os"
	"path/filepath"
)

// configFiles is the daemon's /etc/libvirt. QEMU and swtpm run as root
// without a security driver or cgroups: the test owns the machine's state
// directories, and cgroup placement needs systemd, which tests do not
// have. QEMU's per-domain mount namespace is off: it would copy /dev for
// every boot for nothing a test checks. Logs go to files in the daemon's
// /var/log/libvirt (Logs shows them).
var configFiles = map[string]string{
	"libvirtd.conf": `unix_sock_group = "root"
unix_sock_ro_perms = "0777"
unix_sock_rw_perms = "0770"
auth_unix_ro = "none"
auth_unix_rw = "none"
log_outputs = "3:file:/var/log/libvirt/libvirtd.log"
`,
	"virtlogd.conf": `log_outputs = "3:file:/var/log/libvirt/virtlogd.log"
`,
	"qemu.conf": `user = "root"
group = "root"
dynamic_ownership = 0
remember_owner = 0
security_driver = "none"
cgroup_controllers = [ ]
namespaces = [ ]
swtpm_user = "root"
swtpm_group = "root"
`,
	"libvirt.conf": "",
}

// capabilitiesCache is where the QEMU capabilities probe of the first
// daemon on this machine is kept for the next ones: probing takes about
// 12 s of CPU, and libvirt revalidates a cached result against the QEMU
// binary, libvirtd itself and the kernel, so a stale copy is only re-probed.
func capabilitiesCache() string {
	home, err := os.UserCacheDir()
	if err != nil {
		home = os.TempDir()
	}
	return filepath.Join(home, "hyperfleet", "libvirtd", "qemu-capabilities")
}

// seedCapabilities copies the kept capabilities into a daemon's
// /var/cache/libvirt before it starts.
func seedCapabilities(cacheDir string) error {
	dst := filepath.Join(cacheDir, "qemu", "capabilities")
	if err := os.MkdirAll(dst, 0o755); err != nil {
		return fmt.Errorf("libvirtd: capabilities cache: %w", err)
	}
	// Nothing kept yet (an unreadable directory included): this daemon
	// probes.
	entries, _ := os.ReadDir(capabilitiesCache())
	for _, e := range entries {
		raw, err := os.ReadFile(filepath.Join(capabilitiesCache(), e.Name()))
		if err != nil {
			continue
		}
		if err := os.WriteFile(filepath.Join(dst, e.Name()), raw, 0o600); err != nil {
			return fmt.Errorf("libvirtd: seeding the capabilities cache: %w", err)
		}
	}
	return nil
}

// saveCapabilities keeps a started daemon's capabilities for the next
// daemons, each file replaced atomically (daemons of other test binaries
// read them concurrently). Failing to keep them only costs time.
func saveCapabilities(cacheDir string) {
	src := filepath.Join(cacheDir, "qemu", "capabilities")
	entries, err := os.ReadDir(src)
	if err != nil || os.MkdirAll(capabilitiesCache(), 0o755) != nil {
		return
	}
	for _, e := range entries {
		raw, err := os.ReadFile(filepath.Join(src, e.Name()))
		if err != nil {
			continue
		}
		tmp, err := os.CreateTemp(capabilitiesCache(), ".tmp-")
		if err != nil {
			return
		}
		_, werr := tmp.Write(raw)
		cerr := tmp.Close()
		if werr != nil || cerr != nil || os.Rename(tmp.Name(), filepath.Join(capabilitiesCache(), e.Name())) != nil {
			_ = os.Remove(tmp.Name())
		}
	}
}

// filterSources are where libvirt's own network filters (clean-traffic and
// the filters it references) are found: Debian's
// libvirt-daemon-config-nwfilter ships them under /usr/share and copies
// them to /etc/libvirt/nwfilter, which the daemon's own /etc hides.
var filterSources = []string{"/usr/share/libvirt/nwfilter", "/etc/libvirt/nwfilter"}

// seedFilters copies libvirt's own network filters into a daemon's
// /etc/libvirt/nwfilter, where its nwfilter driver loads them at start.
// A machine without them starts the daemon all the same: only a domain
// referencing clean-traffic fails to start, naming the filter.
func seedFilters(etcDir string) error {
	dst := filepath.Join(etcDir, "nwfilter")
	if err := os.MkdirAll(dst, 0o755); err != nil {
		return fmt.Errorf("libvirtd: nwfilter directory: %w", err)
	}
	for _, src := range filterSources {
		files, _ := filepath.Glob(filepath.Join(src, "*.xml"))
		if len(files) == 0 {
			continue
		}
		for _, f := range files {
			raw, err := os.ReadFile(f)
			if err != nil {
				return fmt.Errorf("libvirtd: reading libvirt's filter %s: %w", f, err)
			}
			if err := os.WriteFile(filepath.Join(dst, filepath.Base(f)), raw, 0o644); err != nil {
				return fmt.Errorf("libvirtd: seeding libvirt's filters: %w", err)
			}
		}
		return nil
	}
	return nil
}

package proxmox

import (
	"fmt"
	"net"
	"regexp"
	"sort"
	"strconv"
	"strings"
)

var (
	driveKeyRE = regexp.MustCompile(`^(ide[0-3]|scsi([0-9]|[12][0-9]|30)|sata[0-5]|virtio([0-9]|1[0-5])|efidisk0|tpmstate0)$`)
	sizeRE     = regexp.MustCompile(`^(\d+(?:\.\d+)?)([KMGT])?$`)
	tagRE      = regexp.MustCompile(`^[a-z0-9_][a-z0-9_\-+.]*$`)
	dnsNameRE  = regexp.MustCompile(`^([a-zA-Z0-9]([a-zA-Z0-9-]*[a-zA-Z0-9])?\.)*[a-zA-Z0-9]([a-zA-Z0-9-]*[a-zA-Z0-9])?$`)
	macRE      = regexp.MustCompile(`^[0-9a-fA-F]{2}(:[0-9a-fA-F]{2}){5}$`)
	netModels  = map[string]bool{"e1000": true, "e1000-82540em": true, "e1000-82544gc": true, "e1000-82545em": true, "e1000e": true,
		"i82551": true, "i82557b": true, "i82559er": true, "ne2k_isa": true, "ne2k_pci": true, "pcnet": true, "rtl8139": true, "virtio": true, "vmxnet3": true}
)

// drive is a parsed drive value: "<volume>,key=value,...".
type drive struct {
	file string
	opts map[string]string
}

func parseDrive(v string) drive {
	d := drive{opts: map[string]string{}}
	for i, part := range strings.Split(v, ",") {
		k, val, ok := strings.Cut(part, "=")
		switch {
		case !ok && i == 0:
			d.file = part
		case k == "file":
			d.file = val
		case ok:
			d.opts[k] = val
		}
	}
	return d
}

func (d drive) cdrom() bool { return d.opts["media"] == "cdrom" }

// cloudInit reports a Proxmox-generated cloud-init drive.
func (d drive) cloudInit() bool {
	return strings.HasSuffix(d.file, ":cloudinit") || strings.HasSuffix(d.file, "-cloudinit") || strings.Contains(d.file, "cloudinit.")
}

// storage is the storage id of a volume ("local-lvm:vm-1-disk-0").
func (d drive) storage() string {
	s, _, ok := strings.Cut(d.file, ":")
	if !ok {
		return ""
	}
	return s
}

// format is the disk format: the format option, else the file extension,
// else raw (block storages).
func (d drive) format() string {
	if f := d.opts["format"]; f != "" {
		return f
	}
	for _, f := range []string{"qcow2", "vmdk", "raw"} {
		if strings.HasSuffix(d.file, "."+f) {
			return f
		}
	}
	return "raw"
}

// parseSize reads a size option such as "32G".
func parseSize(v string) (int64, bool) {
	m := sizeRE.FindStringSubmatch(v)
	if m == nil {
		return 0, false
	}
	f, err := strconv.ParseFloat(m[1], 64)
	if err != nil {
		return 0, false
	}
	mult := map[string]float64{"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}[m[2]]
	return int64(f * mult), true
}

// drives returns the config's drive keys in a stable order.
func (c vmConfig) drives() []string {
	var keys []string
	for k := range c {
		if driveKeyRE.MatchString(k) {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	return keys
}

// disks returns the keys of drives that hold data the clone copies (no
// CD-ROMs; cloud-init drives count, Proxmox copies them in full).
func (c vmConfig) disks() []string {
	var out []string
	for _, k := range c.drives() {
		d := parseDrive(c[k])
		if d.cdrom() && !d.cloudInit() {
			continue
		}
		if d.file == "" || d.file == "none" {
			continue
		}
		out = append(out, k)
	}
	return out
}

// bootDisk returns the key and size of the boot disk: the first disk of the
// boot order, else the first data disk.
func (c vmConfig) bootDisk() (string, int64) {
	var order []string
	if b := c["boot"]; b != "" {
		for _, part := range strings.Split(b, ",") {
			if v, ok := strings.CutPrefix(part, "order="); ok {
				order = strings.Split(v, ";")
			}
		}
	}
	for _, k := range append(order, c.drives()...) {
		v, ok := c[k]
		if !ok || !driveKeyRE.MatchString(k) || k == "efidisk0" || k == tpmKey {
			// EFI variables and TPM state are not disks a guest boots
			// from (tpmstate0 sorts before virtio0).
			continue
		}
		d := parseDrive(v)
		if d.cdrom() || d.cloudInit() || d.file == "none" {
			continue
		}
		size, _ := parseSize(d.opts["size"])
		return k, size
	}
	return "", 0
}

// tpmKey is Proxmox's one TPM state drive.
const tpmKey = "tpmstate0"

// tpmVersion is the TPM version of the config's tpmstate0, "" without
// one. qemu-server's tpmstate0 format is
// "[file=]<volume>[,size=<size>][,version=<v1.2|v2.0>]", version v1.2
// when absent (src/PVE/QemuServer/Drive.pm, $tpmversion_fmt).
func (c vmConfig) tpmVersion() string {
	v, ok := c[tpmKey]
	if !ok {
		return ""
	}
	d := parseDrive(v)
	if d.file == "" || d.file == "none" {
		return ""
	}
	if ver := d.opts["version"]; ver != "" {
		return ver
	}
	return "v1.2"
}

// hasTPM2 says the config has a TPM 2.0.
func (c vmConfig) hasTPM2() bool { return c.tpmVersion() == "v2.0" }

// isoSlot returns the drive key holding volid, "" if none.
func (c vmConfig) isoSlot(volid string) string {
	for _, k := range c.drives() {
		if parseDrive(c[k]).file == volid {
			return k
		}
	}
	return ""
}

// chooseISOSlot picks the IDE slot for the NoCloud ISO: the slot of a
// Proxmox cloud-init drive if the clone has one (replacing it keeps the
// guest from seeing two cidata volumes, and Proxmox frees the old drive),
// else an empty CD-ROM, else a free IDE slot, ide2 first as in the web UI.
func (c vmConfig) chooseISOSlot() (string, bool) {
	for _, k := range c.drives() {
		if strings.HasPrefix(k, "ide") && parseDrive(c[k]).cloudInit() {
			return k, true
		}
	}
	for _, k := range []string{"ide2", "ide3", "ide0", "ide1"} {
		if v, ok := c[k]; ok {
			if d := parseDrive(v); d.cdrom() && (d.file == "none" || d.file == "cdrom") {
				return k, true
			}
		}
	}
	for _, k := range []string{"ide2", "ide3", "ide0", "ide1"} {
		if _, ok := c[k]; !ok {
			return k, true
		}
	}
	return "", false
}

// tags returns the config's tags.
func (c vmConfig) tags() []string { return splitTags(c["tags"]) }

// splitTags splits a Proxmox tag list on ';', ',' and spaces.
func splitTags(s string) []string {
	return strings.FieldsFunc(s, func(r rune) bool { return r == ';' || r == ',' || r == ' ' })
}

// normalizeTags lower-cases, de-duplicates and sorts tags, as Proxmox
// stores them.
func normalizeTags(lists ...[]string) []string {
	seen := map[string]bool{}
	var out []string
	for _, l := range lists {
		for _, t := range l {
			t = strings.ToLower(strings.TrimSpace(t))
			if t == "" || seen[t] {
				continue
			}
			seen[t] = true
			out = append(out, t)
		}
	}
	sort.Strings(out)
	return out
}

// netDevice is a parsed netN value: "<model>=<mac>,bridge=...,tag=...".
type netDevice struct {
	model  string
	mac    string
	bridge string
	tag    string
	// rest keeps other options (firewall, mtu, queues ...) in order.
	rest []string
}

func parseNet(v string) netDevice {
	var n netDevice
	for i, part := range strings.Split(v, ",") {
		k, val, _ := strings.Cut(part, "=")
		switch {
		case i == 0 && netModels[k]:
			n.model, n.mac = k, val
		case k == "model":
			n.model = val
		case k == "macaddr":
			n.mac = val
		case k == "bridge":
			n.bridge = val
		case k == "tag":
			n.tag = val
		case part != "":
			n.rest = append(n.rest, part)
		}
	}
	return n
}

func (n netDevice) String() string {
	parts := []string{n.model}
	if n.mac != "" {
		parts[0] += "=" + n.mac
	}
	if n.bridge != "" {
		parts = append(parts, "bridge="+n.bridge)
	}
	if n.tag != "" {
		parts = append(parts, "tag="+n.tag)
	}
	return strings.Join(append(parts, n.rest...), ",")
}

// guestAddresses returns the addresses the guest agent reports, without
// loopback and link-local ones, and the MAC of the interface that carries
// the first of them (or of the interface with mac, if the guest has it).
func guestAddresses(ifaces []agentIface, mac string) ([]string, string) {
	var addrs []string
	var first string
	for _, ifc := range ifaces {
		hw := strings.ToLower(ifc.mac)
		for _, a := range ifc.addrs {
			ip := net.ParseIP(a)
			if ip == nil || ip.IsLoopback() || ip.IsLinkLocalUnicast() || ip.IsLinkLocalMulticast() || ip.IsUnspecified() {
				continue
			}
			addrs = append(addrs, ip.String())
			if first == "" {
				first = hw
			}
		}
	}
	if mac != "" {
		for _, ifc := range ifaces {
			if strings.EqualFold(ifc.mac, mac) {
				return addrs, strings.ToLower(mac)
			}
		}
	}
	return addrs, first
}

// agentIface is the part of a guest agent interface HyperFleet uses.
type agentIface struct {
	mac   string
	addrs []string
}

// formatSizeArg renders bytes for the resize call, rounded up to MiB.
func formatSizeArg(b int64) string {
	mib := (b + (1<<20 - 1)) >> 20
	if mib%1024 == 0 {
		return fmt.Sprintf("%dG", mib/1024)
	}
	return fmt.Sprintf("%dM", mib)
}

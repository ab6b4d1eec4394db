package proxmoxsim

import (
	"crypto/sha1"
	"encoding/hex"
	"fmt"
	"net"
	"net/url"
	"regexp"
	"sort"
	"strconv"
	"strings"
)

// Drive and device key ranges of qemu-server.
var (
	driveKeyRE = regexp.MustCompile(`^(ide[0-3]|scsi([0-9]|[12][0-9]|30)|sata[0-5]|virtio([0-9]|1[0-5])|efidisk0|tpmstate0)$`)
	netKeyRE   = regexp.MustCompile(`^net([0-9]|[12][0-9]|3[01])$`)
	ipcfgKeyRE = regexp.MustCompile(`^ipconfig([0-9]|[12][0-9]|3[01])$`)
	unusedRE   = regexp.MustCompile(`^unused\d+$`)
	serialRE   = regexp.MustCompile(`^serial[0-3]$`)
	macRE      = regexp.MustCompile(`^[0-9a-fA-F]{2}(:[0-9a-fA-F]{2}){5}$`)
	urlencRE   = regexp.MustCompile(`^[-%a-zA-Z0-9_.!~*'()]*$`)
	memoryRE   = regexp.MustCompile(`^(?:current=)?(\d+)$`)
	legacyBoot = regexp.MustCompile(`^[acdn]{1,4}$`)
)

var netModels = []string{"e1000", "e1000-82540em", "e1000-82544gc", "e1000-82545em", "e1000e", "i82551", "i82557b", "i82559er", "ne2k_isa", "ne2k_pci", "pcnet", "rtl8139", "virtio", "vmxnet3"}

// intConfigKeys are returned as JSON numbers by GET config; booleans are
// numbers 0/1 as well. Everything else is a string.
var intConfigKeys = map[string]bool{
	"cores": true, "sockets": true, "balloon": true, "cpuunits": true, "vcpus": true, "shares": true,
	"template": true, "protection": true, "onboot": true, "numa": true, "kvm": true, "acpi": true,
	"tablet": true, "autostart": true, "localtime": true, "reboot": true, "freeze": true, "ciupgrade": true,
}

// vmConfigSchema is the schema of POST/PUT /nodes/{node}/qemu/{vmid}/config.
func vmConfigSchema() *schema {
	s := sch(nodeP, vmidP,
		param{name: "name", kind: kString, optional: true, format: verifyDNSName},
		param{name: "description", kind: kString, optional: true, maxLen: 8192},
		param{name: "tags", kind: kString, optional: true, format: verifyTags},
		param{name: "cores", kind: kInt, optional: true, min: intPtr(1), max: intPtr(1024)},
		param{name: "sockets", kind: kInt, optional: true, min: intPtr(1), max: intPtr(4)},
		param{name: "vcpus", kind: kInt, optional: true, min: intPtr(1), max: intPtr(4096)},
		param{name: "memory", kind: kString, optional: true, format: verifyMemory},
		param{name: "balloon", kind: kInt, optional: true, min: intPtr(0)},
		param{name: "shares", kind: kInt, optional: true, min: intPtr(0), max: intPtr(50000)},
		param{name: "cpu", kind: kString, optional: true},
		param{name: "cpulimit", kind: kNumber, optional: true},
		param{name: "cpuunits", kind: kInt, optional: true, min: intPtr(1), max: intPtr(262144)},
		param{name: "affinity", kind: kString, optional: true},
		param{name: "numa", kind: kBool, optional: true},
		param{name: "agent", kind: kString, optional: true, format: verifyAgent},
		param{name: "boot", kind: kString, optional: true, format: verifyBoot},
		param{name: "bootdisk", kind: kString, optional: true},
		param{name: "onboot", kind: kBool, optional: true},
		param{name: "protection", kind: kBool, optional: true},
		param{name: "template", kind: kBool, optional: true},
		param{name: "kvm", kind: kBool, optional: true},
		param{name: "acpi", kind: kBool, optional: true},
		param{name: "tablet", kind: kBool, optional: true},
		param{name: "localtime", kind: kBool, optional: true},
		param{name: "reboot", kind: kBool, optional: true},
		param{name: "freeze", kind: kBool, optional: true},
		param{name: "ostype", kind: kString, optional: true, enum: []string{"other", "wxp", "w2k", "w2k3", "w2k8", "wvista", "win7", "win8", "win10", "win11", "l24", "l26", "solaris"}},
		param{name: "scsihw", kind: kString, optional: true, enum: []string{"lsi", "lsi53c810", "virtio-scsi-pci", "virtio-scsi-single", "megasas", "pvscsi"}},
		param{name: "bios", kind: kString, optional: true, enum: []string{"seabios", "ovmf"}},
		param{name: "machine", kind: kString, optional: true, maxLen: 40},
		param{name: "vga", kind: kString, optional: true},
		param{name: "smbios1", kind: kString, optional: true, maxLen: 512},
		param{name: "vmgenid", kind: kString, optional: true},
		param{name: "meta", kind: kString, optional: true},
		param{name: "hotplug", kind: kString, optional: true},
		param{name: "startup", kind: kString, optional: true},
		param{name: "hookscript", kind: kString, optional: true},
		param{name: "vmstatestorage", kind: kString, optional: true, format: verifyStorageID},
		param{name: "rng0", kind: kString, optional: true},
		param{name: "citype", kind: kString, optional: true, enum: []string{"configdrive2", "nocloud", "opennebula"}},
		param{name: "ciuser", kind: kString, optional: true},
		param{name: "cipassword", kind: kString, optional: true},
		param{name: "ciupgrade", kind: kBool, optional: true},
		param{name: "cicustom", kind: kString, optional: true, format: verifyCICustom},
		param{name: "sshkeys", kind: kString, optional: true, format: verifySSHKeys},
		param{name: "nameserver", kind: kString, optional: true, format: verifyNameservers},
		param{name: "searchdomain", kind: kString, optional: true},
		param{name: "delete", kind: kString, optional: true, format: verifyConfigIDList},
		param{name: "revert", kind: kString, optional: true, format: verifyConfigIDList},
		param{name: "digest", kind: kString, optional: true, maxLen: 64},
		param{name: "skiplock", kind: kBool, optional: true},
		param{name: "force", kind: kBool, optional: true},
		param{name: "background_delay", kind: kInt, optional: true, min: intPtr(1), max: intPtr(30)},
	)
	s.dynamic = []dynParam{
		// tpmstate0 has a format of its own; lookup takes the first match.
		{re: regexp.MustCompile(`^` + tpmKey + `$`), p: param{kind: kString, optional: true, format: verifyTPMState}},
		{re: driveKeyRE, p: param{kind: kString, optional: true, format: verifyDrive}},
		{re: netKeyRE, p: param{kind: kString, optional: true, format: verifyNet}},
		{re: hostpciRE, p: param{kind: kString, optional: true, format: verifyHostPCI}},
		{re: ipcfgKeyRE, p: param{kind: kString, optional: true, format: verifyIPConfig}},
		{re: unusedRE, p: param{kind: kString, optional: true}},
		{re: serialRE, p: param{kind: kString, optional: true, pattern: regexp.MustCompile(`^(/dev/.+|socket)$`)}},
	}
	return s
}

func verifyMemory(v string) error {
	m := memoryRE.FindStringSubmatch(v)
	if m == nil {
		return fmtErr("format error\ncurrent: type check ('integer') failed - got '%s'", v)
	}
	if n, _ := strconv.Atoi(m[1]); n < 16 {
		return fmtErr("format error\ncurrent: value must have a minimum value of 16")
	}
	return nil
}

// propertyString parses "default,key=value,..." (defaultKey names the
// unnamed first element).
func propertyString(v, defaultKey string) (map[string]string, error) {
	out := map[string]string{}
	for i, part := range strings.Split(v, ",") {
		k, val, ok := strings.Cut(part, "=")
		if !ok {
			if i != 0 || defaultKey == "" {
				return nil, fmtErr("format error\n%s: property is not defined in schema and the schema does not allow additional properties", part)
			}
			k, val = defaultKey, part
		}
		if _, dup := out[k]; dup {
			return nil, fmtErr("format error\n%s: duplicate key in comma-separated list property", k)
		}
		out[k] = val
	}
	return out, nil
}

func verifyAgent(v string) error {
	p, err := propertyString(v, "enabled")
	if err != nil {
		return err
	}
	for k, val := range p {
		switch k {
		case "enabled", "fstrim_cloned_disks", "freeze-fs-on-backup":
			if val != "0" && val != "1" {
				return fmtErr("format error\n%s: type check ('boolean') failed - got '%s'", k, val)
			}
		case "type":
			if val != "virtio" && val != "isa" {
				return fmtErr("format error\ntype: value '%s' does not have a value in the enumeration 'virtio, isa'", val)
			}
		default:
			return fmtErr("format error\n%s: property is not defined in schema and the schema does not allow additional properties", k)
		}
	}
	return nil
}

func agentEnabled(v string) bool {
	p, err := propertyString(v, "enabled")
	return err == nil && p["enabled"] == "1"
}

func verifyBoot(v string) error {
	if legacyBoot.MatchString(v) {
		return nil
	}
	p, err := propertyString(v, "legacy")
	if err != nil {
		return err
	}
	if l, ok := p["legacy"]; ok && !legacyBoot.MatchString(l) {
		return fmtErr("format error\nlegacy: value does not match the regex pattern")
	}
	if o, ok := p["order"]; ok {
		for _, dev := range strings.Split(o, ";") {
			if !driveKeyRE.MatchString(dev) && !netKeyRE.MatchString(dev) && !strings.HasPrefix(dev, "hostpci") && !strings.HasPrefix(dev, "usb") {
				return fmtErr("format error\norder: invalid format - invalid boot device '%s'", dev)
			}
		}
	}
	return nil
}

func verifyDrive(v string) error {
	p, err := propertyString(v, "file")
	if err != nil {
		return err
	}
	file := p["file"]
	if file == "" {
		return fmtErr("format error\nfile: property is missing and it is not optional")
	}
	if file != "none" && file != "cdrom" && !strings.HasPrefix(file, "/dev/") {
		sid, vol, ok := strings.Cut(file, ":")
		if !ok || !storageIDRE.MatchString(sid) || vol == "" {
			return fmtErr("format error\nfile: invalid format - unable to parse volume ID '%s'", file)
		}
	}
	for k, val := range p {
		switch k {
		case "file", "cache", "discard", "iothread", "ssd", "backup", "replicate", "aio", "format", "serial", "import-from", "detect_zeroes", "ro", "snapshot", "shared", "werror", "rerror", "efitype", "pre-enrolled-keys", "version", "wwn", "model":
		case "media":
			if val != "cdrom" && val != "disk" {
				return fmtErr("format error\nmedia: value '%s' does not have a value in the enumeration 'cdrom, disk'", val)
			}
		case "size":
			if !sizeRE.MatchString(val) {
				return fmtErr("format error\nsize: value does not match the regex pattern")
			}
		default:
			return fmtErr("format error\n%s: property is not defined in schema and the schema does not allow additional properties", k)
		}
	}
	return nil
}

func verifyNet(v string) error {
	parts := strings.Split(v, ",")
	model, mac, _ := strings.Cut(parts[0], "=")
	found := false
	for _, m := range netModels {
		found = found || m == model
	}
	if !found {
		return fmtErr("format error\nmodel: value '%s' does not have a value in the enumeration '%s'", model, strings.Join(netModels, ", "))
	}
	if mac != "" && !macRE.MatchString(mac) {
		return fmtErr("format error\nmacaddr: invalid format - value does not look like a valid MAC address")
	}
	for _, part := range parts[1:] {
		k, val, ok := strings.Cut(part, "=")
		if !ok {
			return fmtErr("format error\n%s: property is not defined in schema and the schema does not allow additional properties", part)
		}
		switch k {
		case "bridge":
			if !regexp.MustCompile(`^[-_.\w\d]+$`).MatchString(val) {
				return fmtErr("format error\nbridge: value does not match the regex pattern")
			}
		case "tag":
			n, err := strconv.Atoi(val)
			if err != nil {
				return fmtErr("format error\ntag: type check ('integer') failed - got '%s'", val)
			}
			if n < 1 || n > 4094 {
				return fmtErr("format error\ntag: value must have a minimum value of 1")
			}
		case "macaddr":
			if !macRE.MatchString(val) {
				return fmtErr("format error\nmacaddr: invalid format - value does not look like a valid MAC address")
			}
		case "firewall", "link_down":
			if val != "0" && val != "1" {
				return fmtErr("format error\n%s: type check ('boolean') failed - got '%s'", k, val)
			}
		case "mtu", "queues", "rate", "trunks":
		default:
			return fmtErr("format error\n%s: property is not defined in schema and the schema does not allow additional properties", k)
		}
	}
	return nil
}

func verifyIPConfig(v string) error {
	p, err := propertyString(v, "")
	if err != nil {
		return err
	}
	for k, val := range p {
		switch k {
		case "ip":
			if val == "dhcp" {
				continue
			}
			if ip, _, err := net.ParseCIDR(val); err != nil || ip.To4() == nil {
				return fmtErr("format error\nip: invalid format - value does not look like a valid IPv4 network configuration")
			}
		case "ip6":
			if val == "dhcp" || val == "auto" {
				continue
			}
			if ip, _, err := net.ParseCIDR(val); err != nil || ip.To4() != nil {
				return fmtErr("format error\nip6: invalid format - value does not look like a valid IPv6 network configuration")
			}
		case "gw":
			if ip := net.ParseIP(val); ip == nil || ip.To4() == nil {
				return fmtErr("format error\ngw: invalid format - value does not look like a valid IPv4 address")
			}
		case "gw6":
			if ip := net.ParseIP(val); ip == nil || ip.To4() != nil {
				return fmtErr("format error\ngw6: invalid format - value does not look like a valid IPv6 address")
			}
		default:
			return fmtErr("format error\n%s: property is not defined in schema and the schema does not allow additional properties", k)
		}
	}
	if p["gw"] != "" && (p["ip"] == "" || p["ip"] == "dhcp") {
		return fmtErr("gateway specified without specifying an IP address")
	}
	return nil
}

func verifyNameservers(v string) error {
	for _, ns := range splitList(v) {
		if net.ParseIP(ns) == nil {
			return fmtErr("value does not look like a valid IP address")
		}
	}
	return nil
}

func verifySSHKeys(v string) error {
	if !urlencRE.MatchString(v) {
		return fmtErr("invalid urlencoded string: %s", v)
	}
	if _, err := url.PathUnescape(v); err != nil {
		return fmtErr("invalid urlencoded string: %s", v)
	}
	return nil
}

func verifyCICustom(v string) error {
	p, err := propertyString(v, "")
	if err != nil {
		return err
	}
	for k, val := range p {
		switch k {
		case "user", "network", "meta", "vendor":
			if _, _, ok := strings.Cut(val, ":"); !ok {
				return fmtErr("format error\n%s: invalid format - unable to parse volume ID '%s'", k, val)
			}
		default:
			return fmtErr("format error\n%s: property is not defined in schema and the schema does not allow additional properties", k)
		}
	}
	return nil
}

func verifyConfigIDList(v string) error {
	for _, id := range splitList(v) {
		if !configKeyRE.MatchString(id) {
			return fmtErr("invalid configuration ID '%s'", id)
		}
	}
	return nil
}

// configDigest is the SHA-1 of the serialised config, as qemu-server
// computes over the config file.
func configDigest(conf map[string]string) string {
	h := sha1.New()
	for _, k := range sortedKeys(conf) {
		if k == "description" {
			// The description is written as leading comment lines.
			for _, line := range strings.Split(conf[k], "\n") {
				fmt.Fprintf(h, "#%s\n", line)
			}
			continue
		}
		fmt.Fprintf(h, "%s: %s\n", k, conf[k])
	}
	return hex.EncodeToString(h.Sum(nil))
}

// typedConfig renders a config the way the API returns it.
func typedConfig(conf map[string]string) map[string]any {
	out := make(map[string]any, len(conf)+1)
	for k, v := range conf {
		if intConfigKeys[k] {
			if n, err := strconv.Atoi(v); err == nil {
				out[k] = n
				continue
			}
		}
		out[k] = v
	}
	out["digest"] = configDigest(conf)
	return out
}

// drive is a parsed drive property string.
type drive struct {
	file string
	opts map[string]string
	keys []string // option order
}

func parseDrive(v string) drive {
	d := drive{opts: map[string]string{}}
	for i, part := range strings.Split(v, ",") {
		k, val, ok := strings.Cut(part, "=")
		if !ok && i == 0 {
			d.file = part
			continue
		}
		if k == "file" {
			d.file = val
			continue
		}
		d.opts[k] = val
		d.keys = append(d.keys, k)
	}
	return d
}

func (d drive) String() string {
	parts := []string{d.file}
	for _, k := range d.keys {
		parts = append(parts, k+"="+d.opts[k])
	}
	return strings.Join(parts, ",")
}

func (d *drive) set(k, v string) {
	if _, ok := d.opts[k]; !ok {
		d.keys = append(d.keys, k)
	}
	d.opts[k] = v
}

func (d drive) isCDROM() bool { return d.opts["media"] == "cdrom" }

func (d drive) isCloudInit() bool {
	return strings.HasSuffix(d.file, "-cloudinit") || strings.HasSuffix(d.file, "cloudinit.qcow2")
}

// formatSize renders bytes like qemu-server does in size= options.
func formatSize(b int64) string {
	switch {
	case b%(1<<40) == 0 && b >= 1<<40:
		return fmt.Sprintf("%dT", b>>40)
	case b%(1<<30) == 0:
		return fmt.Sprintf("%dG", b>>30)
	case b%(1<<20) == 0:
		return fmt.Sprintf("%dM", b>>20)
	case b%(1<<10) == 0:
		return fmt.Sprintf("%dK", b>>10)
	}
	return strconv.FormatInt(b, 10)
}

// parseSize reads "32G", "+10G", "512M" or bytes; relative reports a
// leading '+'.
func parseSize(v string) (int64, bool, bool) {
	m := sizeRE.FindStringSubmatch(v)
	if m == nil {
		return 0, false, false
	}
	f, err := strconv.ParseFloat(m[2], 64)
	if err != nil {
		return 0, false, false
	}
	mult := map[string]float64{"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}[m[3]]
	return int64(f * mult), m[1] == "+", true
}

// driveKeys returns the drive keys of a config in a stable order.
func driveKeys(conf map[string]string) []string {
	var keys []string
	for k := range conf {
		if driveKeyRE.MatchString(k) {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	return keys
}

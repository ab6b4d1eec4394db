package proxmoxsim

import (
	"sort"
	"strings"
)

// Proxmox's TPM state drive, as qemu-server describes it
// (src/PVE/QemuServer/Drive.pm: $tpmstate_fmt, $tpmversion_fmt,
// TPMSTATE_DISK_SIZE): "[file=]<volume>[,size=<size>][,version=<v1.2|v2.0>]",
// volume also spelled "volume=", format fixed to raw, version v1.2 when
// absent and never changed after creation. "<storage>:<n>" allocates a new
// volume of 4 MiB whatever n says.
const (
	tpmKey       = "tpmstate0"
	tpmStateSize = 4 << 20
	tpmV12       = "v1.2"
	tpmV20       = "v2.0"
)

// verifyTPMState is the format check of tpmstate0 (PVE::JSONSchema's
// property-string check against $tpmstate_fmt with allocation, which adds
// import-from).
func verifyTPMState(v string) error {
	p, err := propertyString(v, "file")
	if err != nil {
		return err
	}
	if vol, ok := p["volume"]; ok {
		if _, both := p["file"]; both {
			return fmtErr("format error\nfile: duplicate key in comma-separated list property")
		}
		p["file"] = vol
		delete(p, "volume")
	}
	file := p["file"]
	if file == "" {
		return fmtErr("format error\nfile: property is missing and it is not optional")
	}
	if !strings.HasPrefix(file, "/") {
		sid, vol, ok := strings.Cut(file, ":")
		if !ok || !storageIDRE.MatchString(sid) || vol == "" {
			return fmtErr("format error\nfile: invalid format - unable to parse volume ID '%s'", file)
		}
	}
	for k, val := range p {
		switch k {
		case "file", "import-from":
		case "format":
			if !contains([]string{"raw", "qcow", "qed", "qcow2", "vmdk", "cloop"}, val) {
				return fmtErr("format error\nformat: value '%s' does not have a value in the enumeration 'raw, qcow, qed, qcow2, vmdk, cloop'", val)
			}
		case "size":
			if !sizeRE.MatchString(val) {
				return fmtErr("format error\nsize: value does not match the regex pattern")
			}
		case "version":
			if val != tpmV12 && val != tpmV20 {
				return fmtErr("format error\nversion: value '%s' does not have a value in the enumeration 'v1.2, v2.0'", val)
			}
		default:
			return fmtErr("format error\n%s: property is not defined in schema and the schema does not allow additional properties", k)
		}
	}
	return nil
}

// tpmVersion is a tpmstate0 value's version, with Proxmox's default.
func tpmVersion(v string) string {
	if ver := parseDrive(v).opts["version"]; ver != "" {
		return ver
	}
	return tpmV12
}

// checkTPMVersionChange is qemu-server's prohibit_tpm_version_change
// (src/PVE/API2/Qemu.pm): the same volume keeps its version.
func checkTPMVersionChange(old, val string) error {
	if old == "" || parseDrive(old).file != parseDrive(val).file || tpmVersion(old) == tpmVersion(val) {
		return nil
	}
	return serverError("cannot change TPM state version after creation")
}

// printTPMState renders a tpmstate0 value as qemu-server's print_drive
// does: the volume, then the options in key order.
func printTPMState(d drive) string {
	sort.Strings(d.keys)
	return d.String()
}

// TPMState is the content of VM vmid's TPM state volume (its swtpm
// state; nil while no start has manufactured it), and whether the VM has
// a tpmstate0 at all. Tests compare clones' states with it.
func (s *Simulator) TPMState(vmid int) ([]byte, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	v := s.vms[vmid]
	if v == nil || v.conf[tpmKey] == "" {
		return nil, false
	}
	_, vol := s.findVolumeLocked(parseDrive(v.conf[tpmKey]).file, v.node)
	if vol == nil {
		return nil, false
	}
	return append([]byte(nil), vol.data...), true
}

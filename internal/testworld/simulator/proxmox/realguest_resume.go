package proxmoxsim

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	yaml "go.yaml.in/yaml/v3"

	"github.com/hyperfleet/hyperfleet/internal/testworld/simulator/qemu"
)

// GuestState is a GuestImage booted once to the point where it waits for
// its configuration (the guest agent answers; no seed, so cloud-init did
// nothing and no HyperFleet unit runs) and saved there (qemu.SaveState):
// hack/guest-image --state makes it. A clone whose machine matches it and
// whose seed the simulator can apply (resumableSeed) resumes it instead of
// booting: its own overlay backed by Disk, the state loaded from File,
// then its identity and its seed written through the guest agent
// (applySeed). docs/guest-snapshots.md tells the whole story.
type GuestState struct {
	// File is the saved RAM and device state, Disk the disk it belongs
	// to (a qcow2 overlay of the image's disk, never written again).
	File string `json:"file"`
	Disk string `json:"disk"`
	// The machine it was saved on: a resumed QEMU must have the same.
	Cores     int    `json:"cores"`
	MemoryMiB int    `json:"memoryMiB"`
	CPU       string `json:"cpu"`
}

// seedDoc is what a resumed guest is given of its NoCloud seed.
type seedDoc struct {
	userData, metaData, networkConfig []byte
}

// resumeLocked returns the saved state v resumes and v's seed, or nil
// and why v boots cold: the state's machine differs, v has a TPM (its
// device state is not in the saved one), the guests sit on a tap network
// (each needs its lease from the caller's DHCP server, with its own MAC
// from the first packet), or the seed is one cloud-init must read
// (resumableSeed).
func (r *realGuests) resumeLocked(v *vm) (*GuestState, *seedDoc, string) {
	st := v.image.State
	switch {
	case st == nil:
		return nil, nil, ""
	case v.cores() != st.Cores || int(v.memoryMiB()) != st.MemoryMiB || cpuModel(v.conf["cpu"]) != st.CPU:
		return nil, nil, fmt.Sprintf("its machine (%d cores, %d MiB, %s) is not the saved one's", v.cores(), v.memoryMiB(), cpuModel(v.conf["cpu"]))
	case v.conf[tpmKey] != "":
		return nil, nil, "it has a TPM"
	case r.cfg.Network != nil:
		return nil, nil, "its NIC is on a tap network"
	case cloudInitDriveKey(v) != "":
		return nil, nil, "its seed is Proxmox's cloud-init drive, whose rendering is what runs"
	}
	seed, why := r.s.seedLocked(v)
	if seed == nil {
		return nil, nil, why
	}
	if why := resumableSeed(seed); why != "" {
		return nil, nil, why
	}
	return st, seed, ""
}

// seedLocked reads the NoCloud ISO attached to v.
func (s *Simulator) seedLocked(v *vm) (*seedDoc, string) {
	for _, k := range driveKeys(v.conf) {
		d := parseDrive(v.conf[k])
		if !d.isCDROM() || !strings.Contains(d.file, ":iso/") {
			continue
		}
		_, vol := s.findVolumeLocked(d.file, v.node)
		if vol == nil {
			return nil, "its ISO is missing"
		}
		files, err := readISOFiles(vol.data)
		if err != nil {
			return nil, "its ISO is not a NoCloud seed: " + err.Error()
		}
		return &seedDoc{userData: files["user-data"], metaData: files["meta-data"], networkConfig: files["network-config"]}, ""
	}
	return nil, "it has no seed"
}

// resumedKeys are the cloud-config keys applySeed carries out; a seed with
// any other (users, packages, ssh keys, a MIME document or a script) needs
// cloud-init, and a cold boot.
var resumedKeys = map[string]bool{
	"hostname": true, "fqdn": true, "preserve_hostname": true, "manage_etc_hosts": true,
	"bootcmd": true, "write_files": true, "runcmd": true, "ca_certs": true,
}

// caCerts is cloud-init's ca_certs: trusted PEM certificates, with the
// image's public roots removed when RemoveDefaults.
type caCerts struct {
	RemoveDefaults bool     `yaml:"remove_defaults"`
	Trusted        []string `yaml:"trusted"`
}

// resumableSeed says why applySeed cannot carry out seed ("" when it can).
func resumableSeed(seed *seedDoc) string {
	if !strings.HasPrefix(string(seed.userData), "#cloud-config") {
		return "its user-data is not a single cloud-config document"
	}
	var cc map[string]any
	if err := yaml.Unmarshal(seed.userData, &cc); err != nil {
		return "its user-data is not YAML"
	}
	for k := range cc {
		if !resumedKeys[k] {
			return "its cloud-config has " + k
		}
	}
	if ca, ok := cc["ca_certs"].(map[string]any); ok {
		for k := range ca {
			if k != "remove_defaults" && k != "trusted" {
				return "its ca_certs has " + k
			}
		}
	}
	if wf, ok := cc["write_files"].([]any); ok {
		for _, f := range wf {
			if m, ok := f.(map[string]any); ok && (m["append"] == true || m["defer"] == true) {
				return "its write_files append or defer"
			}
		}
	}
	if dhcpOnly(seed.networkConfig) {
		return ""
	}
	return "its network-config is not DHCP on one NIC"
}

// dhcpOnly reports whether a network-config (version 2) configures its
// NICs by DHCPv4 alone: what a resumed guest gets by asking again.
func dhcpOnly(nc []byte) bool {
	if len(nc) == 0 {
		return true
	}
	var doc struct {
		Version   int `yaml:"version"`
		Ethernets map[string]struct {
			DHCP4     bool     `yaml:"dhcp4"`
			DHCP6     bool     `yaml:"dhcp6"`
			Addresses []string `yaml:"addresses"`
		} `yaml:"ethernets"`
	}
	if yaml.Unmarshal(nc, &doc) != nil || doc.Version != 2 || len(doc.Ethernets) != 1 {
		return false
	}
	for _, e := range doc.Ethernets {
		if !e.DHCP4 || e.DHCP6 || len(e.Addresses) > 0 {
			return false
		}
	}
	return true
}

// resumeGuest lets a resumed QEMU run and makes it the VM it is: the
// clock stepped, a machine-id of its own, its MAC and a fresh DHCP lease
// of addr on the VM's network, then the seed's bootcmd, write_files, host name,
// ca_certs and runcmd, in cloud-init's order. Until it returns, the guest agent is
// not reported up, so the operator places nothing in a guest that is not
// yet its VM.
func resumeGuest(ctx context.Context, p *qemu.Process, seed *seedDoc, mac, addr string) error {
	sock := p.Machine.AgentSocket()
	if err := qemu.Resume(ctx, p); err != nil {
		return err
	}
	if err := qemu.WaitAgent(ctx, sock, p.Done()); err != nil {
		return err
	}
	if err := qemu.StepClock(ctx, sock, time.Now()); err != nil {
		return err
	}
	id := make([]byte, 16)
	_, _ = rand.Read(id)
	if err := qemu.AgentWriteFile(ctx, sock, "/etc/machine-id", []byte(hex.EncodeToString(id)+"\n"), 0o444); err != nil {
		return err
	}
	// The saved guest's NIC has the saved machine's MAC and its lease on
	// the saved machine's network (the image's ifupdown asks by DHCP at
	// boot): the VM's own MAC, no address of the saved guest (neither its
	// lease nor the IPv6 address derived from its MAC), and a lease from
	// the VM's own user-mode network, where ifupdown's DHCP client keeps
	// it (its pid and lease files).
	if err := guestSh(ctx, sock, "dhclient -x -pf /run/dhclient.eth0.pid eth0 2>/dev/null; ip link set dev eth0 down && ip addr flush dev eth0 && ip link set dev eth0 address "+mac+
		" && ip link set dev eth0 up && rm -f /var/lib/dhcp/dhclient.eth0.leases"+
		" && dhclient -4 -1 -pf /run/dhclient.eth0.pid -lf /var/lib/dhcp/dhclient.eth0.leases eth0"); err != nil {
		return err
	}
	// The lease must be the VM's address, the one the simulator reports
	// (the saved lease table can hand out another: startLocked).
	if err := guestSh(ctx, sock, `a=$(ip -4 -o addr show dev eth0); case "$a" in *" "`+shQuote(addr+"/")+`*) ;; *) echo "eth0's lease is not `+addr+`: $a" >&2; exit 1 ;; esac`); err != nil {
		return err
	}
	var cc struct {
		Hostname       string  `yaml:"hostname"`
		FQDN           string  `yaml:"fqdn"`
		ManageEtcHosts any     `yaml:"manage_etc_hosts"`
		Bootcmd        []any   `yaml:"bootcmd"`
		Runcmd         []any   `yaml:"runcmd"`
		CACerts        caCerts `yaml:"ca_certs"`
	}
	if err := yaml.Unmarshal(seed.userData, &cc); err != nil {
		return fmt.Errorf("user-data: %w", err)
	}
	if cc.Hostname == "" {
		var md struct {
			LocalHostname string `yaml:"local-hostname"`
		}
		_ = yaml.Unmarshal(seed.metaData, &md)
		cc.Hostname = md.LocalHostname
	}
	// cloud-init's init stage runs bootcmd, write_files, the host name
	// and /etc/hosts, then ca_certs; its final stage runcmd.
	for _, c := range cc.Bootcmd {
		if err := runCloudCmd(ctx, sock, c); err != nil {
			return fmt.Errorf("bootcmd: %w", err)
		}
	}
	if err := writeSeedFiles(ctx, sock, seed.userData); err != nil {
		return err
	}
	if cc.Hostname != "" {
		if err := setHostname(ctx, sock, cc.Hostname, cc.FQDN, cc.ManageEtcHosts != nil && cc.ManageEtcHosts != false); err != nil {
			return err
		}
	}
	if err := trustCerts(ctx, sock, cc.CACerts); err != nil {
		return err
	}
	// cloud-init runs runcmd as one script that goes on after a failed
	// entry; each entry's failure is the guest's to report.
	for _, c := range cc.Runcmd {
		_ = runCloudCmd(ctx, sock, c)
	}
	// Where a booted guest's console says cloud-init finished, for the
	// reader of the console (and the real-guest tests' milestones).
	return guestSh(ctx, sock, "echo \"hyperfleet: resumed from a saved state and configured (no cloud-init) at $(date -u +%FT%TZ)\" > /dev/ttyS0")
}

// ResumedMark is what a resumed guest's console shows once the simulator
// has given it its identity and seed (resumeGuest): a booted guest's
// console shows cloud-init's "finished at" there.
const ResumedMark = "hyperfleet: resumed from a saved state and configured"

func setHostname(ctx context.Context, sock, host, fqdn string, hosts bool) error {
	if err := qemu.AgentWriteFile(ctx, sock, "/etc/hostname", []byte(host+"\n"), 0o644); err != nil {
		return err
	}
	script := "hostname " + shQuote(host)
	if hosts {
		names := host
		if fqdn != "" {
			names = fqdn + " " + host
		}
		script += " && printf '127.0.0.1 localhost\\n127.0.1.1 %s\\n' " + shQuote(names) + " > /etc/hosts"
	}
	return guestSh(ctx, sock, script)
}

// trustCerts carries out ca_certs where the guest's programs read it:
// each certificate where update-ca-certificates takes local ones from,
// and the bundle Debian's OpenSSL, curl and Go read
// (/etc/ssl/certs/ca-certificates.crt) made of them alone
// (remove_defaults) or with them appended. cloud-init runs
// update-ca-certificates, which also rehashes /etc/ssl/certs, forking a
// few processes per root: seconds under emulation that a resumed guest is
// meant to save; nothing in the guests reads the hashed directory.
func trustCerts(ctx context.Context, sock string, ca caCerts) error {
	if len(ca.Trusted) == 0 && !ca.RemoveDefaults {
		return nil
	}
	var bundle strings.Builder
	for i, pem := range ca.Trusted {
		pem = strings.TrimSpace(pem) + "\n"
		bundle.WriteString(pem)
		if err := qemu.AgentWriteFile(ctx, sock, fmt.Sprintf("/usr/local/share/ca-certificates/cloud-init-ca-cert-%d.crt", i+1), []byte(pem), 0o644); err != nil {
			return err
		}
	}
	const store = "/etc/ssl/certs/ca-certificates.crt"
	if ca.RemoveDefaults {
		return qemu.AgentWriteFile(ctx, sock, store, []byte(bundle.String()), 0o644)
	}
	if err := qemu.AgentWriteFile(ctx, sock, "/run/hf-ca.pem", []byte(bundle.String()), 0o644); err != nil {
		return err
	}
	return guestSh(ctx, sock, "cat /run/hf-ca.pem >> "+store+" && rm -f /run/hf-ca.pem")
}

// writeSeedFiles carries out write_files: decoded and laid out as
// cloud-init would (applyWriteFiles, into a scratch root), then each file
// written into the guest with its mode.
func writeSeedFiles(ctx context.Context, sock string, userData []byte) error {
	root, err := os.MkdirTemp("", "hf-seed-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(root)
	if err := applyWriteFiles(userData, root); err != nil {
		return err
	}
	return filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		dst := "/" + filepath.ToSlash(rel)
		if err := guestSh(ctx, sock, "mkdir -p "+shQuote(filepath.Dir(dst))); err != nil {
			return err
		}
		return qemu.AgentWriteFile(ctx, sock, dst, data, fi.Mode())
	})
}

// runCloudCmd runs one bootcmd or runcmd entry: a list is an argv, a
// string a shell command, as cloud-init has them.
func runCloudCmd(ctx context.Context, sock string, c any) error {
	var argv []string
	switch c := c.(type) {
	case string:
		argv = []string{"sh", "-c", c}
	case []any:
		for _, a := range c {
			argv = append(argv, fmt.Sprint(a))
		}
	default:
		return fmt.Errorf("entry %v is neither a string nor a list", c)
	}
	if len(argv) == 0 {
		return nil
	}
	res, err := qemu.AgentExec(ctx, sock, argv...)
	if err != nil {
		return err
	}
	if res.ExitCode != 0 {
		return fmt.Errorf("%s exited %d: %s", strings.Join(argv, " "), res.ExitCode, strings.TrimSpace(res.Stderr))
	}
	return nil
}

func guestSh(ctx context.Context, sock, script string) error {
	return runCloudCmd(ctx, sock, script)
}

func shQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

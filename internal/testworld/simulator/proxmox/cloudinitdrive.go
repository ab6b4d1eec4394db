package proxmoxsim

import (
	"crypto/sha1" //nolint:gosec // qemu-server's instance id is a SHA-1 hex digest; nothing is secured by it
	"encoding/hex"
	"fmt"
	"net"
	"net/url"
	"sort"
	"strconv"
	"strings"
)

// maxSnippetBytes is what qemu-server reads of a cicustom snippet
// (read_cloudinit_snippets_file: file_get_contents with a 1 MiB limit), and
// maxCloudInitBytes what the files of a drive may sum to (its 4 MiB volume
// less the ISO's overhead).
const (
	maxSnippetBytes   = 1 << 20
	maxCloudInitBytes = 3 << 20
)

// PutSnippet places a file in the snippets directory of a file-based
// storage, as a platform admin does on a real node (scp to
// <path>/snippets/): Proxmox's API has no call that writes snippets (its
// upload takes iso, vztmpl and import only, Proxmox bug 2208). The storage
// must allow content snippets; node names the node for a node-local
// storage and is ignored for a shared one. It returns the volume id a
// cicustom option names, "<storage>:snippets/<name>".
func (s *Simulator) PutSnippet(storageID, node, name string, data []byte) (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	st, ok := s.storages[storageID]
	switch {
	case !ok:
		return "", fmt.Errorf("storage '%s' does not exist", storageID)
	case !st.fileBased():
		return "", fmt.Errorf("storage '%s' (type %s) has no directory for snippets", storageID, st.typ)
	case !st.content["snippets"]:
		return "", fmt.Errorf("storage '%s' does not support 'snippets' content", storageID)
	case !st.shared && (node == "" || !st.availableOn(node)):
		return "", fmt.Errorf("storage '%s' is not available on node '%s'", storageID, node)
	case name == "" || normalizeContentFilename(name) != name:
		return "", fmt.Errorf("snippet name %q: use letters, digits, '_', '.' and '-' only", name)
	case len(data) > maxSnippetBytes:
		return "", fmt.Errorf("snippet %s holds %d bytes; qemu-server reads at most %d", name, len(data), maxSnippetBytes)
	}
	volid := storageID + ":snippets/" + name
	scope := st.scope(node)
	s.addVolumeLocked(st, scope, &volume{volid: volid, scope: scope, content: "snippets", format: "snippet",
		size: int64(len(data)), ctime: s.clock.Now().Unix(), data: append([]byte(nil), data...)})
	return volid, nil
}

// nativeCloudInitLocked renders the NoCloud files qemu-server generates
// for v's cloud-init drive when the VM starts (PVE::QemuServer::Cloudinit,
// generate_nocloud): user-data from the VM's name, searchdomain, ciuser,
// cipassword, sshkeys and ciupgrade; network-config (version 1) from each
// netN that has an ipconfigN, with nameserver and searchdomain; meta-data
// with an instance id that changes with them. A cicustom user=, network=
// or meta= snippet replaces the generated file whole (vendor= adds
// vendor-data, else empty), as on Proxmox; a snippet that is missing, a
// volume that is not in a snippets directory, or files over 3 MiB in all
// fail the start with qemu-server's message. Proxmox takes the node's own
// resolv.conf for whichever of nameserver and searchdomain is unset; the
// simulated nodes have no resolver settings, so only the VM's are written.
func (s *Simulator) nativeCloudInitLocked(v *vm) (map[string][]byte, error) {
	custom := map[string]string{}
	if c := v.conf["cicustom"]; c != "" {
		p, err := propertyString(c, "")
		if err != nil {
			return nil, fmt.Errorf("cicustom: %s", strings.TrimSpace(err.Error()))
		}
		custom = p
	}
	files := map[string][]byte{}
	for _, part := range []struct{ key, file string }{{"user", "user-data"}, {"network", "network-config"}, {"meta", "meta-data"}, {"vendor", "vendor-data"}} {
		volid, ok := custom[part.key]
		if !ok {
			continue
		}
		data, err := s.readSnippetLocked(volid, v.node)
		if err != nil {
			return nil, err
		}
		files[part.file] = data
	}
	if _, ok := files["user-data"]; !ok {
		files["user-data"] = []byte(proxmoxUserData(v))
	}
	if _, ok := files["network-config"]; !ok {
		files["network-config"] = []byte(proxmoxNetworkConfig(v.conf))
	}
	if _, ok := files["vendor-data"]; !ok {
		// Written empty when no snippet gives it.
		files["vendor-data"] = []byte{}
	}
	if _, ok := files["meta-data"]; !ok {
		files["meta-data"] = []byte(proxmoxMetaData(files["user-data"], files["network-config"]))
	}
	total := 0
	for _, f := range files {
		total += len(f)
	}
	if total > maxCloudInitBytes {
		return nil, fmt.Errorf("Cloud-Init sum of snippets too big (> 3 MiB)") //nolint:staticcheck,revive // ST1005/error-strings: qemu-server's own message, verbatim in the task
	}
	return files, nil
}

// proxmoxMetaData is the generated meta-data: qemu-server's instance id is
// a digest of the user-data and network-config, so a changed config is a
// new instance to cloud-init.
func proxmoxMetaData(userData, networkConfig []byte) string {
	sum := sha1.Sum(append(append([]byte(nil), userData...), networkConfig...)) //nolint:gosec // see the import
	return "instance-id: " + hex.EncodeToString(sum[:]) + "\n"
}

// handleCloudInitDump is GET .../cloudinit/dump (qm cloudinit dump): the
// file qemu-server generates from the VM's fields, type user, network or
// meta. Like Proxmox it ignores cicustom: it shows what the snippets
// replace, a starting point for writing one.
func (s *Simulator) handleCloudInitDump(q *apiRequest) (any, error) {
	v, err := s.vmOnNodeLocked(q)
	if err != nil {
		return nil, err
	}
	user, network := proxmoxUserData(v), proxmoxNetworkConfig(v.conf)
	switch q.str("type") {
	case "user":
		return user, nil
	case "network":
		return network, nil
	}
	return proxmoxMetaData([]byte(user), []byte(network)), nil
}

// readSnippetLocked reads a cicustom volume as read_cloudinit_snippets_file
// does: it must be a snippets volume and exist.
func (s *Simulator) readSnippetLocked(volid, node string) ([]byte, error) {
	sid, name, ok := strings.Cut(volid, ":")
	if !ok || !strings.HasPrefix(name, "snippets/") {
		return nil, fmt.Errorf("%s is not in the snippets directory", volid)
	}
	st := s.storages[sid]
	if st == nil {
		return nil, fmt.Errorf("storage '%s' does not exist", sid)
	}
	_, vol := s.findVolumeLocked(volid, node)
	if vol == nil || vol.content != "snippets" {
		return nil, fmt.Errorf("can't open '%s' - No such file or directory", st.volumePath(volid))
	}
	return vol.data, nil
}

// proxmoxUserData is qemu-server's cloudinit_userdata.
func proxmoxUserData(v *vm) string {
	host, fqdn := proxmoxHostname(v)
	var b strings.Builder
	b.WriteString("#cloud-config\nhostname: " + host + "\nmanage_etc_hosts: true\nfqdn: " + fqdn + "\n")
	user, hasUser := v.conf["ciuser"]
	if hasUser {
		b.WriteString("user: " + user + "\n")
		if user == "root" {
			b.WriteString("disable_root: False\n")
		}
	}
	if pw, ok := v.conf["cipassword"]; ok {
		b.WriteString("password: " + pw + "\n")
	}
	if k, ok := v.conf["sshkeys"]; ok {
		keys, _ := url.PathUnescape(k)
		b.WriteString("ssh_authorized_keys:\n")
		for _, line := range strings.Split(keys, "\n") {
			if strings.TrimSpace(line) != "" {
				b.WriteString("  - " + line + "\n")
			}
		}
	}
	b.WriteString("chpasswd:\n  expire: False\n")
	if !hasUser || user != "root" {
		b.WriteString("users:\n  - default\n")
	}
	if up, ok := v.conf["ciupgrade"]; !ok || up == "1" {
		b.WriteString("package_upgrade: true\n")
	}
	return b.String()
}

// proxmoxHostname is qemu-server's get_hostname_fqdn: the VM's name (or
// VM<id>); a dotted name is the FQDN and its first label the host name,
// else the FQDN is the name plus the searchdomain value as written, or the
// name alone.
func proxmoxHostname(v *vm) (string, string) {
	host, ok := v.conf["name"]
	if !ok {
		host = "VM" + strconv.Itoa(v.vmid)
	}
	if first, _, ok := strings.Cut(host, "."); ok {
		return first, host
	}
	if sd := v.conf["searchdomain"]; sd != "" {
		return host, host + "." + sd
	}
	return host, host
}

// proxmoxNetworkConfig is qemu-server's nocloud_network: only the NICs
// that have an ipconfigN are configured.
func proxmoxNetworkConfig(conf map[string]string) string {
	var b strings.Builder
	b.WriteString("version: 1\nconfig:\n")
	var ids []int
	for k := range conf {
		if n, ok := strings.CutPrefix(k, "net"); ok {
			if id, err := strconv.Atoi(n); err == nil && conf["ipconfig"+n] != "" {
				ids = append(ids, id)
			}
		}
	}
	sort.Ints(ids)
	const i = "    "
	for _, id := range ids {
		ipc, _ := propertyString(conf["ipconfig"+strconv.Itoa(id)], "")
		fmt.Fprintf(&b, "%s- type: physical\n%s  name: eth%d\n%s  mac_address: '%s'\n%s  subnets:\n", i, i, id, i, strings.ToLower(macOf(conf["net"+strconv.Itoa(id)])), i)
		const j = i + "  "
		switch ip := ipc["ip"]; {
		case ip == "dhcp":
			b.WriteString(j + "- type: dhcp4\n")
		case ip != "":
			addr, ipnet, err := net.ParseCIDR(ip)
			if err == nil {
				fmt.Fprintf(&b, "%s- type: static\n%s  address: '%s'\n%s  netmask: '%s'\n", j, j, addr, j, net.IP(ipnet.Mask))
				if gw := ipc["gw"]; gw != "" {
					fmt.Fprintf(&b, "%s  gateway: '%s'\n", j, gw)
				}
			}
		}
		switch ip6 := ipc["ip6"]; ip6 {
		case "":
		case "dhcp":
			b.WriteString(j + "- type: dhcp6\n")
		case "auto":
			b.WriteString(j + "- type: ipv6_slaac\n")
		default:
			fmt.Fprintf(&b, "%s- type: static6\n%s  address: '%s'\n", j, j, ip6)
			if gw := ipc["gw6"]; gw != "" {
				fmt.Fprintf(&b, "%s  gateway: '%s'\n", j, gw)
			}
		}
	}
	// get_dns_conf's lists are always there (the node's settings fill in),
	// so the entry is too, even empty; qemu-server splits on whitespace.
	b.WriteString(i + "- type: nameserver\n")
	for _, l := range []struct {
		key  string
		vals []string
	}{{"address", strings.Fields(conf["nameserver"])}, {"search", strings.Fields(conf["searchdomain"])}} {
		if len(l.vals) == 0 {
			continue
		}
		b.WriteString(i + "  " + l.key + ":\n")
		for _, a := range l.vals {
			fmt.Fprintf(&b, "%s  - '%s'\n", i, a)
		}
	}
	return b.String()
}

// cloudInitDriveKey is the config key of v's Proxmox cloud-init drive, ""
// without one.
func cloudInitDriveKey(v *vm) string {
	for _, k := range driveKeys(v.conf) {
		if parseDrive(v.conf[k]).isCloudInit() {
			return k
		}
	}
	return ""
}

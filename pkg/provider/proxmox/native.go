package proxmox

import (
	"errors"
	"net/netip"
	"net/url"
	"regexp"
	"slices"
	"strings"

	"github.com/hyperfleet/hyperfleet/pkg/provider"
)

// fieldDriveStorage is the template field that names the storage of
// Proxmox's cloud-init drive.
const fieldDriveStorage = "spec.cloudInit.proxmox.driveStorage"

// nativeKeys are the config fields of Proxmox's cloud-init drive that a
// native spec (provider.VMSpec.Native) decides: one the spec leaves empty
// is deleted from the clone, so that a template's own value (its ciuser,
// its cicustom) never reaches a VM the spec did not ask for it.
var nativeKeys = []string{"ipconfig0", "nameserver", "searchdomain", "ciuser", "sshkeys", "cicustom"}

// cloudInitSlot returns the key of the config's Proxmox cloud-init drive
// ("ide2: local-lvm:vm-123-cloudinit,media=cdrom"), "" if none.
func (c vmConfig) cloudInitSlot() string {
	for _, k := range c.drives() {
		if d := parseDrive(c[k]); d.cloudInit() && !strings.HasSuffix(d.file, ".iso") {
			return k
		}
	}
	return ""
}

// nativeConfig adds to body the config of Proxmox's own cloud-init drive
// for n (qemu-server's PVE::QemuServer::Cloudinit generates the NoCloud
// files from it at every start; docs/cloud-init.md, "Delivery"): the
// drive itself when the clone has none, citype nocloud, ipconfig0,
// nameserver, searchdomain, ciuser, sshkeys, cicustom and ciupgrade off.
// The host name is
// the VM's name, which configBody sets; with a search domain Proxmox
// makes the FQDN of the two.
func nativeConfig(body map[string]any, n *provider.NativeCloudInit, cfg vmConfig) error {
	if cfg.cloudInitSlot() == "" {
		slot, ok := cfg.chooseISOSlot()
		if !ok {
			return provider.Errorf(provider.ClassConfiguration, "NoFreeIDESlot",
				"%s: every IDE slot of the template is a disk; free one (ide0-ide3) for Proxmox's cloud-init drive", fieldTemplateID)
		}
		storage := n.Storage
		if storage == "" {
			key, _ := cfg.bootDisk()
			storage = parseDrive(cfg[key]).storage()
		}
		if storage == "" {
			return provider.Errorf(provider.ClassConfiguration, "NoCloudInitStorage",
				"%s: the template has no boot disk whose storage could hold the cloud-init drive; name a storage with images content", fieldDriveStorage)
		}
		body[slot] = storage + ":cloudinit"
	}
	body["citype"] = "nocloud"
	// Proxmox's drive upgrades every package at first boot unless told
	// not to (ciupgrade defaults to 1): slow, needs a mirror, and makes
	// two VMs of one template differ. The image decides its packages, as
	// it does under the NoCloud ISO.
	body["ciupgrade"] = 0
	set := map[string]string{
		"ipconfig0":    ipConfig(n),
		"nameserver":   strings.Join(n.Nameservers, " "),
		"searchdomain": first(n.SearchDomains),
		"ciuser":       n.User,
		"sshkeys":      sshKeysParam(n.SSHAuthorizedKeys),
		"cicustom":     ciCustom(n),
	}
	var del []string
	for _, k := range nativeKeys {
		switch v := set[k]; {
		case v != "":
			body[k] = v
		case cfg[k] != "":
			del = append(del, k)
		}
	}
	if len(del) > 0 {
		body["delete"] = strings.Join(del, ",")
	}
	return nil
}

// first is the first of list, "" for none. Proxmox's searchdomain is both
// the resolver's search list and what completes the VM's name to its FQDN
// (qemu-server's get_hostname_fqdn appends the value as written), so it
// can carry one domain only: two would make the FQDN "name.a b".
func first(list []string) string {
	if len(list) == 0 {
		return ""
	}
	return list[0]
}

// ipConfig is the ipconfig0 value: "ip=dhcp", "ip=192.0.2.10/24,gw=192.0.2.1",
// with ip6= and gw6= for IPv6.
func ipConfig(n *provider.NativeCloudInit) string {
	var parts []string
	add := func(k, v string) {
		if v != "" {
			parts = append(parts, k+"="+v)
		}
	}
	add("ip", n.IPv4)
	if n.IPv4 != "dhcp" {
		add("gw", n.Gateway4)
	}
	add("ip6", n.IPv6)
	if n.IPv6 != "dhcp" && n.IPv6 != "auto" {
		add("gw6", n.Gateway6)
	}
	return strings.Join(parts, ",")
}

// sshKeysParam is the sshkeys value: the keys one per line, URI-escaped as
// qemu-server unescapes it (uri_unescape: a space is %20, never '+').
func sshKeysParam(keys []string) string {
	keys = slices.DeleteFunc(slices.Clone(keys), func(k string) bool { return strings.TrimSpace(k) == "" })
	if len(keys) == 0 {
		return ""
	}
	return strings.ReplaceAll(url.QueryEscape(strings.Join(keys, "\n")), "+", "%20")
}

// ciCustom is the cicustom value naming n's snippets.
func ciCustom(n *provider.NativeCloudInit) string {
	var parts []string
	if n.UserData != "" {
		parts = append(parts, "user="+n.UserData)
	}
	if n.VendorData != "" {
		parts = append(parts, "vendor="+n.VendorData)
	}
	return strings.Join(parts, ",")
}

// checkNative rejects native fields Proxmox would reject or misread,
// before any call: a value with a comma or a newline would add options or
// keys of its own to the config.
func checkNative(n *provider.NativeCloudInit, bad func(field, format string, args ...any) error) error {
	addr := func(field, v string, words ...string) error {
		if v == "" || slices.Contains(words, v) {
			return nil
		}
		if _, err := netip.ParsePrefix(v); err != nil {
			return bad(field, "%q is neither %s nor an address with its prefix length", v, strings.Join(words, " nor "))
		}
		return nil
	}
	gw := func(field, v string) error {
		if _, err := netip.ParseAddr(v); v != "" && err != nil {
			return bad(field, "%q is not an IP address", v)
		}
		return nil
	}
	if err := errors.Join(addr("spec.network (ipv4)", n.IPv4, "dhcp"), gw("spec.network (gateway4)", n.Gateway4),
		addr("spec.network (ipv6)", n.IPv6, "dhcp", "auto"), gw("spec.network (gateway6)", n.Gateway6)); err != nil {
		return err
	}
	for _, ns := range n.Nameservers {
		if _, err := netip.ParseAddr(ns); err != nil {
			return bad("spec.dns.servers", "%q is not an IP address", ns)
		}
	}
	for _, d := range n.SearchDomains {
		if !dnsNameRE.MatchString(d) {
			return bad("spec.dns.domain", "%q is not a DNS name", d)
		}
	}
	if n.User != "" && !ciUserRE.MatchString(n.User) {
		return bad("spec.cloudInit.proxmox.user", "%q is not a user name (lower-case letters, digits, '_' and '-')", n.User)
	}
	for _, k := range n.SSHAuthorizedKeys {
		if strings.ContainsAny(k, "\r\n") {
			return bad("spec.cloudInit.proxmox.sshAuthorizedKeys", "a key spans lines; give one key per entry")
		}
	}
	for field, v := range map[string]string{"spec.cloudInit.proxmox.vendorSnippet": n.VendorData, "spec.cloudInit.proxmox.userSnippet": n.UserData} {
		if v != "" && !snippetRE.MatchString(v) {
			return bad(field, "%q is not a snippet volume (<storage>:snippets/<file>)", v)
		}
	}
	return nil
}

var (
	ciUserRE  = regexp.MustCompile(`^[a-z_][a-z0-9_-]{0,31}$`)
	snippetRE = regexp.MustCompile(`^[a-zA-Z][-_a-zA-Z0-9]*:snippets/[a-zA-Z0-9_][-_.a-zA-Z0-9]*$`)
)

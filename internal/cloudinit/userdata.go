package cloudinit

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"mime"
	"mime/multipart"
	"net/mail"
	"strings"
	"unicode/utf8"

	yaml "go.yaml.in/yaml/v3"

	"github.com/hyperfleet/hyperfleet/internal/agentconfig"
)

// Where the operator's cloud-config puts and starts the agent.
const (
	// AgentConfigPath is the agent's config file (mode 0600, owner root).
	AgentConfigPath = agentconfig.Path
	// AgentUnitName is the systemd unit that runs the agent.
	AgentUnitName = "hyperfleet-agent.service"
	// AgentUnitPath is where the operator writes that unit.
	AgentUnitPath = "/etc/systemd/system/" + AgentUnitName
	// AgentBinary is where the image must have the agent (or where a
	// user's cloud-config must put it, see BootstrapServiceURL), and where
	// FetchAgentPath installs it when Vars.AgentDownloadURL is set.
	AgentBinary = "/usr/local/bin/hyperfleet-agent"
	// FetchAgentPath is the script that downloads and verifies the agent
	// (Vars.AgentDownloadURL set).
	FetchAgentPath = "/usr/local/lib/hyperfleet/fetch-agent.sh"
	// AgentCAPath is the CA bundle the VM trusts for the agent download
	// (Vars.AgentCA set).
	AgentCAPath = "/etc/hyperfleet/agent-ca.pem"
)

// MergeType is the Merge-Type header of the operator's part in a MIME
// multipart user-data. cloud-init merges it into the user's cloud-config
// parts the way mergeCloudConfig merges a #cloud-config: keys the user set
// stay, lists are appended, mappings are merged recursively.
const MergeType = "dict(no_replace,recurse_list)+list(append)+str()"

// operatorPolicy is the merge policy for the operator's part.
var operatorPolicy = &mergePolicy{
	reserved: map[string]string{
		"hostname":          "HyperFleet sets the host name of each VM (the claim's name)",
		"fqdn":              "HyperFleet sets the FQDN of each VM from the DNS domain",
		"preserve_hostname": "HyperFleet sets the host name of each VM",
		"power_state":       "HyperFleet powers the VM off when its job ends; power_state would stop or reboot it before the runner starts",
	},
	defaults:   map[string]bool{"manage_etc_hosts": true},
	ownedPaths: map[string]bool{AgentConfigPath: true, AgentUnitPath: true, FetchAgentPath: true, AgentCAPath: true},
}

// fetchAgentScript downloads the agent, checks its SHA-256 and installs it
// atomically: DEST is replaced only by a file with the expected checksum,
// and is left as it was on any failure (the runcmd entry that runs it
// decides what a failure means, see fetchAgentCommand). POSIX sh, curl,
// coreutils: nothing the template guide does not require. Tests run it
// against the agent server.
const fetchAgentScript = `#!/bin/sh
# HyperFleet: download the agent, check its SHA-256, install it.
# Usage: fetch-agent.sh URL SHA256 DEST [CAFILE]
# DEST is replaced (atomically, mode 0755) only by a file whose SHA-256 is
# SHA256; on any failure it is left as it was and the exit status is 1
# (2 for bad arguments). Written by the HyperFleet operator's cloud-init.
set -eu
me=hyperfleet-fetch-agent
if [ "$#" -lt 3 ] || [ "$#" -gt 4 ]; then
    echo "usage: $0 URL SHA256 DEST [CAFILE]" >&2
    exit 2
fi
url=$1 want=$2 dest=$3 ca=${4:-}
case $url in
https://*) ;;
*) echo "$me: refusing $url: not an https:// URL" >&2; exit 2 ;;
esac
case $want in
*[!0-9a-f]*) echo "$me: the expected SHA-256 $want is not lower-case hex" >&2; exit 2 ;;
esac
if [ "${#want}" -ne 64 ]; then
    echo "$me: the expected SHA-256 $want does not have 64 hex digits" >&2
    exit 2
fi
dir=$(dirname -- "$dest")
mkdir -p -- "$dir"
# The download goes next to DEST so that the final mv is an atomic rename.
tmp=$(mktemp "$dir/.hyperfleet-agent.XXXXXX")
trap 'rm -f -- "$tmp"' EXIT
trap 'exit 1' HUP INT TERM
set -- --fail --silent --show-error --location --retry 5 --retry-connrefused \
    --connect-timeout 10 --max-time 300 --proto =https --proto-redir =https --output "$tmp"
if [ -n "$ca" ]; then
    set -- "$@" --cacert "$ca"
fi
curl "$@" --url "$url" || {
    echo "$me: downloading $url failed (curl exit status $?)" >&2
    exit 1
}
got=$(sha256sum -- "$tmp" | cut -d ' ' -f 1)
if [ "$got" != "$want" ]; then
    echo "$me: checksum mismatch for $url: expected sha256 $want, got $got; not installing it" >&2
    exit 1
fi
chmod 0755 -- "$tmp"
mv -f -- "$tmp" "$dest"
echo "$me: installed $dest (sha256 $want)"
`

// fetchAgentCommand is the runcmd entry that installs the agent: the
// script's arguments are passed as sh's positional parameters, never
// spliced into code. A failed download removes AgentBinary, so that no
// binary but the operator's can run (an image may still have an older
// one), and powers the VM off at once when the VM powers off on finish,
// so the operator replaces it; runcmd runs its entries one after the
// other whatever their status, so the unit is still started and fails on
// the missing binary, which FailureAction=poweroff turns into a power-off
// too. Without powerOff the VM stays up, the unit failed, for inspection.
func fetchAgentCommand(v *Vars) []string {
	onFailure := `rm -f -- "$3"; echo "hyperfleet: the agent could not be installed; powering the VM off so that the operator replaces it" >&2; systemctl poweroff; exit 1`
	if !v.PowerOffOnFinish {
		onFailure = `rm -f -- "$3"; echo "hyperfleet: the agent could not be installed; its unit will fail" >&2; exit 1`
	}
	script := FetchAgentPath + ` "$@" || { ` + onFailure + `; }`
	if p := v.proxy(); p != nil {
		// runcmd's environment is cloud-init's: the proxy reaches curl
		// only this way (the agent server itself is in no_proxy). The
		// values are checked to need no quoting but the single quotes.
		var exports []string
		for _, kv := range p.Env() {
			k, val, _ := strings.Cut(kv, "=")
			exports = append(exports, k+"='"+val+"'")
		}
		script = "export " + strings.Join(exports, " ") + "; " + script
	}
	cmd := []string{"sh", "-c", script, "hyperfleet-fetch-agent",
		v.AgentDownloadURL, v.AgentSHA256, AgentBinary}
	if v.AgentCA != "" {
		cmd = append(cmd, AgentCAPath)
	}
	return cmd
}

// DHCPClientIDConf is the DHCP client's configuration file that
// clientIdentifier hostname, requestStaticLease and leaseTime append their
// send statements to: isc-dhcp-client's, which ifupdown runs for "iface
// eth0 inet dhcp", cloud-init's rendering on Debian 12 (docs/cloud-init.md).
const DHCPClientIDConf = "/etc/dhcp/dhclient.conf"

// dhcpClientScript makes the DHCP client send what the template asks (its
// arguments, one dhclient.conf statement each): cloud-init's network config
// cannot say so, and the first lease was taken before any user-data module
// ran (networking.service precedes cloud-init's network stage). So it
// releases that lease, keyed on the default identifier, appends the
// statements, and asks again. Idempotent: on a later boot the statements
// are there and the first lease already carried them.
const dhcpClientScript = `conf=` + DHCPClientIDConf + `
missing=
for line; do grep -qxF "$line" "$conf" 2>/dev/null || missing=1; done
[ -n "$missing" ] || exit 0
if ! command -v dhclient >/dev/null || ! command -v ifup >/dev/null; then
    echo "hyperfleet: network.dhcp clientIdentifier hostname, requestStaticLease and leaseTime need ifupdown and isc-dhcp-client in the image (docs/cloud-init.md)" >&2
    exit 1
fi
ifdown ` + InterfaceName + `
for line; do grep -qxF "$line" "$conf" 2>/dev/null || echo "$line" >>"$conf"; done
ifup ` + InterfaceName

// dhcpClientStatements are the dhclient.conf statements v's DHCP settings
// need, none when the image's defaults do: the host name as client
// identifier (option 61, as its bytes: what dnsmasq's id:<name> and ISC
// dhcpd's dhcp-client-identifier "<name>" match), the host name (option
// 12) named explicitly for a reservation by name, whatever the image's
// default send host-name says, and the lease time (option 51).
func dhcpClientStatements(v *Vars) []string {
	if v.NetworkMode != NetworkDHCP {
		return nil
	}
	var lines []string
	if v.DHCPClientIdentifier == DHCPIdentifierHostname {
		lines = append(lines, fmt.Sprintf("send dhcp-client-identifier %q;", v.Hostname))
	}
	if v.RequestStaticLease {
		lines = append(lines, fmt.Sprintf("send host-name %q;", v.Hostname))
	}
	if v.DHCPLeaseSeconds > 0 {
		lines = append(lines, fmt.Sprintf("send dhcp-lease-time %d;", v.DHCPLeaseSeconds))
	}
	return lines
}

// agentUnit is the systemd unit that runs the agent. After=cloud-final
// makes it start once cloud-init has finished everything, the user's
// runcmd and scripts included, even though runcmd queues it earlier.
func agentUnit(powerOff bool) string { return agentUnitAt(AgentConfigPath, powerOff) }

// agentUnitAt is the agent's unit reading its configuration from config.
func agentUnitAt(config string, powerOff bool) string {
	var b strings.Builder
	b.WriteString(`[Unit]
Description=HyperFleet agent: runs one CI job, then powers the VM off
Wants=network-online.target
After=network-online.target cloud-final.service
ConditionPathExists=` + config + `

[Service]
Type=exec
ExecStart=` + AgentBinary + ` --config ` + config + `
Restart=no
`)
	if powerOff {
		b.WriteString("# The agent powers the VM off itself; these stop the VM however it ends.\nSuccessAction=poweroff\nFailureAction=poweroff\n")
	}
	return b.String()
}

// agentConfig builds the agent's config file from v.
func agentConfig(v *Vars) *agentconfig.Config {
	c := &agentconfig.Config{
		Version:         agentconfig.CurrentVersion,
		Platform:        agentconfig.Platform(v.Platform),
		WorkloadMethod:  agentconfig.WorkloadMethod(v.WorkloadMethod),
		BootstrapMethod: agentconfig.BootstrapMethod(v.BootstrapMethod),
		RegistrationURL: v.RegistrationURL,
		Runner: agentconfig.Runner{
			Name:   v.RunnerName,
			Labels: []string(v.Labels),
			Group:  v.RunnerGroup,
			// The job a VM was made for, on a platform that binds VMs to
			// jobs (agentconfig.PlatformSpec.BindsJob).
			AcquireJob: v.AcquireJob,
			Software: agentconfig.Software{
				DownloadURL:    v.RunnerConfig.DownloadURL,
				DownloadSHA256: v.RunnerConfig.DownloadSHA256,
				InstallPath:    v.RunnerConfig.InstallPath,
				WorkDir:        v.RunnerConfig.WorkDir,
				ConfigScript:   v.RunnerConfig.ConfigScript,
				RunScript:      v.RunnerConfig.RunScript,
				OS:             v.RunnerConfig.OS,
				Arch:           v.RunnerConfig.Arch,
			},
		},
		ExpiresAt:        v.ExpiresAt.Time,
		PowerOffOnFinish: v.PowerOffOnFinish,
		PowerOffNotify:   v.PowerOffNotify,
		Proxy:            v.proxy(),
		JobMayEscalate:   v.JobMayEscalate,
	}
	if spec, ok := v.platformSpec(); ok {
		// The platform's own shape: what its runner does not take goes.
		c.Platform = spec.Platform
		if spec.Shape != nil {
			spec.Shape(c)
		}
	}
	if v.Platform == PlatformGeneric {
		c.Platform, c.BootstrapMethod, c.RegistrationURL = agentconfig.PlatformGeneric, "", ""
		c.Runner = agentconfig.Runner{Software: agentconfig.Software{WorkDir: v.RunnerConfig.WorkDir}}
		c.Generic = &agentconfig.Generic{Script: v.GenericScript, User: v.ScriptUser, Claim: v.Claim, Deadline: v.Deadline.Time}
	}
	if v.receivesSecrets() {
		// Only where they arrive and until when: the secrets themselves
		// reach the running VM through the hypervisor's guest channel,
		// never this file.
		c.SecretsFile, c.SecretsDeadline = agentconfig.SecretsFile, v.SecretsDeadline.Time
	}
	if v.GuestOS == GuestWindows {
		c.Runner.Software = windowsRunnerSoftware(c.Runner.Software)
		if c.SecretsFile != "" {
			c.SecretsFile = agentconfig.WindowsSecretsFile
		}
	}
	if v.SPIFFEEnabled {
		c.SPIFFE = &agentconfig.SPIFFE{
			AttestationMethod: agentconfig.AttestationMethod(v.AttestationMethod),
			TPMDevicePath:     v.TPMDevicePath,
			SPIFFEID:          v.SPIFFEID,
			TrustDomain:       v.TrustDomain,
			TrustBundle:       v.TrustBundle,
			ServerAddress:     v.SPIREServerAddress,
			BrokerURL:         v.BrokerURL,
			BrokerCA:          v.BrokerCA,
		}
		if v.SecretStore != nil {
			store := *v.SecretStore
			store.Role, store.Path, store.CABundle = v.SecretStoreRole, v.SecretStorePath, v.SecretStoreCA
			c.SPIFFE.SecretStore = &store
		}
	}
	return c
}

// agentConfigFile is the agent's config file for v (agentConfig), checked
// unless v is canonical: per-VM values are empty there, and the drift hash
// renders it all the same.
func agentConfigFile(v *Vars) ([]byte, error) {
	cfg := agentConfig(v)
	if !v.canonical {
		if err := cfg.Validate(); err != nil {
			return nil, fmt.Errorf("vars: the agent config they produce is invalid: %w", err)
		}
	}
	return cfg.Marshal()
}

// operatorCloudConfig is the operator's cloud-config as a YAML mapping.
func operatorCloudConfig(v *Vars) (*yaml.Node, error) {
	js, err := agentConfigFile(v)
	if err != nil {
		return nil, err
	}
	str := func(s string) *yaml.Node { return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: s} }
	boolean := func(b bool) *yaml.Node {
		return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!bool", Value: fmt.Sprint(b)}
	}
	mapping := func(kv ...any) *yaml.Node {
		m := &yaml.Node{Kind: yaml.MappingNode, Tag: "!!map"}
		for i := 0; i < len(kv); i += 2 {
			val, ok := kv[i+1].(*yaml.Node)
			if !ok {
				val = str(kv[i+1].(string))
			}
			m.Content = append(m.Content, str(kv[i].(string)), val)
		}
		return m
	}
	seq := func(items ...*yaml.Node) *yaml.Node {
		return &yaml.Node{Kind: yaml.SequenceNode, Tag: "!!seq", Content: items}
	}
	flow := func(items ...string) *yaml.Node {
		s := seq()
		s.Style = yaml.FlowStyle
		for _, it := range items {
			s.Content = append(s.Content, str(it))
		}
		return s
	}
	literal := func(s string) *yaml.Node {
		n := str(s)
		n.Style = yaml.LiteralStyle
		return n
	}

	root := mapping()
	if v.Hostname != "" {
		root.Content = append(root.Content, str("hostname"), str(v.Hostname))
	}
	if v.FQDN != "" {
		root.Content = append(root.Content, str("fqdn"), str(v.FQDN))
	}
	files := seq(
		mapping("path", AgentConfigPath, "owner", "root:root", "permissions", quoted("0600"), "content", literal(string(js))),
		mapping("path", AgentUnitPath, "owner", "root:root", "permissions", quoted("0644"), "content", literal(agentUnit(v.PowerOffOnFinish))),
	)
	// --no-block: the unit is ordered after cloud-final.service, which
	// runs this runcmd; waiting here would deadlock.
	runcmd := seq(
		flow("systemctl", "daemon-reload"),
		flow("systemctl", "start", "--no-block", AgentUnitName),
	)
	if p := v.proxy(); p != nil {
		files.Content = append(files.Content,
			mapping("path", ProxyProfilePath, "owner", "root:root", "permissions", quoted("0644"), "content", literal(proxyProfile(p))),
			mapping("path", ProxyAptPath, "owner", "root:root", "permissions", quoted("0644"), "content", literal(proxyApt(p))))
	}
	if v.AgentDownloadURL != "" {
		if v.AgentCA != "" {
			files.Content = append(files.Content,
				mapping("path", AgentCAPath, "owner", "root:root", "permissions", quoted("0644"), "content", literal(v.AgentCA)))
		}
		files.Content = append(files.Content,
			mapping("path", FetchAgentPath, "owner", "root:root", "permissions", quoted("0755"), "content", literal(fetchAgentScript)))
		// First: the agent must be in place before its unit can start.
		fetch := flow(fetchAgentCommand(v)...)
		for _, n := range fetch.Content {
			if n.Value == v.AgentSHA256 {
				n.Style = yaml.SingleQuotedStyle // hex digits alone would be a YAML number
			}
		}
		runcmd.Content = append([]*yaml.Node{fetch}, runcmd.Content...)
	}
	root.Content = append(root.Content,
		str("preserve_hostname"), boolean(false),
		str("manage_etc_hosts"), boolean(true),
	)
	// bootcmd: the first module of cloud-init's network stage.
	bootcmd := seq()
	if lines := dhcpClientStatements(v); len(lines) > 0 {
		// So that the address changes before anything else uses it.
		cmd := seq(str("sh"), str("-c"), literal(dhcpClientScript), str("hyperfleet-dhcp-client"))
		for _, l := range lines {
			cmd.Content = append(cmd.Content, str(l))
		}
		bootcmd.Content = append(bootcmd.Content, cmd)
	}
	if v.receivesSecrets() {
		// The directory the secrets arrive in (agentconfig.SecretsDir),
		// root's alone before the operator can write into it: the guest
		// agent creates the file itself world-readable.
		bootcmd.Content = append(bootcmd.Content, flow("install", "-d", "-m", "0700", "-o", "root", "-g", "root", agentconfig.SecretsDir))
	}
	if len(bootcmd.Content) > 0 {
		root.Content = append(root.Content, str("bootcmd"), bootcmd)
	}
	root.Content = append(root.Content,
		str("write_files"), files,
		str("runcmd"), runcmd,
	)
	return root, nil
}

func quoted(s string) *yaml.Node {
	return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: s, Style: yaml.SingleQuotedStyle}
}

// partTypes maps the first line of a user-data document to its MIME type,
// as cloud-init's INCLUSION_TYPES_MAP does (longest prefix first).
var partTypes = []struct{ prefix, ctype string }{
	{"#cloud-config-archive", "text/cloud-config-archive"},
	{"#cloud-config-jsonp", "text/cloud-config-jsonp"},
	{"## template: jinja", "text/jinja2"},
	{"#cloud-boothook", "text/cloud-boothook"},
	{"#include-once", "text/x-include-once-url"},
	{"#part-handler", "text/part-handler"},
	{"#cloud-config", "text/cloud-config"},
	{"#include", "text/x-include-url"},
	{"#!", "text/x-shellscript"},
}

const cloudConfigHeader = "#cloud-config"

// userDataKind classifies rendered user data.
func userDataKind(out []byte) (ctype string, mimeDoc bool, err error) {
	trimmed := bytes.TrimLeft(out, " \t\r\n")
	if len(trimmed) == 0 {
		return "", false, nil
	}
	first, _, _ := bytes.Cut(trimmed, []byte("\n"))
	first = bytes.TrimRight(first, "\r")
	lower := strings.ToLower(string(first))
	if strings.HasPrefix(lower, "content-type:") || strings.HasPrefix(lower, "mime-version:") {
		return "multipart/mixed", true, nil
	}
	for _, p := range partTypes {
		if strings.HasPrefix(string(first), p.prefix) {
			if p.ctype == "text/cloud-config" && strings.TrimSpace(string(first)) != cloudConfigHeader {
				break // e.g. "#cloud-configX": not a cloud-config
			}
			return p.ctype, false, nil
		}
	}
	line := 1 + bytes.Count(out[:len(out)-len(trimmed)], []byte("\n"))
	return "", false, &Error{Field: FieldUserData, Line: line, Rendered: true, Err: fmt.Errorf(
		"starts with %q; user data must start with #cloud-config, a script's #!, another cloud-init part header (#cloud-boothook, #include, ...) or be a MIME multipart document", truncate(string(first), 40))}
}

func truncate(s string, n int) string {
	if utf8.RuneCountInString(s) <= n {
		return s
	}
	return string([]rune(s)[:n]) + "..."
}

// buildUserData assembles the final user-data from the user's rendered
// document and the operator's cloud-config.
func buildUserData(user []byte, op *yaml.Node) ([]byte, error) {
	ctype, mimeDoc, err := userDataKind(user)
	if err != nil {
		return nil, err
	}
	switch {
	case ctype == "":
		return cloudConfigBytes(op)
	case ctype == "text/cloud-config":
		merged, err := mergeCloudConfig(blankFirstLine(user), op, operatorPolicy)
		if err != nil {
			return nil, err
		}
		return cloudConfigBytes(merged)
	case mimeDoc:
		if err := inspectUserMIME(user, op); err != nil {
			return nil, err
		}
		return multipartUserData(mimePart{raw: user}, op)
	default:
		// Leading blank lines (easily left by template actions) would put
		// a script's #! off the first line, where the kernel looks for it.
		body := bytes.TrimLeft(user, " \t\r\n")
		return multipartUserData(mimePart{ctype: ctype, filename: "user-data", body: body}, op)
	}
}

// blankFirstLine empties the header line (#cloud-config) of a document,
// keeping the line count so that YAML errors name the rendered line.
func blankFirstLine(b []byte) []byte {
	lead := len(b) - len(bytes.TrimLeft(b, " \t\r\n"))
	if i := bytes.IndexByte(b[lead:], '\n'); i >= 0 {
		out := append([]byte(nil), b[:lead]...)
		return append(out, b[lead+i:]...)
	}
	return b[:lead]
}

func cloudConfigBytes(root *yaml.Node) ([]byte, error) {
	body, err := encodeYAML(root)
	if err != nil {
		return nil, err
	}
	var b bytes.Buffer
	b.WriteString(cloudConfigHeader + "\n")
	if len(root.Content) > 0 {
		b.Write(body)
	}
	return b.Bytes(), nil
}

// mimePart is the user's part of a multipart user-data: a single document
// of a known type, or a whole MIME document (raw) nested as is.
type mimePart struct {
	ctype, filename string
	body            []byte
	raw             []byte
}

// multipartUserData builds a MIME multipart/mixed user-data: the user's
// part first, the operator's cloud-config last with a Merge-Type header,
// so that cloud-init appends the operator's runcmd after the user's and
// keeps the user's other keys. The boundary is derived from the content:
// the same input always gives the same bytes.
func multipartUserData(user mimePart, op *yaml.Node) ([]byte, error) {
	opBody, err := cloudConfigBytes(op)
	if err != nil {
		return nil, err
	}
	h := sha256.New()
	h.Write(user.body)
	h.Write(user.raw)
	h.Write(opBody)
	boundary := "==hyperfleet-" + hex.EncodeToString(h.Sum(nil))[:32] + "=="
	if bytes.Contains(user.body, []byte(boundary)) || bytes.Contains(user.raw, []byte(boundary)) {
		return nil, &Error{Field: FieldUserData, Err: errors.New("contains HyperFleet's MIME boundary; change the user data")}
	}

	var b bytes.Buffer
	fmt.Fprintf(&b, "Content-Type: multipart/mixed; boundary=%q\nMIME-Version: 1.0\n\n", boundary)
	b.WriteString("--" + boundary + "\n")
	if user.raw != nil {
		// A nested multipart: its own headers open the part.
		b.Write(normalizeNewlines(user.raw))
	} else {
		writePart(&b, user.ctype, user.filename, "", user.body)
	}
	b.WriteString("\n--" + boundary + "\n")
	writePart(&b, "text/cloud-config", "hyperfleet.cfg", MergeType, opBody)
	b.WriteString("\n--" + boundary + "--\n")
	return b.Bytes(), nil
}

func writePart(b *bytes.Buffer, ctype, filename, mergeType string, body []byte) {
	ascii := true
	for _, c := range body {
		if c >= 0x80 || (c < 0x20 && c != '\n' && c != '\t' && c != '\r') {
			ascii = false
			break
		}
	}
	charset := "us-ascii"
	enc := "7bit"
	if !ascii {
		charset, enc = "utf-8", "base64"
	}
	fmt.Fprintf(b, "Content-Type: %s; charset=%q\nMIME-Version: 1.0\nContent-Transfer-Encoding: %s\nContent-Disposition: attachment; filename=%q\n",
		ctype, charset, enc, filename)
	if mergeType != "" {
		fmt.Fprintf(b, "Merge-Type: %s\n", mergeType)
	}
	b.WriteString("\n")
	if ascii {
		b.Write(normalizeNewlines(body))
		if len(body) > 0 && body[len(body)-1] != '\n' {
			b.WriteString("\n")
		}
		return
	}
	s := base64.StdEncoding.EncodeToString(body)
	for len(s) > 76 {
		b.WriteString(s[:76] + "\n")
		s = s[76:]
	}
	b.WriteString(s + "\n")
}

func normalizeNewlines(b []byte) []byte {
	return bytes.ReplaceAll(b, []byte("\r\n"), []byte("\n"))
}

// inspectUserMIME reads a user's MIME multipart user data and applies the
// merge rules to each of its text/cloud-config parts, as if each were the
// user's #cloud-config: cloud-init's own merge (MergeType) would otherwise
// keep a user's scalar where the operator has a list, and a null user value
// would drop the operator's list. Other parts cannot be checked (includes
// are fetched by the VM, jinja is rendered there).
func inspectUserMIME(doc []byte, op *yaml.Node) error {
	msg, err := mail.ReadMessage(bufio.NewReader(bytes.NewReader(doc)))
	if err != nil {
		return &Error{Field: FieldUserData, Err: fmt.Errorf("is not a readable MIME document: %w", err)}
	}
	mt, params, err := mime.ParseMediaType(msg.Header.Get("Content-Type"))
	if err != nil || !strings.HasPrefix(mt, "multipart/") || params["boundary"] == "" {
		return &Error{Field: FieldUserData, Err: errors.New("MIME user data must be multipart/mixed with a boundary; a single document should start with its own header, such as #! or #cloud-config")}
	}
	return inspectMultipart(multipart.NewReader(msg.Body, params["boundary"]), op, 0)
}

func inspectMultipart(r *multipart.Reader, op *yaml.Node, depth int) error {
	if depth > 4 {
		return &Error{Field: FieldUserData, Err: errors.New("MIME parts are nested more than 4 deep")}
	}
	for n := 0; ; n++ {
		if n > 64 {
			return &Error{Field: FieldUserData, Err: errors.New("has more than 64 MIME parts")}
		}
		p, err := r.NextPart() // decodes quoted-printable
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return &Error{Field: FieldUserData, Err: fmt.Errorf("MIME part %d: %w", n+1, err)}
		}
		mt, params, _ := mime.ParseMediaType(p.Header.Get("Content-Type"))
		if strings.HasPrefix(mt, "multipart/") {
			if err := inspectMultipart(multipart.NewReader(p, params["boundary"]), op, depth+1); err != nil {
				return err
			}
			continue
		}
		if mt != "text/cloud-config" {
			continue
		}
		body := io.LimitReader(p, maxOutput)
		if strings.EqualFold(p.Header.Get("Content-Transfer-Encoding"), "base64") {
			body = base64.NewDecoder(base64.StdEncoding, body) // skips line breaks
		}
		data, err := io.ReadAll(body)
		if err != nil {
			return &Error{Field: FieldUserData, Err: fmt.Errorf("MIME part %d: %w", n+1, err)}
		}
		if bytes.HasPrefix(bytes.TrimLeft(data, " \t\r\n"), []byte("#")) {
			data = blankFirstLine(data)
		}
		part, err := parseMapping(FieldUserData, data)
		if err != nil {
			return fmt.Errorf("MIME part %d: %w", n+1, err)
		}
		for i := 0; i+1 < len(part.Content); i += 2 {
			k := part.Content[i].Value
			if mapValue(op, k) != nil && isNull(resolve(part.Content[i+1])) && !operatorPolicy.defaults[k] {
				return &Error{Field: FieldUserData, Err: fmt.Errorf("MIME part %d: key %q is null, which would drop HyperFleet's %s when cloud-init merges the parts; remove it or give it a value", n+1, k, k)}
			}
		}
		// A dry run of the merge on a copy finds every other conflict.
		if _, err := mergeCloudConfigNode(part, deepCopy(op), operatorPolicy); err != nil {
			return fmt.Errorf("MIME part %d: %w", n+1, err)
		}
	}
}

// deepCopy copies a YAML node tree (aliases keep pointing at the original
// anchors, which the merge never changes).
func deepCopy(n *yaml.Node) *yaml.Node {
	if n == nil {
		return nil
	}
	cp := *n
	cp.Content = make([]*yaml.Node, len(n.Content))
	for i, c := range n.Content {
		cp.Content[i] = deepCopy(c)
	}
	return &cp
}

// Package kit is the static vendor-data kit of Proxmox VE's own cloud-init
// delivery (spec.cloudInit.delivery: proxmox; docs/cloud-init.md,
// "Delivery"): the cloud-config a platform team puts on a snippets storage
// once, which `hyperfleet proxmox-kit` prints. It is a package of its own
// so that the Proxmox provider does not link the cloud-init renderer.
package kit

import (
	"strings"

	"github.com/hyperfleet/hyperfleet/internal/agentconfig"
	"github.com/hyperfleet/hyperfleet/internal/cloudinit"
)

// What starts the agent under delivery proxmox.
const (
	// AgentPathUnitName is the systemd path unit that starts the agent
	// once cloudinit.GuestAgentConfigPath has been written.
	AgentPathUnitName = "hyperfleet-agent.path"
	// AgentPathUnitPath is where the kit writes that path unit.
	AgentPathUnitPath = "/etc/systemd/system/" + AgentPathUnitName
)

// VendorData is the static cloud-config a platform team puts on a
// Proxmox snippets storage for templates with spec.cloudInit.delivery:
// proxmox, named by spec.cloudInit.proxmox.vendorSnippet (Proxmox's
// cicustom vendor=...). It is what the NoCloud ISO's user-data writes per
// VM minus everything per VM: the agent's unit, reading its configuration
// from cloudinit.GuestAgentConfigPath, and a path unit that starts it when
// the operator has written that file. Proxmox's API cannot write snippets,
// so the operator never writes it: it prints it (hyperfleet proxmox-kit,
// cmd/hyperfleet) for the platform team to copy.
//
// Vendor-data, not user-data: a cicustom user= snippet replaces Proxmox's
// generated user-data whole, and with it the host name, the FQDN, ciuser
// and sshkeys; vendor-data is merged under it, and Proxmox generates none.
//
// Order matters. The path unit uses PathChanged=, which fires when the
// writer closes the file (the guest agent opens, writes and closes it in
// three steps; PathExists= would start the agent on an empty file), and
// PathChanged= does not fire for a file that existed before the unit
// started. So the directory (root's alone: the guest agent creates files
// 0666) is made only after the path unit is started: until then the
// operator's write fails with "No such file or directory", which is
// provider.ErrGuestNotReady, and is retried; no write can land before the
// watch. The agent removes its configuration once it has read it.
//
// powerOff is cloudinit.Vars.PowerOffOnFinish: the agent unit then stops
// the VM however it ends, as the ISO's unit does.
func VendorData(powerOff bool) []byte {
	var b strings.Builder
	b.WriteString(`#cloud-config
# HyperFleet's static kit for templates with spec.cloudInit.delivery: proxmox.
# Place it on a storage with snippets content and name it in the template's
# spec.cloudInit.proxmox.vendorSnippet (docs/cloud-init.md, "Delivery").
# The operator places the agent's per-VM configuration in ` + cloudinit.GuestAgentConfigPath + `
# through the QEMU guest agent; nothing per VM, and no secret, is in here.
write_files:
  - path: ` + cloudinit.AgentUnitPath + `
    owner: root:root
    permissions: '0644'
    content: |
`)
	writeIndented(&b, cloudinit.GuestAgentUnit(powerOff), "      ")
	b.WriteString(`  - path: ` + AgentPathUnitPath + `
    owner: root:root
    permissions: '0644'
    content: |
`)
	writeIndented(&b, agentPathUnit(), "      ")
	b.WriteString(`runcmd:
  - [systemctl, daemon-reload]
  - [systemctl, start, ` + AgentPathUnitName + `]
  - [install, -d, -m, '0700', -o, root, -g, root, ` + agentconfig.SecretsDir + `]
`)
	return []byte(b.String())
}

// agentPathUnit starts the agent unit when the operator has written its
// configuration. It is started by the kit's runcmd, not enabled: a VM runs
// one job and its config dies with the tmpfs at power-off.
func agentPathUnit() string {
	return `[Unit]
Description=HyperFleet agent: start once the operator has placed the VM's configuration

[Path]
PathChanged=` + cloudinit.GuestAgentConfigPath + `
Unit=` + cloudinit.AgentUnitName + `
`
}

// writeIndented writes text into a YAML literal block: each line indented,
// empty lines left empty (no trailing blanks).
func writeIndented(b *strings.Builder, text, indent string) {
	for line := range strings.SplitSeq(strings.TrimSuffix(text, "\n"), "\n") {
		if line == "" {
			b.WriteString("\n")
			continue
		}
		b.WriteString(indent + line + "\n")
	}
}

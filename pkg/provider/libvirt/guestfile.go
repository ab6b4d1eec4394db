package libvirt

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"strings"

	golibvirt "github.com/digitalocean/go-libvirt"

	"github.com/hyperfleet/hyperfleet/pkg/provider"
)

// agentTimeout is how long libvirt waits for the guest agent's answer to
// one command, in seconds.
const agentTimeout = 5

// PlaceGuestFile implements provider.Provider through the QEMU guest
// agent: guest-file-open (mode "w"), guest-file-write of the base64
// content, guest-file-close. The marker is verified first. The guest
// agent creates a new file 0666 whatever its umask: the caller's
// directory is what keeps it from the guest's other users.
func (p *Provider) PlaceGuestFile(_ context.Context, owner provider.Owner, ref provider.VMRef, file provider.GuestFile) error {
	if err := provider.CheckGuestFile(file); err != nil {
		return err
	}
	d, err := p.lookup(ref)
	if err != nil {
		return err
	}
	vmid := d.meta.ID
	if _, err := p.owned(d, owner); err != nil {
		return err
	}
	if !hasAgentChannel(d.xml) {
		return provider.Errorf(provider.ClassConfiguration, "NoGuestAgent",
			"VM %d has no QEMU guest agent channel (%s) to write %s through; add it to the template and install qemu-guest-agent in its image", vmid, agentChannel, file.Path)
	}
	if !d.running() {
		return fmt.Errorf("VM %d is not running: %w", vmid, provider.ErrGuestNotReady)
	}
	l, err := d.host.client()
	if err != nil {
		return err
	}
	var handle int64
	if err := agent(l, d.dom, "guest-file-open", map[string]any{"path": file.Path, "mode": "w"}, &handle); err != nil {
		return guestFileError(vmid, file.Path, err)
	}
	werr := agent(l, d.dom, "guest-file-write", map[string]any{"handle": handle, "buf-b64": base64.StdEncoding.EncodeToString(file.Content)}, nil)
	cerr := agent(l, d.dom, "guest-file-close", map[string]any{"handle": handle}, nil)
	if werr != nil {
		return guestFileError(vmid, file.Path, werr)
	}
	if cerr != nil {
		return guestFileError(vmid, file.Path, cerr)
	}
	return nil
}

// agent runs one guest agent command and decodes its "return" into out.
func agent(l *golibvirt.Libvirt, dom golibvirt.Domain, cmd string, args map[string]any, out any) error {
	req, err := json.Marshal(map[string]any{"execute": cmd, "arguments": args})
	if err != nil {
		return err
	}
	reply, err := l.QEMUDomainAgentCommand(dom, string(req), agentTimeout, 0)
	if err != nil {
		return err
	}
	if out == nil || len(reply) == 0 {
		return nil
	}
	var resp struct {
		Return json.RawMessage `json:"return"`
	}
	if err := json.Unmarshal([]byte(reply[0]), &resp); err != nil {
		return fmt.Errorf("%s: the guest agent's answer %q: %w", cmd, reply[0], err)
	}
	return json.Unmarshal(resp.Return, out)
}

// guestFileError classifies a failed agent command as Proxmox's provider
// does: an agent that does not answer yet, or a directory the guest has
// not made yet, is ErrGuestNotReady.
func guestFileError(vmid int, path string, err error) error {
	msg := strings.ToLower(err.Error())
	switch code := libvirtCode(err); {
	case code == golibvirt.ErrAgentUnresponsive, code == golibvirt.ErrAgentUnsynced, code == golibvirt.ErrOperationInvalid,
		code == golibvirt.ErrOperationTimeout:
		return fmt.Errorf("write %s into VM %d: the guest agent does not answer yet: %w: %w", path, vmid, provider.ErrGuestNotReady, err)
	case strings.Contains(msg, "no such file or directory"):
		return fmt.Errorf("write %s into VM %d: its directory does not exist in the guest yet: %w: %w", path, vmid, provider.ErrGuestNotReady, err)
	}
	return classify(fmt.Errorf("write %s into VM %d: %w", path, vmid, err))
}

package proxmox

import (
	"context"
	"encoding/base64"
	"fmt"
	"net/http"
	"strings"

	"github.com/hyperfleet/hyperfleet/pkg/provider"
)

// PlaceGuestFile implements provider.Provider with two calls: the VM's
// config is read and its ownership marker verified, then the file goes
// through POST /nodes/{node}/qemu/{vmid}/agent/file-write, which has the
// QEMU guest agent open the path (mode wb: created, or truncated), write
// and close it. The content travels base64-encoded (encode=0), so any
// bytes arrive as they are; Proxmox takes at most 61,440 characters of
// it, which provider.MaxGuestFileBytes stays under.
//
// The guest agent creates a new file with mode 0666 whatever its umask
// (an existing file keeps its mode): the caller's directory is what keeps
// the file from the guest's other users.
func (p *Provider) PlaceGuestFile(ctx context.Context, owner provider.Owner, at provider.VMRef, file provider.GuestFile) error {
	ref, err := refOf(at)
	if err != nil {
		return err
	}
	if err := provider.CheckGuestFile(file); err != nil {
		return err
	}
	marker, err := p.marker(ctx)
	if err != nil {
		return err
	}
	node, err := p.nodeOf(ctx, ref)
	if err != nil {
		return err
	}
	cfg, err := p.api.config(ctx, node, ref.VMID)
	if err != nil {
		return fmt.Errorf("read VM %d before writing %s into its guest: %w", ref.VMID, file.Path, err)
	}
	if _, err := p.verifyOwner(marker, cfg, ref.VMID, owner); err != nil {
		return err
	}
	if !agentOn(cfg["agent"]) {
		return noGuestAgent(ref.VMID, file.Path)
	}
	err = p.api.call(ctx, http.MethodPost, fmt.Sprintf("/nodes/%s/qemu/%d/agent/file-write", node, ref.VMID), nil, map[string]any{
		"file": file.Path, "content": base64.StdEncoding.EncodeToString(file.Content), "encode": 0,
	}, nil)
	if err == nil {
		return nil
	}
	msg := apiMessage(err)
	switch {
	case strings.Contains(msg, "No QEMU guest agent configured"):
		return noGuestAgent(ref.VMID, file.Path)
	case containsAny(msg, agentNotYet), strings.Contains(msg, "is not running"):
		return fmt.Errorf("write %s into VM %d: %w: %w", file.Path, ref.VMID, provider.ErrGuestNotReady, err)
	case strings.Contains(msg, "guest-file-open") && strings.Contains(msg, "No such file or directory"):
		// The file's directory is not there yet: the guest makes it as it
		// boots. Not a missing VM, whatever the words.
		return fmt.Errorf("write %s into VM %d: its directory does not exist in the guest yet: %w: %s", file.Path, ref.VMID, provider.ErrGuestNotReady, msg)
	}
	return fmt.Errorf("write %s into VM %d: %w", file.Path, ref.VMID, aboutVM(err, ref.VMID))
}

func noGuestAgent(vmid int, path string) error {
	return provider.Errorf(provider.ClassConfiguration, "NoGuestAgent",
		"%s: VM %d has no QEMU guest agent (agent: 1) to write %s through; enable it in the template and install qemu-guest-agent in its image", fieldTemplateID, vmid, path)
}

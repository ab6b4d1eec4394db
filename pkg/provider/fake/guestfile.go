package fake

import (
	"context"
	"fmt"
	"slices"

	"github.com/hyperfleet/hyperfleet/pkg/provider"
)

// PlaceGuestFile implements provider.Provider: the file is kept with the
// VM until it stops, as a file in the guest's tmpfs would be. Any
// absolute path is taken: the fake's guests have every directory.
func (p *Provider) PlaceGuestFile(_ context.Context, owner provider.Owner, ref provider.VMRef, file provider.GuestFile) error {
	if err := provider.CheckGuestFile(file); err != nil {
		return err
	}
	defer p.c.lock()()
	v, err := p.vmLocked(ref)
	if err != nil {
		return err
	}
	if err := p.ownedLocked(v, owner); err != nil {
		return err
	}
	switch {
	case !v.guestAgent:
		return provider.Errorf(provider.ClassConfiguration, "NoGuestAgent", "VM %d has no guest agent to write %s through; enable it in the template", v.id, file.Path)
	case !v.running:
		return fmt.Errorf("VM %d is not running: %w", v.id, provider.ErrGuestNotReady)
	case p.c.clock.Now().Before(v.guestUpAt):
		return fmt.Errorf("the guest agent of VM %d does not answer yet: %w", v.id, provider.ErrGuestNotReady)
	}
	if v.guestFiles == nil {
		v.guestFiles = map[string][]byte{}
	}
	v.guestFiles[file.Path] = slices.Clone(file.Content)
	return nil
}

package libvirt

import (
	"fmt"

	golibvirt "github.com/digitalocean/go-libvirt"
)

// A shutdown asks the guest, and a guest that is still booting cannot be
// asked yet: libvirt's agent mode fails while the guest agent is not
// connected, and QEMU drops an ACPI power-button press while the guest
// has not enabled the button's event (its kernel has not bound the button
// driver yet), so a real guest loses an early press just as the test
// guest does. A shutdown the agent did not take is therefore kept for the
// domain: when libvirt's agent lifecycle event says the guest's agent has
// connected, the shutdown is issued again (agent, then the button, which
// is bound by then). The domain stopping or being undefined, a power-on
// and a hard stop drop it. It is kept in this process only: after a
// restart, or events lost with a connection, the caller's next
// SetPower(PowerShutdown) asks again, as it does for any VM still running.

// shutdown asks the guest of d to power off: through its agent, else by
// the ACPI power button, keeping the request for the agent's connection.
func (p *Provider) shutdown(l *golibvirt.Libvirt, d *domain) error {
	key := d.host.Name + "/" + d.dom.Name
	// Kept before the agent is tried: its connection event may come
	// between the agent's refusal and the button press.
	p.keepShutdown(key, true)
	agentErr := l.DomainShutdownFlags(d.dom, golibvirt.DomainShutdownGuestAgent)
	if agentErr == nil {
		p.keepShutdown(key, false)
		return nil
	}
	p.log.V(1).Info("Guest agent did not take the shutdown; pressing the power button and keeping the request for its connection",
		"host", d.host.Name, "domain", d.dom.Name, "reason", agentErr.Error())
	if err := l.DomainShutdownFlags(d.dom, golibvirt.DomainShutdownAcpiPowerBtn); err != nil {
		p.keepShutdown(key, false)
		return fmt.Errorf("press the power button of domain %s: %w", d.dom.Name, err)
	}
	return nil
}

// keepShutdown keeps (or, kept false, forgets) a shutdown of the domain
// host/name for its agent's connection.
func (p *Provider) keepShutdown(key string, kept bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if kept {
		p.shutdowns[key] = true
	} else {
		delete(p.shutdowns, key)
	}
}

// agentConnected is told that the guest agent of the domain host/name
// connected and says whether a kept shutdown is due now; it is then no
// longer kept (one re-issue: the agent answers from now on).
func (p *Provider) agentConnected(key string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	due := p.shutdowns[key]
	delete(p.shutdowns, key)
	return due
}

// reissueShutdown asks the guest of dom again, now that its agent is
// connected.
func (h *host) reissueShutdown(dom golibvirt.Domain) {
	log := h.p.log.WithValues("host", h.Name, "domain", dom.Name)
	l, err := h.client()
	if err == nil {
		err = l.DomainShutdownFlags(dom, golibvirt.DomainShutdownGuestAgent|golibvirt.DomainShutdownAcpiPowerBtn)
	}
	if err != nil {
		log.Error(err, "Shutdown kept for the guest agent's connection failed; the next SetPower asks again")
		return
	}
	log.V(1).Info("Shutdown kept for the guest agent's connection issued")
}

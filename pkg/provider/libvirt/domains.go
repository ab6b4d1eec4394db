package libvirt

import (
	"encoding/xml"
	"errors"
	"fmt"
	"slices"

	golibvirt "github.com/digitalocean/go-libvirt"
	"libvirt.org/go/libvirtxml"

	"github.com/hyperfleet/hyperfleet/pkg/ownership"
	"github.com/hyperfleet/hyperfleet/pkg/provider"
)

// domain is one domain as read from its host.
type domain struct {
	host *host
	dom  golibvirt.Domain
	xml  *libvirtxml.Domain
	// meta is its HyperFleet metadata; metaErr says why it has none.
	meta    vmMeta
	metaErr error
	state   golibvirt.DomainState
	reason  int32
	// saved: shut off with a managed save image, suspended to disk
	// (suspend.go).
	saved bool
}

// running says the domain is active (running, paused, being shut down).
func (d *domain) running() bool {
	return d.state != golibvirt.DomainShutoff && d.state != golibvirt.DomainCrashed && d.state != golibvirt.DomainNostate
}

// number is the domain's VM id: the one its HyperFleet metadata gives,
// else, for a domain of no install (a template, an admin's VM), the
// number of its UUID (templateID), so that every domain is addressable.
func (d *domain) number() int {
	if d.metaErr == nil {
		return d.meta.ID
	}
	return templateID(d.dom.UUID)
}

// key names the domain in the provider's event view.
func (d *domain) key() string { return d.host.Name + "/" + d.dom.Name }

// read reads dom's XML, metadata and state on h.
func (h *host) read(l *golibvirt.Libvirt, dom golibvirt.Domain) (*domain, error) {
	doc, err := l.DomainGetXMLDesc(dom, 0)
	if err != nil {
		return nil, classify(fmt.Errorf("read domain %s on host %s: %w", dom.Name, h.Name, err))
	}
	x, err := parseDomain(doc)
	if err != nil {
		return nil, err
	}
	state, reason, err := l.DomainGetState(dom, 0)
	if err != nil {
		return nil, classify(fmt.Errorf("read the state of domain %s on host %s: %w", dom.Name, h.Name, err))
	}
	d := &domain{host: h, dom: dom, xml: x, state: golibvirt.DomainState(state), reason: reason}
	d.meta, d.metaErr = parseMeta(x.Metadata)
	return d, nil
}

// list reads every domain of the host. Which ones are suspended comes
// from one more listing, of the domains with a managed save image, made
// before the states are read: a domain saved in between is read shut off
// with reason "saved" and asked about alone; one resumed in between is
// read active.
func (h *host) list() ([]*domain, error) {
	l, err := h.client()
	if err != nil {
		return nil, err
	}
	withImage, _, err := l.ConnectListAllDomains(1, golibvirt.ConnectListDomainsManagedsave)
	if err != nil {
		return nil, classify(fmt.Errorf("list the suspended domains of host %s: %w", h.Name, err))
	}
	saved := make(map[golibvirt.UUID]bool, len(withImage))
	for _, dom := range withImage {
		saved[dom.UUID] = true
	}
	doms, _, err := l.ConnectListAllDomains(1, 0)
	if err != nil {
		return nil, classify(fmt.Errorf("list the domains of host %s: %w", h.Name, err))
	}
	out := make([]*domain, 0, len(doms))
	for _, dom := range doms {
		d, err := h.read(l, dom)
		if err == nil && !d.running() {
			if saved[dom.UUID] {
				d.saved = true
			} else if golibvirt.DomainShutoffReason(d.reason) == golibvirt.DomainShutoffSaved {
				err = d.readSaved(l)
			}
		}
		if errors.Is(err, provider.ErrNotFound) {
			continue // undefined since the listing
		}
		if err != nil {
			return nil, err
		}
		out = append(out, d)
	}
	return out, nil
}

// find returns the domain of VM vmid. It looks first for the install's
// name of vmid on the host hint names (where the VM was put), then lists
// every host. A VM on no host is ErrNotFound when every host answered, or
// at least the hinted one; otherwise the unreachable host's error.
func (p *Provider) find(vmid int, hint string) (*domain, error) {
	order := slices.Clone(p.hosts)
	if h := p.hostNamed(hint); h != nil {
		order = append([]*host{h}, slices.DeleteFunc(order, func(o *host) bool { return o == h })...)
		if d, err := p.lookupByName(h, vmid); d != nil || err != nil {
			return d, err
		}
	}
	var unreachable error
	for _, h := range order {
		doms, err := h.list()
		if err != nil {
			if h.Name == hint {
				return nil, err
			}
			unreachable = err
			continue
		}
		for _, d := range doms {
			if d.number() == vmid {
				return d, nil
			}
		}
	}
	if unreachable != nil && hint == "" {
		return nil, fmt.Errorf("VM %d is on no reachable host: %w", vmid, unreachable)
	}
	return nil, fmt.Errorf("VM %d: %w", vmid, provider.ErrNotFound)
}

// lookup returns the domain of the VM ref names (find).
func (p *Provider) lookup(ref provider.VMRef) (*domain, error) {
	vmid, err := ParseID(ref.ID)
	if err != nil {
		return nil, err
	}
	if vmid == 0 {
		return nil, provider.Errorf(provider.ClassPermanent, "InvalidVMID", "the VM reference names no VM")
	}
	return p.find(vmid, ref.Node)
}

// lookupByName returns the domain of h named for vmid by this install
// when its metadata says vmid; nil without error when there is none.
func (p *Provider) lookupByName(h *host, vmid int) (*domain, error) {
	l, err := h.client()
	if err != nil {
		return nil, err
	}
	dom, err := l.DomainLookupByName(p.signer.VMName(vmid))
	if isCode(err, golibvirt.ErrNoDomain) {
		return nil, nil
	}
	if err != nil {
		return nil, classify(fmt.Errorf("look up VM %d on host %s: %w", vmid, h.Name, err))
	}
	d, err := h.read(l, dom)
	if err == nil {
		err = d.readSaved(l)
	}
	if errors.Is(err, provider.ErrNotFound) || err == nil && (d.metaErr != nil || d.meta.ID != vmid) {
		return nil, nil //nolint:nilerr // undefined since the lookup, or not VM vmid: the caller lists every host instead
	}
	return d, err
}

// verify checks d's ownership block for VM d.meta.ID; the record, or why
// it does not verify.
func (p *Provider) verify(d *domain) (ownership.Record, error) {
	if d.metaErr != nil {
		return ownership.Record{}, fmt.Errorf("%w: %w", ownership.ErrNoMarker, d.metaErr)
	}
	return p.signer.Verify(d.meta.Description, d.meta.ID)
}

// owned verifies that d is owner's VM: ErrNotOwned otherwise.
func (p *Provider) owned(d *domain, owner provider.Owner) (ownership.Record, error) {
	rec, err := p.verify(d)
	if err == nil && rec.UID != owner.UID {
		err = fmt.Errorf("it belongs to claim %s/%s (uid %s)", rec.Namespace, rec.Name, rec.UID)
	}
	if err != nil {
		return rec, notOwned(d.meta.ID, owner, err)
	}
	return rec, nil
}

// summary is d as ListVMs shows it. A domain with a saved state is a VM
// at rest, never a template.
func (p *Provider) summary(d *domain) provider.VMSummary {
	s := provider.VMSummary{ID: FormatID(d.number()), Node: d.host.Name, Name: d.xml.Title, Power: d.power(),
		Tags: slices.Clone(d.meta.Tags), Template: d.metaErr != nil && !d.running() && !d.saved}
	if s.Name == "" {
		s.Name = d.dom.Name
	}
	s.OperatorTagged = p.signer.HasOperatorTag(s.Tags)
	s.InstallNamed = d.metaErr == nil && p.signer.VerifyVMName(s.Name, d.meta.ID)
	return s
}

// power is d's power state: libvirt's, or suspended for a shut-off
// domain with a managed save image.
func (d *domain) power() provider.PowerState {
	if d.saved && !d.running() {
		return provider.PowerSuspended
	}
	return powerOf(d.state)
}

// powerOf maps libvirt's domain state.
func powerOf(s golibvirt.DomainState) provider.PowerState {
	switch s {
	case golibvirt.DomainRunning, golibvirt.DomainBlocked, golibvirt.DomainShutdown:
		return provider.PowerRunning
	case golibvirt.DomainPaused, golibvirt.DomainPmsuspended:
		return provider.PowerPaused
	case golibvirt.DomainShutoff, golibvirt.DomainCrashed:
		return provider.PowerStopped
	}
	return provider.PowerUnknown
}

// redefine defines d's XML again (a configuration change, one write).
func (h *host) redefine(x *libvirtxml.Domain) error {
	doc, err := x.Marshal()
	if err != nil {
		return fmt.Errorf("render domain %s: %w", x.Name, err)
	}
	l, err := h.client()
	if err != nil {
		return err
	}
	if _, err := l.DomainDefineXMLFlags(doc, 0); err != nil {
		return classify(fmt.Errorf("define domain %s on host %s: %w", x.Name, h.Name, err))
	}
	return nil
}

// inactiveXML reads d's persistent definition.
func (d *domain) inactiveXML() (*libvirtxml.Domain, error) {
	l, err := d.host.client()
	if err != nil {
		return nil, err
	}
	doc, err := l.DomainGetXMLDesc(d.dom, golibvirt.DomainXMLInactive)
	if err != nil {
		return nil, classify(fmt.Errorf("read the definition of domain %s: %w", d.dom.Name, err))
	}
	return parseDomain(doc)
}

// setMetadata rewrites d's HyperFleet metadata in its definition and, when
// it runs, its live state: one write.
func (d *domain) setMetadata(m vmMeta) error {
	raw, err := xml.Marshal(metaBare{ID: m.ID, Description: m.Description, Tags: m.Tags, Medium: m.Medium})
	if err != nil {
		return err
	}
	el := string(raw)
	l, err := d.host.client()
	if err != nil {
		return err
	}
	flags := golibvirt.DomainAffectConfig
	if d.running() {
		flags |= golibvirt.DomainAffectLive
	}
	// libvirt takes the element without a namespace, and the namespace
	// and its prefix beside it.
	if err := l.DomainSetMetadata(d.dom, int32(golibvirt.DomainMetadataElement), golibvirt.OptString{el}, golibvirt.OptString{"hf"},
		golibvirt.OptString{MetadataNamespace}, flags); err != nil {
		return classify(fmt.Errorf("write the metadata of domain %s on host %s: %w", d.dom.Name, d.host.Name, err))
	}
	return nil
}

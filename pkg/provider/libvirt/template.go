package libvirt

import (
	"context"
	"encoding/binary"
	"fmt"

	golibvirt "github.com/digitalocean/go-libvirt"
	"libvirt.org/go/libvirtxml"

	"github.com/hyperfleet/hyperfleet/pkg/provider"
)

// templateDomain is a template as read from one host.
type templateDomain struct {
	host *host
	// id is its number (templateID).
	id int
	// inactive is its persistent definition, what clones copy.
	inactive string
	xml      *libvirtxml.Domain
	// vol is its boot disk's volume, format and capacity its format
	// ("qcow2", "raw") and size.
	vol      golibvirt.StorageVol
	path     string
	format   string
	capacity int64
}

// template reads ref's template on h. A template that is missing or has
// no boot disk volume is ClassConfiguration, naming the field.
func (p *Provider) template(h *host, ref *TemplateRef) (*templateDomain, error) {
	bad := func(format string, args ...any) error {
		return provider.Errorf(provider.ClassConfiguration, "TemplateNotFound", "source.libvirt.domain: template %s on host %s: %s", ref, h.Name, fmt.Sprintf(format, args...))
	}
	l, err := h.client()
	if err != nil {
		return nil, err
	}
	dom, err := lookupTemplate(l, ref)
	if isCode(err, golibvirt.ErrNoDomain) {
		return nil, provider.Errorf(provider.ClassConfiguration, "TemplateNotFound", "source.libvirt.domain: template %s: no such domain on host %s: %w", ref, h.Name, provider.ErrNotFound)
	}
	if err != nil {
		return nil, classify(fmt.Errorf("look up template %s on host %s: %w", ref, h.Name, err))
	}
	doc, err := l.DomainGetXMLDesc(dom, golibvirt.DomainXMLInactive)
	if err != nil {
		return nil, classify(fmt.Errorf("read template %s on host %s: %w", ref, h.Name, err))
	}
	x, err := parseDomain(doc)
	if err != nil {
		return nil, bad("%v", err)
	}
	disk, err := bootDisk(x)
	if err != nil {
		return nil, bad("%v", err)
	}
	var vol golibvirt.StorageVol
	switch src := disk.Source; {
	case src != nil && src.Volume != nil:
		pool, perr := l.StoragePoolLookupByName(src.Volume.Pool)
		if perr != nil {
			return nil, bad("its disk's pool %s: %v", src.Volume.Pool, classify(perr))
		}
		vol, err = l.StorageVolLookupByName(pool, src.Volume.Volume)
	case src != nil && src.File != nil:
		vol, err = l.StorageVolLookupByPath(src.File.File)
	default:
		return nil, bad("its boot disk is neither a file nor a volume of a storage pool")
	}
	if err != nil {
		return nil, bad("its boot disk is no volume of a storage pool of the host: %v", classify(err))
	}
	volDoc, err := l.StorageVolGetXMLDesc(vol, 0)
	if err != nil {
		return nil, classify(fmt.Errorf("read the disk of template %s on host %s: %w", ref, h.Name, err))
	}
	var v libvirtxml.StorageVolume
	if err := v.Unmarshal(volDoc); err != nil {
		return nil, bad("its disk's volume XML: %v", err)
	}
	t := &templateDomain{host: h, inactive: doc, xml: x, vol: vol, id: templateID(dom.UUID)}
	if v.Target != nil {
		t.path = v.Target.Path
		if v.Target.Format != nil {
			t.format = v.Target.Format.Type
		}
	}
	if v.Capacity != nil {
		t.capacity = int64(v.Capacity.Value) * unitBytes(orBytes(v.Capacity.Unit))
	}
	return t, nil
}

func orBytes(unit string) string {
	if unit == "" {
		return "bytes"
	}
	return unit
}

// ValidateTemplate implements provider.Provider: the template exists on a
// host placement may use, its disk is a volume whose format a qcow2
// overlay can stack on (qcow2 or raw) for linked clones, the volume pool
// exists, and it has the guest agent's channel (GuestFiles) and a TPM 2.0
// when the source needs its own.
func (p *Provider) ValidateTemplate(_ context.Context, source provider.TemplateSource) (*provider.TemplateInfo, error) {
	ref, err := templateRef(source)
	if err != nil {
		return nil, err
	}
	var last error
	for _, h := range p.hosts {
		if !p.allowed(h.Name) || ref.Host != "" && ref.Host != h.Name {
			continue
		}
		t, err := p.template(h, ref)
		if err != nil {
			last = err
			continue
		}
		return p.templateInfo(source, ref, t)
	}
	if last == nil {
		last = provider.Errorf(provider.ClassConfiguration, "TemplateNotFound", "source.libvirt.host %q is not an allowed host of the cluster", ref.Host)
	}
	return nil, last
}

func (p *Provider) templateInfo(source provider.TemplateSource, ref *TemplateRef, t *templateDomain) (*provider.TemplateInfo, error) {
	l, err := t.host.client()
	if err != nil {
		return nil, err
	}
	if _, err := l.StoragePoolLookupByName(p.settings.VolumePool); err != nil {
		return nil, provider.Errorf(provider.ClassConfiguration, "StorageNotFound", "spec.libvirt.volumePool %q on host %s: %v", p.settings.VolumePool, t.host.Name, classify(err))
	}
	cores := 0
	if t.xml.VCPU != nil {
		cores = int(t.xml.VCPU.Value)
	}
	if ref.Storage != "" && !source.Linked {
		if _, err := l.StoragePoolLookupByName(ref.Storage); err != nil {
			return nil, provider.Errorf(provider.ClassConfiguration, "StorageNotFound", "source.storage: full-clone target pool %q on host %s: %v", ref.Storage, t.host.Name, classify(err))
		}
	}
	info := &provider.TemplateInfo{ID: t.id, Name: t.xml.Name, Node: t.host.Name, Storages: []string{t.vol.Pool}, DiskBytes: t.capacity,
		Cores: cores, MemoryBytes: memoryBytes(t.xml), LinkedCloneSupported: t.format == "qcow2" || t.format == "raw",
		GuestFiles: hasAgentChannel(t.xml), TPM: hasTPM2(t.xml)}
	switch {
	case source.Linked && !p.settings.FullCopies && !info.LinkedCloneSupported:
		return nil, provider.Errorf(provider.ClassConfiguration, "LinkedCloneUnsupported",
			"source.linked: the disk of template %s is of format %q, which a qcow2 overlay cannot stack on; use a qcow2 or raw volume, or full clones", ref, t.format)
	case source.TPM != nil && !source.TPM.Add && !info.TPM:
		return nil, provider.Errorf(provider.ClassConfiguration, "TemplateHasNoTPM",
			"spec.attestation.tpm.addVirtualTPM: template %s has no TPM 2.0; give it one or set addVirtualTPM", ref)
	}
	return info, nil
}

// templateID is a template's number for a neutral TemplateSource.ID: the
// first 31 bits of its domain's UUID, stable for the domain's life and
// unique among a host's domains but for a chance of 2^-31 per pair.
func templateID(u golibvirt.UUID) int {
	return int(binary.BigEndian.Uint32(u[:4])&0x7fffffff) | 1
}

// lookupTemplate finds ref's domain: by name, or by templateID among
// the host's inactive domains. None is libvirt's ErrNoDomain.
func lookupTemplate(l *golibvirt.Libvirt, ref *TemplateRef) (golibvirt.Domain, error) {
	if ref.Domain != "" {
		return l.DomainLookupByName(ref.Domain)
	}
	doms, _, err := l.ConnectListAllDomains(1, golibvirt.ConnectListDomainsInactive)
	if err != nil {
		return golibvirt.Domain{}, err
	}
	for _, d := range doms {
		if templateID(d.UUID) == ref.id {
			return d, nil
		}
	}
	return golibvirt.Domain{}, golibvirt.Error{Code: uint32(golibvirt.ErrNoDomain), Message: fmt.Sprintf("no template with id %d", ref.id)}
}

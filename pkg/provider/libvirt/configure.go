package libvirt

import (
	"context"
	"fmt"
	"slices"

	"go.yaml.in/yaml/v3"
	"libvirt.org/go/libvirtxml"

	"github.com/hyperfleet/hyperfleet/pkg/provider"
)

// configure takes the next configuration step of a cloned VM: write its
// seed ISO, then define it with the spec's resources, network, tags and
// title and the ISO attached. One write per call.
func (p *Provider) configure(ctx context.Context, spec *provider.VMSpec, d *domain, res *provider.EnsureResult) (*provider.EnsureResult, error) {
	vmid := d.meta.ID
	medium := p.isoName(vmid, spec.Owner.UID)
	if spec.Native != nil {
		medium = p.nativeSeedName(vmid)
	}
	if iso := spec.Isolation; iso != nil {
		if err := checkIsolation(iso); err != nil {
			return nil, err
		}
		// Defined before the domain references it: libvirt starts no
		// domain whose filter is missing.
		p.pendingFilter(spec.Owner, p.filterName(iso))
		defined, err := p.ensureFilter(d.host, iso)
		if err != nil {
			return nil, err
		}
		if defined {
			return p.did(res, d, provider.PhaseConfiguring, opFilter, nextStep, "defined network filter %s of VM %d", p.filterName(iso), vmid), nil
		}
	}
	done, op, err := p.writeMedium(ctx, spec, d, medium)
	if err != nil {
		return nil, err
	}
	if !done {
		return p.did(res, d, provider.PhaseConfiguring, op, nextStep, "writing the cloud-init ISO of VM %d", vmid), nil
	}
	x, err := d.inactiveXML()
	if err != nil {
		return nil, err
	}
	meta := d.meta
	meta.Tags = slices.Concat(p.signer.Tags(), p.cfg.Tags, spec.Tags)
	meta.Medium = medium
	if err := configureDomain(x, p.configSpec(spec, meta, medium)); err != nil {
		return nil, err
	}
	if spec.Isolation != nil {
		if err := isolateInterface(x, spec.Isolation, p.filterName(spec.Isolation)); err != nil {
			return nil, err
		}
	}
	if err := d.host.redefine(x); err != nil {
		return nil, err
	}
	return p.did(res, d, provider.PhaseConfiguring, opConfigure, nextStep, "configured VM %d", vmid), nil
}

// configSpec is what the configuration of spec's VM sets.
func (p *Provider) configSpec(spec *provider.VMSpec, meta vmMeta, medium string) configSpec {
	return configSpec{title: spec.Name, meta: meta, memoryBytes: spec.MemoryBytes, cores: spec.CPUCores, network: p.settings.Network,
		bridge: spec.Network.Bridge, vlan: spec.Network.VLAN, model: spec.Network.Model, mediaPool: p.settings.MediaPool, medium: medium,
		addTPM: spec.TPM != nil && spec.TPM.Add}
}

// checkIsolable refuses, before anything is written, a VM whose isolation
// its configuration could not hold: x is its first definition, which the
// configuration's interface settings are tried on.
func (p *Provider) checkIsolable(spec *provider.VMSpec, x *libvirtxml.Domain) error {
	iso := spec.Isolation
	if iso == nil {
		return nil
	}
	if err := checkIsolation(iso); err != nil {
		return err
	}
	trial := *x
	if x.Devices != nil {
		devices := *x.Devices
		devices.Interfaces = slices.Clone(x.Devices.Interfaces)
		if len(devices.Interfaces) > 0 {
			configureInterface(&devices.Interfaces[0], p.configSpec(spec, vmMeta{}, ""))
		}
		trial.Devices = &devices
	}
	return isolateInterface(&trial, iso, p.filterName(iso))
}

// nativeSeed is the NoCloud seed of a VM under native delivery, built from
// the spec's native fields only: its host name, its first interface's
// addressing and resolver, a user with its keys. It holds no secret.
func nativeSeed(spec *provider.VMSpec, vmid int) (provider.CloudInit, error) {
	n := spec.Native
	user := map[string]any{}
	if n.User != "" {
		user["users"] = []map[string]any{{"name": n.User, "ssh_authorized_keys": n.SSHAuthorizedKeys}}
	} else if len(n.SSHAuthorizedKeys) > 0 {
		user["ssh_authorized_keys"] = n.SSHAuthorizedKeys
	}
	eth := map[string]any{}
	if mac := spec.Network.MACAddress; mac != "" {
		eth["match"] = map[string]any{"macaddress": mac}
	}
	var addrs []string
	for _, a := range []struct{ addr, gw, dhcp, gwKey string }{{n.IPv4, n.Gateway4, "dhcp4", "gateway4"}, {n.IPv6, n.Gateway6, "dhcp6", "gateway6"}} {
		switch a.addr {
		case "":
		case "dhcp", "auto":
			eth[a.dhcp] = true
		default:
			addrs = append(addrs, a.addr)
			if a.gw != "" {
				eth[a.gwKey] = a.gw
			}
		}
	}
	if len(addrs) > 0 {
		eth["addresses"] = addrs
	}
	if len(n.Nameservers) > 0 || len(n.SearchDomains) > 0 {
		eth["nameservers"] = map[string]any{"addresses": n.Nameservers, "search": n.SearchDomains}
	}
	userData, err := yaml.Marshal(user)
	if err != nil {
		return provider.CloudInit{}, err
	}
	network, err := yaml.Marshal(map[string]any{"version": 2, "ethernets": map[string]any{"eth0": eth}})
	if err != nil {
		return provider.CloudInit{}, err
	}
	meta := fmt.Sprintf("instance-id: %s-%d\nlocal-hostname: %s\n", spec.Owner.UID, vmid, spec.Name)
	return provider.CloudInit{UserData: append([]byte("#cloud-config\n"), userData...), MetaData: []byte(meta), NetworkConfig: network}, nil
}

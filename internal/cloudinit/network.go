package cloudinit

import (
	"bytes"
	"errors"
	"fmt"
	"strconv"

	yaml "go.yaml.in/yaml/v3"
)

// InterfaceName is the name HyperFleet gives the VM's first NIC. With a
// known MAC address the NIC is matched by it and renamed to this name (as
// Proxmox's own cloud-init does); without one the config applies to the
// interface already called eth0.
const InterfaceName = "eth0"

// netplan v2 network-config, in the subset cloud-init's v2 parser reads.
// Field order is output order.
type networkConfig struct {
	Version   int                  `yaml:"version"`
	Ethernets map[string]*ethernet `yaml:"ethernets"`
}

type ethernet struct {
	Match          *netMatch      `yaml:"match,omitempty"`
	SetName        string         `yaml:"set-name,omitempty"`
	DHCP4          bool           `yaml:"dhcp4,omitempty"`
	DHCPIdentifier string         `yaml:"dhcp-identifier,omitempty"`
	DHCP4Overrides *dhcpOverrides `yaml:"dhcp4-overrides,omitempty"`
	DHCP6          bool           `yaml:"dhcp6,omitempty"`
	AcceptRA       *bool          `yaml:"accept-ra,omitempty"`
	Addresses      []string       `yaml:"addresses,omitempty"`
	// gateway4/gateway6 rather than routes: Debian 12's cloud-init (22.4)
	// turns a "::/0" route into "::/64" and rejects "to: default".
	Gateway4    string       `yaml:"gateway4,omitempty"`
	Gateway6    string       `yaml:"gateway6,omitempty"`
	Nameservers *nameservers `yaml:"nameservers,omitempty"`
}

type netMatch struct {
	MACAddress string `yaml:"macaddress"`
}

type dhcpOverrides struct {
	SendHostname bool   `yaml:"send-hostname"`
	Hostname     string `yaml:"hostname,omitempty"`
}

type nameservers struct {
	Addresses []string `yaml:"addresses,omitempty"`
	Search    []string `yaml:"search,omitempty"`
}

// renderNetwork builds the network-config of dhcp and static modes.
func renderNetwork(v *Vars, nv netVars) ([]byte, error) {
	eth := &ethernet{}
	if nv.mac != "" {
		eth.Match = &netMatch{MACAddress: nv.mac}
		eth.SetName = InterfaceName
	}
	switch v.NetworkMode {
	case NetworkDHCP:
		eth.DHCP4 = true
		// The client identifier is the MAC address in both modes: it is
		// unique per VM, while a DUID derived from /etc/machine-id repeats
		// in every clone of a template that kept its machine-id. In
		// hostname mode the DHCP server recognises the VM by the host name
		// it always sends (option 12).
		eth.DHCPIdentifier = "mac"
		eth.DHCP4Overrides = &dhcpOverrides{SendHostname: v.SendHostname}
		if v.SendHostname {
			eth.DHCP4Overrides.Hostname = v.Hostname
		}
		if v.IPv6 {
			eth.DHCP6 = true
			t := true
			eth.AcceptRA = &t
		}
	case NetworkStatic:
		if nv.addr.IsValid() {
			eth.Addresses = []string{nv.addr.String() + "/" + strconv.Itoa(v.NetmaskBits)}
		}
		if nv.gateway.IsValid() {
			if nv.gateway.Is4() {
				eth.Gateway4 = nv.gateway.String()
			} else {
				eth.Gateway6 = nv.gateway.String()
			}
		}
		// A dual-stack VM: both addresses on the one NIC, IPv4 first,
		// each family with its own gateway key.
		if nv.addr6.IsValid() {
			eth.Addresses = append(eth.Addresses, nv.addr6.String()+"/"+strconv.Itoa(v.NetmaskBitsIPv6))
		}
		if nv.gateway6.IsValid() {
			eth.Gateway6 = nv.gateway6.String()
		}
	}
	if len(nv.dns) > 0 || len(v.SearchDomains) > 0 {
		eth.Nameservers = &nameservers{Addresses: nv.dns, Search: v.SearchDomains}
	}
	return encodeYAML(&networkConfig{Version: 2, Ethernets: map[string]*ethernet{InterfaceName: eth}})
}

// checkUserNetwork checks that the rendered networkData is a network-config
// document cloud-init can take: one YAML mapping with version 1 or 2, either
// at the top or under a network key.
func checkUserNetwork(out []byte) error {
	var doc yaml.Node
	dec := yaml.NewDecoder(bytes.NewReader(out))
	if err := dec.Decode(&doc); err != nil {
		return yamlError(FieldNetworkData, err)
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); err == nil {
		return &Error{Field: FieldNetworkData, Line: extra.Line, Rendered: true, Err: errors.New("holds more than one YAML document; cloud-init reads exactly one")}
	}
	root := docRoot(&doc)
	if root == nil || root.Kind != yaml.MappingNode {
		return &Error{Field: FieldNetworkData, Err: errors.New("must render to a YAML mapping with version: 2 (or 1), such as one with version: 2 and ethernets")}
	}
	if n := mapValue(root, "network"); n != nil && mapValue(root, "version") == nil {
		root = resolve(n)
		if root.Kind != yaml.MappingNode {
			return &Error{Field: FieldNetworkData, Line: n.Line, Rendered: true, Err: errors.New("network must be a mapping with version: 2 (or 1)")}
		}
	}
	ver := mapValue(root, "version")
	if ver == nil {
		return &Error{Field: FieldNetworkData, Err: errors.New("has no version key; start it with version: 2")}
	}
	if ver = resolve(ver); ver.Kind != yaml.ScalarNode || (ver.Value != "1" && ver.Value != "2") {
		return &Error{Field: FieldNetworkData, Line: ver.Line, Rendered: true, Err: fmt.Errorf("version is %q; cloud-init takes network-config version 1 or 2", ver.Value)}
	}
	return nil
}

// renderMetaData builds meta-data: instance-id and local-hostname, then the
// keys of the user's metaData, which may not set those two.
func renderMetaData(v *Vars, user []byte) ([]byte, error) {
	root := &yaml.Node{Kind: yaml.MappingNode}
	addScalar(root, "instance-id", v.InstanceID)
	addScalar(root, "local-hostname", v.Hostname)
	if len(bytes.TrimSpace(user)) > 0 {
		um, err := parseMapping(FieldMetaData, user)
		if err != nil {
			return nil, err
		}
		for i := 0; i+1 < len(um.Content); i += 2 {
			k := um.Content[i]
			if k.Value == "instance-id" || k.Value == "local-hostname" {
				return nil, &Error{Field: FieldMetaData, Line: k.Line, Rendered: true, Err: fmt.Errorf("key %q is set by HyperFleet for each VM; remove it", k.Value)}
			}
			if k.Value == "<<" {
				return nil, &Error{Field: FieldMetaData, Line: k.Line, Rendered: true, Err: errors.New("merge keys (<<) are not supported at the top level; write the keys out")}
			}
			root.Content = append(root.Content, k, um.Content[i+1])
		}
	}
	return encodeYAML(root)
}

func addScalar(m *yaml.Node, key, value string) {
	m.Content = append(m.Content,
		&yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: key},
		&yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: value})
}

func encodeYAML(v any) ([]byte, error) {
	var buf bytes.Buffer
	enc := yaml.NewEncoder(&buf)
	enc.SetIndent(2)
	if err := enc.Encode(v); err != nil {
		return nil, fmt.Errorf("encode YAML: %w", err)
	}
	if err := enc.Close(); err != nil {
		return nil, fmt.Errorf("encode YAML: %w", err)
	}
	return buf.Bytes(), nil
}

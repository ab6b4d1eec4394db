package tinyguest

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"time"

	"github.com/digitalocean/go-libvirt"
)

// AgentTimeout is how long AgentCommand waits for the guest agent's
// answer.
const AgentTimeout = 30 * time.Second

// AgentError is an error the guest agent answered.
type AgentError struct {
	Class, Desc string
}

func (e *AgentError) Error() string { return "guest agent: " + e.Class + ": " + e.Desc }

// AgentCommand sends one guest agent command (a JSON object such as
// {"execute":"guest-ping"}) through libvirt and returns the "return"
// member of the answer; an "error" answer is an *AgentError.
func AgentCommand(conn *libvirt.Libvirt, dom libvirt.Domain, cmd string) (json.RawMessage, error) {
	res, err := conn.QEMUDomainAgentCommand(dom, cmd, int32(AgentTimeout/time.Second), 0)
	if err != nil {
		return nil, fmt.Errorf("tinyguest: agent command %s on %s: %w", cmd, dom.Name, err)
	}
	if len(res) == 0 {
		return nil, fmt.Errorf("tinyguest: agent command %s on %s: no answer", cmd, dom.Name)
	}
	var reply struct {
		Return json.RawMessage `json:"return"`
		Error  *struct {
			Class string `json:"class"`
			Desc  string `json:"desc"`
		} `json:"error"`
	}
	if err := json.Unmarshal([]byte(res[0]), &reply); err != nil {
		return nil, fmt.Errorf("tinyguest: agent answer %q: %w", res[0], err)
	}
	if reply.Error != nil {
		return nil, &AgentError{Class: reply.Error.Class, Desc: reply.Error.Desc}
	}
	return reply.Return, nil
}

// agentCall runs execute with args and decodes its return into out.
func agentCall(conn *libvirt.Libvirt, dom libvirt.Domain, execute string, args, out any) error {
	cmd, err := json.Marshal(map[string]any{"execute": execute, "arguments": args})
	if err != nil {
		return err
	}
	ret, err := AgentCommand(conn, dom, string(cmd))
	if err != nil || out == nil {
		return err
	}
	return json.Unmarshal(ret, out)
}

// WaitAgent waits until the guest agent answers guest-ping, polling: the
// agent is up once the guest's /init has read its seed and configured
// its NIC.
func WaitAgent(conn *libvirt.Libvirt, dom libvirt.Domain, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for {
		_, err := AgentCommand(conn, dom, `{"execute":"guest-ping"}`)
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("tinyguest: %s's agent did not answer within %s: %w", dom.Name, limit, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// WaitAgentAddress waits until libvirt's agent-sourced addresses of dom
// (DomainInterfaceAddresses with source=agent, what the provider reads)
// include one in subnet with subnet's prefix length, and returns it: the
// guest takes its DHCP lease after its agent is up.
func WaitAgentAddress(conn *libvirt.Libvirt, dom libvirt.Domain, subnet netip.Prefix, limit time.Duration) (netip.Addr, error) {
	deadline := time.Now().Add(limit)
	for {
		ifaces, err := conn.DomainInterfaceAddresses(dom, uint32(libvirt.DomainInterfaceAddressesSrcAgent), 0)
		if err != nil {
			return netip.Addr{}, fmt.Errorf("tinyguest: %s's addresses from its agent: %w", dom.Name, err)
		}
		for _, i := range ifaces {
			for _, a := range i.Addrs {
				if ip, err := netip.ParseAddr(a.Addr); err == nil && subnet.Contains(ip) && int(a.Prefix) == subnet.Bits() {
					return ip, nil
				}
			}
		}
		if time.Now().After(deadline) {
			return netip.Addr{}, fmt.Errorf("tinyguest: %s has no address in %s after %s (it has %+v)", dom.Name, subnet, limit, ifaces)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// GuestFile reads a file in the guest through the agent; false when it
// cannot be opened (it does not exist).
func GuestFile(conn *libvirt.Libvirt, dom libvirt.Domain, path string) ([]byte, bool) {
	var handle int64
	if err := agentCall(conn, dom, "guest-file-open", map[string]string{"path": path, "mode": "r"}, &handle); err != nil {
		return nil, false
	}
	defer func() { _ = agentCall(conn, dom, "guest-file-close", map[string]int64{"handle": handle}, nil) }()
	var data []byte
	for {
		var chunk struct {
			Buf string `json:"buf-b64"`
			EOF bool   `json:"eof"`
		}
		if err := agentCall(conn, dom, "guest-file-read", map[string]int64{"handle": handle, "count": 1 << 20}, &chunk); err != nil {
			return nil, false
		}
		raw, err := base64.StdEncoding.DecodeString(chunk.Buf)
		if err != nil {
			return nil, false
		}
		data = append(data, raw...)
		if chunk.EOF || len(raw) == 0 {
			return data, true
		}
	}
}

// WriteGuestFile creates or truncates a file in the guest (mode 0666 when
// new, as QEMU's agent does) and writes data to it.
func WriteGuestFile(conn *libvirt.Libvirt, dom libvirt.Domain, path string, data []byte) error {
	var handle int64
	if err := agentCall(conn, dom, "guest-file-open", map[string]string{"path": path, "mode": "w"}, &handle); err != nil {
		return err
	}
	werr := agentCall(conn, dom, "guest-file-write", map[string]any{"handle": handle, "buf-b64": base64.StdEncoding.EncodeToString(data)}, nil)
	cerr := agentCall(conn, dom, "guest-file-close", map[string]int64{"handle": handle}, nil)
	return errors.Join(werr, cerr)
}

// Seed is the NoCloud seed a guest read at its last boot; a file it did
// not find is nil.
type Seed struct {
	MetaData, UserData, NetworkConfig []byte
}

// SeenDir is where the guest keeps what it read from its seed.
const SeenDir = "/run/tinyguest/seen"

// SeenCloudInit returns the seed files the guest read at its last boot.
func SeenCloudInit(conn *libvirt.Libvirt, dom libvirt.Domain) Seed {
	read := func(name string) []byte {
		raw, ok := GuestFile(conn, dom, SeenDir+"/"+name)
		if !ok {
			return nil
		}
		return raw
	}
	return Seed{MetaData: read("meta-data"), UserData: read("user-data"), NetworkConfig: read("network-config")}
}

// PowerOffFromInside has the guest power itself off, as a finished CI
// job's VM does: libvirt sends guest-shutdown through the agent and
// returns once QEMU reports the guest's shutdown; the domain is then
// shut off.
func PowerOffFromInside(conn *libvirt.Libvirt, dom libvirt.Domain) error {
	if err := conn.DomainShutdownFlags(dom, libvirt.DomainShutdownGuestAgent); err != nil {
		return fmt.Errorf("tinyguest: powering %s off through its agent: %w", dom.Name, err)
	}
	return nil
}

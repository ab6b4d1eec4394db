package main

import (
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"time"
	"unsafe"

	yaml "go.yaml.in/yaml/v3"
	"golang.org/x/sys/unix"
)

// netplan is the part of a netplan v2 network-config the guest applies:
// the addresses of the entry matching its NIC (by MAC, or the only one).
// Routes and name servers are not applied: the test networks are
// isolated.
type netplan struct {
	Version   int `yaml:"version"`
	Ethernets map[string]struct {
		Match *struct {
			MACAddress string `yaml:"macaddress"`
		} `yaml:"match"`
		DHCP4     bool     `yaml:"dhcp4"`
		Addresses []string `yaml:"addresses"`
	} `yaml:"ethernets"`
}

// configureNetwork brings lo and the first NIC up, with the static
// addresses network-config gives it or else with DHCPv4.
func configureNetwork(s seed) {
	if err := linkUp("lo"); err != nil {
		logf("network: lo: %v", err)
	}
	nic, err := waitNIC()
	if err != nil {
		logf("network: %v", err)
		return
	}
	if err := linkUp(nic.Name); err != nil {
		logf("network: %s: %v", nic.Name, err)
		return
	}
	static := staticAddresses(s["network-config"], nic)
	if len(static) == 0 {
		go keepDHCPLease(nic, s.hostname())
		return
	}
	for _, p := range static {
		if err := addAddress(nic, p); err != nil {
			logf("network: %s: %s: %v", nic.Name, p, err)
		}
	}
	logf("network: %s static %v", nic.Name, static)
}

// waitNIC returns the first non-loopback interface (virtio_net creates it
// while its module loads; the wait covers a late probe).
func waitNIC() (net.Interface, error) {
	deadline := time.Now().Add(5 * time.Second)
	for {
		ifaces, err := net.Interfaces()
		if err == nil {
			for _, i := range ifaces {
				if i.Flags&net.FlagLoopback == 0 && len(i.HardwareAddr) == 6 {
					return i, nil
				}
			}
		}
		if time.Now().After(deadline) {
			return net.Interface{}, fmt.Errorf("no network interface")
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// staticAddresses are the addresses network-config gives nic: the entry
// whose match.macaddress is nic's, or the one entry without a match.
func staticAddresses(config []byte, nic net.Interface) []netip.Prefix {
	var np netplan
	if len(config) == 0 || yaml.Unmarshal(config, &np) != nil || np.Version != 2 {
		return nil
	}
	var out []netip.Prefix
	for _, eth := range np.Ethernets {
		if eth.Match != nil && !strings.EqualFold(eth.Match.MACAddress, nic.HardwareAddr.String()) {
			continue
		}
		if eth.Match == nil && len(np.Ethernets) > 1 {
			continue
		}
		for _, a := range eth.Addresses {
			if p, err := netip.ParsePrefix(a); err == nil {
				out = append(out, p)
			}
		}
	}
	return out
}

// withIfreq runs f with an IPv4 socket for interface ioctls and an
// ifreq naming the interface.
func withIfreq(name string, f func(fd int, ifr *unix.Ifreq) error) error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq(name)
	if err != nil {
		return err
	}
	return f(fd, ifr)
}

// linkUp sets IFF_UP on an interface.
func linkUp(name string) error {
	return withIfreq(name, func(fd int, ifr *unix.Ifreq) error {
		return setUp(fd, ifr)
	})
}

func setUp(fd int, ifr *unix.Ifreq) error {
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
		return fmt.Errorf("get flags: %w", err)
	}
	ifr.SetUint16(ifr.Uint16() | unix.IFF_UP)
	if err := unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr); err != nil {
		return fmt.Errorf("set flags: %w", err)
	}
	return nil
}

// addAddress gives nic an address: IPv4 with SIOCSIFADDR and
// SIOCSIFNETMASK (it replaces the primary address, as a renewed lease
// must), IPv6 with an in6_ifreq.
func addAddress(nic net.Interface, p netip.Prefix) error {
	if p.Addr().Is4() {
		return setIPv4(nic.Name, p)
	}
	fd, err := unix.Socket(unix.AF_INET6, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	req := struct {
		addr      [16]byte
		prefixLen uint32
		ifindex   int32
	}{addr: p.Addr().As16(), prefixLen: uint32(p.Bits()), ifindex: int32(nic.Index)}
	if _, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.SIOCSIFADDR, uintptr(unsafe.Pointer(&req))); errno != 0 {
		return errno
	}
	return nil
}

func setIPv4(name string, p netip.Prefix) error {
	return withIfreq(name, func(fd int, ifr *unix.Ifreq) error {
		return setIPv4Ifreq(fd, ifr, p)
	})
}

func setIPv4Ifreq(fd int, ifr *unix.Ifreq, p netip.Prefix) error {
	if err := ifr.SetInet4Addr(p.Addr().AsSlice()); err != nil {
		return err
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCSIFADDR, ifr); err != nil {
		return fmt.Errorf("address: %w", err)
	}
	mask := net.CIDRMask(p.Bits(), 32)
	if err := ifr.SetInet4Addr(mask); err != nil {
		return err
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCSIFNETMASK, ifr); err != nil {
		return fmt.Errorf("netmask: %w", err)
	}
	return nil
}

// setMAC sets an interface's hardware address (SIOCSIFHWADDR): the
// request's union holds a struct sockaddr of family ARPHRD_ETHER whose
// data is the address. x/sys/unix's Ifreq has no setter for it, so the
// bytes are written in place, after the 16 bytes of the name.
func setMAC(name string, hw net.HardwareAddr) error {
	return withIfreq(name, func(fd int, ifr *unix.Ifreq) error {
		raw := (*[unix.IFNAMSIZ + 24]byte)(unsafe.Pointer(ifr))
		binary.NativeEndian.PutUint16(raw[unix.IFNAMSIZ:], unix.ARPHRD_ETHER)
		copy(raw[unix.IFNAMSIZ+2:], hw)
		if err := unix.IoctlIfreq(fd, unix.SIOCSIFHWADDR, ifr); err != nil {
			return fmt.Errorf("hardware address: %w", err)
		}
		return nil
	})
}

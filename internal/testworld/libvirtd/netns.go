package libvirtd

import (
	"fmt"
	"net"
	"net/netip"
	"os/exec"
	"runtime"
	"testing"
	"time"

	"github.com/digitalocean/go-libvirt"
	"golang.org/x/sys/unix"

	"github.com/hyperfleet/hyperfleet/internal/testworld/netns"
)

// ListenTCP listens on address inside the daemon's network namespace
// (the host side of its networks' bridges, say) and answers every
// connection with one line naming the address, until the test ends.
// The host cannot reach guest addresses; this is the other end a guest
// reaches, or fails to, in a network test.
func (d *Daemon) ListenTCP(t testing.TB, address string) {
	t.Helper()
	var l net.Listener
	err := d.inNetwork(func() error {
		var err error
		l, err = net.Listen("tcp", address)
		return err
	})
	if err != nil {
		t.Fatalf("libvirtd: listening on %s in the daemon's network namespace: %v", address, err)
	}
	t.Cleanup(func() { _ = l.Close() })
	netns.Announce(l, address)
}

// DialTCP connects to address from inside the daemon's network namespace
// and returns the first line the other end says; an error when no
// connection is made within timeout.
func (d *Daemon) DialTCP(address string, timeout time.Duration) (string, error) {
	var c net.Conn
	err := d.inNetwork(func() error {
		var err error
		c, err = net.DialTimeout("tcp", address, timeout)
		return err
	})
	if err != nil {
		return "", err
	}
	defer c.Close()
	_ = c.SetReadDeadline(time.Now().Add(timeout))
	buf := make([]byte, 256)
	n, err := c.Read(buf)
	return string(buf[:n]), err
}

// inNetwork runs f on an OS thread that has joined the daemon's network
// namespace: the sockets f opens belong to it for their whole life,
// whichever thread uses them later. The thread is never unlocked, so the
// runtime ends it with its goroutine instead of reusing it elsewhere.
func (d *Daemon) inNetwork(f func() error) error {
	if d.hostNetwork {
		return f()
	}
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		fd, err := unix.Open(fmt.Sprintf("/proc/%d/ns/net", d.holder.Process.Pid), unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			done <- fmt.Errorf("libvirtd: the daemon's network namespace: %w", err)
			return
		}
		defer unix.Close(fd)
		if err := unix.Setns(fd, unix.CLONE_NEWNET); err != nil {
			done <- fmt.Errorf("libvirtd: joining the daemon's network namespace: %w", err)
			return
		}
		done <- f()
	}()
	return <-done
}

// AddBridgeAddress gives the bridge of network (a network of this daemon)
// one more address, prefix, in the daemon's network namespace: a server
// the test runs there (ListenTCP) then stands for a host other than the
// bridge's own, such as a management address or a service a policy
// allows. ip runs from the thread that joined the namespace, whose
// namespaces its process inherits.
func (d *Daemon) AddBridgeAddress(t testing.TB, network libvirt.Network, prefix netip.Prefix) {
	t.Helper()
	bridge, err := d.Dial(t).NetworkGetBridgeName(network)
	if err != nil {
		t.Fatalf("libvirtd: the bridge of network %s: %v", network.Name, err)
	}
	err = d.inNetwork(func() error {
		out, err := exec.Command("ip", "addr", "add", prefix.String(), "dev", bridge).CombinedOutput()
		if err != nil {
			return fmt.Errorf("%w: %s", err, out)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("libvirtd: adding %s to bridge %s: %v", prefix, bridge, err)
	}
}

package agent

import (
	"context"
	"encoding/binary"
	"fmt"
	"os"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// hostSystem is the guest's own kernel (Linux).
type hostSystem struct{}

// SetClock sets CLOCK_REALTIME: timers the agent set run on
// CLOCK_MONOTONIC, which a step leaves alone.
func (hostSystem) SetClock(t time.Time) error {
	ts := unix.NsecToTimespec(t.UnixNano())
	if err := unix.ClockSettime(unix.CLOCK_REALTIME, &ts); err != nil {
		return fmt.Errorf("clock_settime: %w", err)
	}
	return nil
}

// AddEntropy adds seed to the input pool with RNDADDENTROPY, credited at
// its full size (it comes from the operator's CSPRNG, over the guest
// channel), then forces the CRNG to reseed from the pool with
// RNDRESEEDCRNG (Linux 4.17 and later): without it, the CRNG would go on
// from its saved state until its next scheduled reseed, up to a minute.
func (hostSystem) AddEntropy(seed []byte) error {
	f, err := os.OpenFile("/dev/urandom", os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	// struct rand_pool_info { int entropy_count; int buf_size; __u32 buf[]; }
	info := make([]byte, 8+len(seed))
	binary.NativeEndian.PutUint32(info[0:], uint32(8*len(seed)))
	binary.NativeEndian.PutUint32(info[4:], uint32(len(seed)))
	copy(info[8:], seed)
	defer clear(info)
	if _, _, errno := unix.Syscall(unix.SYS_IOCTL, f.Fd(), unix.RNDADDENTROPY, uintptr(unsafe.Pointer(&info[0]))); errno != 0 {
		return fmt.Errorf("RNDADDENTROPY: %w", errno)
	}
	if err := unix.IoctlSetInt(int(f.Fd()), unix.RNDRESEEDCRNG, 0); err != nil {
		return fmt.Errorf("RNDRESEEDCRNG: %w", err)
	}
	return nil
}

// RenewLeases has the guest's DHCP clients renew their leases
// (leaseRenewer), within two minutes: a client the server does not answer
// gives up after its own timeout (dhclient's is a minute).
func (hostSystem) RenewLeases(ctx context.Context) ([]string, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	l := leaseRenewer{root: "/", run: runCommand, terminate: func(pid int) error { return unix.Kill(pid, unix.SIGTERM) }}
	return l.renew(ctx)
}

package devenv

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"time"

	golibvirt "github.com/digitalocean/go-libvirt"
	"github.com/digitalocean/go-libvirt/socket/dialers"
	"libvirt.org/go/libvirtxml"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/testworld/simulator/qemu"
)

// LibvirtHost is a running libvirtd the world's cluster is made of
// (Options.Libvirt): a private daemon (internal/testworld/libvirtd,
// started with HostNetwork so that its user-mode guests reach the host's
// loopback) or any local one the world may define pools and a domain on.
type LibvirtHost struct {
	// SocketPath is the daemon's read-write unix socket; the cluster's
	// host URI is qemu:///system?socket=SocketPath.
	SocketPath string
	// Dir is a directory the daemon and its QEMU see at the same path:
	// the world's storage pools go there.
	Dir string
	// GuestClockBehind starts the template's guests with their clock
	// (their emulated RTC, which the kernel reads at boot) this far
	// behind the host's; zero keeps the host's. The clock stays behind
	// until something steps it, as the agent does with the operator's
	// time when its secrets arrive (a test of that step: a resumed
	// guest's clock under TCG goes on with the host's, so a suspend alone
	// would not put it behind).
	GuestClockBehind time.Duration
}

// Names of what the world defines on the libvirt host.
const (
	// LibvirtHostName is the cluster's one host (spec.libvirt.hosts).
	LibvirtHostName = "local"
	// LibvirtVolumePool holds the template's disk and the clones'
	// overlays; LibvirtMediaPool the seed ISOs.
	LibvirtVolumePool = "hf-volumes"
	LibvirtMediaPool  = "hf-media"
	// LibvirtTemplate is the template domain (source.libvirt.domain).
	LibvirtTemplate = "debian-runner"
	// LibvirtTemplateVolume is the template's disk in LibvirtVolumePool.
	LibvirtTemplateVolume = "debian-runner.raw"
)

// libvirtURI is the cluster's host URI.
func (h *LibvirtHost) libvirtURI() string { return "qemu:///system?socket=" + h.SocketPath }

// setUpLibvirt makes the libvirt host ready for the cluster: the two dir
// pools, the guest image as the template's volume and the template
// domain, as a platform team prepares a KVM host (docs/libvirt.md).
func (w *World) setUpLibvirt() error {
	h, img := w.opts.Libvirt, w.opts.GuestImage
	l := golibvirt.NewWithDialer(dialers.NewLocal(dialers.WithSocket(h.SocketPath), dialers.WithLocalTimeout(30*time.Second)))
	if err := l.ConnectToURI(golibvirt.QEMUSystem); err != nil {
		return fmt.Errorf("devenv: connect to libvirtd at %s: %w", h.SocketPath, err)
	}
	defer func() { _ = l.Disconnect() }()
	volumeDir := filepath.Join(h.Dir, LibvirtVolumePool)
	volumes, err := defineDirPool(l, LibvirtVolumePool, volumeDir)
	if err != nil {
		return err
	}
	if _, err := defineDirPool(l, LibvirtMediaPool, filepath.Join(h.Dir, LibvirtMediaPool)); err != nil {
		return err
	}
	disk := filepath.Join(volumeDir, LibvirtTemplateVolume)
	if err := placeImage(img.Disk, disk); err != nil {
		return err
	}
	if err := l.StoragePoolRefresh(volumes, 0); err != nil {
		return fmt.Errorf("devenv: refresh pool %s: %w", LibvirtVolumePool, err)
	}
	doc, err := w.libvirtTemplate(disk).Marshal()
	if err != nil {
		return fmt.Errorf("devenv: template domain: %w", err)
	}
	if _, err := l.DomainDefineXML(doc); err != nil {
		return fmt.Errorf("devenv: define template domain %s: %w", LibvirtTemplate, err)
	}
	return nil
}

// defineDirPool defines, builds and starts a directory pool at path.
func defineDirPool(l *golibvirt.Libvirt, name, path string) (golibvirt.StoragePool, error) {
	doc, err := (&libvirtxml.StoragePool{Type: "dir", Name: name, Target: &libvirtxml.StoragePoolTarget{Path: path}}).Marshal()
	if err != nil {
		return golibvirt.StoragePool{}, fmt.Errorf("devenv: pool %s: %w", name, err)
	}
	pool, err := l.StoragePoolDefineXML(doc, 0)
	if err != nil {
		return pool, fmt.Errorf("devenv: define pool %s: %w", name, err)
	}
	if err := l.StoragePoolBuild(pool, 0); err != nil {
		return pool, fmt.Errorf("devenv: build pool %s: %w", name, err)
	}
	if err := l.StoragePoolCreate(pool, 0); err != nil {
		return pool, fmt.Errorf("devenv: start pool %s: %w", name, err)
	}
	return pool, nil
}

// placeImage puts the guest image at dst: a hard link (the image is a
// sparse 4 GiB file and the template's volume is never written: clones
// are overlays on it), or a sparse copy across file systems.
func placeImage(src, dst string) error {
	if err := os.Link(src, dst); err == nil {
		return nil
	}
	if out, err := exec.Command("cp", "--sparse=always", src, dst).CombinedOutput(); err != nil {
		return fmt.Errorf("devenv: copy the guest image into the volume pool: %w: %s", err, out)
	}
	return nil
}

// libvirtTemplate is the template domain: the guest image booted as the
// Proxmox simulator boots it (internal/testworld/simulator/qemu: machine
// pc under TCG, direct kernel boot, the disk on virtio-scsi, virtio-net
// on QEMU's user-mode network, the guest agent's channel), with the
// template's memory and one vCPU, and an empty SCSI CD-ROM for the seed.
// The user-mode network is the Proxmox simulator's guest network, so the
// guests reach the host's loopback at the same GuestHostAddress.
func (w *World) libvirtTemplate(disk string) *libvirtxml.Domain {
	img := w.opts.GuestImage
	cmdline := img.Append
	if cmdline == "" {
		cmdline = qemu.KernelArgs()
	}
	format := img.Format
	if format == "" {
		format = "raw"
	}
	res := w.resources()
	zero := uint(0)
	return &libvirtxml.Domain{
		Type:   "qemu",
		Name:   LibvirtTemplate,
		Memory: &libvirtxml.DomainMemory{Value: uint(res.Memory.Value() >> 20), Unit: "MiB"},
		VCPU:   &libvirtxml.DomainVCPU{Value: uint(res.CPU)},
		OS: &libvirtxml.DomainOS{
			Type:    &libvirtxml.DomainOSType{Arch: "x86_64", Machine: "pc", Type: "hvm"},
			Kernel:  img.Kernel,
			Initrd:  img.Initrd,
			Cmdline: cmdline,
		},
		Features:   &libvirtxml.DomainFeatureList{ACPI: &libvirtxml.DomainFeature{}},
		Clock:      w.libvirtClock(),
		OnPoweroff: "destroy",
		OnReboot:   "restart",
		OnCrash:    "destroy",
		Devices: &libvirtxml.DomainDeviceList{
			Disks: []libvirtxml.DomainDisk{
				{
					Device: "disk",
					Driver: &libvirtxml.DomainDiskDriver{Name: "qemu", Type: format, Cache: "unsafe", Discard: "unmap"},
					Source: &libvirtxml.DomainDiskSource{Volume: &libvirtxml.DomainDiskSourceVolume{Pool: LibvirtVolumePool, Volume: LibvirtTemplateVolume}},
					Target: &libvirtxml.DomainDiskTarget{Dev: "sda", Bus: "scsi"},
				},
				{
					Device:   "cdrom",
					Driver:   &libvirtxml.DomainDiskDriver{Name: "qemu", Type: "raw"},
					Target:   &libvirtxml.DomainDiskTarget{Dev: "sdb", Bus: "scsi"},
					ReadOnly: &libvirtxml.DomainDiskReadOnly{},
				},
			},
			Controllers: []libvirtxml.DomainController{
				{Type: "scsi", Index: &zero, Model: "virtio-scsi"},
				{Type: "usb", Index: &zero, Model: "none"},
			},
			Interfaces: []libvirtxml.DomainInterface{{
				Source: &libvirtxml.DomainInterfaceSource{User: &libvirtxml.DomainInterfaceSourceUser{}},
				IP:     []libvirtxml.DomainInterfaceIP{{Family: "ipv4", Address: w.guestNetworkAddress(), Prefix: 24}},
				Model:  &libvirtxml.DomainInterfaceModel{Type: "virtio"},
			}},
			Serials: []libvirtxml.DomainSerial{{
				Source: &libvirtxml.DomainChardevSource{File: &libvirtxml.DomainChardevSourceFile{Path: filepath.Join(w.opts.Dir, "libvirt-console.log"), Append: "on"}},
				Target: &libvirtxml.DomainSerialTarget{Port: &zero},
			}},
			Channels: []libvirtxml.DomainChannel{{
				// libvirt picks the socket path and connects to it.
				Source: &libvirtxml.DomainChardevSource{UNIX: &libvirtxml.DomainChardevSourceUNIX{Mode: "bind"}},
				Target: &libvirtxml.DomainChannelTarget{VirtIO: &libvirtxml.DomainChannelTargetVirtIO{Name: "org.qemu.guest_agent.0"}},
			}},
			// Entropy for the guest's first TLS connections, without
			// waiting.
			RNGs: []libvirtxml.DomainRNG{{Model: "virtio",
				Backend: &libvirtxml.DomainRNGBackend{Random: &libvirtxml.DomainRNGBackendRandom{Device: "/dev/urandom"}}}},
			MemBalloon: &libvirtxml.DomainMemBalloon{Model: "none"},
		},
	}
}

// libvirtClock is the template's clock: the host's (UTC), or
// LibvirtHost.GuestClockBehind behind it; nil leaves libvirt's default.
func (w *World) libvirtClock() *libvirtxml.DomainClock {
	behind := w.opts.Libvirt.GuestClockBehind
	if behind <= 0 {
		return nil
	}
	return &libvirtxml.DomainClock{Offset: "variable", Basis: "utc", Adjustment: strconv.FormatInt(-int64(behind/time.Second), 10)}
}

// guestNetworkAddress is the network of QEMU's user-mode network whose
// .2 is the Proxmox simulator's GuestHostAddress (QEMU puts the host at
// .2 and DNS at .3 of the network it is given).
func (w *World) guestNetworkAddress() string {
	ip := net.ParseIP(w.Proxmox.GuestHostAddress()).To4()
	if ip == nil {
		return "10.99.0.0"
	}
	return net.IPv4(ip[0], ip[1], ip[2], 0).String()
}

// checkLibvirt refuses what a libvirt world cannot do.
func (o *Options) checkLibvirt() error {
	switch {
	case o.Libvirt == nil:
		return nil
	case o.GuestImage == nil:
		return errors.New("devenv: Options.Libvirt needs GuestImage: the template domain boots it")
	case o.ProxmoxDelivery || o.GuestNetwork != nil || o.TPM || o.KeepGuestDisks != "":
		return errors.New("devenv: Options.Libvirt runs guests on QEMU's user-mode network with a NoCloud seed: ProxmoxDelivery, GuestNetwork, TPM and KeepGuestDisks are the Proxmox simulator's")
	}
	return nil
}

// useLibvirt turns the world's cluster and template into the libvirt
// host's: provider libvirt with its pools, and the template domain.
func (w *World) useLibvirt(cluster *hfv1.HypervisorCluster, tmpl *hfv1.HypervisorMachineTemplate) {
	cluster.Spec.Provider = hfv1.ProviderLibvirt
	cluster.Spec.Endpoint = ""
	cluster.Spec.Credentials = hfv1.HypervisorCredentials{}
	cluster.Spec.TLS = nil
	cluster.Spec.Proxmox = nil
	cluster.Spec.Libvirt = &hfv1.LibvirtClusterSettings{
		Hosts:      []hfv1.LibvirtHost{{Name: LibvirtHostName, URI: w.opts.Libvirt.libvirtURI()}},
		VolumePool: LibvirtVolumePool,
		MediaPool:  LibvirtMediaPool,
	}
	tmpl.Spec.Source = hfv1.MachineSource{Libvirt: &hfv1.LibvirtSource{Domain: LibvirtTemplate}}
}

package tinyguest

import (
	"libvirt.org/go/libvirtxml"
)

// DefaultMemoryMiB is the guest's memory. The least measured to boot is
// 80 MiB (at 64 the kernel runs out while unpacking the initramfs); the
// rest is room for files written through the agent. Less memory is also
// less for the kernel to initialise: 80 MiB boots about 0.4 CPU-s
// cheaper than 128.
const DefaultMemoryMiB = 96

// SeedDevice is the target device of the CD-ROM slot for the NoCloud ISO
// (SCSI, on a virtio-scsi controller): a clone changes the media there.
const SeedDevice = "sda"

// KernelCmdline is the command line the guest boots with. Besides the
// console on the first serial port, an immediate reboot on panic and
// synchronous SCSI scanning (the CD-ROM exists once its module is
// loaded), each option saves TCG cycles on a work a test guest has no use
// for: speculative-execution mitigations, the TSC watchdog and timer
// check, audit, AppArmor, IMA, zeroing every allocated page, and ACPI
// interrupt routing (interpreting the AML of each PCI link took about
// 0.15 CPU-s per device; the BIOS's $PIR table does it for nothing).
const KernelCmdline = "console=ttyS0 panic=-1 loglevel=4 scsi_mod.scan=sync mitigations=off tsc=reliable no_timer_check " +
	"audit=0 apparmor=0 ima_appraise=off init_on_alloc=0 acpi=noirq"

// Options describe a tinyguest domain.
type Options struct {
	// Name is the domain's name.
	Name string
	// Image is what it boots (Build).
	Image Image
	// Disk is a qcow2 file for the first disk (vda). The guest does not
	// read it; it is there so that linked clones have a disk to overlay.
	Disk string
	// SeedISO is the NoCloud ISO in the CD-ROM slot; empty leaves the
	// slot's tray empty.
	SeedISO string
	// Network is the libvirt network of the one NIC (virtio).
	Network string
	// MAC is the NIC's address; empty lets libvirt choose.
	MAC string
	// ConsoleLog is a file the serial console is written to; empty
	// discards it.
	ConsoleLog string
	// MemoryMiB defaults to DefaultMemoryMiB.
	MemoryMiB uint
}

// Template returns the domain: type qemu (TCG: this machine's KVM does
// not run guest kernels), machine pc, one vCPU, direct kernel boot, the
// qcow2 disk, the seed CD-ROM, one NIC, the guest agent's channel and the
// serial console; no USB, balloon, graphics or video.
func Template(o Options) *libvirtxml.Domain {
	mem := o.MemoryMiB
	if mem == 0 {
		mem = DefaultMemoryMiB
	}
	zero := uint(0)
	return &libvirtxml.Domain{
		Type:   "qemu",
		Name:   o.Name,
		Memory: &libvirtxml.DomainMemory{Value: mem, Unit: "MiB"},
		VCPU:   &libvirtxml.DomainVCPU{Value: 1},
		OS: &libvirtxml.DomainOS{
			Type:    &libvirtxml.DomainOSType{Arch: "x86_64", Machine: "pc", Type: "hvm"},
			Kernel:  o.Image.Kernel,
			Initrd:  o.Image.Initrd,
			Cmdline: KernelCmdline,
		},
		Features:   &libvirtxml.DomainFeatureList{ACPI: &libvirtxml.DomainFeature{}},
		OnPoweroff: "destroy",
		OnReboot:   "restart",
		OnCrash:    "destroy",
		Devices: &libvirtxml.DomainDeviceList{
			Disks: []libvirtxml.DomainDisk{
				{
					Device: "disk",
					Driver: &libvirtxml.DomainDiskDriver{Name: "qemu", Type: "qcow2"},
					Source: &libvirtxml.DomainDiskSource{File: &libvirtxml.DomainDiskSourceFile{File: o.Disk}},
					Target: &libvirtxml.DomainDiskTarget{Dev: "vda", Bus: "virtio"},
				},
				seedCDROM(o.SeedISO),
			},
			Controllers: []libvirtxml.DomainController{
				{Type: "scsi", Index: &zero, Model: "virtio-scsi"},
				{Type: "usb", Index: &zero, Model: "none"},
			},
			Interfaces: []libvirtxml.DomainInterface{nic(o.Network, o.MAC)},
			Serials:    []libvirtxml.DomainSerial{console(o.ConsoleLog)},
			Channels: []libvirtxml.DomainChannel{{
				// libvirt picks the socket path and connects to it.
				Source: &libvirtxml.DomainChardevSource{UNIX: &libvirtxml.DomainChardevSourceUNIX{Mode: "bind"}},
				Target: &libvirtxml.DomainChannelTarget{VirtIO: &libvirtxml.DomainChannelTargetVirtIO{Name: "org.qemu.guest_agent.0"}},
			}},
			MemBalloon: &libvirtxml.DomainMemBalloon{Model: "none"},
		},
	}
}

// seedCDROM is the CD-ROM slot, with iso in it (or empty).
func seedCDROM(iso string) libvirtxml.DomainDisk {
	d := libvirtxml.DomainDisk{
		Device:   "cdrom",
		Driver:   &libvirtxml.DomainDiskDriver{Name: "qemu", Type: "raw"},
		Target:   &libvirtxml.DomainDiskTarget{Dev: SeedDevice, Bus: "scsi"},
		ReadOnly: &libvirtxml.DomainDiskReadOnly{},
	}
	if iso != "" {
		d.Source = &libvirtxml.DomainDiskSource{File: &libvirtxml.DomainDiskSourceFile{File: iso}}
	}
	return d
}

func nic(network, mac string) libvirtxml.DomainInterface {
	i := libvirtxml.DomainInterface{
		Source: &libvirtxml.DomainInterfaceSource{Network: &libvirtxml.DomainInterfaceSourceNetwork{Network: network}},
		Model:  &libvirtxml.DomainInterfaceModel{Type: "virtio"},
	}
	if mac != "" {
		i.MAC = &libvirtxml.DomainInterfaceMAC{Address: mac}
	}
	return i
}

// console is the first serial port, written to path (or discarded).
func console(path string) libvirtxml.DomainSerial {
	port := uint(0)
	src := &libvirtxml.DomainChardevSource{Null: &libvirtxml.DomainChardevSourceNull{}}
	if path != "" {
		src = &libvirtxml.DomainChardevSource{File: &libvirtxml.DomainChardevSourceFile{Path: path}}
	}
	return libvirtxml.DomainSerial{Source: src, Target: &libvirtxml.DomainSerialTarget{Port: &port}}
}

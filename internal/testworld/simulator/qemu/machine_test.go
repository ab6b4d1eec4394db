package qemu

import (
	"cmp"
	"slices"
	"strings"
	"testing"
)

// TestArgsTPM: a machine with an swtpm control socket gets Proxmox's TPM
// devices (a tpm-tis device on the emulator backend, its chardev on the
// control socket), each once; one without gets no TPM device at all.
func TestArgsTPM(t *testing.T) {
	m := Machine{Name: "t", Kernel: "k", Initrd: "i", Disk: "d", MAC: "02:00:00:00:00:01", Console: "/tmp/c", SocketDir: "/tmp/s"}
	if args := strings.Join(m.Args(), " "); strings.Contains(args, "tpm") {
		t.Fatalf("no TPM asked, yet: %s", args)
	}
	m.TPMCtrl = "/run/hf/tpm.sock.ctrl"
	args := m.Args()
	for _, pair := range [][2]string{
		{"-chardev", "socket,id=tpmchar,path=/run/hf/tpm.sock.ctrl"},
		{"-tpmdev", "emulator,id=tpmdev,chardev=tpmchar"},
		{"-device", "tpm-tis,tpmdev=tpmdev"},
	} {
		n := 0
		for i := 0; i+1 < len(args); i++ {
			if args[i] == pair[0] && args[i+1] == pair[1] {
				n++
			}
		}
		if n != 1 {
			t.Errorf("%s %s appears %d times in %q, want once", pair[0], pair[1], n, args)
		}
	}
	if slices.Contains(args, "tpm-crb,tpmdev=tpmdev") {
		t.Errorf("a CRB device besides TIS: %q", args)
	}
}

// TestArgsCPU: a machine's CPU model is QEMU's -cpu, once; without one
// QEMU picks its default and no -cpu is given.
func TestArgsCPU(t *testing.T) {
	m := Machine{Name: "t", Kernel: "k", Initrd: "i", Disk: "d", MAC: "02:00:00:00:00:01", Console: "/tmp/c", SocketDir: "/tmp/s"}
	if slices.Contains(m.Args(), "-cpu") {
		t.Fatalf("no CPU model asked, yet: %q", m.Args())
	}
	m.CPU = "kvm64"
	args := m.Args()
	i := slices.Index(args, "-cpu")
	if i < 0 || i+1 >= len(args) || args[i+1] != "kvm64" || slices.Index(args[i+1:], "-cpu") >= 0 {
		t.Fatalf("want -cpu kvm64 once: %q", args)
	}
}

// TestArgsIncoming: a machine with a saved state loads it (-incoming from
// cat of the file, the path quoted for the shell that runs it) instead of
// booting; one without boots, with no -incoming at all.
//
// Mutation: appending -incoming unquoted ("exec:cat " + path) fails this
// test on the path with a space.
func TestArgsIncoming(t *testing.T) {
	m := Machine{Name: "t", Kernel: "k", Initrd: "i", Disk: "d", MAC: "02:00:00:00:00:01", Console: "/tmp/c", SocketDir: "/tmp/s"}
	if slices.Contains(m.Args(), "-incoming") {
		t.Fatalf("no state asked, yet: %q", m.Args())
	}
	m.Incoming = "/cache/state-1/it's state"
	args := m.Args()
	i := slices.Index(args, "-incoming")
	if i < 0 || i+1 >= len(args) || args[i+1] != `exec:cat '/cache/state-1/it'\''s state'` {
		t.Fatalf("-incoming in %q, want exec:cat of the quoted path", args)
	}
	if n := strings.Count(strings.Join(args, " "), "-incoming"); n != 1 {
		t.Errorf("-incoming appears %d times", n)
	}
}

// TestArgsCDROM: a machine's ISO is a SCSI CD-ROM under its config key;
// a machine whose ISO was ejected keeps the drive with no medium (a
// resumed QEMU must have every device of the saved one); a machine with
// neither has no CD-ROM at all.
//
// Mutation: emitting the drive only with an ISO (the old condition)
// drops the empty drive and fails this test.
func TestArgsCDROM(t *testing.T) {
	m := Machine{Name: "t", Kernel: "k", Initrd: "i", Disk: "d", MAC: "02:00:00:00:00:01", Console: "/tmp/c", SocketDir: "/tmp/s"}
	if args := strings.Join(m.Args(), " "); strings.Contains(args, "scsi-cd") {
		t.Fatalf("no CD-ROM asked, yet: %s", args)
	}
	cases := []struct {
		iso, id, drive string
	}{
		{"/vm/ide2.iso", "ide2", "file=/vm/ide2.iso,if=none,id=drive-ide2,media=cdrom,readonly=on"},
		{"", "ide2", "if=none,id=drive-ide2,media=cdrom,readonly=on"},
		{"/vm/seed.iso", "", "file=/vm/seed.iso,if=none,id=drive-cdrom0,media=cdrom,readonly=on"},
	}
	for _, c := range cases {
		m.CDROM, m.CDROMID = c.iso, c.id
		args := m.Args()
		if i := slices.Index(args, c.drive); i < 1 || args[i-1] != "-drive" {
			t.Errorf("CD-ROM %q (%q): no -drive %s in %q", c.iso, c.id, c.drive, args)
		}
		dev := "scsi-cd,bus=scsihw0.0,drive=drive-" + cmp.Or(c.id, "cdrom0") + ",id=" + cmp.Or(c.id, "cdrom0")
		if i := slices.Index(args, dev); i < 1 || args[i-1] != "-device" {
			t.Errorf("CD-ROM %q (%q): no -device %s in %q", c.iso, c.id, dev, args)
		}
	}
}

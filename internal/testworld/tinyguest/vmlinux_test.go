package tinyguest

import (
	"debug/elf"
	"os"
	"path/filepath"
	"testing"
)

// TestExtractVmlinux: the kernel Build keeps unpacks to an x86-64 ELF
// with a PVH note (what QEMU boots without the decompressor).
func TestExtractVmlinux(t *testing.T) {
	img := Build(t)
	bz, err := os.ReadFile(filepath.Join(filepath.Dir(img.Kernel), "vmlinuz"))
	if err != nil {
		t.Fatal(err)
	}
	raw, err := extractVmlinux(bz)
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.CreateTemp(t.TempDir(), "vmlinux")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write(raw); err != nil {
		t.Fatal(err)
	}
	f.Close()
	e, err := elf.Open(f.Name())
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	if e.Machine != elf.EM_X86_64 {
		t.Errorf("machine %v, want x86-64", e.Machine)
	}
	if !hasPVHNote(e) {
		t.Error("no PVH entry note (XEN_ELFNOTE_PHYS32_ENTRY)")
	}
	if _, err := extractVmlinux(raw); err == nil {
		t.Error("an ELF file was taken for a bzImage")
	}
}

// hasPVHNote looks for the Xen ELF note 18 (PHYS32_ENTRY).
func hasPVHNote(f *elf.File) bool {
	for _, p := range f.Progs {
		if p.Type != elf.PT_NOTE {
			continue
		}
		data := make([]byte, p.Filesz)
		if _, err := p.ReadAt(data, 0); err != nil {
			return false
		}
		for len(data) >= 12 {
			nameSz := int(f.ByteOrder.Uint32(data))
			descSz := int(f.ByteOrder.Uint32(data[4:]))
			typ := f.ByteOrder.Uint32(data[8:])
			name := string(data[12 : 12+nameSz])
			if typ == 18 && len(name) >= 3 && name[:3] == "Xen" {
				return true
			}
			next := 12 + (nameSz+3)&^3 + (descSz+3)&^3
			if next > len(data) {
				break
			}
			data = data[next:]
		}
	}
	return false
}

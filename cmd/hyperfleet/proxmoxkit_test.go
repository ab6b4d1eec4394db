package main

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
)

// The command prints the kit the golden file of pkg/provider/proxmox/kit
// reviews, byte for byte.
func TestPrintProxmoxKit(t *testing.T) {
	var out bytes.Buffer
	if err := printProxmoxKit(&out, nil); err != nil {
		t.Fatal(err)
	}
	want, err := os.ReadFile(filepath.Join("..", "..", "pkg", "provider", "proxmox", "kit", "testdata", "proxmox-kit.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(out.Bytes(), want) {
		t.Errorf("hyperfleet proxmox-kit printed:\n%s\nwant pkg/provider/proxmox/kit/testdata/proxmox-kit.yaml:\n%s", out.Bytes(), want)
	}
	if err := printProxmoxKit(&out, []string{"extra"}); err == nil {
		t.Error("an unexpected argument was accepted")
	}
}

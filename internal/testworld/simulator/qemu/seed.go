package qemu

import (
	"fmt"
	"os"

	"github.com/diskfs/go-diskfs/backend/file"
	"github.com/diskfs/go-diskfs/filesystem/iso9660"
)

// WriteNoCloudISO writes a NoCloud seed ISO (volume label cidata) with
// files at its root, as the operator builds them.
func WriteNoCloudISO(path string, files map[string][]byte) error {
	size := int64(1 << 20)
	for _, c := range files {
		size += int64(len(c)) + 4096
	}
	st, err := file.CreateFromPath(path, size)
	if err != nil {
		return fmt.Errorf("seed ISO: %w", err)
	}
	defer st.Close()
	staging, err := os.MkdirTemp("", "guest-image-seed-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(staging)
	fsys, err := iso9660.Create(st, 0, 0, 2048, staging)
	if err != nil {
		return fmt.Errorf("seed ISO: %w", err)
	}
	for name, content := range files {
		f, err := fsys.OpenFile("/"+name, os.O_CREATE|os.O_RDWR)
		if err != nil {
			return fmt.Errorf("seed ISO: %w", err)
		}
		if _, err := f.Write(content); err != nil {
			return fmt.Errorf("seed ISO: %w", err)
		}
		if err := f.Close(); err != nil {
			return fmt.Errorf("seed ISO: %w", err)
		}
	}
	if err := fsys.Finalize(iso9660.FinalizeOptions{RockRidge: true, Joliet: true, VolumeIdentifier: "cidata"}); err != nil {
		return fmt.Errorf("seed ISO: %w", err)
	}
	return nil
}

//go:build !windows

package tpmdevid

import (
	"fmt"
	"io"

	"github.com/google/go-tpm/legacy/tpm2"
	"github.com/google/go-tpm/tpmutil"
)

// openTPM opens the TPM by path; for a unix socket go-tpm connects once
// per command.
func openTPM(devicePath string) (io.ReadWriteCloser, error) {
	rw, err := tpm2.OpenTPM(devicePath)
	if err != nil {
		return nil, fmt.Errorf("tpmdevid: opening the TPM at %s: %w", devicePath, err)
	}
	return rw, nil
}

// closeTPM closes a device; go-tpm's socket connection closes itself after
// each command and reports closing it again as an error, which means
// nothing here.
func closeTPM(rw io.ReadWriteCloser) {
	if _, perCommand := rw.(*tpmutil.EmulatorReadWriteCloser); perCommand {
		return
	}
	_ = rw.Close()
}

//go:build windows

package tpmdevid

import (
	"errors"
	"io"
)

// errWindowsTPM: the DevID enrollment opens the TPM by device path, which
// Windows does not have (its TPM is reached through TBS); the API refuses
// attestation for Windows guests (spec.guest.os windows), so the agent's
// Windows build never gets here with a valid config.
var errWindowsTPM = errors.New("tpmdevid: TPM attestation is not built for Windows guests (spec.guest.os windows takes attestation.method none)")

func openTPM(string) (io.ReadWriteCloser, error) { return nil, errWindowsTPM }

func closeTPM(rw io.ReadWriteCloser) { _ = rw.Close() }

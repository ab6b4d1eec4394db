package swtpm

import (
	"os"
	"path/filepath"
	"testing"
)

// NewLocalCAForTest makes a local CA in the test's temporary directory.
func NewLocalCAForTest(t testing.TB) *LocalCA {
	t.Helper()
	ca, err := NewLocalCA(filepath.Join(t.TempDir(), "localca"))
	if err != nil {
		t.Fatal(err)
	}
	return ca
}

// StartForTest manufactures a TPM with ca in the test's temporary
// directory and runs it until the test ends; a TPM that cannot be made or
// started fails the test. Its sockets live in a short directory of their
// own: a t.TempDir() path, named after the test, can pass a unix socket's
// 107 bytes.
func StartForTest(t testing.TB, ca *LocalCA) *TPM {
	t.Helper()
	state := filepath.Join(t.TempDir(), "tpmstate")
	if err := ca.Manufacture(state); err != nil {
		t.Fatal(err)
	}
	runDir, err := os.MkdirTemp("", "tpm")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(runDir) })
	tpm, err := Start(state, runDir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := tpm.Stop(); err != nil {
			t.Error(err)
		}
		if t.Failed() {
			t.Logf("swtpm log (%s):\n%s", tpm.LogPath, tpm.Log())
		}
	})
	return tpm
}

package main

import (
	"errors"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// loadModules loads the modules listed in moduleOrder with finit_module,
// in that order (dependencies first). A module already built in or
// loaded is fine.
func loadModules() {
	raw, err := os.ReadFile(moduleOrder)
	if err != nil {
		logf("module list: %v", err)
		return
	}
	for _, name := range strings.Fields(string(raw)) {
		if err := loadModule(filepath.Join(moduleDir, name)); err != nil {
			logf("module %s: %v", name, err)
		}
	}
}

func loadModule(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := unix.FinitModule(int(f.Fd()), "", 0); err != nil && !errors.Is(err, unix.EEXIST) {
		return err
	}
	return nil
}

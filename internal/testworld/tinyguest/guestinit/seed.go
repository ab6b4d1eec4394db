package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"time"

	yaml "go.yaml.in/yaml/v3"
	"golang.org/x/sys/unix"
)

// seedFiles are the NoCloud files the guest keeps a copy of.
var seedFiles = []string{"meta-data", "user-data", "network-config"}

// seed is what the guest read from its NoCloud CD-ROM; a nil file was
// absent.
type seed map[string][]byte

// hostname is meta-data's local-hostname, or "".
func (s seed) hostname() string {
	var md struct {
		LocalHostname string `yaml:"local-hostname"`
	}
	if yaml.Unmarshal(s["meta-data"], &md) != nil {
		return ""
	}
	return md.LocalHostname
}

// readSeed finds the ISO9660 CD-ROM labelled cidata, mounts it, and copies
// its NoCloud files to seenDir (which then exists even without a seed, so
// a reader can tell "no seed" from "not booted yet").
func readSeed() seed {
	s := seed{}
	if err := os.MkdirAll(seenDir, 0o755); err != nil {
		logf("seed: %v", err)
		return s
	}
	dev := findSeedDevice()
	if dev == "" {
		logf("seed: no CD-ROM labelled cidata")
		return s
	}
	if err := os.MkdirAll(seedMount, 0o755); err != nil {
		logf("seed: %v", err)
		return s
	}
	if err := unix.Mount(dev, seedMount, "iso9660", unix.MS_RDONLY, ""); err != nil {
		logf("seed: mounting %s: %v", dev, err)
		return s
	}
	defer func() { _ = unix.Unmount(seedMount, 0) }()
	for _, name := range seedFiles {
		raw, err := os.ReadFile(filepath.Join(seedMount, name))
		if err != nil {
			continue
		}
		s[name] = raw
		if err := os.WriteFile(filepath.Join(seenDir, name), raw, 0o644); err != nil {
			logf("seed: keeping %s: %v", name, err)
		}
	}
	logf("seed: read %d files from %s", len(s), dev)
	return s
}

// findSeedDevice returns the CD-ROM device whose ISO9660 volume label is
// cidata. SCSI scanning is synchronous (scsi_mod.scan=sync on the kernel
// command line), so the drives exist once the modules are loaded; the
// short wait covers a slow media change.
func findSeedDevice() string {
	deadline := time.Now().Add(2 * time.Second)
	for {
		drives, _ := filepath.Glob("/sys/block/sr*")
		for _, d := range drives {
			dev := "/dev/" + filepath.Base(d)
			if label, ok := isoLabel(dev); ok && strings.EqualFold(label, "cidata") {
				return dev
			}
		}
		if time.Now().After(deadline) {
			return ""
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// isoLabel reads the volume identifier of an ISO9660 image's primary
// volume descriptor (sector 16).
func isoLabel(dev string) (string, bool) {
	f, err := os.Open(dev)
	if err != nil {
		return "", false
	}
	defer f.Close()
	pvd := make([]byte, 2048)
	if _, err := f.ReadAt(pvd, 16*2048); err != nil {
		return "", false
	}
	if pvd[0] != 1 || !bytes.Equal(pvd[1:6], []byte("CD001")) {
		return "", false
	}
	return strings.TrimRight(string(pvd[40:72]), " \x00"), true
}

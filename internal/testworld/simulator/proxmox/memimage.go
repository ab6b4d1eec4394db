package proxmoxsim

import (
	"archive/tar"
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
)

// A simulated guest's memory, as a suspend to disk saves it on the state
// volume: a tar of what the guest holds in RAM. For a guest the hook runs
// that is its /run (a tmpfs in a real guest; the directory tree under the
// VM's root here), for a guest without a program the files agent/file-write
// put into it. Contents are stored as they are, so that what the guest held
// in memory (a secret in /run) is at rest on storage, readable in the
// volume's bytes, for as long as the state volume exists.

// maxMemoryImage bounds a memory image: a simulated guest's /run holds a
// few small files; more is a test or guest program gone wrong.
const maxMemoryImage = 64 << 20

// takeMemoryLocked moves the guest's memory out of the running guest into
// an image: the hook guest's /run is emptied, the file map cleared.
func (s *Simulator) takeMemoryLocked(v *vm) ([]byte, error) {
	if s.guest != nil {
		run := filepath.Join(s.guest.rootDir(v.vmid), "run")
		image, err := tarDir(run, "run")
		if err != nil {
			return nil, err
		}
		return image, s.guest.resetRun(v.vmid)
	}
	image, err := tarFiles(v.guestFiles)
	if err != nil {
		return nil, err
	}
	v.guestFiles = nil
	return image, nil
}

// restoreMemoryLocked puts a memory image back into the guest.
func (s *Simulator) restoreMemoryLocked(v *vm, image []byte) error {
	if s.guest != nil {
		if err := s.guest.resetRun(v.vmid); err != nil {
			return err
		}
		return untarDir(image, s.guest.rootDir(v.vmid), "run")
	}
	files, err := untarFiles(image)
	if err != nil {
		return err
	}
	v.guestFiles = files
	return nil
}

// tarFiles is an image of a guest's file map, in path order.
func tarFiles(files map[string]guestFile) ([]byte, error) {
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	for _, name := range sortedKeys(files) {
		f := files[name]
		hdr := &tar.Header{Typeflag: tar.TypeReg, Name: strings.TrimPrefix(path.Clean(name), "/"), Mode: int64(f.mode.Perm()), Size: int64(len(f.content))}
		if err := tw.WriteHeader(hdr); err != nil {
			return nil, err
		}
		if _, err := tw.Write(f.content); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

// untarFiles reads an image of tarFiles back into a file map.
func untarFiles(image []byte) (map[string]guestFile, error) {
	files := map[string]guestFile{}
	err := readImage(image, func(hdr *tar.Header, content []byte) error {
		if hdr.Typeflag == tar.TypeReg {
			files["/"+hdr.Name] = guestFile{content: content, mode: fs.FileMode(hdr.Mode).Perm()}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return files, nil
}

// tarDir is an image of the tree at dir, its entries named under prefix.
func tarDir(dir, prefix string) ([]byte, error) {
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	var paths []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if p != dir && (d.IsDir() || d.Type().IsRegular()) {
			paths = append(paths, p)
		}
		return nil
	})
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, err
	}
	sort.Strings(paths)
	for _, p := range paths {
		fi, err := os.Stat(p)
		if err != nil {
			return nil, err
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil {
			return nil, err
		}
		hdr := &tar.Header{Name: path.Join(prefix, filepath.ToSlash(rel)), Mode: int64(fi.Mode().Perm())}
		var content []byte
		if fi.IsDir() {
			hdr.Typeflag = tar.TypeDir
		} else {
			if content, err = os.ReadFile(p); err != nil {
				return nil, err
			}
			hdr.Typeflag, hdr.Size = tar.TypeReg, int64(len(content))
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return nil, err
		}
		if _, err := tw.Write(content); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

// untarDir writes an image of tarDir under root; every entry must lie
// under prefix. Directories get their modes last, so that one without
// write permission still receives its files.
func untarDir(image []byte, root, prefix string) error {
	dirs := map[string]fs.FileMode{}
	err := readImage(image, func(hdr *tar.Header, content []byte) error {
		if hdr.Name != prefix && !strings.HasPrefix(hdr.Name, prefix+"/") {
			return fmt.Errorf("memory image entry %q is outside %s", hdr.Name, prefix)
		}
		dst := filepath.Join(root, filepath.FromSlash(hdr.Name))
		mode := fs.FileMode(hdr.Mode).Perm()
		switch hdr.Typeflag {
		case tar.TypeDir:
			dirs[dst] = mode
			return os.MkdirAll(dst, 0o755)
		case tar.TypeReg:
			if err := os.WriteFile(dst, content, mode); err != nil {
				return err
			}
			// WriteFile's mode passes the umask.
			return os.Chmod(dst, mode)
		}
		return nil
	})
	if err != nil {
		return err
	}
	for dst, mode := range dirs {
		if err := os.Chmod(dst, mode); err != nil {
			return err
		}
	}
	return nil
}

// readImage calls entry for every entry of a memory image, with its
// content; names must be local paths.
func readImage(image []byte, entry func(hdr *tar.Header, content []byte) error) error {
	tr := tar.NewReader(bytes.NewReader(image))
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("memory image: %w", err)
		}
		if !filepath.IsLocal(hdr.Name) || hdr.Size > maxMemoryImage {
			return fmt.Errorf("memory image: bad entry %q", hdr.Name)
		}
		content, err := io.ReadAll(tr)
		if err != nil {
			return fmt.Errorf("memory image: %w", err)
		}
		if err := entry(hdr, content); err != nil {
			return err
		}
	}
}

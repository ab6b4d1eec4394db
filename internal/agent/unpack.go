package agent

import (
	"archive/tar"
	"archive/zip"
	"bytes"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/url"
	"os"
	"path/filepath"
	"strings"
)

// Archive formats of runner packages.
const (
	formatTarGz = "tar.gz"
	formatZip   = "zip"
)

// archiveFormat tells the package's format from its URL (.tar.gz, .tgz,
// .zip), else from its first bytes.
func archiveFormat(rawURL, file string) (string, error) {
	if u, err := url.Parse(rawURL); err == nil {
		p := strings.ToLower(u.Path)
		switch {
		case strings.HasSuffix(p, ".tar.gz"), strings.HasSuffix(p, ".tgz"):
			return formatTarGz, nil
		case strings.HasSuffix(p, ".zip"):
			return formatZip, nil
		}
	}
	f, err := os.Open(file)
	if err != nil {
		return "", err
	}
	defer f.Close()
	head := make([]byte, 4)
	n, _ := io.ReadFull(f, head)
	switch {
	case n >= 2 && head[0] == 0x1f && head[1] == 0x8b:
		return formatTarGz, nil
	case n == 4 && bytes.Equal(head, []byte("PK\x03\x04")):
		return formatZip, nil
	}
	return "", errors.New("neither a .tar.gz nor a .zip file")
}

// unpack extracts the archive file into dest, which must exist, and
// returns the number of entries. Entry names must stay in dest (no
// absolute names, no "..", no writing through symbolic links that leave
// it), symbolic links must point inside dest, and file modes (permission
// bits) are kept; owners, set-id bits and device nodes are not.
//
// lim bounds what the archive may write: a compressed archive can expand
// without limit (a decompression bomb), and the checksum only proves that
// the package is the one the config names, not that it is sane.
func unpack(file, format, dest string, lim unpackLimits) (int, error) {
	root, err := os.OpenRoot(dest)
	if err != nil {
		return 0, err
	}
	defer root.Close()
	x := &extractor{root: root, dest: dest, lim: lim}
	var n int
	switch format {
	case formatTarGz:
		n, err = x.tarGz(file)
	case formatZip:
		n, err = x.zip(file)
	default:
		err = fmt.Errorf("unknown archive format %q", format)
	}
	if err != nil {
		return n, err
	}
	return n, x.checkLinks()
}

// unpackLimits bound one extraction.
type unpackLimits struct {
	// bytes is the most file content written in all, entries the most
	// entries of any kind.
	bytes   int64
	entries int
}

// errTooLarge: the archive exceeds its unpackLimits.
var errTooLarge = errors.New("the runner package is larger than the agent's bounds")

// extractor writes entries into root.
type extractor struct {
	root  *os.Root
	dest  string
	links []string // symbolic links created
	lim   unpackLimits
	// written and entries are what was extracted so far.
	written int64
	entries int
}

// count admits one more entry.
func (x *extractor) count(name string) error {
	x.entries++
	if x.entries > x.lim.entries {
		return fmt.Errorf("entry %q: more than %d entries (--max-unpacked-files): %w", name, x.lim.entries, errTooLarge)
	}
	return nil
}

func (x *extractor) tarGz(file string) (int, error) {
	f, err := os.Open(file)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	gz, err := gzip.NewReader(f)
	if err != nil {
		return 0, fmt.Errorf("not a gzip file: %w", err)
	}
	tr := tar.NewReader(gz)
	n := 0
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return n, nil
		}
		if err != nil {
			return n, fmt.Errorf("read tar: %w", err)
		}
		if h.Typeflag == tar.TypeXGlobalHeader {
			continue
		}
		name, err := entryName(h.Name)
		if err != nil {
			return n, err
		}
		if err := x.count(h.Name); err != nil {
			return n, err
		}
		perm := fs.FileMode(h.Mode) & fs.ModePerm
		switch h.Typeflag {
		case tar.TypeDir:
			err = x.dir(name, perm)
		case tar.TypeReg:
			err = x.file(name, perm, tr)
		case tar.TypeSymlink:
			err = x.symlink(name, h.Linkname)
		case tar.TypeLink:
			err = x.hardlink(name, h.Linkname)
		default:
			err = fmt.Errorf("entry %q: unsupported tar entry type %q", h.Name, h.Typeflag)
		}
		if err != nil {
			return n, err
		}
		n++
	}
}

func (x *extractor) zip(file string) (int, error) {
	zr, err := zip.OpenReader(file)
	if err != nil && !errors.Is(err, zip.ErrInsecurePath) {
		return 0, fmt.Errorf("read zip: %w", err)
	}
	// With ErrInsecurePath the names are checked below, entry by entry.
	defer zr.Close()
	n := 0
	for _, zf := range zr.File {
		name, err := entryName(zf.Name)
		if err != nil {
			return n, err
		}
		if err := x.count(zf.Name); err != nil {
			return n, err
		}
		mode := zf.Mode()
		perm := mode.Perm()
		switch {
		case mode.IsDir():
			err = x.dir(name, perm)
		case mode&fs.ModeSymlink != 0:
			var target []byte
			if target, err = readZipEntry(zf, 4096); err == nil {
				err = x.symlink(name, string(target))
			}
		case mode.IsRegular():
			var rc io.ReadCloser
			if rc, err = zf.Open(); err == nil {
				err = x.file(name, perm, rc)
				if cerr := rc.Close(); err == nil && cerr != nil {
					err = fmt.Errorf("entry %q: %w", zf.Name, cerr)
				}
			}
		default:
			err = fmt.Errorf("entry %q: unsupported zip entry mode %s", zf.Name, mode)
		}
		if err != nil {
			return n, err
		}
		n++
	}
	return n, nil
}

func readZipEntry(zf *zip.File, limit int64) ([]byte, error) {
	rc, err := zf.Open()
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	data, err := io.ReadAll(io.LimitReader(rc, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(data)) > limit {
		return nil, fmt.Errorf("entry %q: symbolic link target longer than %d bytes", zf.Name, limit)
	}
	return data, nil
}

// entryName checks an archive entry name and returns it as a clean local
// path; "." is the directory itself.
func entryName(name string) (string, error) {
	switch {
	case name == "":
		return "", errors.New("entry with an empty name")
	case strings.ContainsRune(name, 0):
		return "", fmt.Errorf("entry %q: NUL in name", name)
	case strings.HasPrefix(name, "/") || filepath.IsAbs(name):
		return "", fmt.Errorf("entry %q: absolute name; refusing to write outside the install directory", name)
	}
	clean := filepath.Clean(filepath.FromSlash(name))
	if clean != "." && !filepath.IsLocal(clean) {
		return "", fmt.Errorf("entry %q leaves the install directory; refusing it", name)
	}
	return clean, nil
}

func (x *extractor) parent(name string) error {
	if d := filepath.Dir(name); d != "." {
		return x.root.MkdirAll(d, 0o755)
	}
	return nil
}

// replace removes an existing non-directory at name (an archive may hold
// a name twice; the later entry wins).
func (x *extractor) replace(name string) error {
	fi, err := x.root.Lstat(name)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return nil
	case err != nil:
		return err
	case fi.IsDir():
		return fmt.Errorf("entry %q would replace a directory", name)
	}
	return x.root.Remove(name)
}

func (x *extractor) dir(name string, perm fs.FileMode) error {
	if name == "." {
		return nil
	}
	if err := x.root.MkdirAll(name, 0o755); err != nil {
		return err
	}
	// The owner keeps write access so later entries can go in.
	return x.root.Chmod(name, perm|0o700)
}

func (x *extractor) file(name string, perm fs.FileMode, r io.Reader) error {
	if name == "." {
		return errors.New("file entry with the name of the directory itself")
	}
	if err := x.parent(name); err != nil {
		return err
	}
	if err := x.replace(name); err != nil {
		return err
	}
	f, err := x.root.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	// The headers' sizes are not trusted: the bytes actually written
	// count, one beyond what is left telling an entry that exceeds it.
	left := x.lim.bytes - x.written
	n, err := io.Copy(f, io.LimitReader(r, left+1))
	x.written += n
	if err == nil && n > left {
		err = fmt.Errorf("more than %d bytes unpacked (--max-unpacked-bytes): %w", x.lim.bytes, errTooLarge)
	}
	if err != nil {
		_ = f.Close()
		return fmt.Errorf("entry %q: %w", name, err)
	}
	if err := f.Close(); err != nil {
		return err
	}
	return x.root.Chmod(name, perm)
}

func (x *extractor) symlink(name, target string) error {
	switch {
	case name == ".":
		return errors.New("symbolic link entry with the name of the directory itself")
	case target == "":
		return fmt.Errorf("symbolic link %q has an empty target", name)
	case strings.HasPrefix(target, "/") || filepath.IsAbs(target):
		return fmt.Errorf("symbolic link %q points to the absolute path %q, outside the install directory; refusing it", name, target)
	}
	if !filepath.IsLocal(filepath.Join(filepath.Dir(name), filepath.FromSlash(target))) {
		return fmt.Errorf("symbolic link %q points to %q, outside the install directory; refusing it", name, target)
	}
	if err := x.parent(name); err != nil {
		return err
	}
	if err := x.replace(name); err != nil {
		return err
	}
	if err := x.root.Symlink(target, name); err != nil {
		return err
	}
	x.links = append(x.links, name)
	return nil
}

func (x *extractor) hardlink(name, target string) error {
	t, err := entryName(target)
	if err != nil {
		return fmt.Errorf("hard link %q: %w", name, err)
	}
	if name == "." || t == "." {
		return fmt.Errorf("hard link %q to %q: not a file", name, target)
	}
	if err := x.parent(name); err != nil {
		return err
	}
	if err := x.replace(name); err != nil {
		return err
	}
	return x.root.Link(t, name)
}

// checkLinks resolves every symbolic link created: each checked on its
// own, a chain of them could still lead out of dest.
func (x *extractor) checkLinks() error {
	if len(x.links) == 0 {
		return nil
	}
	realDest, err := filepath.EvalSymlinks(x.dest)
	if err != nil {
		return err
	}
	for _, l := range x.links {
		r, err := filepath.EvalSymlinks(filepath.Join(x.dest, l))
		if err != nil {
			continue // dangling, or a loop: points nowhere
		}
		if rel, err := filepath.Rel(realDest, r); err != nil || (rel != "." && !filepath.IsLocal(rel)) {
			return fmt.Errorf("symbolic link %q resolves to %s, outside the install directory; refusing the package", l, r)
		}
	}
	return nil
}

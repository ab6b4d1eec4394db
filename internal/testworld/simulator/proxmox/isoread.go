package proxmoxsim

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"strings"
	"time"

	"github.com/diskfs/go-diskfs/backend"
	"github.com/diskfs/go-diskfs/filesystem/iso9660"
)

// memBackend serves an in-memory image to go-diskfs read-only.
type memBackend struct {
	*bytes.Reader
	size int64
}

var _ backend.Storage = memBackend{}

func (m memBackend) Stat() (fs.FileInfo, error) { return memInfo{size: m.size}, nil }
func (m memBackend) Close() error               { return nil }
func (m memBackend) Sys() (*os.File, error)     { return nil, backend.ErrNotSuitable }
func (m memBackend) Writable() (backend.WritableFile, error) {
	return nil, backend.ErrIncorrectOpenMode
}
func (m memBackend) Path() string { return "" }

type memInfo struct{ size int64 }

func (i memInfo) Name() string       { return "image.iso" }
func (i memInfo) Size() int64        { return i.size }
func (i memInfo) Mode() fs.FileMode  { return 0o400 }
func (i memInfo) ModTime() time.Time { return time.Time{} }
func (i memInfo) IsDir() bool        { return false }
func (i memInfo) Sys() any           { return nil }

// readISOFiles returns the root files of an ISO9660 image (Rock Ridge or
// Joliet names when present), keyed by lower-case name.
func readISOFiles(data []byte) (map[string][]byte, error) {
	if len(data) < 32*1024 {
		return nil, errors.New("image too small to be ISO9660")
	}
	b := memBackend{Reader: bytes.NewReader(data), size: int64(len(data))}
	fsys, err := iso9660.Read(b, int64(len(data)), 0, 2048)
	if err != nil {
		return nil, fmt.Errorf("read ISO9660: %w", err)
	}
	entries, err := fsys.ReadDir(".")
	if err != nil {
		return nil, fmt.Errorf("list ISO root: %w", err)
	}
	out := map[string][]byte{}
	for _, e := range entries {
		if e.IsDir() {
			continue
		}
		f, err := fsys.OpenFile(e.Name(), os.O_RDONLY)
		if err != nil {
			return nil, fmt.Errorf("open %s in ISO: %w", e.Name(), err)
		}
		content, err := io.ReadAll(f)
		_ = f.Close()
		if err != nil {
			return nil, fmt.Errorf("read %s in ISO: %w", e.Name(), err)
		}
		out[strings.ToLower(strings.TrimSuffix(e.Name(), ";1"))] = content
	}
	return out, nil
}

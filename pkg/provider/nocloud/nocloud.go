// Package nocloud builds cloud-init's NoCloud seed for providers that
// deliver it on a CD-ROM (pkg/provider/proxmox, pkg/provider/libvirt):
// the seed files of a VM and the ISO9660 image labelled cidata that holds
// them, built in memory so that the VM's single-use credential never
// lands in a local file.
package nocloud

import (
	"fmt"
	"io"
	"io/fs"
	"os"
	"sort"
	"sync"
	"time"

	"github.com/diskfs/go-diskfs/backend"
	"github.com/diskfs/go-diskfs/filesystem/iso9660"

	"github.com/hyperfleet/hyperfleet/pkg/provider"
)

// Files returns the NoCloud seed files for spec's VM vmid. NoCloud needs
// user-data and meta-data; meta-data defaults to an instance id and the
// host name so that cloud-init treats every VM as a new instance.
func Files(spec *provider.VMSpec, ci provider.CloudInit, vmid int) map[string][]byte {
	files := map[string][]byte{
		"user-data": ci.UserData,
		"meta-data": ci.MetaData,
	}
	if len(files["user-data"]) == 0 {
		files["user-data"] = []byte("#cloud-config\n{}\n")
	}
	if len(files["meta-data"]) == 0 {
		files["meta-data"] = []byte(fmt.Sprintf("instance-id: %s-%d\nlocal-hostname: %s\n", spec.Owner.UID, vmid, spec.Name))
	}
	if len(ci.NetworkConfig) > 0 {
		files["network-config"] = ci.NetworkConfig
	}
	return files
}

// ISO renders files into an ISO9660 image with volume label "cidata"
// (Rock Ridge and Joliet names, as cloud-init's NoCloud reader expects),
// written to memory. go-diskfs stages the files in a private temporary
// directory (mode 0700) that is removed before returning.
func ISO(files map[string][]byte) ([]byte, error) {
	work, err := os.MkdirTemp("", "hyperfleet-cidata-")
	if err != nil {
		return nil, fmt.Errorf("create cloud-init staging directory: %w", err)
	}
	defer func() { _ = os.RemoveAll(work) }()
	img := &memImage{}
	fsys, err := iso9660.Create(img, 0, 0, 2048, work)
	if err != nil {
		return nil, fmt.Errorf("create ISO9660 image: %w", err)
	}
	names := make([]string, 0, len(files))
	for name := range files {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		f, err := fsys.OpenFile("/"+name, os.O_CREATE|os.O_RDWR)
		if err != nil {
			return nil, fmt.Errorf("add %s to the ISO: %w", name, err)
		}
		if _, err := f.Write(files[name]); err != nil {
			_ = f.Close()
			return nil, fmt.Errorf("write %s to the ISO: %w", name, err)
		}
		// go-diskfs records a file's size when it is closed.
		if err := f.Close(); err != nil {
			return nil, fmt.Errorf("close %s in the ISO: %w", name, err)
		}
	}
	if err := fsys.Finalize(iso9660.FinalizeOptions{RockRidge: true, Joliet: true, VolumeIdentifier: "cidata"}); err != nil {
		return nil, fmt.Errorf("finalize the ISO: %w", err)
	}
	return img.bytes(), nil
}

// memImage is a growable in-memory disk image for go-diskfs, so the image
// (and the secrets in it) never lands in a file.
type memImage struct {
	mu   sync.Mutex
	data []byte
	pos  int64
}

var (
	_ backend.Storage      = (*memImage)(nil)
	_ backend.WritableFile = (*memImage)(nil)
)

func (m *memImage) bytes() []byte {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]byte(nil), m.data...)
}

func (m *memImage) ReadAt(p []byte, off int64) (int, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if off >= int64(len(m.data)) {
		return 0, io.EOF
	}
	n := copy(p, m.data[off:])
	if n < len(p) {
		return n, io.EOF
	}
	return n, nil
}

func (m *memImage) WriteAt(p []byte, off int64) (int, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if end := off + int64(len(p)); end > int64(len(m.data)) {
		m.data = append(m.data, make([]byte, end-int64(len(m.data)))...)
	}
	return copy(m.data[off:], p), nil
}

func (m *memImage) Read(p []byte) (int, error) {
	n, err := m.ReadAt(p, m.pos)
	m.mu.Lock()
	m.pos += int64(n)
	m.mu.Unlock()
	return n, err
}

func (m *memImage) Seek(offset int64, whence int) (int64, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	switch whence {
	case io.SeekStart:
		m.pos = offset
	case io.SeekCurrent:
		m.pos += offset
	case io.SeekEnd:
		m.pos = int64(len(m.data)) + offset
	}
	return m.pos, nil
}

func (m *memImage) Stat() (fs.FileInfo, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return memInfo{size: int64(len(m.data))}, nil
}

func (m *memImage) Close() error                            { return nil }
func (m *memImage) Sys() (*os.File, error)                  { return nil, backend.ErrNotSuitable }
func (m *memImage) Writable() (backend.WritableFile, error) { return m, nil }
func (m *memImage) Path() string                            { return "" }

type memInfo struct{ size int64 }

func (i memInfo) Name() string       { return "cidata.iso" }
func (i memInfo) Size() int64        { return i.size }
func (i memInfo) Mode() fs.FileMode  { return 0o600 }
func (i memInfo) ModTime() time.Time { return time.Time{} }
func (i memInfo) IsDir() bool        { return false }
func (i memInfo) Sys() any           { return nil }

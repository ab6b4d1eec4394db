//go:build !windows

package agent

import (
	"archive/tar"
	"archive/zip"
	"bytes"
	"compress/gzip"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// entry is one archive member for the test archives.
type entry struct {
	name   string
	mode   fs.FileMode // permission bits
	kind   byte        // 'f' file, 'd' directory, 'l' symlink, 'h' hard link
	data   string      // file content or link target
	rawTar byte        // tar type flag overriding kind
}

func file(name string, mode fs.FileMode, data string) entry {
	return entry{name: name, mode: mode, kind: 'f', data: data}
}
func dir(name string) entry { return entry{name: name, mode: 0o755, kind: 'd'} }
func symlink(name, target string) entry {
	return entry{name: name, mode: 0o777, kind: 'l', data: target}
}
func hardlink(name, target string) entry {
	return entry{name: name, mode: 0o644, kind: 'h', data: target}
}
func device(name string) entry               { return entry{name: name, mode: 0o600, rawTar: tar.TypeChar} }
func tarGz(t testing.TB, es ...entry) []byte { return buildTarGz(t, es) }

func buildTarGz(t testing.TB, es []entry) []byte {
	t.Helper()
	var buf bytes.Buffer
	gz := gzip.NewWriter(&buf)
	tw := tar.NewWriter(gz)
	for _, e := range es {
		h := &tar.Header{Name: e.name, Mode: int64(e.mode), ModTime: time.Unix(1700000000, 0), Uid: 1001, Gid: 1001}
		switch {
		case e.rawTar != 0:
			h.Typeflag = e.rawTar
		case e.kind == 'f':
			h.Typeflag, h.Size = tar.TypeReg, int64(len(e.data))
		case e.kind == 'd':
			h.Typeflag = tar.TypeDir
		case e.kind == 'l':
			h.Typeflag, h.Linkname = tar.TypeSymlink, e.data
		case e.kind == 'h':
			h.Typeflag, h.Linkname = tar.TypeLink, e.data
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if h.Typeflag == tar.TypeReg {
			if _, err := tw.Write([]byte(e.data)); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := gz.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func zipFile(t testing.TB, es ...entry) []byte {
	t.Helper()
	var buf bytes.Buffer
	zw := zip.NewWriter(&buf)
	for _, e := range es {
		h := &zip.FileHeader{Name: e.name, Method: zip.Deflate}
		switch e.kind {
		case 'f':
			h.SetMode(e.mode)
		case 'd':
			if !strings.HasSuffix(h.Name, "/") {
				h.Name += "/"
			}
			h.SetMode(fs.ModeDir | e.mode)
		case 'l':
			h.SetMode(fs.ModeSymlink | 0o777)
		default:
			t.Fatalf("zip cannot hold %q", e.name)
		}
		w, err := zw.CreateHeader(h)
		if err != nil {
			t.Fatal(err)
		}
		if e.kind != 'd' {
			if _, err := w.Write([]byte(e.data)); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// unpackBytes writes pkg to a file and unpacks it into base/a/b/dest, so
// that escapes one or two levels up land in directories the test checks.
func unpackBytes(t *testing.T, format string, pkg []byte) (dest string, err error) {
	t.Helper()
	return unpackBytesWithin(t, format, pkg, unpackLimits{bytes: DefaultMaxUnpackedBytes, entries: DefaultMaxUnpackedFiles})
}

func unpackBytesWithin(t *testing.T, format string, pkg []byte, lim unpackLimits) (dest string, err error) {
	t.Helper()
	base := t.TempDir()
	dest = filepath.Join(base, "a", "b", "dest")
	if err := os.MkdirAll(dest, 0o755); err != nil {
		t.Fatal(err)
	}
	f := filepath.Join(base, "pkg")
	if err := os.WriteFile(f, pkg, 0o600); err != nil {
		t.Fatal(err)
	}
	_, err = unpack(f, format, dest, lim)
	return dest, err
}

func checkFile(t *testing.T, p, data string, mode fs.FileMode) {
	t.Helper()
	fi, err := os.Lstat(p)
	if err != nil {
		t.Errorf("%s: %v", p, err)
		return
	}
	if !fi.Mode().IsRegular() || fi.Mode().Perm() != mode {
		t.Errorf("%s: mode %s, want regular %s", p, fi.Mode(), mode)
	}
	if got, _ := os.ReadFile(p); string(got) != data {
		t.Errorf("%s = %q, want %q", p, got, data)
	}
}

func TestUnpackTarGz(t *testing.T) {
	t.Parallel()
	pkg := tarGz(t,
		dir("./"),
		file("run.sh", 0o755, "#!/bin/sh\necho run\n"),
		file("./config.sh", 0o750, "#!/bin/sh\n"),
		dir("bin"),
		file("bin/Runner.Listener", 0o755, "ELF"),
		file("bin/data.json", 0o640, `{"a":1}`),
		file("deep/er/file.txt", 0o644, "implicit parents"),
		symlink("bin/listener", "Runner.Listener"),
		symlink("externals", "bin"),
		hardlink("bin/copy", "bin/data.json"),
		file("run.sh", 0o755, "#!/bin/sh\necho second\n"), // a later entry wins
	)
	dest, err := unpackBytes(t, formatTarGz, pkg)
	if err != nil {
		t.Fatal(err)
	}
	checkFile(t, filepath.Join(dest, "run.sh"), "#!/bin/sh\necho second\n", 0o755)
	checkFile(t, filepath.Join(dest, "config.sh"), "#!/bin/sh\n", 0o750)
	checkFile(t, filepath.Join(dest, "bin/Runner.Listener"), "ELF", 0o755)
	checkFile(t, filepath.Join(dest, "bin/data.json"), `{"a":1}`, 0o640)
	checkFile(t, filepath.Join(dest, "bin/copy"), `{"a":1}`, 0o640)
	checkFile(t, filepath.Join(dest, "deep/er/file.txt"), "implicit parents", 0o644)
	if target, err := os.Readlink(filepath.Join(dest, "bin/listener")); err != nil || target != "Runner.Listener" {
		t.Errorf("bin/listener -> %q (%v)", target, err)
	}
	if got, err := os.ReadFile(filepath.Join(dest, "externals/data.json")); err != nil || string(got) != `{"a":1}` {
		t.Errorf("externals/data.json through the directory link: %q %v", got, err)
	}
}

func TestUnpackZip(t *testing.T) {
	t.Parallel()
	pkg := zipFile(t,
		dir("bin"),
		file("run.cmd", 0o644, "@echo off"),
		file("run.sh", 0o755, "#!/bin/sh\n"),
		file("bin/tool", 0o700, "tool"),
		file("lib/x/y.txt", 0o644, "y"),
		symlink("bin/t", "tool"),
	)
	dest, err := unpackBytes(t, formatZip, pkg)
	if err != nil {
		t.Fatal(err)
	}
	checkFile(t, filepath.Join(dest, "run.sh"), "#!/bin/sh\n", 0o755)
	checkFile(t, filepath.Join(dest, "run.cmd"), "@echo off", 0o644)
	checkFile(t, filepath.Join(dest, "bin/tool"), "tool", 0o700)
	checkFile(t, filepath.Join(dest, "lib/x/y.txt"), "y", 0o644)
	if target, err := os.Readlink(filepath.Join(dest, "bin/t")); err != nil || target != "tool" {
		t.Errorf("bin/t -> %q (%v)", target, err)
	}
}

func TestUnpackRefusesEscapes(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct {
		entries []entry
		zip     bool
		msg     string
	}{
		"dot-dot":                {entries: []entry{file("../escape", 0o644, "x")}, msg: "leaves the install directory"},
		"dot-dot inside":         {entries: []entry{file("bin/../../escape", 0o644, "x")}, msg: "leaves the install directory"},
		"deep dot-dot":           {entries: []entry{file("x/../../../escape", 0o644, "x")}, msg: "leaves the install directory"},
		"absolute":               {entries: []entry{file("/tmp/escape", 0o644, "x")}, msg: "absolute name"},
		"absolute symlink":       {entries: []entry{symlink("passwd", "/etc/passwd")}, msg: "absolute path"},
		"escaping symlink":       {entries: []entry{symlink("up", "../..")}, msg: "outside the install directory"},
		"nested escaping link":   {entries: []entry{symlink("bin/up", "../../escape")}, msg: "outside the install directory"},
		"hard link outside":      {entries: []entry{hardlink("h", "../../escape")}, msg: "leaves the install directory"},
		"device":                 {entries: []entry{device("dev")}, msg: "unsupported tar entry type"},
		"zip dot-dot":            {entries: []entry{file("../escape", 0o644, "x")}, zip: true, msg: "leaves the install directory"},
		"zip absolute":           {entries: []entry{file("/escape", 0o644, "x")}, zip: true, msg: "absolute name"},
		"zip escaping symlink":   {entries: []entry{symlink("up", "../escape")}, zip: true, msg: "outside the install directory"},
		"zip absolute symlink":   {entries: []entry{symlink("up", "/etc")}, zip: true, msg: "absolute path"},
		"symlink chain resolves": {entries: []entry{dir("d1/d2"), symlink("d1/d2/a", "../.."), symlink("b", "d1/d2/a/../..")}, msg: "resolves to"},
		// Each link looks local on its own; writing through the chain must
		// still fail.
		"write through chain": {entries: []entry{dir("d1/d2"), symlink("d1/d2/a", "../.."), symlink("b", "d1/d2/a/../.."), file("b/escape", 0o644, "x")}},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			format, pkg := formatTarGz, []byte(nil)
			if tc.zip {
				format, pkg = formatZip, zipFile(t, tc.entries...)
			} else {
				pkg = tarGz(t, tc.entries...)
			}
			dest, err := unpackBytes(t, format, pkg)
			if err == nil {
				t.Fatalf("unpack accepted the package")
			}
			if !strings.Contains(err.Error(), tc.msg) {
				t.Errorf("error %q lacks %q", err, tc.msg)
			}
			for _, p := range []string{filepath.Join(dest, "..", "escape"), filepath.Join(dest, "..", "..", "escape"), filepath.Join(dest, "..", "..", "..", "escape")} {
				if _, err := os.Lstat(p); err == nil {
					t.Errorf("%s was written outside the install directory", p)
				}
			}
		})
	}
}

func TestArchiveFormat(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	gz := filepath.Join(dir, "a")
	zp := filepath.Join(dir, "b")
	junk := filepath.Join(dir, "c")
	_ = os.WriteFile(gz, tarGz(t, file("x", 0o644, "x")), 0o600)
	_ = os.WriteFile(zp, zipFile(t, file("x", 0o644, "x")), 0o600)
	_ = os.WriteFile(junk, []byte("hello"), 0o600)
	for _, tc := range []struct{ url, file, want string }{
		{"https://h/actions-runner-linux-x64-2.330.0.tar.gz", junk, formatTarGz},
		{"https://h/pkg.TGZ?sig=1", junk, formatTarGz},
		{"https://h/actions-runner-win-x64.zip", junk, formatZip},
		{"https://h/download?id=3", gz, formatTarGz},
		{"https://h/download", zp, formatZip},
		{"https://h/download", junk, ""},
	} {
		got, err := archiveFormat(tc.url, tc.file)
		if got != tc.want || (tc.want == "") != (err != nil) {
			t.Errorf("archiveFormat(%s) = %q, %v; want %q", tc.url, got, err, tc.want)
		}
	}
}

// TestUnpackBounds: an archive with more file bytes or more entries than
// the bounds is refused, whatever its headers claim, in both formats; one
// exactly at the bounds is unpacked.
func TestUnpackBounds(t *testing.T) {
	big := strings.Repeat("x", 1000)
	entries := []entry{dir("bin"), file("bin/a", 0o755, big), file("bin/b", 0o644, big)}
	for _, format := range []string{formatTarGz, formatZip} {
		pkg := tarGz(t, entries...)
		if format == formatZip {
			pkg = zipFile(t, entries...)
		}
		cases := []struct {
			name string
			lim  unpackLimits
			ok   bool
		}{
			{"at the bounds", unpackLimits{bytes: 2000, entries: 3}, true},
			{"one byte too many", unpackLimits{bytes: 1999, entries: 3}, false},
			{"one entry too many", unpackLimits{bytes: 2000, entries: 2}, false},
		}
		for _, c := range cases {
			t.Run(format+"/"+c.name, func(t *testing.T) {
				dest, err := unpackBytesWithin(t, format, pkg, c.lim)
				switch {
				case c.ok && err != nil:
					t.Fatalf("unpack: %v", err)
				case c.ok:
					checkFile(t, filepath.Join(dest, "bin/b"), big, 0o644)
				case !errors.Is(err, errTooLarge):
					t.Fatalf("unpack: %v, want %v", err, errTooLarge)
				}
			})
		}
	}
}

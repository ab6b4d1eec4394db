package githubsim

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"embed"
	"fmt"
	"net/http"
	"regexp"
	"strconv"
	"time"
)

// runnerFiles are the runner package's scripts (text only, no binaries).
//
//go:embed runner/config.sh runner/run.sh
var runnerFiles embed.FS

// runnerPkgPrefix serves the runner package without authentication, like
// the actions/runner release downloads on github.com.
const runnerPkgPrefix = "/_sim/runner/"

// runnerPkgRE is the package name: actions-runner-{os}-{arch}[-{version}].tar.gz,
// as the real release assets are named (every version is the same package).
var runnerPkgRE = regexp.MustCompile(`^actions-runner-(linux|osx|win)-(x64|arm64|arm)(-[0-9]+\.[0-9]+\.[0-9]+)?\.tar\.gz$`)

func (s *Simulator) serveRunnerPackage(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
	name := r.URL.Path[len(runnerPkgPrefix):]
	if !runnerPkgRE.MatchString(name) {
		http.Error(w, "no such runner package; use actions-runner-{linux,osx,win}-{x64,arm64,arm}.tar.gz", http.StatusNotFound)
		return
	}
	s.mu.Lock()
	ca := append([]byte(nil), s.caPEM...)
	s.mu.Unlock()
	pkg, err := RunnerPackage(ca)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/gzip")
	w.Header().Set("Content-Length", strconv.Itoa(len(pkg)))
	_, _ = w.Write(pkg)
}

// RunnerPackage builds the runner tarball in memory: config.sh, run.sh and,
// when caPEM is set, sim-ca.pem (which the scripts pass to curl --cacert).
func RunnerPackage(caPEM []byte) ([]byte, error) {
	var buf bytes.Buffer
	gz := gzip.NewWriter(&buf)
	tw := tar.NewWriter(gz)
	mtime := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	add := func(name string, mode int64, data []byte) error {
		if err := tw.WriteHeader(&tar.Header{Name: name, Mode: mode, Size: int64(len(data)), ModTime: mtime, Typeflag: tar.TypeReg}); err != nil {
			return err
		}
		_, err := tw.Write(data)
		return err
	}
	for _, f := range []string{"config.sh", "run.sh"} {
		data, err := runnerFiles.ReadFile("runner/" + f)
		if err != nil {
			return nil, fmt.Errorf("runner package: %w", err)
		}
		if err := add(f, 0o755, data); err != nil {
			return nil, err
		}
	}
	if len(caPEM) > 0 {
		if err := add("sim-ca.pem", 0o644, caPEM); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	if err := gz.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

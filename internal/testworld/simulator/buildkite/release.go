package buildkitesim

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/http"
	"os"
	"sync"
	"time"
)

// The agent binary for VMs, served like the real agent's GitHub release:
// buildkite-agent-linux-amd64-<version>.tar.gz (the binary, mode 0755, at
// the archive's root) and buildkite-agent-<version>.SHA256SUMS (sha256sum
// lines), so that a VM downloads it with a pinned checksum as it does the
// GitHub runner.

type release struct {
	once    sync.Once
	tarball []byte
	err     error
}

// agentTarball packs the binary once per simulator, on first request (it
// is tens of megabytes; a simulator that serves none never reads it).
func (s *Simulator) agentTarball() ([]byte, error) {
	if s.cfg.AgentBinary == "" {
		return nil, fmt.Errorf("no agent binary configured")
	}
	s.release.once.Do(func() { s.release.tarball, s.release.err = buildTarball(s.cfg.AgentBinary) })
	return s.release.tarball, s.release.err
}

// buildTarball packs the binary with a fixed modification time, so that
// its checksum depends on the binary only.
func buildTarball(binary string) ([]byte, error) {
	data, err := os.ReadFile(binary)
	if err != nil {
		return nil, fmt.Errorf("read agent binary: %w", err)
	}
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	tw := tar.NewWriter(zw)
	hdr := &tar.Header{Name: "buildkite-agent", Mode: 0o755, Size: int64(len(data)), ModTime: time.Unix(0, 0), Typeflag: tar.TypeReg}
	if err := tw.WriteHeader(hdr); err != nil {
		return nil, fmt.Errorf("tar header: %w", err)
	}
	if _, err := tw.Write(data); err != nil {
		return nil, fmt.Errorf("tar: %w", err)
	}
	if err := tw.Close(); err != nil {
		return nil, fmt.Errorf("tar: %w", err)
	}
	if err := zw.Close(); err != nil {
		return nil, fmt.Errorf("gzip: %w", err)
	}
	return buf.Bytes(), nil
}

// TarballName is the release asset's name for a version.
func TarballName(version string) string {
	return "buildkite-agent-linux-amd64-" + version + ".tar.gz"
}

// AgentTarballSHA256 is the hex SHA-256 of the served tarball.
func (s *Simulator) AgentTarballSHA256() (string, error) {
	tb, err := s.agentTarball()
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256(tb)
	return hex.EncodeToString(sum[:]), nil
}

func (s *Simulator) serveAgentRelease(w http.ResponseWriter, r *http.Request, name string) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		writeMessage(w, http.StatusMethodNotAllowed, "GET only")
		return
	}
	v := s.cfg.AgentVersion
	switch name {
	case TarballName(v):
		tb, err := s.agentTarball()
		if err != nil {
			writeMessage(w, http.StatusNotFound, err.Error())
			return
		}
		w.Header().Set("Content-Type", "application/gzip")
		_, _ = w.Write(tb)
	case "buildkite-agent-" + v + ".SHA256SUMS":
		sum, err := s.AgentTarballSHA256()
		if err != nil {
			writeMessage(w, http.StatusNotFound, err.Error())
			return
		}
		w.Header().Set("Content-Type", "text/plain")
		fmt.Fprintf(w, "%s  %s\n", sum, TarballName(v))
	default:
		writeMessage(w, http.StatusNotFound, "Not Found")
	}
}

// AgentVersion is the version of the agent release the simulator serves
// (Config.AgentVersion): its tarball is /_sim/agent/TarballName(version).
func (s *Simulator) AgentVersion() string { return s.cfg.AgentVersion }

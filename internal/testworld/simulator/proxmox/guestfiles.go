package proxmoxsim

import (
	"bytes"
	"compress/gzip"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"mime"
	"mime/multipart"
	"net/mail"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"

	yaml "go.yaml.in/yaml/v3"
)

// EnvRoot names the directory standing in for the guest's root file system
// when GuestConfig.WriteFiles is set.
const EnvRoot = "HF_SIM_ROOT"

// writeFile is one entry of cloud-init's write_files module.
type writeFile struct {
	Path        string `yaml:"path"`
	Content     string `yaml:"content"`
	Encoding    string `yaml:"encoding"`
	Permissions string `yaml:"permissions"`
	Append      bool   `yaml:"append"`
}

// applyWriteFiles does what cloud-init's write_files module would do in the
// guest with the seed's user-data: every file lands under root (the guest's
// stand-in root file system). A #cloud-config document and the
// text/cloud-config parts of a MIME multipart document are read; other
// kinds of user-data are ignored, as they are not files.
func applyWriteFiles(userData []byte, root string) error {
	docs, err := cloudConfigs(userData)
	if err != nil {
		return err
	}
	for _, doc := range docs {
		var cfg struct {
			WriteFiles []writeFile `yaml:"write_files"`
		}
		if err := yaml.Unmarshal(doc, &cfg); err != nil {
			return fmt.Errorf("user-data: cloud-config is not YAML: %w", err)
		}
		for i, f := range cfg.WriteFiles {
			if err := f.write(root); err != nil {
				return fmt.Errorf("user-data: write_files[%d] (%s): %w", i, f.Path, err)
			}
		}
	}
	return nil
}

// cloudConfigs returns the cloud-config documents in user-data.
func cloudConfigs(userData []byte) ([][]byte, error) {
	if bytes.HasPrefix(userData, []byte("#cloud-config")) {
		return [][]byte{userData}, nil
	}
	msg, err := mail.ReadMessage(bytes.NewReader(userData))
	if err != nil {
		return nil, nil //nolint:nilerr // not a MIME message is a valid answer: neither cloud-config nor MIME, nothing to write
	}
	mediaType, params, err := mime.ParseMediaType(msg.Header.Get("Content-Type"))
	if err != nil || !strings.HasPrefix(mediaType, "multipart/") {
		return nil, nil //nolint:nilerr // no parseable multipart type: like cloud-init, nothing to write
	}
	var docs [][]byte
	mr := multipart.NewReader(msg.Body, params["boundary"])
	for {
		part, err := mr.NextPart()
		if errors.Is(err, io.EOF) {
			return docs, nil
		}
		if err != nil {
			return nil, fmt.Errorf("user-data: MIME multipart: %w", err)
		}
		body, err := io.ReadAll(part)
		if err != nil {
			return nil, fmt.Errorf("user-data: MIME part: %w", err)
		}
		if strings.EqualFold(part.Header.Get("Content-Transfer-Encoding"), "base64") {
			if body, err = base64.StdEncoding.DecodeString(strings.Join(strings.Fields(string(body)), "")); err != nil {
				return nil, fmt.Errorf("user-data: MIME part: %w", err)
			}
		}
		if ct, _, _ := mime.ParseMediaType(part.Header.Get("Content-Type")); ct == "text/cloud-config" || bytes.HasPrefix(body, []byte("#cloud-config")) {
			docs = append(docs, body)
		}
	}
}

// write writes one file the way cloud-init does: content decoded per
// encoding, mode from permissions (default 0644), parents created.
func (f writeFile) write(root string) error {
	if !path.IsAbs(f.Path) {
		return errors.New("path must be absolute")
	}
	content := []byte(f.Content)
	var err error
	switch strings.ToLower(f.Encoding) {
	case "", "text/plain":
	case "b64", "base64":
		content, err = base64.StdEncoding.DecodeString(f.Content)
	case "gz", "gzip":
		content, err = gunzip(content)
	case "gz+base64", "gzip+base64", "gz+b64", "gzip+b64":
		if content, err = base64.StdEncoding.DecodeString(f.Content); err == nil {
			content, err = gunzip(content)
		}
	default:
		return fmt.Errorf("unknown encoding %q", f.Encoding)
	}
	if err != nil {
		return fmt.Errorf("decode %s content: %w", f.Encoding, err)
	}
	mode := os.FileMode(0o644)
	if f.Permissions != "" {
		m, err := strconv.ParseUint(f.Permissions, 8, 32)
		if err != nil {
			return fmt.Errorf("permissions %q are not octal", f.Permissions)
		}
		mode = os.FileMode(m)
	}
	dst := filepath.Join(root, filepath.FromSlash(path.Clean(f.Path)))
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return err
	}
	flags := os.O_CREATE | os.O_WRONLY | os.O_TRUNC
	if f.Append {
		flags = os.O_CREATE | os.O_WRONLY | os.O_APPEND
	}
	out, err := os.OpenFile(dst, flags, mode)
	if err != nil {
		return err
	}
	if _, err := out.Write(content); err != nil {
		_ = out.Close()
		return err
	}
	if err := out.Close(); err != nil {
		return err
	}
	return os.Chmod(dst, mode)
}

func gunzip(data []byte) ([]byte, error) {
	zr, err := gzip.NewReader(bytes.NewReader(data))
	if err != nil {
		return nil, err
	}
	defer zr.Close()
	return io.ReadAll(zr)
}

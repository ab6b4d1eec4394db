package proxmoxsim

import (
	"bytes"
	"compress/gzip"
	"encoding/base64"
	"os"
	"path/filepath"
	"testing"
)

// TestApplyWriteFiles: write_files entries land under the guest root with
// their content decoded and their permissions, from plain and multipart
// user-data.
func TestApplyWriteFiles(t *testing.T) {
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	_, _ = zw.Write([]byte("zipped\n"))
	_ = zw.Close()
	cloudConfig := "#cloud-config\nwrite_files:\n" +
		"  - path: /etc/hyperfleet/agent.json\n    permissions: '0600'\n    content: |\n      {\"version\": 1}\n" +
		"  - path: /opt/b64.txt\n    encoding: b64\n    content: " + base64.StdEncoding.EncodeToString([]byte("decoded")) + "\n" +
		"  - path: /opt/gz.txt\n    encoding: gzip+base64\n    content: " + base64.StdEncoding.EncodeToString(gz.Bytes()) + "\n" +
		"  - path: /opt/log.txt\n    content: one\n  - path: /opt/log.txt\n    append: true\n    content: two\n"
	multipartDoc := "Content-Type: multipart/mixed; boundary=\"XX\"\nMIME-Version: 1.0\n\n--XX\nContent-Type: text/x-shellscript\n\n#!/bin/sh\necho hi\n" +
		"--XX\nContent-Type: text/cloud-config\nContent-Transfer-Encoding: base64\n\n" + base64.StdEncoding.EncodeToString([]byte(cloudConfig)) + "\n--XX--\n"
	for name, doc := range map[string]string{"cloud-config": cloudConfig, "multipart": multipartDoc} {
		t.Run(name, func(t *testing.T) {
			root := t.TempDir()
			if err := applyWriteFiles([]byte(doc), root); err != nil {
				t.Fatal(err)
			}
			for file, want := range map[string]string{
				"etc/hyperfleet/agent.json": "{\"version\": 1}\n", "opt/b64.txt": "decoded", "opt/gz.txt": "zipped\n", "opt/log.txt": "onetwo",
			} {
				got, err := os.ReadFile(filepath.Join(root, file))
				if err != nil || string(got) != want {
					t.Errorf("%s = %q, %v; want %q", file, got, err, want)
				}
			}
			if fi, err := os.Stat(filepath.Join(root, "etc/hyperfleet/agent.json")); err != nil || fi.Mode().Perm() != 0o600 {
				t.Errorf("agent.json mode: %v %v, want 0600", fi, err)
			}
		})
	}
	if err := applyWriteFiles([]byte("#cloud-config\nwrite_files:\n  - path: relative\n    content: x\n"), t.TempDir()); err == nil {
		t.Error("a relative path was accepted")
	}
	if err := applyWriteFiles([]byte("#cloud-config\nwrite_files:\n  - path: /x\n    encoding: rot13\n    content: x\n"), t.TempDir()); err == nil {
		t.Error("an unknown encoding was accepted")
	}
}

// FuzzApplyWriteFiles: no user-data makes the parser panic or write
// outside the guest root.
func FuzzApplyWriteFiles(f *testing.F) {
	f.Add([]byte("#cloud-config\nwrite_files:\n  - path: /a/b\n    content: x\n"))
	f.Add([]byte("#cloud-config\nwrite_files:\n  - path: /../../escape\n    content: x\n"))
	f.Add([]byte("Content-Type: multipart/mixed; boundary=B\n\n--B\nContent-Type: text/cloud-config\n\n#cloud-config\n--B--\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		parent := t.TempDir()
		root := filepath.Join(parent, "root")
		_ = applyWriteFiles(data, root)
		entries, err := os.ReadDir(parent)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range entries {
			if e.Name() != "root" {
				t.Fatalf("wrote %s outside the guest root", e.Name())
			}
		}
	})
}

package nocloud

import (
	"bytes"
	"strings"
	"testing"

	"github.com/diskfs/go-diskfs/filesystem/iso9660"

	"github.com/hyperfleet/hyperfleet/pkg/provider"
)

// TestISO reads the NoCloud image back with go-diskfs: label cidata,
// the three files with their exact contents.
func TestISO(t *testing.T) {
	files := map[string][]byte{
		"user-data":      []byte("#cloud-config\nruncmd: [echo hi]\n"),
		"meta-data":      []byte("instance-id: x\n"),
		"network-config": []byte("version: 2\n"),
	}
	img, err := ISO(files)
	if err != nil {
		t.Fatal(err)
	}
	fsys, err := iso9660.Read(&memImage{data: img}, int64(len(img)), 0, 2048)
	if err != nil {
		t.Fatal(err)
	}
	// go-diskfs pads the identifier with NULs; blkid reads it as a C string.
	if label := strings.TrimRight(fsys.Label(), "\x00 "); label != "cidata" {
		t.Fatalf("volume label %q, want cidata", label)
	}
	for name, want := range files {
		f, err := fsys.OpenFile("/"+name, 0)
		if err != nil {
			t.Fatalf("open %s: %v", name, err)
		}
		var got bytes.Buffer
		if _, err := got.ReadFrom(f); err != nil {
			t.Fatal(err)
		}
		if got.String() != string(want) {
			t.Fatalf("%s = %q, want %q", name, got.String(), want)
		}
	}
}

func TestFiles(t *testing.T) {
	defaults := Files(&provider.VMSpec{Name: "vm-a", Owner: provider.Owner{UID: "u1"}}, provider.CloudInit{}, 1234)
	if string(defaults["meta-data"]) != "instance-id: u1-1234\nlocal-hostname: vm-a\n" || len(defaults["user-data"]) == 0 {
		t.Fatalf("default seed files: %q", defaults)
	}
	if _, ok := defaults["network-config"]; ok {
		t.Fatal("network-config without a network config")
	}
	given := Files(&provider.VMSpec{}, provider.CloudInit{UserData: []byte("u"), MetaData: []byte("m"), NetworkConfig: []byte("n")}, 1)
	if string(given["user-data"]) != "u" || string(given["meta-data"]) != "m" || string(given["network-config"]) != "n" {
		t.Fatalf("given seed files: %q", given)
	}
}

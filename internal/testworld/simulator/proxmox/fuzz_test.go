package proxmoxsim

import (
	"regexp"
	"sort"
	"strings"
	"testing"
)

var normalTagsRE = regexp.MustCompile(`^([a-z0-9_][a-z0-9_\-+.]*(;[a-z0-9_][a-z0-9_\-+.]*)*)?$`)

func FuzzParseTags(f *testing.F) {
	for _, s := range []string{"", "a", "B;a,a c", "hyperfleet.io/managed-by=x", "go-proxmox+cloud-init;template", " ; ,", "Ä", "a\x00b"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		out, err := ParseTags(in)
		if err != nil {
			if !strings.HasSuffix(err.Error(), "\n") {
				t.Fatalf("format errors end in a newline: %q", err)
			}
			return
		}
		if !normalTagsRE.MatchString(out) {
			t.Fatalf("ParseTags(%q) = %q: not normalised", in, out)
		}
		parts := strings.Split(out, ";")
		if out != "" && (!sort.StringsAreSorted(parts) || hasDup(parts)) {
			t.Fatalf("ParseTags(%q) = %q: not sorted/unique", in, out)
		}
		again, err := ParseTags(out)
		if err != nil || again != out {
			t.Fatalf("not idempotent: %q -> %q -> %q (%v)", in, out, again, err)
		}
	})
}

func hasDup(s []string) bool {
	for i := 1; i < len(s); i++ {
		if s[i] == s[i-1] {
			return true
		}
	}
	return false
}

// FuzzConfigParams feeds arbitrary key/value pairs through the config
// schema and the config update path: nothing may panic, every rejection
// must be a schema message, and accepted values must round-trip.
func FuzzConfigParams(f *testing.F) {
	for _, kv := range [][2]string{{"tags", "a;b"}, {"net0", "virtio,bridge=vmbr0,tag=5"}, {"ipconfig0", "ip=10.0.0.5/24,gw=10.0.0.1"},
		{"scsi1", "local-lvm:4"}, {"boot", "order=scsi0;net0"}, {"memory", "current=2048"}, {"description", "x"}, {"sshkeys", "ssh-rsa%20AAA"},
		{"agent", "1,fstrim_cloned_disks=1"}, {"delete", "tags,description"}, {"cores", "-1"}, {"ide0", "none,media=cdrom"}} {
		f.Add(kv[0], kv[1])
	}
	sch := vmConfigSchema()
	f.Fuzz(func(t *testing.T, key, value string) {
		errs := sch.validate(map[string]string{"node": "pve1", "vmid": "9000", key: value})
		for k, msg := range errs {
			if k != key || msg == "" {
				t.Fatalf("unexpected error %q for %q=%q", msg, k, value)
			}
		}
		if len(errs) > 0 || configMeta[key] {
			return
		}
		s, err := New(testConfig())
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		s.mu.Lock()
		defer s.mu.Unlock()
		v := s.vms[9000]
		if key == "boot" || driveKeyRE.MatchString(key) {
			// These need storage/boot-order checks first, like the handler.
			if s.checkDriveLocked(v, key, value) != nil {
				return
			}
		}
		s.applyConfigLocked(v, map[string]string{key: value}, nil, nil)
		if key == "tags" {
			want, _ := ParseTags(value)
			if v.conf["tags"] != want {
				t.Fatalf("tags %q stored as %q", value, v.conf["tags"])
			}
		}
		_ = typedConfig(v.conf)
	})
}

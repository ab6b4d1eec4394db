//go:build !windows

package agent

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/hyperfleet/hyperfleet/internal/agentconfig"
)

// cloudInitTree writes, under root, a VM's cloud-init state after a boot
// with a user-data holding secret: every file CloudInitCopies names (the
// instance link included), scripts with and without the secret, and /run
// files with and without it. It returns the paths that must go and those
// that must stay.
func cloudInitTree(t *testing.T, root, secret string) (gone, kept []string) {
	t.Helper()
	write := func(rel, content string) string {
		p := filepath.Join(root, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	inst := "/var/lib/cloud/instances/iid-hf-1"
	if err := os.MkdirAll(filepath.Join(root, inst), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(root, inst), filepath.Join(root, "/var/lib/cloud/instance")); err != nil {
		t.Fatal(err)
	}
	// Encoded as cloud-init may store it: the secret need not appear
	// literally for these to go.
	for _, name := range []string{"user-data.txt", "user-data.txt.i", "vendor-data.txt", "vendor-data.txt.i",
		"vendor-data2.txt", "vendor-data2.txt.i", "cloud-config.txt", "obj.pkl"} {
		gone = append(gone, write(inst+"/"+name, "base64-encoded part"))
	}
	gone = append(gone,
		write("/var/lib/cloud/instances/iid-old/user-data.txt", "an earlier instance"),
		write("/var/lib/cloud/seed/nocloud/user-data", "#cloud-config"),
		write("/var/lib/cloud/seed/nocloud-net/user-data", "#cloud-config"),
		write("/run/cloud-init/instance-data-sensitive.json", "{}"),
		write("/run/cloud-init/combined-cloud-config.json", "{}"),
		write(inst+"/scripts/part-001", "#!/bin/sh\nexport TOKEN="+secret+"\n"),
		write("/run/cloud-init/cloud.cfg", "token: "+secret),
	)
	kept = append(kept,
		write(inst+"/scripts/runcmd", "#!/bin/sh\nsystemctl start --no-block hyperfleet-agent.service\n"),
		write("/run/cloud-init/instance-data.json", `{"redacted": true}`),
		write("/var/lib/cloud/instance/boot-finished", "done"),
		write("/var/lib/cloud/data/status.json", "{}"),
	)
	return gone, kept
}

// TestScrubCloudInit runs the scrub over a temporary root standing for a
// VM's file system.
func TestScrubCloudInit(t *testing.T) {
	root := t.TempDir()
	secret := "CANARY-jit-7f3a9c"
	gone, kept := cloudInitTree(t, root, secret)
	removed, err := scrubCloudInit(root, []string{secret})
	if err != nil {
		t.Fatalf("scrubCloudInit: %v", err)
	}
	for _, p := range gone {
		if _, err := os.Lstat(p); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s is still there (%v)", p, err)
		}
	}
	// Each file once, under whichever path (the instance link or its
	// target) matched first.
	if len(removed) != len(gone) {
		t.Errorf("reported removed %d files, want %d: %v", len(removed), len(gone), removed)
	}
	for _, p := range kept {
		if _, err := os.Stat(p); err != nil {
			t.Errorf("%s was removed, but holds no credential: %v", p, err)
		}
	}
	if fi, err := os.Lstat(filepath.Join(root, "/var/lib/cloud/instance")); err != nil || fi.Mode()&os.ModeSymlink == 0 {
		t.Errorf("the instance link itself must stay: %v", err)
	}
	// Again: nothing left to do is no error.
	if again, err := scrubCloudInit(root, []string{secret}); err != nil || len(again) != 0 {
		t.Errorf("second scrub: removed %v, %v", again, err)
	}
}

// TestAgentScrubsCloudInit: a run removes cloud-init's copies of the
// user-data, even when the config is invalid.
func TestAgentScrubsCloudInit(t *testing.T) {
	for _, valid := range []bool{true, false} {
		v := newVM(t)
		gone, kept := cloudInitTree(t, v.root, v.secret)
		writeScript(t, filepath.Join(v.install(), "run.sh"), v.goodRunner(0))
		if valid {
			// The seed's one secret now: the notice token.
			c := v.baseConfig()
			c.PowerOffNotify = &agentconfig.PowerOffNotify{URL: "https://127.0.0.1:1/hints/v1/power-off", Token: v.secret,
				Claim: agentconfig.ClaimRef{Namespace: "ci", Name: "runner-1", UID: "uid-1"}}
			v.writeConfig(c)
		} else if err := os.WriteFile(v.cfgPath, []byte(`{"version": 99, "jitConfig": "`+v.secret+`", "powerOffOnFinish": true}`), 0o600); err != nil {
			t.Fatal(err)
		}
		code := v.run(context.Background())
		if want := map[bool]int{true: ExitOK, false: ExitBadConfig}[valid]; code != want {
			t.Errorf("valid config %v: exit code %d, want %d", valid, code, want)
		}
		for _, p := range gone {
			if _, err := os.Lstat(p); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("valid config %v: %s is still there (%v)", valid, p, err)
			}
		}
		for _, p := range kept {
			if _, err := os.Stat(p); err != nil {
				t.Errorf("valid config %v: %s was removed: %v", valid, p, err)
			}
		}
	}
}

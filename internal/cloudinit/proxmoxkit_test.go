package cloudinit

import (
	"bytes"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/hyperfleet/hyperfleet/internal/agentconfig"
)

// The kit is a file a platform team copies onto its snippets storage: its
// bytes are reviewed as a golden file, not only its meaning.
func TestProxmoxKitGolden(t *testing.T) {
	for name, powerOff := range map[string]bool{"proxmox-kit.yaml": true, "proxmox-kit-keep-vm.yaml": false} {
		t.Run(name, func(t *testing.T) {
			got := ProxmoxKit(powerOff)
			// A file, not a directory: every directory under testdata/ is
			// a seed (TestRenderGolden).
			path := filepath.Join("testdata", name)
			if *update {
				if err := os.WriteFile(path, got, 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("%v (run go test ./internal/cloudinit/ -run TestProxmoxKitGolden -update to create it)", err)
			}
			if !bytes.Equal(got, want) {
				t.Errorf("the kit differs from %s (rerun with -update if the change is intended):\n--- got\n%s\n--- want\n%s", path, got, want)
			}
		})
	}
}

// TestProxmoxKitCloudInit has Debian's cloud-init read the kit: its schema
// validator accepts it, and the config it acts on writes the two units
// and runs, in this order, daemon-reload, the path unit's start and only
// then the directory's creation (the order that keeps the operator's
// write from landing before the watch; see ProxmoxKit).
func TestProxmoxKitCloudInit(t *testing.T) {
	_, python := cloudInit(t)
	dir := t.TempDir()
	kit := filepath.Join(dir, "kit.yaml")
	if err := os.WriteFile(kit, ProxmoxKit(true), 0o600); err != nil {
		t.Fatal(err)
	}
	merged := filepath.Join(dir, "merged.cfg")
	res := runView(t, python, []viewRequest{{ID: "kit", UserData: kit, MergedOut: merged, Schema: []string{kit, merged}}})["kit"]
	files, _ := res.Config["write_files"].([]any)
	units := map[string]string{}
	for _, f := range files {
		m, _ := f.(map[string]any)
		path, _ := m["path"].(string)
		content, _ := m["content"].(string)
		units[path] = content
	}
	if u := units[AgentUnitPath]; !strings.Contains(u, "ExecStart="+AgentBinary+" --config "+GuestAgentConfigPath+"\n") ||
		!strings.Contains(u, "FailureAction=poweroff\n") {
		t.Errorf("the agent unit does not run the agent on %s and power off:\n%s", GuestAgentConfigPath, u)
	}
	if u := units[AgentPathUnitPath]; !strings.Contains(u, "PathChanged="+GuestAgentConfigPath+"\n") || !strings.Contains(u, "Unit="+AgentUnitName+"\n") {
		t.Errorf("the path unit does not start %s on %s:\n%s", AgentUnitName, GuestAgentConfigPath, u)
	}
	want := []any{
		[]any{"systemctl", "daemon-reload"},
		[]any{"systemctl", "start", AgentPathUnitName},
		[]any{"install", "-d", "-m", "0700", "-o", "root", "-g", "root", agentconfig.SecretsDir},
	}
	if got := res.Config["runcmd"]; !reflect.DeepEqual(got, want) {
		t.Errorf("runcmd = %v, want %v", got, want)
	}
	if strings.Contains(string(ProxmoxKit(false)), "poweroff") {
		t.Error("the kit for a VM kept after its job powers it off")
	}
}

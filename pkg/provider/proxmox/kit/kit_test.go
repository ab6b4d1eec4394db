package kit

import (
	"bytes"
	"flag"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/hyperfleet/hyperfleet/internal/agentconfig"
	"github.com/hyperfleet/hyperfleet/internal/cloudinit"
)

var update = flag.Bool("update", false, "rewrite the golden files under testdata/")

// The kit is a file a platform team copies onto its snippets storage: its
// bytes are reviewed as a golden file, not only its meaning.
func TestVendorDataGolden(t *testing.T) {
	for name, powerOff := range map[string]bool{"proxmox-kit.yaml": true, "proxmox-kit-keep-vm.yaml": false} {
		t.Run(name, func(t *testing.T) {
			got := VendorData(powerOff)
			path := filepath.Join("testdata", name)
			if *update {
				if err := os.WriteFile(path, got, 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("%v (run go test ./pkg/provider/proxmox/kit/ -run TestVendorDataGolden -update to create it)", err)
			}
			if !bytes.Equal(got, want) {
				t.Errorf("the kit differs from %s (rerun with -update if the change is intended):\n--- got\n%s\n--- want\n%s", path, got, want)
			}
		})
	}
}

// TestVendorDataCloudInit has Debian's cloud-init validate the kit (what
// cloud-init schema --config-file accepts, a VM acts on), and reads what
// it asks for: the two units, and runcmd running, in this order,
// daemon-reload, the path unit's start and only then the directory's
// creation (the order that keeps the operator's write from landing before
// the watch; see VendorData). A missing cloud-init fails the test, as the
// renderer's own seed checks do (internal/cloudinit).
func TestVendorDataCloudInit(t *testing.T) {
	bin, err := exec.LookPath("cloud-init")
	if err != nil {
		t.Fatalf("cloud-init is not installed: this test validates the kit with the real cloud-init; install Debian's package: apt-get update && apt-get install -y cloud-init (%v)", err)
	}
	kit := filepath.Join(t.TempDir(), "kit.yaml")
	if err := os.WriteFile(kit, VendorData(true), 0o600); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(bin, "schema", "--config-file", kit).CombinedOutput(); err != nil || strings.Contains(strings.ToLower(string(out)), "deprecat") {
		t.Fatalf("cloud-init schema --config-file refuses the kit or warns (%v):\n%s", err, out)
	}
	var cfg struct {
		WriteFiles []struct{ Path, Content string } `json:"write_files"`
		RunCmd     []any                            `json:"runcmd"`
	}
	if err := yaml.Unmarshal(VendorData(true), &cfg); err != nil {
		t.Fatal(err)
	}
	units := map[string]string{}
	for _, f := range cfg.WriteFiles {
		units[f.Path] = f.Content
	}
	if u := units[cloudinit.AgentUnitPath]; !strings.Contains(u, "ExecStart="+cloudinit.AgentBinary+" --config "+cloudinit.GuestAgentConfigPath+"\n") ||
		!strings.Contains(u, "FailureAction=poweroff\n") {
		t.Errorf("the agent unit does not run the agent on %s and power off:\n%s", cloudinit.GuestAgentConfigPath, u)
	}
	if u := units[AgentPathUnitPath]; !strings.Contains(u, "PathChanged="+cloudinit.GuestAgentConfigPath+"\n") || !strings.Contains(u, "Unit="+cloudinit.AgentUnitName+"\n") {
		t.Errorf("the path unit does not start %s on %s:\n%s", cloudinit.AgentUnitName, cloudinit.GuestAgentConfigPath, u)
	}
	want := []any{
		[]any{"systemctl", "daemon-reload"},
		[]any{"systemctl", "start", AgentPathUnitName},
		[]any{"install", "-d", "-m", "0700", "-o", "root", "-g", "root", agentconfig.SecretsDir},
	}
	if !reflect.DeepEqual(cfg.RunCmd, want) {
		t.Errorf("runcmd = %v, want %v", cfg.RunCmd, want)
	}
	if strings.Contains(string(VendorData(false)), "poweroff") {
		t.Error("the kit for a VM kept after its job powers it off")
	}
}

//go:build spire

package spiretest_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hyperfleet/hyperfleet/test/spiretest"
)

// TestSlimBuildRefusesUnlinkedPlugins checks the other side of
// hack/spire/build.sh's trimmed plugin catalogs: a plugin the test world's
// build does not link is refused at start, by name, with SPIRE's own error,
// never silently left out. The plugins the tests do configure (join_token,
// tpm_devid, the disk and memory key managers, the unix workload attestor)
// are proven by every other test of this package.
func TestSlimBuildRefusesUnlinkedPlugins(t *testing.T) {
	t.Parallel()
	dir := spiretest.SpireDir(t)
	work := t.TempDir()
	sock, err := os.MkdirTemp("", "spire")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(sock) })

	server := fmt.Sprintf(`server {
	bind_address = "127.0.0.1"
	bind_port = 0
	socket_path = %q
	trust_domain = "example.org"
	data_dir = %q
	log_level = "INFO"
}
plugins {
	DataStore "sql" {
		plugin_data {
			database_type = "sqlite3"
			connection_string = %q
		}
	}
	KeyManager "aws_kms" {
		plugin_data {
			region = "us-east-1"
		}
	}
	NodeAttestor "join_token" {
		plugin_data {}
	}
}
`, filepath.Join(sock, "api.sock"), work, filepath.Join(work, "datastore.sqlite3"))
	agent := fmt.Sprintf(`agent {
	data_dir = %q
	log_level = "INFO"
	server_address = "127.0.0.1"
	server_port = 1
	socket_path = %q
	trust_domain = "example.org"
	insecure_bootstrap = true
}
plugins {
	KeyManager "memory" {
		plugin_data {}
	}
	NodeAttestor "join_token" {
		plugin_data {}
	}
	WorkloadAttestor "docker" {
		plugin_data {}
	}
}
`, filepath.Join(work, "agent"), filepath.Join(sock, "agent.sock"))

	for _, c := range []struct {
		bin, config, want string
	}{
		{"spire-server", server, `no built-in plugin "aws_kms" for type "KeyManager"`},
		{"spire-agent", agent, `no built-in plugin "docker" for type "WorkloadAttestor"`},
	} {
		conf := filepath.Join(work, c.bin+".conf")
		if err := os.WriteFile(conf, []byte(c.config), 0o600); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		args := []string{"run", "-config", conf}
		if c.bin == "spire-agent" {
			args = append(args, "-joinToken", "unused")
		}
		out, err := exec.CommandContext(ctx, filepath.Join(dir, c.bin), args...).CombinedOutput()
		timedOut := ctx.Err() != nil
		cancel()
		var exit *exec.ExitError
		if !errors.As(err, &exit) || timedOut {
			t.Errorf("%s with a plugin the build does not link: %v (want it to exit with an error at start); output:\n%s", c.bin, err, out)
			continue
		}
		// SPIRE logs the error as a quoted field (error="... \"aws_kms\" ...").
		if !strings.Contains(strings.ReplaceAll(string(out), `\"`, `"`), c.want) {
			t.Errorf("%s exited (%v) without naming the plugin (%s); output:\n%s", c.bin, err, c.want, out)
		}
	}
}

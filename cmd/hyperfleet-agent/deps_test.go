package main

import (
	"bytes"
	"os"
	"os/exec"
	"strings"
	"testing"
)

// TestAgentLinksStandardLibraryOnly: the in-VM agent is built static
// (CGO_ENABLED=0) from the standard library and this module's packages
// only. Broker mode drives SPIRE's own spire-agent CLI instead of linking
// go-spiffe and gRPC, and this keeps it so.
func TestAgentLinksStandardLibraryOnly(t *testing.T) {
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the go command is needed to list the agent's dependencies: %v", err)
	}
	var stdout, stderr bytes.Buffer
	cmd := exec.Command(goTool, "list", "-deps", "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}", ".")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("go list -deps: %v\n%s", err, stderr.String())
	}
	n := 0
	for _, pkg := range strings.Fields(stdout.String()) {
		n++
		if !strings.HasPrefix(pkg, "github.com/hyperfleet/hyperfleet/") {
			t.Errorf("the agent links %s, which is neither the standard library nor this module", pkg)
		}
	}
	if n == 0 {
		t.Fatal("go list named no package of this module: the listing is wrong")
	}
}

package main

import (
	"bytes"
	"os"
	"os/exec"
	"strings"
	"testing"
)

// tpmDeps are the one exception: attestationMethod tpm drives the VM's
// TPM itself (internal/tpmdevid: the DevID enrollment, which spire-agent
// cannot do), through go-tpm, pure Go, and the golang.org/x/sys it needs
// (internal/procgroup uses its waitid too: the standard library has none).
var tpmDeps = []string{"github.com/google/go-tpm/", "golang.org/x/sys/"}

// proxyDeps are the second: spec.network.proxy's rules are read with
// golang.org/x/net/http/httpproxy (internal/agentconfig/proxy.go), the
// standard library's own proxy logic, and the golang.org/x/net/idna and
// golang.org/x/text packages it needs.
var proxyDeps = []string{"golang.org/x/net/http/httpproxy", "golang.org/x/net/idna", "golang.org/x/text/"}

// TestAgentLinksStandardLibraryOnly: the in-VM agent is built static
// (CGO_ENABLED=0) from the standard library and this module's packages
// only, besides tpmDeps and proxyDeps. Broker mode drives SPIRE's own spire-agent CLI
// instead of linking go-spiffe and gRPC, and this keeps it so. The Windows
// build (docs/windows.md) is listed too: it adds only golang.org/x/sys's
// windows packages (the service manager, job objects).
func TestAgentLinksStandardLibraryOnly(t *testing.T) {
	for _, goos := range []string{"linux", "windows"} {
		t.Run(goos, func(t *testing.T) { checkAgentDeps(t, goos) })
	}
}

func checkAgentDeps(t *testing.T, goos string) {
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the go command is needed to list the agent's dependencies: %v", err)
	}
	var stdout, stderr bytes.Buffer
	cmd := exec.Command(goTool, "list", "-deps", "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}", ".")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS="+goos, "GOARCH=amd64")
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("go list -deps: %v\n%s", err, stderr.String())
	}
	n := 0
	tpm := false
packages:
	for _, pkg := range strings.Fields(stdout.String()) {
		n++
		if strings.HasPrefix(pkg, "github.com/hyperfleet/hyperfleet/") {
			continue
		}
		for _, prefix := range append(tpmDeps, proxyDeps...) {
			if strings.HasPrefix(pkg, prefix) {
				tpm = true
				continue packages
			}
		}
		t.Errorf("the agent links %s, which is neither the standard library nor this module nor go-tpm (tpmDeps) nor the proxy rules (proxyDeps)", pkg)
	}
	if !tpm {
		t.Error("the agent links no go-tpm: the listing is wrong, or tpmDeps is stale")
	}
	if n == 0 {
		t.Fatal("go list named no package of this module: the listing is wrong")
	}
}

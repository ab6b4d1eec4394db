// These tests check what lets a fresh machine compile each package
// of the dependency tree once: the tool module that builds kube-apiserver
// and etcd (hack/envtest) resolves every package it shares with the
// operator's module to the same module version, and the Makefile and CI
// build without cgo, the setting the image's binaries are built with.
// Nothing here fails a build when it drifts; a drift only costs a fresh
// machine minutes (docs/testing.md, "CI timings"), which is why a test has
// to notice it.

package repo

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"sort"
	"strings"
	"testing"

	"github.com/hyperfleet/hyperfleet/internal/testworld/repodir"
)

// depsFormat prints, for each package with a module, its import path and
// the version its code comes from: the replacement's when the module is
// replaced (hack/envtest replaces Kubernetes' staging modules).
const depsFormat = `{{with .Module}}{{$.ImportPath}} {{.Path}}@{{with .Replace}}{{.Version}}{{else}}{{.Version}}{{end}}{{end}}`

// moduleOfPackage lists the dependencies of pkgs, run in dir, as import
// path to module@version, for the build configuration the Makefile uses.
func moduleOfPackage(t *testing.T, dir string, args ...string) map[string]string {
	t.Helper()
	cmd := exec.Command("go", append([]string{"list", "-deps", "-f", depsFormat}, args...)...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list in %s: %v\n%s", dir, err, stderr.String())
	}
	deps := map[string]string{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		if f := strings.Fields(sc.Text()); len(f) == 2 {
			deps[f[0]] = f[1]
		}
	}
	return deps
}

// TestEnvtestSharesTheOperatorModulesVersions fails when a package that both
// the kube-apiserver and etcd build (hack/envtest) and this module's tests
// compile comes from different module versions: each version is compiled
// separately, and the shared part is about half of either build (about
// 800 packages: client-go, apimachinery, apiserver, grpc, protobuf, cel-go,
// the x/ modules, opentelemetry).
func TestEnvtestSharesTheOperatorModulesVersions(t *testing.T) {
	root := repodir.Root()
	ours := moduleOfPackage(t, root, "-test", "./...")
	envtest := moduleOfPackage(t, repodir.Path("hack/envtest"), "k8s.io/kubernetes/cmd/kube-apiserver", "./etcd")

	shared := 0
	drift := map[string]string{}
	for pkg, theirs := range envtest {
		mine, ok := ours[pkg]
		if !ok || strings.HasPrefix(mine, "github.com/hyperfleet/hyperfleet@") {
			continue
		}
		shared++
		if mine != theirs {
			drift[fmt.Sprintf("%s: hack/envtest has %s, this module %s", modulePath(theirs), version(theirs), version(mine))] = pkg
		}
	}
	if shared < 500 {
		t.Fatalf("only %d packages are shared between hack/envtest's build and this module's tests; expected about 800 (is the go list format right?)", shared)
	}
	if len(drift) > 0 {
		lines := make([]string, 0, len(drift))
		for d := range drift {
			lines = append(lines, d)
		}
		sort.Strings(lines)
		t.Errorf("%d of the modules hack/envtest shares with this module are at other versions, so a fresh machine compiles their packages twice:\n  %s\n"+
			"fix: in hack/envtest, go get each at this module's version (cd hack/envtest && go get MODULE@VERSION && go mod tidy); "+
			"when hack/envtest needs the newer one, raise this module's instead",
			len(lines), strings.Join(lines, "\n  "))
	}
	t.Logf("%d packages shared, at the same versions", shared)
}

func modulePath(modVersion string) string { p, _, _ := strings.Cut(modVersion, "@"); return p }
func version(modVersion string) string    { _, v, _ := strings.Cut(modVersion, "@"); return v }

// TestBuildsAreStatic fails when the Makefile or CI stops building without
// cgo, or when the race run, which needs cgo, stops turning it on for
// itself.
func TestBuildsAreStatic(t *testing.T) {
	makefile, err := os.ReadFile(repodir.Path("Makefile"))
	if err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`(?m)^export CGO_ENABLED \?= 0$`).Match(makefile) {
		t.Error("the Makefile no longer exports CGO_ENABLED ?= 0: its builds and tests would compile the dependency tree once more than the image's")
	}
	race := regexp.MustCompile(`(?m)^test-race:.*\n\t@export CGO_ENABLED=1;`)
	if !race.Match(makefile) {
		t.Error("test-race's recipe must start with export CGO_ENABLED=1 (the race detector needs cgo)")
	}
	ci, err := os.ReadFile(repodir.Path(".ci/run"))
	if err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`(?m)^export CGO_ENABLED=0$`).Match(ci) {
		t.Error(".ci/run no longer exports CGO_ENABLED=0 for the go commands it runs outside make")
	}
}

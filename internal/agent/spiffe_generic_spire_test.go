//go:build spire && !windows

package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hyperfleet/hyperfleet/internal/agentconfig"
)

var svidIDLine = regexp.MustCompile(`SPIFFE ID:\s+(spiffe://\S+)`)

// TestGenericScriptSVIDSPIRE: with a real spire-server and spire-agent, a
// generic VM whose registration entry selects its script's user by name
// (unix:user:nobody, as the operator writes it for generic claims) runs
// the script as that user, and the script fetches the VM's X509-SVID
// through SPIFFE_ENDPOINT_SOCKET; while it runs, processes of other uids
// on the same socket (the agent's, root, and another user's) get none.
// Afterwards spire-agent is gone and the VM powered off.
func TestGenericScriptSVIDSPIRE(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("needs root: the script runs as another user")
	}
	nobody, err := user.Lookup("nobody")
	if err != nil {
		t.Skip("no user nobody")
	}
	w := newSPIREWorld(t)
	token, id := w.vmIdentitySelecting(t, "generic", "user:nobody")

	v := newVM(t)
	v.secret = token // checkCommon: never in the log
	v.openToOthers()
	// A VM's /run is everyone's (the agent makes what is below it).
	if err := os.Mkdir(filepath.Join(v.root, "run"), 0o755); err != nil {
		t.Fatal(err)
	}
	// The script's user, which the agent also fetches the first SVID as,
	// cannot reach the build cache under root's home.
	bin := filepath.Join(v.dir, "spire-agent")
	linkOrCopy(t, w.bin, bin)
	v.opts.SPIREAgent = bin
	v.opts.AttestTimeout = time.Minute

	rec := v.rec
	script := fmt.Sprintf(`sock="${SPIFFE_ENDPOINT_SOCKET#unix://}"
id -u >%[1]s/uid
%[2]s api fetch x509 -socketPath "$sock" -timeout 30s >%[1]s/fetch.out 2>&1
echo $? >%[1]s/fetch.tmp
printf '%%s' "$sock" >%[1]s/socket
mv %[1]s/fetch.tmp %[1]s/fetch.status
i=0
while [ ! -e %[1]s/go ] && [ $i -lt 1200 ]; do sleep 0.1; i=$((i+1)); done`, rec, bin)
	c := v.genericConfig(script, 10*time.Minute)
	c.Generic.User = "nobody"
	c.WorkloadMethod = agentconfig.WorkloadBroker
	c.SecretsFile, c.SecretsDeadline = agentconfig.SecretsFile, time.Now().Add(5*time.Minute)
	c.SPIFFE = &agentconfig.SPIFFE{AttestationMethod: agentconfig.AttestationJoinToken, SPIFFEID: id,
		TrustDomain: spireTrustDomain, TrustBundle: string(w.server.Bundle), ServerAddress: w.server.Address}
	v.writeConfig(c)
	v.placeSecrets(agentconfig.GuestSecrets{JoinToken: token, BrokerProof: "proof-generic"})

	done := make(chan int, 1)
	go func() { done <- v.run(context.Background()) }()
	status := waitRecord(t, filepath.Join(rec, "fetch.status"), done, 3*time.Minute)
	out := v.read("fetch.out")
	if status != "0" {
		t.Errorf("the script's fetch exited %s:\n%s", status, out)
	}
	if m := svidIDLine.FindStringSubmatch(out); m == nil || m[1] != id {
		t.Errorf("the script's SVID: %v, want %s; it printed:\n%s", m, id, out)
	}
	if got := v.read("uid"); got != nobody.Uid {
		t.Errorf("the script ran as uid %s, want nobody's %s", got, nobody.Uid)
	}

	// Others on the same socket, while the script still holds it.
	sock := v.read("socket")
	others := map[string]*syscall.Credential{"the agent's uid (root)": nil}
	if d, err := user.Lookup("daemon"); err == nil {
		uid, _ := strconv.ParseUint(d.Uid, 10, 32)
		gid, _ := strconv.ParseUint(d.Gid, 10, 32)
		others["daemon"] = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
	}
	for who, cred := range others {
		cmd := exec.Command(bin, "api", "fetch", "x509", "-socketPath", sock, "-timeout", "5s")
		if cred != nil {
			cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
		}
		got, err := cmd.CombinedOutput()
		if err == nil || strings.Contains(string(got), id) {
			t.Errorf("%s fetched an SVID from the script's socket (%v):\n%s", who, err, got)
		}
	}
	if err := os.WriteFile(filepath.Join(rec, "go"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	select {
	case code := <-done:
		v.checkCommon(code, ExitOK, 1)
	case <-time.After(2 * time.Minute):
		t.Fatal("the agent did not end after the script")
	}
	if _, err := os.Stat(sock); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the Workload API socket is still there after the script: %v", err)
	}
	checkNothingLeft(t, v.root, token, v.log.String(), nil)
}

// waitRecord waits up to d for the record file path and returns its
// content; the agent ending first (done) fails the test.
func waitRecord(t *testing.T, path string, done <-chan int, d time.Duration) string {
	t.Helper()
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		if b, err := os.ReadFile(path); err == nil {
			return strings.TrimSpace(string(b))
		}
		select {
		case code := <-done:
			t.Fatalf("the agent ended (exit code %d) before %s was written", code, filepath.Base(path))
		case <-time.After(100 * time.Millisecond):
		}
	}
	t.Fatalf("no %s after %s", filepath.Base(path), d)
	return ""
}

// linkOrCopy puts src at dst, hard-linked when both are on one file
// system (spire-agent is large).
func linkOrCopy(t *testing.T, src, dst string) {
	t.Helper()
	if err := os.Link(src, dst); err == nil {
		return
	}
	in, err := os.Open(src)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o755)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(out, in); err != nil {
		t.Fatal(err)
	}
	if err := out.Close(); err != nil {
		t.Fatal(err)
	}
}

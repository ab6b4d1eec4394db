//go:build !windows

package agent

import (
	"context"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/hyperfleet/hyperfleet/internal/agentconfig"
	"github.com/hyperfleet/hyperfleet/internal/testworld/testci"
)

// testciRunner is the runner kind of TestCI, a platform only the tests
// know (internal/testworld/testci): it takes its credential as every
// runner kind does (credential) and leaves it in a credential file, which
// the agent must remove.
type testciRunner struct{ got chan Credential }

func (testciRunner) credentialFiles() []string { return []string{"testci.cred"} }

func (r testciRunner) run(ctx context.Context, a *agent, p *place) error {
	cred, err := a.credential(ctx, p)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(p.install, 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(p.install, "testci.cred"), []byte(cred.RegistrationToken), 0o600); err != nil {
		return err
	}
	r.got <- cred
	return nil
}

var (
	registerTestCI sync.Once
	testciRun      = testciRunner{got: make(chan Credential, 16)}
)

// TestATestOnlyPlatformRunsInTheAgent: a platform registered only by the
// tests, its config part with agentconfig.RegisterPlatform and its runner
// kind with RegisterRunner as the agent's main registers the shipped
// ones, runs through the agent's shared steps with no edit to them: the
// config is validated by its spec, its credential read from the guest
// secrets by its method's spec, and its credential file removed at
// cleanup; the VM powers off.
func TestATestOnlyPlatformRunsInTheAgent(t *testing.T) {
	registerTestCI.Do(func() {
		testci.Register()
		RegisterRunner(testci.Platform, testciRun)
	})
	v := newVM(t)
	cfg := &agentconfig.Config{
		Version: agentconfig.CurrentVersion, Platform: testci.Platform,
		WorkloadMethod: agentconfig.WorkloadDirect, BootstrapMethod: testci.MethodToken,
		SecretsFile: agentconfig.SecretsFile, SecretsDeadline: time.Now().Add(time.Minute),
		RegistrationURL: testci.RegistrationURL,
		Runner: agentconfig.Runner{Name: "tci-1", Software: agentconfig.Software{
			InstallPath: testci.InstallPath, RunScript: testci.RunScript, WorkDir: testci.WorkDir, OS: "linux", Arch: "amd64",
		}},
		PowerOffOnFinish: true,
	}
	v.writeConfig(cfg)
	v.checkCommon(v.run(context.Background()), ExitOK, 1)
	select {
	case cred := <-testciRun.got:
		if cred.Method != testci.MethodToken || cred.RegistrationToken != v.secret || cred.JITConfig != "" {
			t.Errorf("the TestCI runner got a %s credential (token %t), want its %s with the placed token", cred.Method, cred.RegistrationToken == v.secret, testci.MethodToken)
		}
	default:
		t.Fatal("the TestCI runner kind did not run")
	}
	if _, err := os.Stat(filepath.Join(v.root, testci.InstallPath, "testci.cred")); !os.IsNotExist(err) {
		t.Errorf("TestCI's credential file was not removed: %v", err)
	}
}

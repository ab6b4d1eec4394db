package v1alpha1_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hyperfleet/hyperfleet/internal/agentconfig"
)

// TestRunnerPathsMatchAgent: the CEL rules on spec.bootstrap.github.runner.installPath and
// workDir admit exactly the paths the agent accepts (agentconfig
// CheckRunnerPath), so a template the API server admits never yields VMs
// whose agent refuses its config, and no system directory gets through.
func TestRunnerPathsMatchAgent(t *testing.T) {
	ctx := context.Background()
	ns := newNamespace(t)
	paths := []string{
		"/opt/actions-runner", "/var/lib/hyperfleet/work", "/home/runner/_work", "/usr/local/actions-runner", "/srv/ci", "/tmp/runner",
		"/", "/etc", "/etc/runner", "/usr", "/usr/lib/runner", "/usr/local", "/usr/local/bin", "/usr/local/share/runner",
		"/bin", "/boot", "/dev/shm", "/proc", "/root", "/root/work", "/run/runner", "/sbin", "/sys", "/lib64",
		"/var", "/var/lib", "/var/lib/cloud", "/var/log", "/var/tmp", "/home", "/opt", "/tmp", "/media", "/mnt", "/srv",
		"/opt//runner", "/opt/runner/", "/opt/x/../../etc", "/opt/./runner", "/opt/..",
	}
	for i, p := range paths {
		for _, field := range []string{"installPath", "workDir"} {
			why := agentconfig.CheckRunnerPath(p)
			obj := validTemplate()
			obj.SetName(fmt.Sprintf("path-%d-%s", i, strings.ToLower(field)))
			obj.SetNamespace(ns)
			set(p, "spec", "bootstrap", "github", "runner", field)(obj)
			err := env.Client.Create(ctx, obj, client.FieldValidation("Strict"))
			switch {
			case why == "" && err != nil:
				t.Errorf("%s %q: the agent accepts it, the API server refused it: %v", field, p, err)
			case why != "" && err == nil:
				t.Errorf("%s %q: the agent refuses it (%s), the API server accepted it", field, p, why)
			case why != "" && !strings.Contains(err.Error(), "bootstrap.github.runner."+field+" must"):
				t.Errorf("%s %q: the rejection does not name the field: %v", field, p, err)
			}
		}
	}
}

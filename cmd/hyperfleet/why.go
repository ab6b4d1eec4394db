package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"path/filepath"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/config"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/why"
	"github.com/hyperfleet/hyperfleet/pkg/workload"
)

// kubectlPluginName is the binary's name as a kubectl plugin: kubectl runs
// kubectl-hyperfleet for `kubectl hyperfleet ...` with the words after
// "hyperfleet" as arguments, so the plugin's commands are this binary's.
const kubectlPluginName = "kubectl-hyperfleet"

// isKubectlPlugin reports whether the binary runs as the kubectl plugin
// (installed, or linked, under kubectlPluginName).
func isKubectlPlugin(argv0 string) bool {
	base := strings.TrimSuffix(filepath.Base(argv0), ".exe")
	return base == kubectlPluginName
}

// pluginCommands are the commands `kubectl hyperfleet` offers: the ones
// that read the cluster for a person at a terminal.
var pluginCommands = map[string]bool{"why": true, "status": true, "version": true, "--version": true, "-h": true, "--help": true, "help": true}

// kubeFlags are the kubectl-style flags of why and status.
type kubeFlags struct {
	kubeconfig, context, namespace, output string
}

func bindKubeFlags(fs *flag.FlagSet) *kubeFlags {
	k := &kubeFlags{}
	fs.StringVar(&k.kubeconfig, "kubeconfig", "", "path to the kubeconfig file; default: $KUBECONFIG, then ~/.kube/config, then the in-cluster account")
	fs.StringVar(&k.context, "context", "", "kubeconfig context to use; default: the current context")
	fs.StringVar(&k.namespace, "namespace", "", "namespace to look in; default: every namespace")
	fs.StringVar(&k.namespace, "n", "", "shorthand for --namespace")
	fs.StringVar(&k.output, "output", "text", "output format: text or json")
	fs.StringVar(&k.output, "o", "text", "shorthand for --output")
	return k
}

// errHelp: -h was asked for and the usage printed; the command ends
// without an error.
var errHelp = errors.New("help printed")

// parseInterspersed parses fs from args with flags before and after the
// positional arguments (kubectl's habit: `why 4242 -n team-a`), which
// flag.Parse alone stops at.
func parseInterspersed(fs *flag.FlagSet, args []string) ([]string, error) {
	var positional []string
	for {
		if err := fs.Parse(args); errors.Is(err, flag.ErrHelp) {
			return nil, errHelp
		} else if err != nil {
			return nil, err
		}
		args = fs.Args()
		if len(args) == 0 {
			return positional, nil
		}
		positional = append(positional, args[0])
		args = args[1:]
	}
}

// parseKubeCommand binds the kubeconfig flags to a command's fs and parses
// args with them (parseInterspersed).
func parseKubeCommand(fs *flag.FlagSet, args []string) (*kubeFlags, []string, error) {
	k := bindKubeFlags(fs)
	pos, err := parseInterspersed(fs, args)
	return k, pos, err
}

// ignoreHelp is a command's answer to its parse error: nil when -h printed
// the usage (errHelp), else err.
func ignoreHelp(err error) error {
	if errors.Is(err, errHelp) {
		return nil
	}
	return err
}

// restConfig finds the API server the kubectl way: --kubeconfig, else
// $KUBECONFIG or ~/.kube/config (controller-runtime's config package),
// else the in-cluster account; --context picks the context.
func (k *kubeFlags) restConfig() (*rest.Config, error) {
	if k.kubeconfig == "" {
		cfg, err := config.GetConfigWithContext(k.context)
		if err != nil {
			return nil, fmt.Errorf("finding the Kubernetes API (give --kubeconfig or set KUBECONFIG): %w", err)
		}
		return cfg, nil
	}
	cfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(
		&clientcmd.ClientConfigLoadingRules{ExplicitPath: k.kubeconfig},
		&clientcmd.ConfigOverrides{CurrentContext: k.context}).ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("reading --kubeconfig %s: %w", k.kubeconfig, err)
	}
	return cfg, nil
}

func (k *kubeFlags) load(ctx context.Context) (*why.World, error) {
	if k.output != "text" && k.output != "json" {
		return nil, fmt.Errorf("-o %q: give text or json", k.output)
	}
	cfg, err := k.restConfig()
	if err != nil {
		return nil, err
	}
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		return nil, err
	}
	if err := hfv1.AddToScheme(scheme); err != nil {
		return nil, err
	}
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		return nil, fmt.Errorf("connecting to the Kubernetes API at %s: %w", cfg.Host, err)
	}
	w, err := why.Load(ctx, c, k.namespace, time.Now())
	if err != nil {
		return nil, err
	}
	// The platforms this binary registers (main.go's init) read a pool's
	// runner labels as routing does; they make no call here.
	if w.Backends, err = workload.NewBackends(workload.Registered(), workload.Dependencies{}); err != nil {
		return nil, fmt.Errorf("building the CI platforms' back-ends: %w", err)
	}
	return w, nil
}

const whyUsage = `Usage: hyperfleet why <job-id | job-url | job/CIJOB | pool/NAME | claim/NAME> [-n namespace] [-o text|json]

Prints the chain from the job to its VM (CIJob, RunnerPool, template, cluster,
claims and their VMs), one line per object, and the reason it is blocked with
the object and field that record it and the fix (docs/troubleshooting.md,
"Why is my job not running?"). A job is given by its id, by the URL of its page
(GitHub .../actions/runs/RUN/job/JOB, GitLab .../-/jobs/JOB, Buildkite
.../builds/N#JOB) or by its CIJob's name.

Flags:
`

// runWhy is `hyperfleet why`.
func runWhy(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("why", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprint(stderr, whyUsage); fs.PrintDefaults() }
	k, pos, err := parseKubeCommand(fs, args)
	if err != nil {
		return ignoreHelp(err)
	}
	if len(pos) != 1 {
		fs.Usage()
		return fmt.Errorf("give one job, pool/NAME or claim/NAME (got %d arguments)", len(pos))
	}
	t, err := why.ParseTarget(pos[0], k.namespace)
	if err != nil {
		return err
	}
	w, err := k.load(ctx)
	if err != nil {
		return err
	}
	r := why.Explain(w, t)
	if k.output == "json" {
		return writeJSON(stdout, r)
	}
	return r.WriteText(stdout)
}

// runStatus is `hyperfleet status`.
func runStatus(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("status", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, "Usage: hyperfleet status [-n namespace] [-o text|json]\n\nRunnerPools (ready/min/max/desired/busy/queued and the Ready reason) and HypervisorClusters (connected, nodes, reason) at a glance.\n\nFlags:\n")
		fs.PrintDefaults()
	}
	k, pos, err := parseKubeCommand(fs, args)
	if err != nil {
		return ignoreHelp(err)
	}
	if len(pos) != 0 {
		fs.Usage()
		return fmt.Errorf("status takes no arguments (got %q)", pos)
	}
	w, err := k.load(ctx)
	if err != nil {
		return err
	}
	s := why.Summarize(w)
	if k.output == "json" {
		return writeJSON(stdout, s)
	}
	return s.WriteText(stdout)
}

func writeJSON(out io.Writer, v any) error {
	enc := json.NewEncoder(out)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		return fmt.Errorf("writing JSON: %w", err)
	}
	return nil
}

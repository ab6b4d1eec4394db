package testenv

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"
)

var (
	helmOnce sync.Once
	helmBin  string
	helmErr  error
)

// Helm runs the helm CLI (HelmPath) with args from the repository's root,
// with an empty configuration, cache and data directory of its own and no
// kubeconfig, so that neither the machine's helm setup nor a cluster plays
// a part; it returns the standard output, and an error carrying the
// standard error when helm fails. No helm CLI fails the test.
func Helm(t testing.TB, args ...string) (string, error) {
	t.Helper()
	helmOnce.Do(func() { helmBin, helmErr = HelmPath() })
	if helmErr != nil {
		t.Fatalf("no helm CLI: %v", helmErr)
	}
	home := t.TempDir()
	cmd := exec.Command(helmBin, args...)
	cmd.Dir = RepoRoot()
	cmd.Env = append(os.Environ(),
		"HELM_CACHE_HOME="+filepath.Join(home, "cache"),
		"HELM_CONFIG_HOME="+filepath.Join(home, "config"),
		"HELM_DATA_HOME="+filepath.Join(home, "data"),
		"KUBECONFIG="+filepath.Join(home, "no-kubeconfig"),
	)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("helm %s: %w\n%s%s", strings.Join(args, " "), err, stdout.String(), stderr.String())
	}
	return stdout.String(), nil
}

// DecodeObjects splits a YAML stream (what helm template or kustomize
// prints) into objects, in order, skipping empty documents.
func DecodeObjects(stream []byte) ([]*unstructured.Unstructured, error) {
	reader := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(stream)))
	var objs []*unstructured.Unstructured
	for {
		doc, err := reader.Read()
		if errors.Is(err, io.EOF) {
			return objs, nil
		}
		if err != nil {
			return nil, err
		}
		raw, err := yaml.YAMLToJSON(doc)
		if err != nil {
			return nil, fmt.Errorf("%w in\n%s", err, doc)
		}
		if string(raw) == "null" {
			continue
		}
		u := &unstructured.Unstructured{}
		if err := u.UnmarshalJSON(raw); err != nil {
			return nil, fmt.Errorf("%w in\n%s", err, doc)
		}
		objs = append(objs, u)
	}
}

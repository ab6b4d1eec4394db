package controller_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/prometheus/common/expfmt"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	crmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/testworld/simulator/github/githubsimtest"
	"github.com/hyperfleet/hyperfleet/pkg/ownership"
)

// canaryWorld is what a canary scan reads: the operator and the simulators
// it worked with, and the directory the Proxmox simulator copied every
// VM's cloud-init into ("" when the test captures none).
type canaryWorld struct {
	sim   *simulator
	gs    *githubsimtest.Server
	op    *operator
	seeds string
}

// longLivedCanaries are the test world's long-lived secrets, each a value
// distinct enough that finding it anywhere is a leak: the PAT, the App's
// private key, the Proxmox API token, the webhook secret and the install's
// ownership key (raw, base64 and hex).
func longLivedCanaries() map[string]string {
	key := bytes.Repeat([]byte{42}, ownership.MinKeyLength)
	return map[string]string{
		"the GitHub PAT":               testGitHubPAT,
		"the GitHub App private key":   strings.Join(strings.Split(string(testAppKey.PrivatePEM), "\n")[2:5], "\n"),
		"the Proxmox API token secret": simTokenSecret,
		"the webhook secret":           poolWebhookSecret,
		"the ownership key (base64)":   base64.StdEncoding.EncodeToString(key),
		"the ownership key (hex)":      hex.EncodeToString(key),
		"the ownership key (raw)":      string(key),
	}
}

// installationToken matches a GitHub App installation token.
var installationToken = regexp.MustCompile(`ghs_[A-Za-z0-9]{20,}`)

// assertNoCanaries checks that no long-lived secret appears in anything the
// operator writes or sends (its log, events, every HyperFleet object with
// its status, CIJobs included, its metrics, the Proxmox simulator's state,
// the GitHub simulator's record of runners and jobs) nor in anything that
// reached a VM; and that the VMs' single-use credentials appear only in
// what reached their VM.
func assertNoCanaries(t reporter, w canaryWorld, singleUse ...string) {
	t.Helper()
	ctx := context.Background()
	places := map[string]string{"operator log": w.op.logs.String()}
	var events corev1.EventList
	if err := env.Client.List(ctx, &events); err != nil {
		t.Fatal(err)
	}
	places["events"] = mustJSON(t, events.Items)
	for _, kind := range []string{"HypervisorClusterList", "HypervisorMachineTemplateList", "RunnerPoolList", "MachineClaimList", "IPPoolList", "CIJobList"} {
		list := &unstructured.UnstructuredList{}
		list.SetGroupVersionKind(schema.GroupVersionKind{Group: hfv1.GroupVersion.Group, Version: hfv1.GroupVersion.Version, Kind: kind})
		if err := env.Client.List(ctx, list); err != nil {
			t.Fatal(err)
		}
		places[strings.TrimSuffix(kind, "List")+" objects"] = mustJSON(t, list.Items)
	}
	families, err := crmetrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var metricsText bytes.Buffer
	for _, mf := range families {
		if _, err := expfmt.MetricFamilyToText(&metricsText, mf); err != nil {
			t.Fatal(err)
		}
	}
	places["metrics"] = metricsText.String()
	places["Proxmox simulator state"] = mustJSON(t, w.sim.State())
	if w.gs != nil {
		st := w.gs.Sim.State()
		places["GitHub runners and jobs"] = mustJSON(t, []any{st.Runners, st.Jobs, st.RemovedRunners})
	}
	vm := ""
	if w.seeds != "" {
		_ = filepath.Walk(w.seeds, func(p string, info os.FileInfo, err error) error {
			if err == nil && !info.IsDir() {
				b, _ := os.ReadFile(p)
				vm += string(b)
			}
			return nil
		})
		places["the VMs' seeds"] = vm
	}
	for where, text := range places {
		for what, canary := range longLivedCanaries() {
			if strings.Contains(text, canary) {
				t.Errorf("%s found in %s", what, where)
			}
		}
		if m := installationToken.FindString(text); m != "" {
			t.Errorf("an installation token (%s…) found in %s", m[:8], where)
		}
		if where == "GitHub runners and jobs" {
			// The simulator's own record of what it issued.
			continue
		}
		for _, s := range singleUse {
			if s != "" && strings.Contains(text, s) {
				t.Errorf("a VM's single-use credential (%.6s…) found in %s", s, where)
			}
		}
	}
}

func mustJSON(t reporter, v any) string {
	t.Helper()
	raw, err := json.Marshal(v)
	if err != nil {
		t.Fatalf("encode for the canary scan: %v", err)
	}
	return string(raw)
}

// TestCanaryScanFindsLeaks: the scan is not blind; a canary written into a
// claim's annotation and into the operator's log is reported.
func TestCanaryScanFindsLeaks(t *testing.T) {
	sim := startSim(t, nil)
	op := startOperator(t, operatorOptions{})
	f := newFixture(t, sim, nil)
	// A claim of a template that does not exist: it never gets a VM, so
	// the test is about the scan alone.
	f.create(&hfv1.MachineClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: f.namespace, Name: "leaky", Annotations: map[string]string{"note": "token " + simTokenSecret}},
		Spec:       hfv1.MachineClaimSpec{TemplateRef: hfv1.ObjectName{Name: "no-such-template"}},
	})
	fmt.Fprintf(op.logs, "oops %s\n", testGitHubPAT)
	inner := &canaryRecorder{}
	assertNoCanaries(inner, canaryWorld{sim: sim, op: op})
	for _, want := range []string{"the Proxmox API token secret found in MachineClaim objects", "the GitHub PAT found in operator log"} {
		if !strings.Contains(strings.Join(inner.errs, "\n"), want) {
			t.Errorf("the canary scan missed %q; it reported:\n%s", want, strings.Join(inner.errs, "\n"))
		}
	}
}

// reporter is the part of testing.T the canary scan uses.
type reporter interface {
	Helper()
	Errorf(format string, args ...any)
	Fatal(args ...any)
	Fatalf(format string, args ...any)
}

// canaryRecorder collects a scan's findings instead of failing a test.
type canaryRecorder struct{ errs []string }

func (r *canaryRecorder) Helper() {}
func (r *canaryRecorder) Errorf(format string, a ...any) {
	r.errs = append(r.errs, fmt.Sprintf(format, a...))
}
func (r *canaryRecorder) Fatal(a ...any) { r.errs = append(r.errs, fmt.Sprint(a...)) }
func (r *canaryRecorder) Fatalf(format string, a ...any) {
	r.errs = append(r.errs, fmt.Sprintf(format, a...))
}

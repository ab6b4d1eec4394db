package settings

import (
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

type testFlags struct {
	fs       *flag.FlagSet
	inFlight *int
	maxAge   *time.Duration
	leader   *bool
	ns       *string
}

func newTestFlags() *testFlags {
	fs := flag.NewFlagSet("manager", flag.ContinueOnError)
	fs.SetOutput(os.Stderr)
	return &testFlags{
		fs:       fs,
		inFlight: fs.Int("webhook-max-in-flight", 64, ""),
		maxAge:   fs.Duration("webhook-max-event-age", 5*time.Minute, ""),
		leader:   fs.Bool("leader-elect", true, ""),
		ns:       fs.String("namespace", "hyperfleet-system", ""),
	}
}

func writeFile(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestPrecedence: flag > environment > file > default, for every setting
// on its own.
func TestPrecedence(t *testing.T) {
	file := writeFile(t, "webhook-max-in-flight: 32\nwebhook-max-event-age: 2m\nleader-elect: false\nnamespace: from-file\n")
	f := newTestFlags()
	src, err := Parse(f.fs,
		[]string{"--config", file, "--webhook-max-in-flight=8"},
		[]string{"HYPERFLEET_WEBHOOK_MAX_IN_FLIGHT=16", "HYPERFLEET_WEBHOOK_MAX_EVENT_AGE=3m", "PATH=/bin", "HYPERFLEET_CACHE=/tmp/x"})
	if err != nil {
		t.Fatal(err)
	}
	if *f.inFlight != 8 || src["webhook-max-in-flight"] != SourceFlag {
		t.Errorf("flag over environment and file: %d from %s", *f.inFlight, src["webhook-max-in-flight"])
	}
	if *f.maxAge != 3*time.Minute || src["webhook-max-event-age"] != SourceEnv {
		t.Errorf("environment over file: %s from %s", *f.maxAge, src["webhook-max-event-age"])
	}
	if *f.leader || *f.ns != "from-file" || src["namespace"] != SourceFile {
		t.Errorf("file over default: leader %v, namespace %q from %s", *f.leader, *f.ns, src["namespace"])
	}

	d := newTestFlags()
	src, err = Parse(d.fs, nil, nil)
	if err != nil || *d.inFlight != 64 || src["webhook-max-in-flight"] != SourceDefault {
		t.Fatalf("defaults: %d from %s (%v)", *d.inFlight, src["webhook-max-in-flight"], err)
	}
}

// TestFileFromEnvironment: HYPERFLEET_CONFIG names the file when --config
// does not.
func TestFileFromEnvironment(t *testing.T) {
	f := newTestFlags()
	if _, err := Parse(f.fs, nil, []string{"HYPERFLEET_CONFIG=" + writeFile(t, "namespace: env-file\n")}); err != nil || *f.ns != "env-file" {
		t.Fatalf("namespace %q (%v)", *f.ns, err)
	}
}

// TestRefusals: every unknown or invalid setting is an error naming the
// key, where it came from, and the fix.
func TestRefusals(t *testing.T) {
	for name, tc := range map[string]struct {
		file string
		env  []string
		says []string
	}{
		"unknown file key":      {file: "webhook-max-inflight: 3\n", says: []string{`unknown key "webhook-max-inflight"`, "flag names"}},
		"invalid file value":    {file: "webhook-max-in-flight: many\n", says: []string{"key webhook-max-in-flight", `"many"`, "--webhook-max-in-flight"}},
		"invalid duration":      {file: "webhook-max-event-age: 5\n", says: []string{"key webhook-max-event-age", `default is "5m0s"`}},
		"list value":            {file: "namespace: [a, b]\n", says: []string{"key namespace", "string, number or boolean"}},
		"empty value":           {file: "namespace:\n", says: []string{"key namespace", "remove the key"}},
		"file names a file":     {file: "config: other.yaml\n", says: []string{"key config", "cannot name another"}},
		"not a map":             {file: "- a\n- b\n", says: []string{"not a YAML map"}},
		"unknown env":           {env: []string{"HYPERFLEET_WEBHOOK_MAX_INFLIGHT=3"}, says: []string{"HYPERFLEET_WEBHOOK_MAX_INFLIGHT", "name no setting"}},
		"invalid env":           {env: []string{"HYPERFLEET_LEADER_ELECT=maybe"}, says: []string{"HYPERFLEET_LEADER_ELECT", `"maybe"`, "--leader-elect"}},
		"missing file from env": {env: []string{"HYPERFLEET_CONFIG=/nonexistent/config.yaml"}, says: []string{"settings file", "/nonexistent/config.yaml"}},
	} {
		t.Run(name, func(t *testing.T) {
			f := newTestFlags()
			var args []string
			if tc.file != "" {
				args = []string{"--config", writeFile(t, tc.file)}
			}
			_, err := Parse(f.fs, args, tc.env)
			if err == nil {
				t.Fatal("accepted")
			}
			for _, s := range tc.says {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("error %q does not say %q", err, s)
				}
			}
		})
	}
}

func TestEnvName(t *testing.T) {
	if got := EnvName("claim-stuck-pending"); got != "HYPERFLEET_CLAIM_STUCK_PENDING" {
		t.Fatal(got)
	}
}

// FuzzReadFile: any settings file either becomes a flag value or an error, never a
// panic.
func FuzzReadFile(f *testing.F) {
	f.Add("namespace: x\n")
	f.Add("webhook-max-in-flight: 1e3\n")
	f.Add("{a: [1, {b: c}]}")
	f.Fuzz(func(t *testing.T, body string) {
		p := filepath.Join(t.TempDir(), "c.yaml")
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		fl := newTestFlags()
		_, _ = Parse(fl.fs, []string{"--config", p}, nil)
	})
}

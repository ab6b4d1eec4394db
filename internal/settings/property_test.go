package settings

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/hyperfleet/hyperfleet/internal/testworld/proptest"
)

// setting is one of the test flag set's flags: how to draw a value it
// accepts, one it refuses, and how to read its current value back.
type setting struct {
	name    string
	valid   *rapid.Generator[string]
	invalid *rapid.Generator[string]
	get     func(*testFlags) string
}

var settingsUnderTest = []setting{
	{"webhook-max-in-flight",
		rapid.Map(rapid.IntRange(1, 100000), strconv.Itoa),
		rapid.SampledFrom([]string{"many", "1.5", "0x", "ten"}),
		func(f *testFlags) string { return strconv.Itoa(*f.inFlight) }},
	{"webhook-max-event-age",
		rapid.Map(rapid.Int64Range(1, int64(48*time.Hour)), func(n int64) string { return time.Duration(n).String() }),
		rapid.SampledFrom([]string{"5", "five minutes", "1x"}),
		func(f *testFlags) string { return f.maxAge.String() }},
	{"leader-elect",
		rapid.Map(rapid.Bool(), strconv.FormatBool),
		rapid.SampledFrom([]string{"maybe", "yes please", "2"}),
		func(f *testFlags) string { return strconv.FormatBool(*f.leader) }},
	{"namespace",
		rapid.StringMatching(`[a-z][a-z0-9-]{0,20}`),
		nil, // every string is a namespace flag's value
		func(f *testFlags) string { return *f.ns }},
}

// normal is how a valid value reads back through its flag.
func normal(s setting, v string) string {
	switch s.name {
	case "webhook-max-event-age":
		d, _ := time.ParseDuration(v)
		return d.String()
	}
	return v
}

// Feature: hyperfleet-operator, Property 22: Configuration Management
//
// TestConfigurationSourcesProperty: for every assignment of each setting
// to any of the command line, a HYPERFLEET_ environment variable and the
// settings file (the chart's ConfigMap), with generated values, valid and
// not: the value a setting takes is the one of its strongest source (flag,
// then environment, then file, then the default) and Parse reports that
// source; and a refused value that would take effect fails Parse with an
// error naming the setting, where it came from and the flag it feeds.
func TestConfigurationSourcesProperty(t *testing.T) {
	dir := t.TempDir()
	proptest.Check(t, 500, func(t *rapid.T) {
		var args, env []string
		var file strings.Builder
		want := map[string]string{}
		wantSource := map[string]Source{}
		// refused holds, for each setting whose strongest source has a
		// refused value, what the error must say.
		refused := map[string][]string{}
		for _, s := range settingsUnderTest {
			wantSource[s.name] = SourceDefault
			// Weakest first, so the strongest present source is the last
			// one written into want.
			for _, src := range []Source{SourceFile, SourceEnv, SourceFlag} {
				if !rapid.Bool().Draw(t, fmt.Sprintf("%s from %s", s.name, src)) {
					continue
				}
				v := s.valid.Draw(t, fmt.Sprintf("%s %s value", s.name, src))
				bad := s.invalid != nil && rapid.IntRange(0, 9).Draw(t, fmt.Sprintf("%s %s refused", s.name, src)) == 0
				if bad {
					v = s.invalid.Draw(t, fmt.Sprintf("%s %s refused value", s.name, src))
				}
				switch src {
				case SourceFile:
					fmt.Fprintf(&file, "%s: %q\n", s.name, v)
				case SourceEnv:
					env = append(env, EnvName(s.name)+"="+v)
				case SourceFlag:
					args = append(args, "--"+s.name+"="+v)
				}
				wantSource[s.name] = src
				want[s.name] = normal(s, v)
				delete(refused, s.name)
				if bad {
					refused[s.name] = []string{s.name, strconv.Quote(v)}
					if src == SourceEnv {
						refused[s.name][0] = EnvName(s.name)
					}
				}
			}
		}
		env = append(env, "PATH=/usr/bin", "HYPERFLEET_CACHE=/tmp/cache")
		if file.Len() > 0 {
			path := filepath.Join(dir, "config.yaml")
			if err := os.WriteFile(path, []byte(file.String()), 0o600); err != nil {
				t.Fatal(err)
			}
			if rapid.Bool().Draw(t, "file named by environment") {
				env = append(env, EnvName(FileFlag)+"="+path)
			} else {
				args = append(args, "--"+FileFlag+"="+path)
			}
		}

		f := newTestFlags()
		f.fs.SetOutput(discard{})
		sources, err := Parse(f.fs, args, env)
		if len(refused) > 0 || err != nil {
			// A refused value that took effect (or, for flags, that the
			// command line gave) fails Parse, naming it; nothing else does.
			if err == nil {
				t.Fatalf("Parse accepted a refused value (args %q, env %q, file %q)", args, env, file.String())
			}
			if len(refused) == 0 {
				t.Fatalf("Parse: %v (args %q, env %q, file %q)", err, args, env, file.String())
			}
			// A refused command-line flag stops flag parsing before any
			// other source is read; otherwise every refused value that
			// took effect is named.
			if anyRefusedOnCommandLine(args) {
				return
			}
			for _, says := range refused {
				for _, s := range says {
					if !strings.Contains(err.Error(), s) {
						t.Fatalf("error %q does not name %q", err, s)
					}
				}
			}
			return
		}
		for _, s := range settingsUnderTest {
			if sources[s.name] != wantSource[s.name] {
				t.Fatalf("%s: source %s, want %s (args %q, env %q, file %q)", s.name, sources[s.name], wantSource[s.name], args, env, file.String())
			}
			if w, ok := want[s.name]; ok && s.get(f) != w {
				t.Fatalf("%s = %q, want %q from %s", s.name, s.get(f), w, wantSource[s.name])
			}
		}
	})
}

// anyRefusedOnCommandLine: a refused command-line flag fails flag parsing
// itself, before any other source is read (a weaker source's refused value
// is then never reached).
func anyRefusedOnCommandLine(args []string) bool {
	f := newTestFlags()
	f.fs.SetOutput(discard{})
	return f.fs.Parse(args) != nil
}

type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }

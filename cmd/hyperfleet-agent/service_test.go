package main

import (
	"strings"
	"testing"
)

// TestParseServiceCommand: `hyperfleet-agent service ...` (Windows,
// docs/windows.md) is parsed on every OS, so its rules run in every test
// run: install needs absolute --config and --log, uninstall takes nothing.
func TestParseServiceCommand(t *testing.T) {
	ok := []struct {
		words  []string
		action string
	}{
		{[]string{"install", "--config", `C:\ProgramData\HyperFleet\agent.json`, "--log", `C:\ProgramData\HyperFleet\agent.log`}, "install"},
		{[]string{"install", `--config=C:\ProgramData\HyperFleet\agent.json`, `--log=C:\ProgramData\HyperFleet\agent.log`, "--idle-timeout", "1h"}, "install"},
		{[]string{"uninstall"}, "uninstall"},
	}
	for _, tc := range ok {
		c, err := parseServiceCommand(tc.words, isWindowsAbs)
		if err != nil {
			t.Errorf("%q: %v", tc.words, err)
			continue
		}
		if c.action != tc.action || (c.action == "install" && len(c.args) != len(tc.words)-1) {
			t.Errorf("%q: got %+v", tc.words, c)
		}
	}
	bad := []struct {
		words []string
		want  string
	}{
		{nil, "want install or uninstall"},
		{[]string{"start"}, `unknown action "start"`},
		{[]string{"uninstall", "--config", "x"}, "takes no arguments"},
		{[]string{"install", "--log", `C:\l.log`}, "--config is required"},
		{[]string{"install", "--config", `C:\a.json`}, "--log is required"},
		{[]string{"install", "--config", `agent.json`, "--log", `C:\l.log`}, `--config "agent.json" must be an absolute path`},
		{[]string{"install", "--config", `C:\a.json`, "--log"}, "--log needs a value"},
		{[]string{"install", "--config", `C:\a.json`, "--log", `C:\l.log`, "extra"}, `unexpected argument "extra"`},
		{[]string{"install", "--service", "x", "--config", `C:\a.json`, "--log", `C:\l.log`}, "--service cannot be a service's flag"},
	}
	for _, tc := range bad {
		_, err := parseServiceCommand(tc.words, isWindowsAbs)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: got %v, want an error with %q", tc.words, err, tc.want)
		}
	}
	for p, want := range map[string]bool{`C:\x`: true, `c:/x`: true, `\\server\share`: true, `x`: false, `/x`: false, `C:x`: false} {
		if isWindowsAbs(p) != want {
			t.Errorf("isWindowsAbs(%q) = %v", p, !want)
		}
	}
}

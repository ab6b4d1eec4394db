package main

import (
	"fmt"
	"path/filepath"
	"strings"
)

// serviceCommand is `hyperfleet-agent service install|uninstall [flags]`,
// parsed on every OS so that its rules are tested where the tests run.
type serviceCommand struct {
	action string // install or uninstall
	// args are the agent's flags the service manager starts it with.
	args []string
}

// parseServiceCommand reads the words after `service`: install takes the
// agent's flags the service runs with (--config and --log are required,
// absolute paths: the service manager starts it in C:\Windows\System32),
// uninstall takes none.
func parseServiceCommand(words []string, isAbs func(string) bool) (serviceCommand, error) {
	if len(words) == 0 {
		return serviceCommand{}, fmt.Errorf("service: want install or uninstall")
	}
	c := serviceCommand{action: words[0], args: words[1:]}
	switch c.action {
	case "uninstall":
		if len(c.args) > 0 {
			return serviceCommand{}, fmt.Errorf("service uninstall takes no arguments, got %q", c.args)
		}
		return c, nil
	case "install":
	default:
		return serviceCommand{}, fmt.Errorf("service: unknown action %q; want install or uninstall", c.action)
	}
	seen := map[string]bool{}
	for i := 0; i < len(c.args); i++ {
		name, value, hasValue := strings.Cut(strings.TrimLeft(c.args[i], "-"), "=")
		if !strings.HasPrefix(c.args[i], "-") {
			return serviceCommand{}, fmt.Errorf("service install: unexpected argument %q", c.args[i])
		}
		if name == "service" || name == "version" {
			return serviceCommand{}, fmt.Errorf("service install: --%s cannot be a service's flag", name)
		}
		if !hasValue {
			if i+1 >= len(c.args) {
				return serviceCommand{}, fmt.Errorf("service install: --%s needs a value", name)
			}
			i++
			value = c.args[i]
		}
		seen[name] = true
		if (name == "config" || name == "log") && !isAbs(value) {
			return serviceCommand{}, fmt.Errorf("service install: --%s %q must be an absolute path", name, value)
		}
	}
	for _, need := range []string{"config", "log"} {
		if !seen[need] {
			return serviceCommand{}, fmt.Errorf("service install: --%s is required (a service has no console; the log goes to a file)", need)
		}
	}
	return c, nil
}

// Windows' own path rule, for the tests that run elsewhere: a drive letter
// and a separator, or a UNC path.
func isWindowsAbs(p string) bool {
	p = filepath.ToSlash(strings.ReplaceAll(p, `\`, "/"))
	if strings.HasPrefix(p, "//") {
		return len(p) > 2
	}
	return len(p) >= 3 && p[1] == ':' && p[2] == '/' && ((p[0] >= 'a' && p[0] <= 'z') || (p[0] >= 'A' && p[0] <= 'Z'))
}

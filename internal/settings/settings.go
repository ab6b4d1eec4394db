// Package settings fills a command's flag set from three more sources than
// its command line, with one precedence: a flag given on the command line,
// then an environment variable, then a key of a YAML settings file (the
// Helm chart mounts its ConfigMap as one), then the flag's default.
//
// Every setting is a flag: the environment variable of flag
// webhook-max-in-flight is HYPERFLEET_WEBHOOK_MAX_IN_FLIGHT, its file key
// is webhook-max-in-flight. A file key or a HYPERFLEET_ variable that names
// no flag, and a value a flag does not accept, are errors that name the
// key, its source and the fix: a setting that silently does nothing is
// worse than a manager that does not start.
package settings

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"slices"
	"sort"
	"strings"

	"sigs.k8s.io/yaml"
)

// EnvPrefix starts the environment variable of every setting.
const EnvPrefix = "HYPERFLEET_"

// FileFlag is the flag (and HYPERFLEET_CONFIG the variable) naming the
// settings file.
const FileFlag = "config"

// ignoredEnv are HYPERFLEET_ variables that are not settings of the
// manager: the repository's build and test tooling reads them.
var ignoredEnv = []string{"HYPERFLEET_CACHE"}

// Source says where a setting's value came from.
type Source string

// The sources, strongest first.
const (
	SourceFlag    Source = "flag"
	SourceEnv     Source = "environment"
	SourceFile    Source = "file"
	SourceDefault Source = "default"
)

// Parse parses args into fs, then sets every flag not given on the command
// line from the environment (environ, as os.Environ returns it) or, failing
// that, from the settings file named by --config or HYPERFLEET_CONFIG. It
// returns where each flag's value came from. fs must not define the
// config flag itself; Parse adds it.
func Parse(fs *flag.FlagSet, args, environ []string) (map[string]Source, error) {
	file := fs.String(FileFlag, "", "YAML file of settings: keys are flag names (webhook-max-in-flight: 32); a flag or a HYPERFLEET_<FLAG_NAME> environment variable overrides a key")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	sources := map[string]Source{}
	fs.VisitAll(func(f *flag.Flag) { sources[f.Name] = SourceDefault })
	fs.Visit(func(f *flag.Flag) { sources[f.Name] = SourceFlag })

	env, err := settingsFromEnv(fs, environ)
	if err != nil {
		return nil, err
	}
	if sources[FileFlag] != SourceFlag {
		if v, ok := env[FileFlag]; ok {
			*file = v
			sources[FileFlag] = SourceEnv
		}
	}
	var fromFile map[string]string
	if *file != "" {
		if fromFile, err = readFile(fs, *file); err != nil {
			return nil, err
		}
	}
	var errs []error
	fs.VisitAll(func(f *flag.Flag) {
		if sources[f.Name] != SourceDefault || f.Name == FileFlag {
			return
		}
		if v, ok := env[f.Name]; ok {
			if err := fs.Set(f.Name, v); err != nil {
				errs = append(errs, fmt.Errorf("environment variable %s=%q: %w (%s)", EnvName(f.Name), v, err, describe(f)))
			}
			sources[f.Name] = SourceEnv
			return
		}
		if v, ok := fromFile[f.Name]; ok {
			if err := fs.Set(f.Name, v); err != nil {
				errs = append(errs, fmt.Errorf("settings file %s: key %s: %q: %w (%s)", *file, f.Name, v, err, describe(f)))
			}
			sources[f.Name] = SourceFile
		}
	})
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return sources, nil
}

// describe names a flag and shows its default as an example of a value
// it accepts.
func describe(f *flag.Flag) string {
	return fmt.Sprintf("the value of flag --%s, whose default is %q", f.Name, f.DefValue)
}

// EnvName is the environment variable of flag name.
func EnvName(name string) string {
	return EnvPrefix + strings.ToUpper(strings.ReplaceAll(name, "-", "_"))
}

// settingsFromEnv returns the HYPERFLEET_ variables by flag name, and
// refuses one that names no flag.
func settingsFromEnv(fs *flag.FlagSet, environ []string) (map[string]string, error) {
	byEnv := map[string]string{}
	fs.VisitAll(func(f *flag.Flag) { byEnv[EnvName(f.Name)] = f.Name })
	out := map[string]string{}
	var unknown []string
	for _, kv := range environ {
		k, v, _ := strings.Cut(kv, "=")
		if !strings.HasPrefix(k, EnvPrefix) || slices.Contains(ignoredEnv, k) {
			continue
		}
		name, ok := byEnv[k]
		if !ok {
			unknown = append(unknown, k)
			continue
		}
		out[name] = v
	}
	if len(unknown) > 0 {
		sort.Strings(unknown)
		return nil, fmt.Errorf("environment variables %s name no setting: each %s<FLAG_NAME> sets one flag (run with -help for the flags); unset or rename them",
			strings.Join(unknown, ", "), EnvPrefix)
	}
	return out, nil
}

// readFile reads a settings file: a YAML map from flag names to scalar
// values.
func readFile(fs *flag.FlagSet, path string) (map[string]string, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("settings file (--%s or %s): %w", FileFlag, EnvName(FileFlag), err)
	}
	var doc map[string]any
	if err := yaml.Unmarshal(raw, &doc); err != nil {
		return nil, fmt.Errorf("settings file %s: not a YAML map of flag names to values: %w", path, err)
	}
	out := make(map[string]string, len(doc))
	var errs []error
	keys := make([]string, 0, len(doc))
	for k := range doc {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		v := doc[k]
		switch {
		case k == FileFlag:
			errs = append(errs, fmt.Errorf("settings file %s: key %s: a settings file cannot name another one", path, k))
		case fs.Lookup(k) == nil:
			errs = append(errs, fmt.Errorf("settings file %s: unknown key %q: keys are the manager's flag names (run with -help); remove it or fix its spelling", path, k))
		default:
			s, err := scalar(v)
			if err != nil {
				errs = append(errs, fmt.Errorf("settings file %s: key %s: %w", path, k, err))
				continue
			}
			out[k] = s
		}
	}
	return out, errors.Join(errs...)
}

// scalar renders a YAML scalar as a flag value.
func scalar(v any) (string, error) {
	switch x := v.(type) {
	case string:
		return x, nil
	case bool:
		return fmt.Sprint(x), nil
	case float64:
		// sigs.k8s.io/yaml decodes every number as float64; a setting's
		// number is an integer or a plain decimal.
		return strings.TrimSuffix(strings.TrimRight(fmt.Sprintf("%f", x), "0"), "."), nil
	case nil:
		return "", errors.New("no value; remove the key to keep the default")
	default:
		return "", fmt.Errorf("a %T is not a setting's value: give a string, number or boolean", v)
	}
}

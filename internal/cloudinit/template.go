package cloudinit

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"text/template"
	"text/template/parse"

	yaml "go.yaml.in/yaml/v3"

	"github.com/hyperfleet/hyperfleet/internal/agentconfig"
)

// Field paths of the user's templates, used in every error about them.
const (
	FieldUserData    = "spec.cloudInit.userData"
	FieldNetworkData = "spec.cloudInit.networkData"
	FieldMetaData    = "spec.cloudInit.metaData"
)

// Limits that keep a tenant's template from exhausting the operator, which
// renders it in its own process.
const (
	// maxRangeDepth bounds nested {{ range }} blocks; ranges may only walk
	// the variables' lists, which are short.
	maxRangeDepth = 3
	// maxOutput bounds a rendered template, plus three times the size of
	// BootstrapServiceBinary (room for its base64 form).
	maxOutput = 4 << 20
	// maxIndent bounds the indent function's width.
	maxIndent = 64
	// maxFormatWidth bounds widths and precisions in printf formats.
	maxFormatWidth = 256
)

// Error is a problem with one of the user's templates or with what it
// rendered: something the template's author must fix. Errors from Render
// that are not an *Error come from Vars (the operator's side).
type Error struct {
	// Field is the template's field path, such as spec.cloudInit.userData.
	Field string
	// Line is the line in the template source (Rendered false) or in its
	// rendered output (Rendered true); zero when unknown.
	Line     int
	Rendered bool
	// Err says what is wrong and what to do.
	Err error
}

func (e *Error) Error() string {
	switch {
	case e.Line > 0 && e.Rendered:
		return fmt.Sprintf("%s (rendered) line %d: %v", e.Field, e.Line, e.Err)
	case e.Line > 0:
		return fmt.Sprintf("%s line %d: %v", e.Field, e.Line, e.Err)
	default:
		return fmt.Sprintf("%s: %v", e.Field, e.Err)
	}
}

func (e *Error) Unwrap() error { return e.Err }

// explained is a rewritten message that still wraps the original error, so
// errors.As finds a *template.ExecError or a YAML error underneath.
type explained struct {
	msg   string
	cause error
}

func (e *explained) Error() string { return e.msg }
func (e *explained) Unwrap() error { return e.cause }

// funcNames lists the template functions in the order the docs give them.
var funcNames = []string{"toJson", "toYaml", "base64", "quote", "join", "indent", "lower", "upper", "default"}

// compactJSON is v as one line of JSON, with <, > and & as they are (the
// output is YAML, not HTML).
func compactJSON(v any) (string, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return "", err
	}
	return strings.TrimSuffix(buf.String(), "\n"), nil
}

func templateFuncs() template.FuncMap {
	return template.FuncMap{
		// toJson encodes any value as compact JSON (strings quoted, lists
		// as arrays); JSON is also valid YAML flow syntax.
		"toJson": compactJSON,
		// toYaml encodes a value as block YAML without a final newline;
		// combine with indent to nest it.
		"toYaml": func(v any) (string, error) {
			if l, ok := v.(List); ok {
				v = []string(l)
			}
			var buf bytes.Buffer
			enc := yaml.NewEncoder(&buf)
			enc.SetIndent(2)
			if err := enc.Encode(v); err != nil {
				return "", err
			}
			if err := enc.Close(); err != nil {
				return "", err
			}
			return strings.TrimSuffix(buf.String(), "\n"), nil
		},
		// base64 encodes a string or Bytes in standard base64.
		"base64": func(v any) (string, error) {
			switch x := v.(type) {
			case string:
				return base64.StdEncoding.EncodeToString([]byte(x)), nil
			case Bytes:
				return base64.StdEncoding.EncodeToString(x.b), nil
			case []byte:
				return base64.StdEncoding.EncodeToString(x), nil
			case fmt.Stringer:
				return base64.StdEncoding.EncodeToString([]byte(x.String())), nil
			default:
				return "", fmt.Errorf("base64 takes a string or bytes, not %T", v)
			}
		},
		// quote gives a double-quoted string valid in both YAML and JSON.
		"quote": func(v any) (string, error) { return compactJSON(fmt.Sprint(v)) },
		// join joins a list with a separator: {{ join .Labels "," }}.
		"join": func(l []string, sep string) string { return strings.Join(l, sep) },
		// indent prefixes every line of s with n spaces.
		"indent": func(n int, s string) (string, error) {
			if n < 0 || n > maxIndent {
				return "", fmt.Errorf("indent takes 0 to %d spaces, not %d", maxIndent, n)
			}
			pad := strings.Repeat(" ", n)
			return pad + strings.ReplaceAll(s, "\n", "\n"+pad), nil
		},
		"lower": strings.ToLower,
		"upper": strings.ToUpper,
		// default gives def when v is empty: {{ default "x64" .RunnerConfig.Arch }}.
		"default": func(def string, v any) string {
			s := fmt.Sprint(v)
			if v == nil || s == "" {
				return def
			}
			return s
		},
		// printf replaces text/template's builtin to bound widths.
		"printf": safeSprintf,
	}
}

var formatWidthRE = regexp.MustCompile(`%[-+# 0]*(\*|[0-9]+)?(\.(\*|[0-9]+))?`)

func safeSprintf(format string, args ...any) (string, error) {
	for _, m := range formatWidthRE.FindAllStringSubmatch(format, -1) {
		for _, w := range []string{m[1], m[3]} {
			if w == "*" {
				return "", errors.New("printf: '*' widths are not allowed")
			}
			if w != "" {
				if n, err := strconv.Atoi(w); err != nil || n > maxFormatWidth {
					return "", fmt.Errorf("printf: widths and precisions above %d are not allowed", maxFormatWidth)
				}
			}
		}
	}
	return fmt.Sprintf(format, args...), nil
}

var (
	execErrRE   = regexp.MustCompile(`^template: [^:]+:(\d+)(?::\d+)?: (?:executing "[^"]*" at <([^>]*)>: )?(.*)$`)
	noFieldRE   = regexp.MustCompile(`can't evaluate field (\w+) in type (\S+)`)
	noFuncRE    = regexp.MustCompile(`function "([^"]+)" not defined`)
	mapNoKeyRE  = regexp.MustCompile(`map has no entry for key "([^"]*)"`)
	varFieldSet = func() map[string]bool {
		m := map[string]bool{}
		t := reflect.TypeFor[Vars]()
		for i := range t.NumField() {
			if t.Field(i).IsExported() {
				m[t.Field(i).Name] = true
			}
		}
		return m
	}()
)

// variableNames lists Vars' exported fields, for error messages.
func variableNames() string {
	names := make([]string, 0, len(varFieldSet))
	for n := range varFieldSet {
		names = append(names, "."+n)
	}
	slices.Sort(names)
	return strings.Join(names, ", ")
}

// didYouMean suggests the name that differs from got only in case.
func didYouMean(got string, names []string, prefix string) string {
	for _, n := range names {
		if strings.EqualFold(n, got) {
			return fmt.Sprintf(" did you mean %s%s?", prefix, n)
		}
	}
	return ""
}

// explain turns a text/template error into one that names the line and
// says what to do, wrapping the original.
func explain(field string, cause error) *Error {
	msg := cause.Error()
	line := 0
	detail := msg
	if m := execErrRE.FindStringSubmatch(msg); m != nil {
		line, _ = strconv.Atoi(m[1])
		detail = m[3]
		if m[2] != "" {
			detail = fmt.Sprintf("at <%s>: %s", m[2], m[3])
		}
	}
	switch {
	case noFuncRE.MatchString(msg):
		fn := noFuncRE.FindStringSubmatch(msg)[1]
		detail = fmt.Sprintf("unknown function %q;%s the functions are %s and text/template's builtins (see docs/cloud-init.md)", fn, didYouMean(fn, funcNames, ""), strings.Join(funcNames, ", "))
	case noFieldRE.MatchString(msg):
		m := noFieldRE.FindStringSubmatch(msg)
		switch {
		case strings.HasSuffix(m[2], "cloudinit.Vars") && m[1] == "JoinToken":
			detail = "unknown variable .JoinToken: the SPIRE join token is never rendered into cloud-init, whose seed can be read off the hypervisor's storage; HyperFleet's agent receives it in the running VM (docs/identity.md). Remove it from the template"
		case strings.HasSuffix(m[2], "cloudinit.Vars") && (m[1] == "JITConfig" || m[1] == "RunnerToken"):
			detail = fmt.Sprintf("unknown variable .%s: the runner credential is never rendered into cloud-init, whose seed can be read off the hypervisor's storage and used before the VM runs; the operator places it in the running VM, where HyperFleet's agent receives it (docs/security.md, \"Nothing replayable at rest\"). Remove it from the template; to run the runner yourself, read it from %s in the VM", m[1], agentconfig.SecretsFile)
		case strings.HasSuffix(m[2], "cloudinit.Vars"):
			detail = fmt.Sprintf("unknown variable .%s;%s the variables are %s (see docs/cloud-init.md)", m[1], didYouMean(m[1], slices.Collect(maps.Keys(varFieldSet)), "."), variableNames())
		case strings.HasSuffix(m[2], "cloudinit.RunnerConfig"):
			detail = fmt.Sprintf("unknown variable .RunnerConfig.%s; RunnerConfig has .DownloadURL, .DownloadSHA256, .InstallPath, .WorkDir, .ConfigScript, .RunScript, .OS, .Arch", m[1])
		default:
			detail = fmt.Sprintf("%s has no field %s; inside range or with, reach the variables through $, as in $.%s", m[2], m[1], m[1])
		}
	case strings.Contains(detail, "started at "+field+":"):
		detail = strings.ReplaceAll(detail, "started at "+field+":", "started at line ")
	case mapNoKeyRE.MatchString(msg):
		detail = fmt.Sprintf("no key %q; check the spelling", mapNoKeyRE.FindStringSubmatch(msg)[1])
	}
	return &Error{Field: field, Line: line, Err: &explained{msg: detail, cause: cause}}
}

// limitedBuffer fails writes beyond max, which stops template execution.
type limitedBuffer struct {
	bytes.Buffer
	max int
}

var errOutputTooLarge = errors.New("output too large")

func (b *limitedBuffer) Write(p []byte) (int, error) {
	if b.Len()+len(p) > b.max {
		return 0, errOutputTooLarge
	}
	return b.Buffer.Write(p)
}

// execute parses and runs one of the user's templates over v.
func execute(field, text string, v Vars) ([]byte, error) {
	t, err := template.New(field).Option("missingkey=error").Funcs(templateFuncs()).Parse(text)
	if err != nil {
		return nil, explain(field, err)
	}
	if err := checkTree(field, t); err != nil {
		return nil, err
	}
	out := &limitedBuffer{max: maxOutput + 3*v.BootstrapServiceBinary.Len()}
	if err := t.Execute(out, v); err != nil {
		if errors.Is(err, errOutputTooLarge) {
			return nil, &Error{Field: field, Err: &explained{msg: fmt.Sprintf("rendered output is larger than %d bytes; simplify the template", out.max), cause: err}}
		}
		return nil, explain(field, err)
	}
	return out.Bytes(), nil
}

// checkTree rejects the template features that could make rendering
// unbounded: template definitions and calls (recursion), and ranges over
// anything but the variables' own lists, nested deeper than maxRangeDepth.
func checkTree(field string, t *template.Template) error {
	for _, tt := range t.Templates() {
		if tt.Name() != field {
			return &Error{Field: field, Err: fmt.Errorf("{{ define }} and {{ block }} are not supported (found %q); write the text out", tt.Name())}
		}
	}
	var walk func(n parse.Node, depth int) error
	lineOf := func(n parse.Node) int { return lineAt(t, n) }
	walk = func(n parse.Node, depth int) error {
		switch x := n.(type) {
		case *parse.ListNode:
			if x == nil {
				return nil
			}
			for _, c := range x.Nodes {
				if err := walk(c, depth); err != nil {
					return err
				}
			}
		case *parse.TemplateNode:
			return &Error{Field: field, Line: lineOf(x), Err: fmt.Errorf("{{ template %q }} is not supported; write the text out", x.Name)}
		case *parse.IfNode:
			return walkBranch(walk, &x.BranchNode, depth)
		case *parse.WithNode:
			return walkBranch(walk, &x.BranchNode, depth)
		case *parse.RangeNode:
			if depth+1 > maxRangeDepth {
				return &Error{Field: field, Line: lineOf(x), Err: fmt.Errorf("ranges are nested more than %d deep", maxRangeDepth)}
			}
			if !rangesOverVariable(x.Pipe) {
				return &Error{Field: field, Line: lineOf(x), Err: errors.New("range may only walk a variable's list, such as {{ range .Labels }} or {{ range $.DNSServers }}")}
			}
			return walkBranch(walk, &x.BranchNode, depth+1)
		}
		return nil
	}
	return walk(t.Root, 0)
}

func walkBranch(walk func(parse.Node, int) error, b *parse.BranchNode, depth int) error {
	if err := walk(b.List, depth); err != nil {
		return err
	}
	if b.ElseList != nil {
		return walk(b.ElseList, depth)
	}
	return nil
}

// lineAt is the 1-based line of n in t's source, or 0.
func lineAt(t *template.Template, n parse.Node) int {
	loc, _ := t.ErrorContext(n) // "name:line:col"
	parts := strings.Split(loc, ":")
	if len(parts) >= 3 {
		if l, err := strconv.Atoi(parts[len(parts)-2]); err == nil {
			return l
		}
	}
	return 0
}

// rangesOverVariable accepts pipelines of one command that is .Field... or
// $.Field... .
func rangesOverVariable(p *parse.PipeNode) bool {
	if p == nil || len(p.Cmds) != 1 || len(p.Cmds[0].Args) != 1 {
		return false
	}
	switch a := p.Cmds[0].Args[0].(type) {
	case *parse.FieldNode:
		return len(a.Ident) >= 1 && varFieldSet[a.Ident[0]]
	case *parse.VariableNode:
		return len(a.Ident) >= 2 && a.Ident[0] == "$" && varFieldSet[a.Ident[1]]
	}
	return false
}

package gitlabsim

import (
	"bytes"
	"encoding/json"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"
)

// gitlab-runner's own source, read at test time: its module cannot be
// built here (several of its dependencies cannot be fetched), but the Go
// module proxy serves the module's source, which go/parser reads without
// building anything. The version is pinned so that the comparison only
// changes when someone moves it; the download lands in the module cache,
// so later runs need no network.
const (
	gitlabRunnerModule = "gitlab.com/gitlab-org/gitlab-runner"
	// gitlabRunnerVersion is the proxy's pseudo-version of gitlab-runner's
	// main branch at commit fc1f1862bd91 (2026-09-03): the module's path
	// has no /v18 suffix, so its release tags are not module versions and
	// the proxy resolves only commits.
	gitlabRunnerVersion = "v1.11.1-0.20260903214710-fc1f1862bd91"
)

// runnerTypePairs pairs each mirror type of runnerapi_test.go with the
// gitlab-runner type it stands for ("package.Type"). leftOut lists the
// runner's JSON fields the mirror deliberately does not carry, with why;
// every other field must be mirrored with the same JSON name, omitempty
// and Go kind.
var runnerTypePairs = []struct {
	mirror  reflect.Type
	runner  string
	leftOut map[string]string
}{
	{mirror: reflect.TypeFor[glrVerifyRunnerRequest](), runner: "common.VerifyRunnerRequest"},
	{mirror: reflect.TypeFor[glrVerifyRunnerResponse](), runner: "common.VerifyRunnerResponse"},
	{mirror: reflect.TypeFor[glrUnregisterRunnerManagerRequest](), runner: "common.UnregisterRunnerManagerRequest"},
	{mirror: reflect.TypeFor[glrInfo](), runner: "common.Info", leftOut: map[string]string{
		"features": "what the runner supports (GitLab picks job payload parts by it); the simulator sends every job the same payload",
		"config":   "the runner's GPU configuration; the simulator reads none of it",
		"labels":   "the runner's labels for job routing; the simulator routes by tags only",
	}},
	{mirror: reflect.TypeFor[glrJobRequest](), runner: "common.JobRequest", leftOut: map[string]string{
		"session": "the runner's interactive web terminal session, which the simulator does not model",
	}},
	{mirror: reflect.TypeFor[glrJob](), runner: "spec.Job"},
	{mirror: reflect.TypeFor[glrJobInfo](), runner: "spec.JobInfo"},
	{mirror: reflect.TypeFor[glrGitInfo](), runner: "spec.GitInfo"},
	{mirror: reflect.TypeFor[glrVariable](), runner: "spec.Variable"},
	{mirror: reflect.TypeFor[glrStep](), runner: "spec.Step"},
	{mirror: reflect.TypeFor[glrFeatures](), runner: "spec.GitlabFeatures"},
	{mirror: reflect.TypeFor[glrCredentials](), runner: "spec.Credentials"},
	{mirror: reflect.TypeFor[glrJobTraceOutput](), runner: "common.JobTraceOutput"},
	{mirror: reflect.TypeFor[glrUpdateJobRequest](), runner: "common.UpdateJobRequest"},
}

// TestMirrorMatchesGitLabRunnerSource downloads gitlab-runner's source at
// the pinned version, parses the packages that define the runner API's
// types (common and common/spec) and compares every mirror type of
// runnerapi_test.go with its counterpart, field by field: JSON name,
// omitempty and Go kind (string, bool, integer, float, slice, map,
// struct, pointer, time). A download that fails fails the test: without
// the source there is nothing to compare.
func TestMirrorMatchesGitLabRunnerSource(t *testing.T) {
	dir := downloadModule(t, gitlabRunnerModule, gitlabRunnerVersion)
	src := &runnerSource{module: gitlabRunnerModule, types: map[string]*runnerType{}}
	for _, pkg := range []string{"common", "common/spec"} {
		if err := src.parseDir(filepath.Join(dir, filepath.FromSlash(pkg)), pkg); err != nil {
			t.Fatalf("gitlab-runner %s: %v", gitlabRunnerVersion, err)
		}
	}
	paired := map[reflect.Type]string{}
	for _, p := range runnerTypePairs {
		paired[p.mirror] = p.runner
	}
	for _, p := range runnerTypePairs {
		rt := src.types[p.runner]
		if rt == nil {
			t.Errorf("%s: gitlab-runner %s defines no %s in common or common/spec; find where the type went and update runnerTypePairs", p.mirror.Name(), gitlabRunnerVersion, p.runner)
			continue
		}
		n := src.compare(t, p.mirror.Name(), p.mirror, rt, p.leftOut, paired)
		t.Logf("%-34s %-37s %2d JSON fields compared, %d left out", p.mirror.Name(), p.runner, n, len(p.leftOut))
	}
}

// downloadModule runs `go mod download -json module@version` outside any
// module (so that this project's go.mod and go.sum are not touched) and
// returns the module's directory in the module cache.
func downloadModule(t *testing.T, module, version string) string {
	t.Helper()
	// go test puts its own toolchain's go command first on PATH.
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the go command is needed to download %s@%s: %v", module, version, err)
	}
	var stdout, stderr bytes.Buffer
	cmd := exec.Command(goTool, "mod", "download", "-json", module+"@"+version)
	cmd.Dir = t.TempDir()
	cmd.Env = append(os.Environ(), "GOWORK=off", "GO111MODULE=on")
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	runErr := cmd.Run()
	var info struct{ Dir, Error string }
	if err := json.Unmarshal(stdout.Bytes(), &info); err != nil || runErr != nil || info.Error != "" || info.Dir == "" {
		t.Fatalf("go mod download %s@%s failed (the module proxy must serve it; GOPROXY=%q): %v %s\n%s%s",
			module, version, os.Getenv("GOPROXY"), runErr, info.Error, stdout.String(), stderr.String())
	}
	return info.Dir
}

// runnerType is a type declaration of gitlab-runner's source.
type runnerType struct {
	pkg     string // "common" or "spec"
	name    string
	expr    ast.Expr
	imports map[string]string // the declaring file's import names -> paths
}

type runnerSource struct {
	module string
	types  map[string]*runnerType // "pkg.Name"
}

// parseDir reads the type declarations of a package directory (tests
// left out).
func (s *runnerSource) parseDir(dir, pkgPath string) error {
	files, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil {
		return err
	}
	if len(files) == 0 {
		return fmt.Errorf("no Go files in %s", pkgPath)
	}
	pkg := pkgPath[strings.LastIndex(pkgPath, "/")+1:]
	fset := token.NewFileSet()
	for _, file := range files {
		if strings.HasSuffix(file, "_test.go") {
			continue
		}
		af, err := parser.ParseFile(fset, file, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		imports := map[string]string{}
		for _, im := range af.Imports {
			path, _ := strconv.Unquote(im.Path.Value)
			elems := strings.Split(path, "/")
			name := elems[len(elems)-1]
			// A major-version suffix (schema/v1) is not the package's name.
			if len(elems) > 1 && len(name) > 1 && name[0] == 'v' && strings.Trim(name[1:], "0123456789") == "" {
				name = elems[len(elems)-2]
			}
			if im.Name != nil {
				name = im.Name.Name
			}
			imports[name] = path
		}
		for _, decl := range af.Decls {
			gd, ok := decl.(*ast.GenDecl)
			if !ok || gd.Tok != token.TYPE {
				continue
			}
			for _, spec := range gd.Specs {
				ts := spec.(*ast.TypeSpec)
				key := pkg + "." + ts.Name.Name
				// The first declaration wins: a type declared twice is one
				// of a file per operating system, none of which the
				// runner API's types are.
				if _, dup := s.types[key]; !dup {
					s.types[key] = &runnerType{pkg: pkg, name: ts.Name.Name, expr: ts.Type, imports: imports}
				}
			}
		}
	}
	return nil
}

// lookup resolves a type name used in a file of pkg.
func (s *runnerSource) lookup(from *runnerType, expr ast.Expr) (*runnerType, string) {
	switch e := expr.(type) {
	case *ast.Ident:
		return s.types[from.pkg+"."+e.Name], from.pkg + "." + e.Name
	case *ast.SelectorExpr:
		x, ok := e.X.(*ast.Ident)
		if !ok {
			return nil, "?"
		}
		path := from.imports[x.Name]
		qualified := path + "." + e.Sel.Name
		switch path {
		case s.module + "/common":
			return s.types["common."+e.Sel.Name], qualified
		case s.module + "/common/spec":
			return s.types["spec."+e.Sel.Name], qualified
		}
		return nil, qualified
	}
	return nil, "?"
}

var basicKinds = map[string]string{
	"string": "string", "bool": "bool", "byte": "integer", "rune": "integer",
	"int": "integer", "int8": "integer", "int16": "integer", "int32": "integer", "int64": "integer",
	"uint": "integer", "uint8": "integer", "uint16": "integer", "uint32": "integer", "uint64": "integer",
	"float32": "float", "float64": "float", "any": "interface", "error": "interface",
}

// kind names the Go kind of a type expression of from's file: a basic
// kind, "slice of K", "pointer to K", "map", "struct", "time" for
// time.Time, or "external pkg.Type" for a type of another module.
func (s *runnerSource) kind(from *runnerType, expr ast.Expr, depth int) string {
	if depth > 20 {
		return "recursive"
	}
	switch e := expr.(type) {
	case *ast.Ident:
		if k, ok := basicKinds[e.Name]; ok {
			return k
		}
	case *ast.SelectorExpr:
		if x, ok := e.X.(*ast.Ident); ok && from.imports[x.Name] == "time" && e.Sel.Name == "Time" {
			return "time"
		}
		if x, ok := e.X.(*ast.Ident); ok && from.imports[x.Name] == "encoding/json" && e.Sel.Name == "RawMessage" {
			return "slice of integer"
		}
	case *ast.StarExpr:
		return "pointer to " + s.kind(from, e.X, depth+1)
	case *ast.ArrayType:
		return "slice of " + s.kind(from, e.Elt, depth+1)
	case *ast.MapType:
		return "map"
	case *ast.StructType:
		return "struct"
	case *ast.InterfaceType:
		return "interface"
	case *ast.FuncType:
		return "func"
	default:
		return fmt.Sprintf("%T", expr)
	}
	named, qualified := s.lookup(from, expr)
	if named == nil {
		return "external " + qualified
	}
	return s.kind(named, named.expr, depth+1)
}

// named is the gitlab-runner type a field's type names, through pointers
// and slices (nil for an unnamed or foreign type).
func (s *runnerSource) named(from *runnerType, expr ast.Expr) *runnerType {
	for {
		switch e := expr.(type) {
		case *ast.StarExpr:
			expr = e.X
			continue
		case *ast.ArrayType:
			expr = e.Elt
			continue
		}
		rt, _ := s.lookup(from, expr)
		if rt == nil {
			return nil
		}
		// A named slice (Steps []Step) names its element's type.
		if _, ok := rt.expr.(*ast.ArrayType); ok {
			from, expr = rt, rt.expr
			continue
		}
		return rt
	}
}

// runnerField is a JSON field of a gitlab-runner struct.
type runnerField struct {
	kind      string
	omitempty bool
	named     *runnerType // the struct type it holds, if any
	anonymous *runnerType // its own struct type, when unnamed
}

// fields lists a gitlab-runner struct's JSON fields as encoding/json
// marshals them: exported fields by their json tag's name (the Go name
// without one), "-" left out, embedded structs' fields promoted.
func (s *runnerSource) fields(rt *runnerType, depth int) (map[string]runnerField, error) {
	st, ok := rt.expr.(*ast.StructType)
	if !ok {
		named, _ := s.lookup(rt, rt.expr)
		if named == nil || depth > 10 {
			return nil, fmt.Errorf("%s.%s is not a struct", rt.pkg, rt.name)
		}
		return s.fields(named, depth+1)
	}
	out := map[string]runnerField{}
	for _, fld := range st.Fields.List {
		tag := ""
		if fld.Tag != nil {
			raw, _ := strconv.Unquote(fld.Tag.Value)
			tag = reflect.StructTag(raw).Get("json")
		}
		name, opts, _ := strings.Cut(tag, ",")
		if name == "-" && opts == "" {
			continue
		}
		if len(fld.Names) == 0 && name == "" {
			// An embedded struct: encoding/json promotes its fields.
			if embedded := s.named(rt, fld.Type); embedded != nil {
				promoted, err := s.fields(embedded, depth+1)
				if err != nil {
					return nil, err
				}
				for k, v := range promoted {
					out[k] = v
				}
			}
			continue
		}
		f := runnerField{kind: s.kind(rt, fld.Type, 0), omitempty: slices.Contains(strings.Split(opts, ","), "omitempty")}
		if f.named = s.named(rt, fld.Type); f.named != nil && s.kindOf(f.named) != "struct" {
			f.named = nil
		}
		if _, ok := fld.Type.(*ast.StructType); ok {
			f.anonymous = &runnerType{pkg: rt.pkg, name: rt.name + "." + name, expr: fld.Type, imports: rt.imports}
		}
		if len(fld.Names) == 0 {
			// An embedded type with a json name is a field of that name.
			out[name] = f
			continue
		}
		for _, n := range fld.Names {
			if !ast.IsExported(n.Name) {
				continue
			}
			key := name
			if key == "" {
				key = n.Name
			}
			out[key] = f
		}
	}
	return out, nil
}

func (s *runnerSource) kindOf(rt *runnerType) string { return s.kind(rt, rt.expr, 0) }

// mirrorKind names a mirror field's Go kind as kind does for the
// runner's; json.RawMessage is "raw": the mirror keeps such a field
// undecoded on purpose (the simulator does not model its content), and it
// stands for any kind.
func mirrorKind(t reflect.Type) string {
	switch {
	case t == reflect.TypeFor[json.RawMessage]():
		return "raw"
	case t == reflect.TypeFor[time.Time]():
		return "time"
	}
	switch t.Kind() {
	case reflect.String:
		return "string"
	case reflect.Bool:
		return "bool"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "integer"
	case reflect.Float32, reflect.Float64:
		return "float"
	case reflect.Slice, reflect.Array:
		return "slice of " + mirrorKind(t.Elem())
	case reflect.Pointer:
		return "pointer to " + mirrorKind(t.Elem())
	case reflect.Map:
		return "map"
	case reflect.Struct:
		return "struct"
	case reflect.Interface:
		return "interface"
	}
	return t.Kind().String()
}

// structOf is the struct type a mirror field holds, through pointers and
// slices.
func structOf(t reflect.Type) reflect.Type {
	for t.Kind() == reflect.Pointer || t.Kind() == reflect.Slice {
		t = t.Elem()
	}
	if t.Kind() == reflect.Struct && t != reflect.TypeFor[time.Time]() {
		return t
	}
	return nil
}

// compare checks a mirror struct against gitlab-runner's, field by field,
// and returns how many fields it compared.
func (s *runnerSource) compare(t *testing.T, where string, mirror reflect.Type, rt *runnerType, leftOut map[string]string, paired map[reflect.Type]string) int {
	t.Helper()
	runner := rt.pkg + "." + rt.name
	theirs, err := s.fields(rt, 0)
	if err != nil {
		t.Errorf("%s: %v", where, err)
		return 0
	}
	compared := 0
	seen := map[string]bool{}
	for i := range mirror.NumField() {
		mf := mirror.Field(i)
		name, opts, _ := strings.Cut(mf.Tag.Get("json"), ",")
		if name == "" || name == "-" {
			continue
		}
		seen[name] = true
		compared++
		rf, ok := theirs[name]
		if !ok {
			t.Errorf("%s.%s: the mirror has JSON field %q, which gitlab-runner %s's %s does not; remove it from the mirror", where, mf.Name, name, gitlabRunnerVersion, runner)
			continue
		}
		if _, deliberately := leftOut[name]; deliberately {
			t.Errorf("%s: %q is both mirrored and listed in leftOut for %s; drop one", where, name, runner)
		}
		mk := mirrorKind(mf.Type)
		if mk != "raw" && mk != rf.kind {
			t.Errorf("%s.%s (json %q): mirror is %s, gitlab-runner %s's %s has %s; make the mirror's type match", where, mf.Name, name, mk, gitlabRunnerVersion, runner, rf.kind)
		}
		if mOmit := slices.Contains(strings.Split(opts, ","), "omitempty"); mOmit != rf.omitempty {
			t.Errorf("%s.%s (json %q): mirror omitempty=%v, gitlab-runner %s's %s has omitempty=%v; make the mirror's tag match", where, mf.Name, name, mOmit, gitlabRunnerVersion, runner, rf.omitempty)
		}
		if mk == "raw" {
			continue
		}
		ms := structOf(mf.Type)
		switch {
		case ms == nil:
		case ms.Name() == "" && rf.anonymous != nil:
			compared += s.compare(t, where+"."+mf.Name, ms, rf.anonymous, nil, paired)
		case ms.Name() == "" && rf.named != nil:
			compared += s.compare(t, where+"."+mf.Name, ms, rf.named, nil, paired)
		case rf.named != nil:
			want := rf.named.pkg + "." + rf.named.name
			if paired[ms] != want {
				t.Errorf("%s.%s (json %q): the mirror's %s stands for %q in runnerTypePairs, but gitlab-runner's field holds %s; pair them", where, mf.Name, name, ms.Name(), paired[ms], want)
			}
		}
	}
	var missing []string
	for name, rf := range theirs {
		if !seen[name] && leftOut[name] == "" {
			missing = append(missing, fmt.Sprintf("%q (%s)", name, rf.kind))
		}
	}
	sort.Strings(missing)
	for _, m := range missing {
		t.Errorf("%s: gitlab-runner %s's %s has JSON field %s, which the mirror lacks; add it to the mirror (and to the simulator's answer if the runner reads it) or list it in leftOut with the reason", where, gitlabRunnerVersion, runner, m)
	}
	for name := range leftOut {
		if _, ok := theirs[name]; !ok {
			t.Errorf("%s: leftOut names %q, which gitlab-runner %s's %s no longer has; remove it", where, name, gitlabRunnerVersion, runner)
		}
	}
	return compared
}

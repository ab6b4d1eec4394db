package monitoring

import (
	"bufio"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
)

// The part of docs/troubleshooting.md that has an entry per condition
// reason, each a heading of this level named by the reason, so that its
// anchor is the reason in lower case (#namespacenotallowed).
const (
	reasonSection = "## By condition reason"
	reasonHeading = "#### "
)

// apiDir declares the ConditionReason and EndReason constants.
const apiDir = "api/v1alpha1"

// errorReasonDirs are the packages whose errors carry the reasons that the
// controllers put into conditions (docs/architecture.md, "Classified
// errors"): the classification itself, the hypervisor side and each of its
// implementations, the CI platform side and each of its back-ends, the
// SPIRE Server API client, the controllers and the services they call
// (internal/workloads, vmspec, clusterconfig, the claim services in
// internal/controller/machineclaim), and the DNS registration library and
// its back-ends (internal/dnsreg), whose reasons the DNSReady and
// DNSRegistered conditions carry. The test doubles (pkg/provider/fake,
// providertest) are not the product and are left out.
var errorReasonDirs = []string{"pkg/errclass", "pkg/provider", "pkg/provider/*", "pkg/workload", "pkg/workload/*", "internal/controller", "internal/controller/*", "internal/spire", "internal/workloads", "internal/vmspec", "internal/clusterconfig", "internal/poweroff", "internal/poolclaims", "internal/dnsreg", "internal/dnsreg/*"}

var errorReasonExcluded = []string{"pkg/provider/fake", "pkg/provider/providertest"}

// TestEveryConditionReasonHasAnEntry: someone who reads `Ready=False
// reason=X` in kubectl describe finds X in docs/troubleshooting.md. Every
// ConditionReason constant (by value), every end reason's condition form
// (EndReason.ConditionReason, its fallback included) and every reason the
// code gives a classified error has a heading of its own there, once; and
// every heading of the section names a reason that exists, so that a
// renamed reason does not leave a stale entry behind.
func TestEveryConditionReasonHasAnEntry(t *testing.T) {
	constants, ends := apiReasons(t)
	errs := errorReasons(t)
	if len(constants) < 50 || len(ends) < 10 {
		t.Fatalf("found %d ConditionReason constants and %d end reasons in %s; the parse no longer finds them", len(constants), len(ends), apiDir)
	}
	all := map[string]string{}
	for _, src := range []map[string]string{errs, ends, constants} {
		for reason, where := range src {
			all[reason] = where
		}
	}
	headings := reasonHeadings(t, Path(RunbookPath))
	var missing []string
	for reason, where := range all {
		switch n := headings[reason]; {
		case n == 0:
			missing = append(missing, reason+" ("+where+")")
		case n > 1:
			t.Errorf("%s: reason %s has %d entries; give it one (a second heading gets the anchor #%s-1)", RunbookPath, reason, n, strings.ToLower(reason))
		}
	}
	sort.Strings(missing)
	for _, m := range missing {
		t.Errorf("%s: no entry for condition reason %s: add a heading %q to %q saying where it appears, what it means and what to do", RunbookPath, m, reasonHeading+strings.Fields(m)[0], reasonSection)
	}
	var stale []string
	for h := range headings {
		if _, ok := all[h]; !ok {
			stale = append(stale, h)
		}
	}
	sort.Strings(stale)
	for _, h := range stale {
		t.Errorf("%s: the entry %q names no reason the code sets (renamed or removed?); fix or remove it", RunbookPath, h)
	}
	t.Logf("%d reasons: %d ConditionReason constants, %d end reasons, %d error reasons", len(all), len(constants), len(ends), len(errs))
}

// reasonHeadings counts the entries of the reason section by title.
func reasonHeadings(t *testing.T, path string) map[string]int {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	out := map[string]int{}
	in, found, inFence := false, false, false
	s := bufio.NewScanner(f)
	for s.Scan() {
		line := s.Text()
		if strings.HasPrefix(line, "```") {
			inFence = !inFence
		}
		switch {
		case inFence:
		case line == reasonSection:
			in, found = true, true
		case strings.HasPrefix(line, "## "):
			in = false
		case in && strings.HasPrefix(line, reasonHeading):
			out[strings.TrimSpace(strings.TrimPrefix(line, reasonHeading))]++
		}
	}
	if err := s.Err(); err != nil {
		t.Fatal(err)
	}
	if !found {
		t.Fatalf("%s has no section %q", path, reasonSection)
	}
	return out
}

// goPackage is the parsed non-test files of one directory.
type goPackage struct {
	dir   string
	name  string
	files []*ast.File
}

func parsePackage(t *testing.T, fset *token.FileSet, dir string) goPackage {
	t.Helper()
	entries, err := os.ReadDir(Path(dir))
	if err != nil {
		t.Fatal(err)
	}
	p := goPackage{dir: dir}
	for _, e := range entries {
		name := e.Name()
		if e.IsDir() || !strings.HasSuffix(name, ".go") || strings.HasSuffix(name, "_test.go") {
			continue
		}
		src, err := os.ReadFile(filepath.Join(Path(dir), name))
		if err != nil {
			t.Fatal(err)
		}
		// Named relative to the repository's root, as messages show it.
		f, err := parser.ParseFile(fset, dir+"/"+name, src, 0)
		if err != nil {
			t.Fatal(err)
		}
		p.name = f.Name.Name
		p.files = append(p.files, f)
	}
	if len(p.files) == 0 {
		t.Fatalf("%s holds no Go files", dir)
	}
	return p
}

// stringValue is the value of a string literal, and whether e is one.
func stringValue(e ast.Expr) (string, bool) {
	lit, ok := e.(*ast.BasicLit)
	if !ok || lit.Kind != token.STRING {
		return "", false
	}
	v, err := strconv.Unquote(lit.Value)
	return v, err == nil
}

// typedConstants returns the constants of type typ (by name: their
// values) declared in pkg, with where each is declared. A constant of
// that type whose value is not a string literal fails the test: the parse
// would miss its value.
func typedConstants(t *testing.T, fset *token.FileSet, pkg goPackage, typ string) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, f := range pkg.files {
		for _, d := range f.Decls {
			gd, ok := d.(*ast.GenDecl)
			if !ok || gd.Tok != token.CONST {
				continue
			}
			for _, spec := range gd.Specs {
				vs := spec.(*ast.ValueSpec)
				id, ok := vs.Type.(*ast.Ident)
				if !ok || id.Name != typ {
					continue
				}
				for i, name := range vs.Names {
					if i >= len(vs.Values) {
						t.Errorf("%s: constant %s of type %s has no value of its own", fset.Position(name.Pos()), name.Name, typ)
						continue
					}
					v, ok := stringValue(vs.Values[i])
					if !ok {
						t.Errorf("%s: constant %s of type %s is not a string literal; this test reads values from the source", fset.Position(name.Pos()), name.Name, typ)
						continue
					}
					out[v] = fset.Position(name.Pos()).String()
				}
			}
		}
	}
	return out
}

// apiReasons returns the values of the ConditionReason constants, and the
// condition reasons of the end reasons: each EndReason constant through
// EndReason.ConditionReason (the code itself, so that the mapping is the
// one claims get), and its fallback for a reason this version does not
// know.
func apiReasons(t *testing.T) (constants, ends map[string]string) {
	fset := token.NewFileSet()
	api := parsePackage(t, fset, apiDir)
	constants = typedConstants(t, fset, api, "ConditionReason")
	ends = map[string]string{}
	for v, where := range typedConstants(t, fset, api, "EndReason") {
		ends[string(hfv1.EndReason(v).ConditionReason())] = where + " (end reason " + v + ")"
	}
	ends[string(hfv1.EndReason("").ConditionReason())] = "EndReason.ConditionReason of an unknown end reason"
	return constants, ends
}

// errorReasons returns the reasons the product's code gives its errors,
// found in the source of errorReasonDirs: string literals passed as a
// parameter named reason of a function or method declared there (such as
// errclass.Errorf, errclass.NewSentinel, provider.Errorf), assigned to a
// variable, constant or struct field named reason, or returned by a
// ReasonOf (its fallback); and, for each CI platform back-end (a
// pkg/workload/* type whose Name method returns its name, or whose
// platformbackend.Identity literal names it), the platform's
// name before each reason of a configuration sentinel of pkg/workload
// (workload.Classified) and before the literal the code appends to a
// Name() call (be.Name()+"ScopeMissing").
func errorReasons(t *testing.T) map[string]string {
	fset := token.NewFileSet()
	var pkgs []goPackage
	for _, pattern := range errorReasonDirs {
		dirs, err := filepath.Glob(Path(pattern))
		if err != nil || len(dirs) == 0 {
			t.Fatalf("%s matches no directory (%v)", pattern, err)
		}
		for _, abs := range dirs {
			rel, err := filepath.Rel(Path("."), abs)
			if err != nil {
				t.Fatal(err)
			}
			// testdata holds no Go package (rapid writes its fail files
			// there after a failed property test).
			if fi, err := os.Stat(abs); err != nil || !fi.IsDir() || filepath.Base(abs) == "testdata" || slices.Contains(errorReasonExcluded, filepath.ToSlash(rel)) {
				continue
			}
			pkgs = append(pkgs, parsePackage(t, fset, filepath.ToSlash(rel)))
		}
	}
	s := &reasonScan{fset: fset, funcs: map[string][][]string{}, structs: map[string][]string{}, consts: map[string]map[string]string{}, found: map[string]string{}}
	for _, p := range pkgs {
		s.declarations(p)
	}
	for _, p := range pkgs {
		s.scan(p)
	}
	if len(s.platforms) == 0 {
		t.Fatal("no CI platform back-end found (a Name method returning a string literal, or a platformbackend.Identity with a literal Name, under pkg/workload/*)")
	}
	for _, p := range s.platforms {
		for _, r := range s.platformSentinels {
			s.found[p+r.reason] = r.where + " (with platform " + p + ")"
		}
	}
	// A few reasons each rule above finds today: if one is missing, the
	// code moved away from what the rules read; adapt the rules (or this
	// list, if the reason itself is gone).
	for _, r := range []string{"LockTimeout", "TemplateAmbiguous", "Unauthorized", "RequestRefused", "ProviderError", "InvalidCloudInit",
		"IPPoolNotReady", "RunnerReleaseNotFound", "GitHubCredentialsInvalid", "GitHubUnauthorized", "GitHubScopeMissing"} {
		if _, ok := s.found[r]; !ok {
			t.Errorf("the source scan no longer finds error reason %s: the code no longer sets it (drop it from this list) or a rule of errorReasons no longer matches the code", r)
		}
	}
	return s.found
}

// reasonScan collects reasons from the source of several packages.
type reasonScan struct {
	fset *token.FileSet
	// funcs are the parameter names of the functions ("pkg.Name") and
	// methods (".Name") declared in the scanned packages.
	funcs map[string][][]string
	// structs are the field names of their struct types, for positional
	// composite literals ("pkg.Type").
	structs map[string][]string
	// consts are their string constants, by package directory.
	consts map[string]map[string]string
	// platforms are the CI platform back-ends' names.
	platforms []string
	// platformSentinels are the reasons of pkg/workload's configuration
	// sentinels and the literals appended to a Name() call.
	platformSentinels []platformReason
	found             map[string]string
}

type platformReason struct{ reason, where string }

func fieldNames(fl *ast.FieldList) []string {
	var out []string
	if fl == nil {
		return nil
	}
	for _, f := range fl.List {
		if len(f.Names) == 0 {
			out = append(out, "")
		}
		for _, n := range f.Names {
			out = append(out, n.Name)
		}
	}
	return out
}

// declaresNoRunner reports whether p declares a RunsNoRunner method: a
// workload.NoRunner back-end (generic), which the controllers never ask
// for a Provider, so that none of the platform reasons (be.Name()+
// "ScopeMissing", the classified sentinels) is ever given with its name.
func declaresNoRunner(p goPackage) bool {
	for _, f := range p.files {
		for _, d := range f.Decls {
			if fd, ok := d.(*ast.FuncDecl); ok && fd.Recv != nil && fd.Name.Name == "RunsNoRunner" {
				return true
			}
		}
	}
	return false
}

func isReasonName(name string) bool {
	l := strings.ToLower(name)
	return strings.HasPrefix(l, "reason") || strings.HasSuffix(l, "reason")
}

// declarations records what calls and literals elsewhere refer to.
func (s *reasonScan) declarations(p goPackage) {
	consts := map[string]string{}
	s.consts[p.dir] = consts
	for _, f := range p.files {
		if strings.HasPrefix(p.dir, "pkg/workload/") && !declaresNoRunner(p) {
			s.platforms = append(s.platforms, identityNames(f)...)
		}
		for _, d := range f.Decls {
			switch d := d.(type) {
			case *ast.FuncDecl:
				key := p.name + "." + d.Name.Name
				if d.Recv != nil {
					key = "." + d.Name.Name
					if d.Name.Name == "Name" && strings.HasPrefix(p.dir, "pkg/workload/") && d.Body != nil && len(d.Body.List) == 1 && !declaresNoRunner(p) {
						if ret, ok := d.Body.List[0].(*ast.ReturnStmt); ok && len(ret.Results) == 1 {
							if v, ok := stringValue(ret.Results[0]); ok {
								s.platforms = append(s.platforms, v)
							}
						}
					}
				}
				s.funcs[key] = append(s.funcs[key], fieldNames(d.Type.Params))
			case *ast.GenDecl:
				for _, spec := range d.Specs {
					switch spec := spec.(type) {
					case *ast.TypeSpec:
						if st, ok := spec.Type.(*ast.StructType); ok {
							s.structs[p.name+"."+spec.Name.Name] = fieldNames(st.Fields)
						}
					case *ast.ValueSpec:
						if d.Tok != token.CONST {
							continue
						}
						for i, n := range spec.Names {
							if i < len(spec.Values) {
								if v, ok := stringValue(spec.Values[i]); ok {
									consts[n.Name] = v
								}
							}
						}
					}
				}
			}
		}
	}
}

// identityNames are the platform names of f's platformbackend.Identity
// literals (Name: "GitHub"): a back-end built on platformbackend.Base
// takes its Name from there.
func identityNames(f *ast.File) []string {
	var names []string
	ast.Inspect(f, func(n ast.Node) bool {
		lit, ok := n.(*ast.CompositeLit)
		if !ok {
			return true
		}
		sel, ok := lit.Type.(*ast.SelectorExpr)
		if !ok || sel.Sel.Name != "Identity" {
			return true
		}
		if pkg, ok := sel.X.(*ast.Ident); !ok || imports(f)[pkg.Name] != "platformbackend" {
			return true
		}
		for _, el := range lit.Elts {
			kv, ok := el.(*ast.KeyValueExpr)
			if !ok {
				continue
			}
			if key, ok := kv.Key.(*ast.Ident); ok && key.Name == "Name" {
				if v, ok := stringValue(kv.Value); ok {
					names = append(names, v)
				}
			}
		}
		return true
	})
	return names
}

// imports maps the names a file's imports go by to the imported packages'
// last path element.
func imports(f *ast.File) map[string]string {
	out := map[string]string{}
	for _, imp := range f.Imports {
		path, _ := strconv.Unquote(imp.Path.Value)
		name := path[strings.LastIndex(path, "/")+1:]
		local := name
		if imp.Name != nil {
			local = imp.Name.Name
		}
		out[local] = name
	}
	return out
}

// value resolves e to the reasons it stands for: a string literal, a
// string constant of the package, or a literal appended to a Name() call
// (recorded per platform).
func (s *reasonScan) value(p goPackage, e ast.Expr, where string) []string {
	if v, ok := stringValue(e); ok {
		return []string{v}
	}
	switch e := e.(type) {
	case *ast.Ident:
		if v, ok := s.consts[p.dir][e.Name]; ok {
			return []string{v}
		}
	case *ast.BinaryExpr:
		call, ok := e.X.(*ast.CallExpr)
		if !ok || e.Op != token.ADD {
			return nil
		}
		if sel, ok := call.Fun.(*ast.SelectorExpr); ok && sel.Sel.Name == "Name" {
			if v, ok := stringValue(e.Y); ok {
				s.platformSentinels = append(s.platformSentinels, platformReason{v, where})
			}
		}
	}
	return nil
}

func (s *reasonScan) add(p goPackage, e ast.Expr) {
	where := s.fset.Position(e.Pos()).String()
	for _, v := range s.value(p, e, where) {
		if v != "" {
			s.found[v] = where
		}
	}
}

// scan collects the reasons of one package.
func (s *reasonScan) scan(p goPackage) {
	for _, f := range p.files {
		imp := imports(f)
		ast.Inspect(f, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.CallExpr:
				s.call(p, imp, n)
			case *ast.CompositeLit:
				s.composite(p, imp, n)
			case *ast.AssignStmt:
				if len(n.Lhs) != len(n.Rhs) {
					return true
				}
				for i, l := range n.Lhs {
					if id, ok := l.(*ast.Ident); ok && isReasonName(id.Name) {
						s.add(p, n.Rhs[i])
					}
				}
			case *ast.ValueSpec:
				for i, id := range n.Names {
					if isReasonName(id.Name) && i < len(n.Values) {
						s.add(p, n.Values[i])
					}
				}
			case *ast.FuncDecl:
				if n.Name.Name == "ReasonOf" && n.Body != nil {
					ast.Inspect(n.Body, func(m ast.Node) bool {
						if ret, ok := m.(*ast.ReturnStmt); ok {
							for _, r := range ret.Results {
								s.add(p, r)
							}
						}
						return true
					})
				}
			}
			return true
		})
	}
}

// call collects the literals passed as a parameter named reason, and the
// reasons of pkg/workload's configuration sentinels, which
// workload.Classified prefixes with the platform's name on objects.
func (s *reasonScan) call(p goPackage, imp map[string]string, c *ast.CallExpr) {
	var key, name string
	switch fun := c.Fun.(type) {
	case *ast.Ident:
		key, name = p.name+"."+fun.Name, fun.Name
	case *ast.SelectorExpr:
		name = fun.Sel.Name
		key = "." + name
		if x, ok := fun.X.(*ast.Ident); ok {
			if pkg, ok := imp[x.Name]; ok {
				key = pkg + "." + name
			}
		}
	default:
		return
	}
	for _, params := range s.funcs[key] {
		for i, param := range params {
			if i < len(c.Args) && param == "reason" {
				s.add(p, c.Args[i])
			}
		}
	}
	if name == "NewSentinel" && p.dir == "pkg/workload" && len(c.Args) == 3 {
		if sel, ok := c.Args[1].(*ast.SelectorExpr); ok && sel.Sel.Name == "ClassConfiguration" {
			where := s.fset.Position(c.Pos()).String()
			for _, v := range s.value(p, c.Args[2], where) {
				s.platformSentinels = append(s.platformSentinels, platformReason{v, where})
			}
		}
	}
}

// composite collects the reason fields of struct literals: keyed
// (Reason: "X") or positional, by the struct's declared field names.
func (s *reasonScan) composite(p goPackage, imp map[string]string, c *ast.CompositeLit) {
	var fields []string
	switch typ := c.Type.(type) {
	case *ast.Ident:
		fields = s.structs[p.name+"."+typ.Name]
	case *ast.SelectorExpr:
		if x, ok := typ.X.(*ast.Ident); ok {
			fields = s.structs[imp[x.Name]+"."+typ.Sel.Name]
		}
	}
	for i, e := range c.Elts {
		if kv, ok := e.(*ast.KeyValueExpr); ok {
			if k, ok := kv.Key.(*ast.Ident); ok && isReasonName(k.Name) {
				s.add(p, kv.Value)
			}
			continue
		}
		if i < len(fields) && isReasonName(fields[i]) {
			s.add(p, e)
		}
	}
}

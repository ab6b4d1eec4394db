// Command pkg-docs writes the package table of docs/architecture.md from the
// packages themselves: each row is a package's import path, the first
// paragraph of its doc comment ("// Package x ..." or "// Command x ...")
// and the project packages it imports, so that the map cannot drift from the
// code (`make docs` runs it; `make verify` fails when the table is out of
// date). A package without a doc comment is an error, so that no package
// goes without a row that says what it is.
//
// The table has two parts. The product is what the operator and the agent
// binaries link (go list -deps ./cmd/hyperfleet ./cmd/hyperfleet-agent);
// the test world is every other package: the simulators, the local world,
// the test doubles, the suites and the commands that run them
// (docs/architecture.md, "Packages").
// Packages are listed with the build tags of every test suite, so that a
// tag-gated suite (test/e2e, test/guest, ...) has a row too; a package with
// test files only is described by their doc comment and imports.
//
// The table replaces the lines between "<!-- packages:begin -->" and
// "<!-- packages:end -->" of the page.
package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"go/doc/comment"
	"go/parser"
	"go/token"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strings"

	"github.com/hyperfleet/hyperfleet/hack/internal/markers"
)

const (
	beginMarker = "<!-- packages:begin -->"
	endMarker   = "<!-- packages:end -->"
)

// listedRoots are the directories whose packages get a row; hack/ holds
// build tools, each a command documented by its own doc comment.
var listedRoots = []string{"api/", "cmd/", "internal/", "pkg/", "test/"}

// defaultTags are the build tags of the test suites (test/e2e, test/guest,
// ...), so that every package of the repository is listed.
const defaultTags = "e2e,spire,guest,bench,flood,deploy,release,chaos"

// productCommands are the binaries that ship; what they link is the
// product, everything else in listedRoots the test world.
var productCommands = []string{"./cmd/hyperfleet", "./cmd/hyperfleet-agent"}

// testWorldRoot is where the internal packages of the test world live.
const testWorldRoot = "internal/testworld"

func main() {
	doc := flag.String("doc", "docs/architecture.md", "the page whose package table is rewritten")
	tags := flag.String("tags", defaultTags, "the build tags of every test suite, so that tag-gated packages are listed")
	flag.Parse()
	if err := run(".", *doc, *tags); err != nil {
		fmt.Fprintf(os.Stderr, "pkg-docs: %v\n", err)
		os.Exit(1)
	}
}

func run(root, docPath, tags string) error {
	pkgs, err := loadPackages(root, tags)
	if err != nil {
		return err
	}
	page, err := os.ReadFile(docPath)
	if err != nil {
		return err
	}
	table, err := renderTables(pkgs)
	if err != nil {
		return err
	}
	out, err := markers.Replace(page, beginMarker, endMarker, []byte(table))
	if err != nil {
		return fmt.Errorf("%s: %w", docPath, err)
	}
	return os.WriteFile(docPath, out, 0o644)
}

// pkg is one row of the table.
type pkg struct {
	Path    string   // relative to the module: "internal/ipam"
	Doc     string   // first paragraph of the doc comment, on one line
	Imports []string // the project packages it imports, relative to the module
	Product bool     // linked by a product binary
}

// listedPackage is the part of go list -json this command reads.
type listedPackage struct {
	ImportPath   string
	Dir          string
	Module       *struct{ Path string }
	GoFiles      []string
	TestGoFiles  []string
	XTestGoFiles []string
	Imports      []string
	TestImports  []string
	XTestImports []string
	Error        *struct{ Err string }
}

// loadPackages lists the module's packages with go list and reads their
// doc comments.
func loadPackages(root, tags string) ([]pkg, error) {
	listed, err := goList(root, "-tags", tags, "-json", "./...")
	if err != nil {
		return nil, err
	}
	product, err := goList(root, append([]string{"-deps", "-json"}, productCommands...)...)
	if err != nil {
		return nil, err
	}
	linked := map[string]bool{}
	for _, p := range product {
		linked[p.ImportPath] = true
	}
	var pkgs []pkg
	var problems []error
	for _, lp := range listed {
		if lp.Module == nil {
			continue
		}
		module := lp.Module.Path
		rel := strings.TrimPrefix(lp.ImportPath, module+"/")
		if !slices.ContainsFunc(listedRoots, func(r string) bool { return strings.HasPrefix(rel+"/", r) }) {
			continue
		}
		if lp.Error != nil {
			problems = append(problems, fmt.Errorf("%s: %s", rel, lp.Error.Err))
			continue
		}
		files, imports := lp.GoFiles, lp.Imports
		if len(files) == 0 {
			// A package of tests only: its tests are what it is.
			files = append(slices.Clone(lp.TestGoFiles), lp.XTestGoFiles...)
			imports = append(slices.Clone(lp.TestImports), lp.XTestImports...)
		}
		doc, err := packageDoc(lp.Dir, files)
		if err != nil {
			problems = append(problems, fmt.Errorf("%s: %w", rel, err))
			continue
		}
		pkgs = append(pkgs, pkg{
			Path:    rel,
			Doc:     doc,
			Imports: projectImports(module, lp.ImportPath, imports),
			Product: linked[lp.ImportPath],
		})
	}
	if err := errors.Join(problems...); err != nil {
		return nil, err
	}
	return pkgs, nil
}

func goList(dir string, args ...string) ([]listedPackage, error) {
	var stdout, stderr bytes.Buffer
	cmd := exec.Command("go", append([]string{"list", "-e"}, args...)...)
	cmd.Dir = dir
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("go list %s: %w\n%s", strings.Join(args, " "), err, stderr.String())
	}
	var pkgs []listedPackage
	dec := json.NewDecoder(&stdout)
	for {
		var p listedPackage
		if err := dec.Decode(&p); errors.Is(err, io.EOF) {
			return pkgs, nil
		} else if err != nil {
			return nil, fmt.Errorf("go list %s: %w", strings.Join(args, " "), err)
		}
		pkgs = append(pkgs, p)
	}
}

// packageDoc returns the first paragraph of the package's doc comment, the
// first one found in files (in the order given, non-test files first), on
// one line.
func packageDoc(dir string, files []string) (string, error) {
	fset := token.NewFileSet()
	for _, name := range files {
		f, err := parser.ParseFile(fset, filepath.Join(dir, name), nil, parser.PackageClauseOnly|parser.ParseComments)
		if err != nil {
			return "", err
		}
		if f.Doc == nil {
			continue
		}
		if text := firstParagraph(f.Doc.Text()); text != "" {
			return text, nil
		}
	}
	return "", errors.New(`no doc comment ("// Package x ..." above the package clause of one of its files): write one, its first paragraph is the package's row in docs/architecture.md`)
}

// firstParagraph returns the first paragraph of a doc comment's text on
// one line; one that ends in a colon introduces a list, whose items follow
// it, separated by semicolons. Directives (+kubebuilder:...) are not text.
func firstParagraph(text string) string {
	var lines []string
	for line := range strings.SplitSeq(text, "\n") {
		if !strings.HasPrefix(line, "+") {
			lines = append(lines, line)
		}
	}
	blocks := new(comment.Parser).Parse(strings.Join(lines, "\n")).Content
	if len(blocks) == 0 {
		return ""
	}
	para, ok := blocks[0].(*comment.Paragraph)
	if !ok {
		return ""
	}
	out := inlineText(para.Text)
	if list, ok := nextList(blocks); ok && strings.HasSuffix(out, ":") {
		var items []string
		for _, item := range list.Items {
			var parts []string
			for _, b := range item.Content {
				if p, ok := b.(*comment.Paragraph); ok {
					parts = append(parts, inlineText(p.Text))
				}
			}
			items = append(items, strings.TrimRight(strings.Join(parts, " "), ".;"))
		}
		out += " " + strings.Join(items, "; ") + "."
	}
	return strings.Join(strings.Fields(out), " ")
}

func nextList(blocks []comment.Block) (*comment.List, bool) {
	if len(blocks) < 2 {
		return nil, false
	}
	list, ok := blocks[1].(*comment.List)
	return list, ok
}

// inlineText is the plain text of a paragraph: a link is its text.
func inlineText(text []comment.Text) string {
	var b strings.Builder
	for _, t := range text {
		switch t := t.(type) {
		case comment.Plain:
			b.WriteString(string(t))
		case comment.Italic:
			b.WriteString(string(t))
		case *comment.Link:
			b.WriteString(inlineText(t.Text))
		case *comment.DocLink:
			b.WriteString(inlineText(t.Text))
		}
	}
	return b.String()
}

// projectImports returns the module's packages among imports, relative to
// the module, sorted, without self (an external test imports its package).
func projectImports(module, self string, imports []string) []string {
	var out []string
	for _, imp := range imports {
		if imp == self || !strings.HasPrefix(imp, module+"/") {
			continue
		}
		out = append(out, strings.TrimPrefix(imp, module+"/"))
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// compact writes import paths grouped by their directory:
// internal/a, internal/b and pkg/c become "`internal/{a,b}`, `pkg/c`".
func compact(paths []string) string {
	if len(paths) == 0 {
		return "no project package"
	}
	var groups []string
	byDir := map[string][]string{}
	for _, p := range paths {
		dir, base := path.Split(p)
		if _, ok := byDir[dir]; !ok {
			groups = append(groups, dir)
		}
		byDir[dir] = append(byDir[dir], base)
	}
	var out []string
	for _, dir := range groups {
		bases := byDir[dir]
		if len(bases) == 1 {
			out = append(out, "`"+dir+bases[0]+"`")
			continue
		}
		out = append(out, "`"+dir+"{"+strings.Join(bases, ",")+"}`")
	}
	return strings.Join(out, ", ")
}

// renderTables writes the product's table and the test world's, each
// sorted by path.
func renderTables(pkgs []pkg) (string, error) {
	if len(pkgs) == 0 {
		return "", errors.New("no packages listed")
	}
	pkgs = slices.Clone(pkgs)
	slices.SortFunc(pkgs, func(a, b pkg) int { return strings.Compare(a.Path, b.Path) })
	var b strings.Builder
	b.WriteString("The product (what `cmd/hyperfleet` and `cmd/hyperfleet-agent` link, and the API):\n\n")
	writeTable(&b, pkgs, true)
	b.WriteString("\nThe test world (what no product binary links: simulators, the local world, test doubles, suites; its internal packages under `" + testWorldRoot + "`):\n\n")
	writeTable(&b, pkgs, false)
	return b.String(), nil
}

func writeTable(b *strings.Builder, pkgs []pkg, product bool) {
	b.WriteString("| package | what it is | imports (project packages) |\n|---|---|---|\n")
	for _, p := range pkgs {
		if p.Product != product {
			continue
		}
		fmt.Fprintf(b, "| `%s` | %s | %s |\n", p.Path, escape(p.Doc), compact(p.Imports))
	}
}

func escape(s string) string { return strings.ReplaceAll(s, "|", `\|`) }

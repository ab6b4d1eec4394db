// This test checks the hypervisor seam: a hypervisor kind's fields, ids
// and advice appear only in its own package and the API types, never in
// the shared code that asks the kind (provider.Kind).

package repo

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// kindHomes are where a hypervisor kind may be named: its own package, the
// API types (which hold each kind's section), the binaries (whose main
// registers each kind), the test world and the repository's tools (hack/,
// which include a kind's own generators). Paths are slash-separated, from
// the repository's root.
var kindHomes = []string{"pkg/provider/proxmox/", "pkg/provider/libvirt/", "api/", "cmd/", "test/", "internal/testworld/", "hack/"}

// kindWord is a hypervisor kind's name, in an identifier or a string.
var kindWord = regexp.MustCompile(`(?i)proxmox|libvirt`)

// kindFields are the Go names of fields in a kind's own API section
// (source.proxmox.templateID, spec.proxmox.isoStorage and vmidRange). The
// neutral machine number (a VM's id in its kind's numbering: VMID in
// ownership records, VMIDStart and VMIDEnd in a ClusterConfig) is not
// among them: every kind numbers its machines.
var kindFields = []string{"TemplateID", "DeprecatedTemplateID", "ISOStorage", "DefaultISOStorage", "VMIDRange"}

// kindLeaksKnown are the places in shared code that name a kind's word
// without meaning the kind, each with why: a file and the exact leak
// there (kindLeak.what), allowed once. Any other leak in the same file is
// still reported, and the test fails when a known one is no longer found,
// so the list only shrinks.
var kindLeaksKnown = map[knownLeak]string{
	// A Unix group of the guest (membership is root), not the kind.
	{file: "internal/agent/harden.go", what: `string "libvirt"`}: "the guest's libvirt group",
}

// knownLeak is a leak kindLeaksKnown allows: its file and what it names.
type knownLeak struct{ file, what string }

// kindLeak is one place shared code names a kind.
type kindLeak struct {
	file string
	line int
	what string
}

func (l kindLeak) String() string { return fmt.Sprintf("%s:%d: %s", l.file, l.line, l.what) }

// TestSharedCodeNamesNoHypervisorKind fails when a non-test Go file outside
// kindHomes names a hypervisor kind in its code (comments, which may give
// examples, are not read):
//   - it imports a kind's package (a path holding proxmox or libvirt);
//   - an identifier holds "proxmox" or "libvirt" in any case: a kind's
//     package, its API types (hfv1.ProxmoxSource), its id
//     (hfv1.ProviderProxmox), its sections (.Spec.Proxmox, .Source.Proxmox,
//     .Libvirt) or its cloud-init delivery (CloudInitDeliveryProxmox);
//   - an identifier is a field of a kind's section (kindFields);
//   - a string literal holds "proxmox" or "libvirt" in any case: a message,
//     a piece of advice or a field path of the kind's.
//
// Such code belongs in the kind's package, behind provider.Kind.
func TestSharedCodeNamesNoHypervisorKind(t *testing.T) {
	leaks, err := kindLeaks(repoRoot)
	if err != nil {
		t.Fatal(err)
	}
	found := map[knownLeak][]kindLeak{}
	for _, l := range leaks {
		k := knownLeak{file: l.file, what: l.what}
		found[k] = append(found[k], l)
	}
	for k, ls := range found {
		if _, known := kindLeaksKnown[k]; known && len(ls) == 1 {
			continue
		}
		for _, l := range ls {
			t.Errorf("%s: shared code names a hypervisor kind; move it behind provider.Kind (pkg/provider/<kind>)", l)
		}
	}
	for k, why := range kindLeaksKnown {
		if len(found[k]) == 0 {
			t.Errorf("%s no longer holds %s (%s): remove it from kindLeaksKnown", k.file, k.what, why)
		}
	}
}

// TestKindLeaksFindsEachRule runs the check over testdata/kindseam, a
// shared package that breaks each rule once and mentions kinds in comments
// only elsewhere: each break is found, and nothing else.
func TestKindLeaksFindsEachRule(t *testing.T) {
	leaks, err := kindLeaks(filepath.Join("testdata", "kindseam"))
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, l := range leaks {
		got = append(got, l.String())
	}
	want := []string{
		`leaky.go:6: import "example.com/pkg/provider/proxmox"`,
		`leaky.go:12: identifier proxmox`,
		`leaky.go:12: identifier Proxmox`,
		`leaky.go:13: identifier TemplateID`,
		`leaky.go:14: string "set libvirt's pool"`,
	}
	if !slices.Equal(got, want) {
		t.Fatalf("kindLeaks found\n  %s\nwant\n  %s", strings.Join(got, "\n  "), strings.Join(want, "\n  "))
	}
}

// kindLeaks lists every place below root where shared code names a
// hypervisor kind, by the rules of TestSharedCodeNamesNoHypervisorKind.
func kindLeaks(root string) ([]kindLeak, error) {
	var out []kindLeak
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(root, path)
		if err != nil {
			return err
		}
		rel = filepath.ToSlash(rel)
		if d.IsDir() {
			name := d.Name()
			if rel != "." && (strings.HasPrefix(name, ".") || name == "testdata" || name == "vendor" || home(rel+"/")) {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(rel, ".go") || strings.HasSuffix(rel, "_test.go") {
			return nil
		}
		leaks, err := fileKindLeaks(path, rel)
		out = append(out, leaks...)
		return err
	})
	return out, err
}

func home(dir string) bool {
	return slices.ContainsFunc(kindHomes, func(h string) bool { return strings.HasPrefix(dir, h) })
}

// fileKindLeaks applies the rules to one file; rel names it in the leaks.
func fileKindLeaks(path, rel string) ([]kindLeak, error) {
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
	if err != nil {
		return nil, err
	}
	var out []kindLeak
	add := func(pos token.Pos, what string) {
		out = append(out, kindLeak{file: rel, line: fset.Position(pos).Line, what: what})
	}
	for _, imp := range f.Imports {
		if p, _ := strconv.Unquote(imp.Path.Value); kindWord.MatchString(p) {
			add(imp.Pos(), "import "+imp.Path.Value)
		}
	}
	ast.Inspect(f, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.ImportSpec:
			return false // reported above, with its path
		case *ast.Ident:
			if kindWord.MatchString(n.Name) || slices.Contains(kindFields, n.Name) {
				add(n.Pos(), "identifier "+n.Name)
			}
		case *ast.BasicLit:
			if n.Kind == token.STRING && kindWord.MatchString(n.Value) {
				add(n.Pos(), "string "+n.Value)
			}
		}
		return true
	})
	return out, nil
}

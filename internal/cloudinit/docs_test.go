package cloudinit

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	yaml "go.yaml.in/yaml/v3"
)

// templatesGuide is the template-building guide whose cloud-config examples
// are checked here.
const templatesGuide = "../../docs/templates.md"

// docBlock is a fenced ```yaml block of a Markdown file.
type docBlock struct {
	line int // of the opening fence
	text string
}

// yamlBlocks returns the ```yaml blocks of a Markdown document, with the
// fence's indentation (a block inside a list item) removed.
func yamlBlocks(t *testing.T, doc []byte) []docBlock {
	t.Helper()
	var out []docBlock
	var cur *docBlock
	var indent string
	sc := bufio.NewScanner(bytes.NewReader(doc))
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		trimmed := strings.TrimLeft(line, " ")
		switch {
		case cur == nil && strings.HasPrefix(trimmed, "```yaml"):
			cur, indent = &docBlock{line: n}, line[:len(line)-len(trimmed)]
		case cur != nil && strings.TrimSpace(line) == "```":
			out = append(out, *cur)
			cur = nil
		case cur != nil:
			cur.text += strings.TrimPrefix(line, indent) + "\n"
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if cur != nil {
		t.Fatalf("%s line %d: unterminated ```yaml block", templatesGuide, cur.line)
	}
	return out
}

// TestTemplatesGuideCloudConfigs validates every #cloud-config example in
// docs/templates.md with cloud-init's schema validator, as the rendered
// goldens are, and checks that the guide's excerpt of HyperFleet's agent
// download runs what the operator renders.
func TestTemplatesGuideCloudConfigs(t *testing.T) {
	_, python := cloudInit(t)
	doc, err := os.ReadFile(templatesGuide)
	if err != nil {
		t.Fatal(err)
	}
	rendered, err := Render(Input{Vars: operatorAgentVars(baseVars())})
	if err != nil {
		t.Fatal(err)
	}
	want := parseAgentFetch(t, rendered.UserData).runcmd

	// Every example through cloud-init's schema validator, in one go.
	tmp := t.TempDir()
	var blocks []docBlock
	var schema viewRequest
	for _, b := range yamlBlocks(t, doc) {
		if !strings.HasPrefix(b.text, cloudConfigHeader+"\n") {
			continue
		}
		file := filepath.Join(tmp, fmt.Sprintf("templates.md-line-%d.yaml", b.line))
		if err := os.WriteFile(file, []byte(b.text), 0o600); err != nil {
			t.Fatal(err)
		}
		blocks = append(blocks, b)
		schema.Schema = append(schema.Schema, file)
	}
	schema.ID = templatesGuide
	runView(t, python, []viewRequest{schema})

	var excerpts int
	for _, b := range blocks {
		t.Run(fmt.Sprintf("line-%d", b.line), func(t *testing.T) {
			if !strings.Contains(b.text, FetchAgentPath) {
				return
			}
			excerpts++
			var got struct {
				Runcmd [][]string `yaml:"runcmd"`
			}
			if err := yaml.Unmarshal([]byte(b.text), &got); err != nil {
				t.Fatalf("%s line %d: %v", templatesGuide, b.line, err)
			}
			if len(got.Runcmd) != len(want) {
				t.Fatalf("%s line %d: runcmd has %d entries, HyperFleet renders %d: %q", templatesGuide, b.line, len(got.Runcmd), len(want), want)
			}
			for i := range want {
				g, w := got.Runcmd[i], want[i]
				if i == 0 && len(g) == len(w) {
					// The URL and checksum are examples; the rest is the command.
					g, w = slices.Concat(g[:4], g[6:]), slices.Concat(w[:4], w[6:])
				}
				if !slices.Equal(g, w) {
					t.Errorf("%s line %d: runcmd entry %d is\n%q\nbut HyperFleet renders\n%q", templatesGuide, b.line, i, g, w)
				}
			}
		})
	}
	if len(blocks) < 2 || excerpts != 1 {
		t.Errorf("%s has %d #cloud-config examples (%d with the agent download); the test expects the template preparation and HyperFleet's download excerpt", templatesGuide, len(blocks), excerpts)
	}
}

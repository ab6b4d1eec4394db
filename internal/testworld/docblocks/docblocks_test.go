package docblocks

import (
	"strings"
	"testing"
)

func TestReadKeepsOrderHeadingsAndMarks(t *testing.T) {
	page := "# Install\n\n## 1. The image\n\n```sh\nmake image\n```\n\n" +
		"```yaml\nproxy: {}\n```\n\n" +
		"<!-- docs-test: run-by TestElsewhere -->\n```sh\npveum role add X\n```\n\n" +
		"- In a list:\n\n  ```bash\n  kubectl create namespace ci \\\n    --dry-run=client\n  ```\n"
	blocks, err := Read([]byte(page))
	if err != nil {
		t.Fatal(err)
	}
	if len(blocks) != 3 {
		t.Fatalf("%d blocks, want the 3 command blocks: %+v", len(blocks), blocks)
	}
	if b := blocks[0]; b.Line != 5 || b.Heading != "1. The image" || b.Text != "make image\n" || b.RunBy != "" {
		t.Errorf("first block %+v", b)
	}
	if b := blocks[1]; b.RunBy != "TestElsewhere" || b.Text != "pveum role add X\n" {
		t.Errorf("marked block %+v", b)
	}
	if b := blocks[2]; b.Text != "kubectl create namespace ci \\\n  --dry-run=client\n" {
		t.Errorf("the list's block keeps its own indentation, not the list's: %q", b.Text)
	}
	if got := Unmarked(blocks); len(got) != 2 || got[1].Line != blocks[2].Line {
		t.Errorf("Unmarked = %+v", got)
	}
	if got := RunBy(blocks, "TestElsewhere"); len(got) != 1 || got[0].Line != blocks[1].Line {
		t.Errorf("RunBy = %+v", got)
	}
}

// TestReadRefusesWhatWouldHideABlock: every way a block could silently go
// unrun is an error.
func TestReadRefusesWhatWouldHideABlock(t *testing.T) {
	for _, c := range []struct{ name, page, want string }{
		{"open fence", "```sh\nmake\n", "never closed"},
		{"unknown mark", "<!-- docs-test: skip -->\n```sh\nmake\n```\n", "the only mark"},
		{"mark on prose", "<!-- docs-test: run-by TestX -->\nSome text.\n```sh\nmake\n```\n", "line before a command block"},
		{"mark on yaml", "<!-- docs-test: run-by TestX -->\n```yaml\na: 1\n```\n", "not a command block"},
		{"mark at the end", "text\n<!-- docs-test: run-by TestX -->\n", "end of the page"},
	} {
		if _, err := Read([]byte(c.page)); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want %q", c.name, err, c.want)
		}
	}
}

// Package docblocks reads the shell command blocks of a Markdown page, in
// the page's order, so that a test can run them as a reader would
// (test/deploy, docs_test.go: docs/install.md and the quick starts). A
// block the page's own test does not run where it stands carries a mark on
// the line before its fence naming the test that runs it:
//
//	<!-- docs-test: run-by TestInstallRolesOnProxmoxVE8 -->
//	```sh
//	...
//	```
//
// so that a block added to a page is run by default, and one moved
// elsewhere says where it went.
package docblocks

import (
	"bufio"
	"bytes"
	"fmt"
	"regexp"
	"slices"
	"strings"
)

// Block is one fenced command block.
type Block struct {
	// Line is the line of its opening fence, from 1.
	Line int
	// Heading is the nearest heading above it, without its #s.
	Heading string
	// Text is what is between the fences.
	Text string
	// RunBy is the test its mark names; empty when the page's test runs
	// it in order.
	RunBy string
}

// String names the block for a test's messages.
func (b Block) String() string {
	return fmt.Sprintf("the block at line %d (%q)", b.Line, b.Heading)
}

// shellLangs are the fence languages of command blocks.
var shellLangs = []string{"sh", "bash", "shell", "console"}

var (
	markRE  = regexp.MustCompile(`^<!--\s*docs-test:\s*(.*?)\s*-->$`)
	runByRE = regexp.MustCompile(`^run-by (Test[A-Za-z0-9_]+)$`)
)

// Read returns the page's command blocks in order. A fence left open, a
// mark it cannot read, or a mark not followed by a command block is an
// error: each would let a block go unrun without anyone noticing.
func Read(page []byte) ([]Block, error) {
	var (
		blocks  []Block
		heading string
		mark    string
		markAt  int
		fence   string
		indent  string
		cur     *Block
		text    strings.Builder
	)
	sc := bufio.NewScanner(bytes.NewReader(page))
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		trimmed := strings.TrimSpace(line)
		if fence != "" {
			if strings.HasPrefix(trimmed, fence) && strings.Trim(trimmed, "`~") == "" {
				if cur != nil {
					cur.Text = text.String()
					blocks = append(blocks, *cur)
					cur = nil
				}
				fence = ""
				continue
			}
			if cur != nil {
				text.WriteString(strings.TrimPrefix(line, indent))
				text.WriteByte('\n')
			}
			continue
		}
		if f, lang, ok := openingFence(trimmed); ok {
			fence, indent = f, indentOf(line)
			if slices.Contains(shellLangs, lang) {
				cur = &Block{Line: n, Heading: heading}
				text.Reset()
				if mark != "" {
					m := runByRE.FindStringSubmatch(mark)
					if m == nil {
						return nil, fmt.Errorf("line %d: docs-test mark %q: the only mark is \"run-by TestName\"", markAt, mark)
					}
					cur.RunBy = m[1]
				}
			} else if mark != "" {
				return nil, fmt.Errorf("line %d: a docs-test mark before a %q block, not a command block", markAt, lang)
			}
			mark = ""
			continue
		}
		if m := markRE.FindStringSubmatch(trimmed); m != nil {
			mark, markAt = m[1], n
			continue
		}
		if trimmed == "" {
			continue
		}
		if mark != "" {
			return nil, fmt.Errorf("line %d: a docs-test mark must stand on the line before a command block's fence", markAt)
		}
		if strings.HasPrefix(line, "#") {
			heading = strings.TrimSpace(strings.TrimLeft(line, "#"))
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if fence != "" {
		return nil, fmt.Errorf("a %s fence is never closed", fence)
	}
	if mark != "" {
		return nil, fmt.Errorf("line %d: a docs-test mark at the end of the page", markAt)
	}
	return blocks, nil
}

// openingFence recognises ```lang or ~~~lang.
func openingFence(line string) (fence, lang string, ok bool) {
	for _, c := range []string{"```", "~~~"} {
		if strings.HasPrefix(line, c) {
			n := len(line) - len(strings.TrimLeft(line, c[:1]))
			return line[:n], strings.TrimSpace(line[n:]), true
		}
	}
	return "", "", false
}

func indentOf(line string) string { return line[:len(line)-len(strings.TrimLeft(line, " "))] }

// Unmarked are the blocks the page's own test runs, in order.
func Unmarked(blocks []Block) []Block {
	var out []Block
	for _, b := range blocks {
		if b.RunBy == "" {
			out = append(out, b)
		}
	}
	return out
}

// RunBy are the blocks whose mark names test.
func RunBy(blocks []Block, test string) []Block {
	var out []Block
	for _, b := range blocks {
		if b.RunBy == test {
			out = append(out, b)
		}
	}
	return out
}

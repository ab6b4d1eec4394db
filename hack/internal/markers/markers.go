// Package markers replaces the generated part of a hand-written document:
// what lies between a begin and an end marker, each on a line of its own.
// The generators under hack/ (chart-docs, pkg-docs, proxmox-roles) write
// their tables into Markdown this way, and `make verify` fails when a
// rerun changes the file.
package markers

import (
	"bytes"
	"fmt"
)

// Replace returns page with what lies between the begin marker's line and
// the end marker replaced by block (which should end with a newline). The
// markers stay; a page without both, in order, is an error.
func Replace(page []byte, begin, end string, block []byte) ([]byte, error) {
	b := bytes.Index(page, []byte(begin+"\n"))
	e := bytes.Index(page, []byte(end))
	if b < 0 || e < 0 || e < b {
		return nil, fmt.Errorf("no %q ... %q lines to put the generated text between", begin, end)
	}
	var out bytes.Buffer
	out.Write(page[:b+len(begin)+1])
	out.Write(block)
	out.Write(page[e:])
	return out.Bytes(), nil
}

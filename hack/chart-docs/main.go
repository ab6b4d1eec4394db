// Command chart-docs writes the table of a Helm chart's values into its
// README from the comments in values.yaml, so that the table cannot drift
// from the values (`make docs` runs it; `make verify` fails when the README
// is out of date).
//
// The convention: a comment whose first line starts with "# --" right
// above a key documents that key; the comment lines after it continue the
// description. "# -- (type) text" sets the type shown (otherwise it is the
// default's). A documented map also documents the keys under it that have
// no comment of their own (its default shows them). A value documented
// neither by itself nor by a map above it is an error, so that no value
// goes undocumented.
//
// The table replaces the README's lines between "<!-- values:begin -->"
// and "<!-- values:end -->".
package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"regexp"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/hyperfleet/hyperfleet/hack/internal/markers"
)

const (
	beginMarker = "<!-- values:begin -->"
	endMarker   = "<!-- values:end -->"
	docPrefix   = "# --"
)

func main() {
	valuesPath := flag.String("values", "charts/hyperfleet/values.yaml", "the chart's values file")
	readmePath := flag.String("readme", "charts/hyperfleet/README.md", "the README whose values table is rewritten")
	flag.Parse()
	if err := run(*valuesPath, *readmePath); err != nil {
		fmt.Fprintf(os.Stderr, "chart-docs: %v\n", err)
		os.Exit(1)
	}
}

func run(valuesPath, readmePath string) error {
	values, err := os.ReadFile(valuesPath)
	if err != nil {
		return err
	}
	rows, err := parseValues(values)
	if err != nil {
		return fmt.Errorf("%s: %w", valuesPath, err)
	}
	readme, err := os.ReadFile(readmePath)
	if err != nil {
		return err
	}
	out, err := markers.Replace(readme, beginMarker, endMarker, []byte(renderTable(rows)))
	if err != nil {
		return fmt.Errorf("%s: %w", readmePath, err)
	}
	return os.WriteFile(readmePath, out, 0o644)
}

// A row documents one value.
type row struct {
	key, typ, def, description string
}

// parseValues returns a row per documented value, in the file's order.
func parseValues(values []byte) ([]row, error) {
	var doc yaml.Node
	if err := yaml.Unmarshal(values, &doc); err != nil {
		return nil, err
	}
	if len(doc.Content) == 0 {
		return nil, errors.New("no values")
	}
	if doc.Content[0].Kind != yaml.MappingNode {
		return nil, errors.New("the values are not a map")
	}
	p := &parser{}
	if err := p.mapping(doc.Content[0], "", false); err != nil {
		return nil, err
	}
	if len(p.undocumented) > 0 {
		return nil, fmt.Errorf("%d values have no %q comment (nor a documented map above them): %s",
			len(p.undocumented), docPrefix, strings.Join(p.undocumented, ", "))
	}
	return p.rows, nil
}

type parser struct {
	rows         []row
	undocumented []string
}

// mapping walks a map's keys; covered says a map above documents them.
func (p *parser) mapping(node *yaml.Node, prefix string, covered bool) error {
	for i := 0; i+1 < len(node.Content); i += 2 {
		keyNode, value := node.Content[i], node.Content[i+1]
		key := prefix + keyNode.Value
		typ, description, documented := docComment(keyNode.HeadComment)
		if documented {
			def, err := defaultOf(value)
			if err != nil {
				return fmt.Errorf("%s: %w", key, err)
			}
			if typ == "" {
				typ = typeOf(value)
			}
			p.rows = append(p.rows, row{key: key, typ: typ, def: def, description: description})
		}
		switch {
		case value.Kind == yaml.MappingNode && len(value.Content) > 0:
			if err := p.mapping(value, key+".", covered || documented); err != nil {
				return err
			}
		case !documented && !covered:
			p.undocumented = append(p.undocumented, key)
		}
	}
	return nil
}

var typeOverride = regexp.MustCompile(`^\(([^)]+)\)\s*`)

// docComment finds the "# --" comment in a key's head comment: from its
// last line starting with "# --" to the comment's end.
func docComment(head string) (typ, description string, ok bool) {
	lines := strings.Split(head, "\n")
	start := -1
	for i, l := range lines {
		if strings.HasPrefix(strings.TrimSpace(l), docPrefix) {
			start = i
		}
	}
	if start < 0 {
		return "", "", false
	}
	var words []string
	for i, l := range lines[start:] {
		l = strings.TrimSpace(l)
		if i == 0 {
			l = strings.TrimPrefix(l, docPrefix)
		} else {
			l = strings.TrimPrefix(l, "#")
		}
		if l = strings.TrimSpace(l); l != "" {
			words = append(words, l)
		}
	}
	description = strings.Join(words, " ")
	if m := typeOverride.FindStringSubmatch(description); m != nil {
		typ, description = m[1], description[len(m[0]):]
	}
	return typ, description, true
}

// defaultOf is a value as compact JSON.
func defaultOf(value *yaml.Node) (string, error) {
	var v any
	if err := value.Decode(&v); err != nil {
		return "", err
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return "", err
	}
	return strings.TrimSpace(buf.String()), nil
}

func typeOf(value *yaml.Node) string {
	switch value.Kind {
	case yaml.MappingNode:
		return "object"
	case yaml.SequenceNode:
		return "list"
	}
	switch value.Tag {
	case "!!str":
		return "string"
	case "!!int":
		return "int"
	case "!!float":
		return "float"
	case "!!bool":
		return "bool"
	case "!!null":
		return "null"
	}
	return value.Tag
}

func renderTable(rows []row) string {
	var b strings.Builder
	b.WriteString("| Key | Type | Default | Description |\n|---|---|---|---|\n")
	for _, r := range rows {
		fmt.Fprintf(&b, "| `%s` | %s | %s | %s |\n", r.key, cell(r.typ), code(r.def), cell(r.description))
	}
	return b.String()
}

// cell escapes what would end a table cell.
func cell(s string) string { return strings.ReplaceAll(s, "|", `\|`) }

// code is s as inline code, with a fence longer than any backtick run in s.
func code(s string) string {
	fence := "`"
	for strings.Contains(s, fence) {
		fence += "`"
	}
	pad := ""
	if strings.HasPrefix(s, "`") || strings.HasSuffix(s, "`") {
		pad = " "
	}
	return fence + pad + cell(s) + pad + fence
}

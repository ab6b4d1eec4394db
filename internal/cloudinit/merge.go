package cloudinit

import (
	"bytes"
	"errors"
	"fmt"
	"path"
	"regexp"
	"strconv"
	"strings"

	yaml "go.yaml.in/yaml/v3"
)

// mergePolicy says which keys of a cloud-config belong to whom.
type mergePolicy struct {
	// reserved are top-level keys the user may not set, with the reason.
	reserved map[string]string
	// defaults are operator keys the user may override (the user wins).
	defaults map[string]bool
	// ownedPaths are write_files paths only the operator writes.
	ownedPaths map[string]bool
}

// mergeCloudConfig merges the operator's cloud-config (op, a mapping) into
// the user's rendered #cloud-config document. The rules, which
// docs/cloud-init.md states for users:
//
//   - reserved keys may not appear in the user's document;
//   - a key only one side sets is kept as it is;
//   - lists set by both are concatenated, the user's items first;
//   - mappings set by both are merged by these same rules, recursively;
//   - any other key set by both (a scalar, or values of different kinds) is
//     a conflict, unless the operator marks it as a default the user may
//     override;
//   - a user write_files entry may not write a path the operator writes;
//   - a null user value counts as unset.
//
// The user's keys keep their order (and comments); keys only the operator
// sets follow them. The result is a single mapping node.
func mergeCloudConfig(userDoc []byte, op *yaml.Node, pol *mergePolicy) (*yaml.Node, error) {
	user, err := parseMapping(FieldUserData, userDoc)
	if err != nil {
		return nil, err
	}
	return mergeCloudConfigNode(user, op, pol)
}

// mergeCloudConfigNode is mergeCloudConfig on a parsed mapping, which it
// changes.
func mergeCloudConfigNode(user, op *yaml.Node, pol *mergePolicy) (*yaml.Node, error) {
	for i := 0; i+1 < len(user.Content); i += 2 {
		k := user.Content[i]
		if k.Value == "<<" {
			return nil, &Error{Field: FieldUserData, Line: k.Line, Rendered: true, Err: errors.New("merge keys (<<) are not supported at the top level: they could hide keys from the merge; write the keys out")}
		}
		if why, ok := pol.reserved[k.Value]; ok {
			return nil, &Error{Field: FieldUserData, Line: k.Line, Rendered: true, Err: fmt.Errorf("key %q is reserved: %s; remove it", k.Value, why)}
		}
	}
	if err := checkWriteFiles(FieldUserData, user, pol); err != nil {
		return nil, err
	}
	if err := mergeMapping(user, op, "", pol); err != nil {
		return nil, err
	}
	return user, nil
}

func mergeMapping(user, op *yaml.Node, prefix string, pol *mergePolicy) error {
	for i := 0; i+1 < len(op.Content); i += 2 {
		key, ov := op.Content[i].Value, op.Content[i+1]
		name := prefix + key
		ui := mapIndex(user, key)
		if ui < 0 || isNull(resolve(user.Content[ui+1])) {
			if ui >= 0 {
				user.Content[ui+1] = ov
			} else {
				user.Content = append(user.Content, op.Content[i], ov)
			}
			continue
		}
		uk, uv := user.Content[ui], resolve(user.Content[ui+1])
		switch {
		case prefix == "" && pol.defaults[key]:
			// The user's value wins.
		case uv.Kind == yaml.SequenceNode && ov.Kind == yaml.SequenceNode:
			merged := &yaml.Node{Kind: yaml.SequenceNode, Tag: uv.Tag, Style: uv.Style &^ yaml.FlowStyle}
			merged.Content = append(append(merged.Content, uv.Content...), ov.Content...)
			merged.HeadComment, merged.LineComment, merged.FootComment = uv.HeadComment, uv.LineComment, uv.FootComment
			user.Content[ui+1] = merged
		case uv.Kind == yaml.MappingNode && ov.Kind == yaml.MappingNode:
			cp := copyMapping(uv)
			if err := mergeMapping(cp, ov, name+".", pol); err != nil {
				return err
			}
			user.Content[ui+1] = cp
		default:
			return &Error{Field: FieldUserData, Line: uk.Line, Rendered: true,
				Err: fmt.Errorf("key %q is also set by HyperFleet (as a %s, yours is a %s); only lists and mappings are merged: remove it", name, kindName(ov), kindName(uv))}
		}
	}
	return nil
}

// copyMapping copies the top level of a mapping so that merging into it
// does not change an anchored original another alias points at.
func copyMapping(n *yaml.Node) *yaml.Node {
	cp := *n
	cp.Anchor = ""
	cp.Content = append([]*yaml.Node(nil), n.Content...)
	return &cp
}

// checkWriteFiles rejects write_files entries for paths the operator owns.
func checkWriteFiles(field string, user *yaml.Node, pol *mergePolicy) error {
	wf := mapValue(user, "write_files")
	if wf == nil {
		return nil
	}
	wf = resolve(wf)
	if wf.Kind != yaml.SequenceNode {
		return nil // the merge reports the kind mismatch
	}
	for _, e := range wf.Content {
		e = resolve(e)
		if e.Kind != yaml.MappingNode {
			continue
		}
		p := mapValue(e, "path")
		if p == nil || resolve(p).Kind != yaml.ScalarNode {
			continue
		}
		if pol.ownedPaths[path.Clean(resolve(p).Value)] {
			return &Error{Field: field, Line: p.Line, Rendered: true, Err: fmt.Errorf("write_files path %s is written by HyperFleet; choose another path", resolve(p).Value)}
		}
	}
	return nil
}

func kindName(n *yaml.Node) string {
	switch n.Kind {
	case yaml.SequenceNode:
		return "list"
	case yaml.MappingNode:
		return "mapping"
	default:
		return "scalar"
	}
}

// parseMapping parses one YAML document that must be a mapping (an empty
// document is an empty mapping). Duplicate top-level keys are an error:
// cloud-init would silently take the last one.
func parseMapping(field string, data []byte) (*yaml.Node, error) {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil {
		if err.Error() == "EOF" {
			return &yaml.Node{Kind: yaml.MappingNode, Tag: "!!map"}, nil
		}
		return nil, yamlError(field, err)
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); err == nil {
		return nil, &Error{Field: field, Line: extra.Line, Rendered: true, Err: errors.New("holds more than one YAML document (---); cloud-init reads exactly one")}
	} else if err.Error() != "EOF" {
		return nil, yamlError(field, err)
	}
	root := docRoot(&doc)
	if root == nil || isNull(root) {
		return &yaml.Node{Kind: yaml.MappingNode, Tag: "!!map"}, nil
	}
	if root.Kind != yaml.MappingNode {
		return nil, &Error{Field: field, Line: root.Line, Rendered: true, Err: fmt.Errorf("must be a YAML mapping of keys to values, not a %s", kindName(root))}
	}
	if err := checkNodes(field, root, 0); err != nil {
		return nil, err
	}
	keepPlain(root)
	seen := map[string]int{}
	for i := 0; i+1 < len(root.Content); i += 2 {
		k := root.Content[i]
		if k.Kind != yaml.ScalarNode {
			return nil, &Error{Field: field, Line: k.Line, Rendered: true, Err: errors.New("top-level keys must be plain strings")}
		}
		if first, dup := seen[k.Value]; dup {
			return nil, &Error{Field: field, Line: k.Line, Rendered: true, Err: fmt.Errorf("key %q is set twice (first on line %d)", k.Value, first)}
		}
		seen[k.Value] = k.Line
	}
	root.HeadComment = joinComments(doc.HeadComment, root.HeadComment)
	return root, nil
}

// checkNodes rejects what yaml.v3 reads but cloud-init's YAML loader
// (PyYAML, YAML 1.1) cannot: lists or mappings used as mapping keys ("found
// unhashable key") and a plain "=" (YAML 1.1's value key).
func checkNodes(field string, n *yaml.Node, depth int) error {
	if n == nil || depth > 200 {
		return nil
	}
	switch n.Kind {
	case yaml.MappingNode:
		for i := 0; i+1 < len(n.Content); i += 2 {
			if k := resolve(n.Content[i]); k.Kind != yaml.ScalarNode {
				return &Error{Field: field, Line: n.Content[i].Line, Rendered: true, Err: fmt.Errorf("a %s is used as a mapping key; cloud-init cannot load that (check for an unquoted {{ or [ at the start of a value)", kindName(k))}
			}
		}
	case yaml.ScalarNode:
		if n.Value == "=" && n.Style&(yaml.SingleQuotedStyle|yaml.DoubleQuotedStyle) == 0 {
			return &Error{Field: field, Line: n.Line, Rendered: true, Err: errors.New("a plain = is YAML 1.1's value key, which cloud-init cannot load; quote it: '='")}
		}
	}
	for _, c := range n.Content {
		if err := checkNodes(field, c, depth+1); err != nil {
			return err
		}
	}
	return nil
}

// keepPlain makes sure that writing the document back keeps every plain
// scalar plain. The YAML emitter quotes a scalar holding ':' or '?' inside
// a flow collection ([1:20] becomes ['1:20']), which changes its meaning
// for cloud-init's YAML 1.1 loader (1:20 is the base-60 integer 80, a MAC
// address of digits is an integer too). Such flow collections, and the
// flow collections around them, are written in block style instead, where
// the scalar stays plain. It reports whether n had to change.
func keepPlain(n *yaml.Node) bool {
	if n == nil {
		return false
	}
	switch n.Kind {
	case yaml.ScalarNode:
		return n.Style&(yaml.SingleQuotedStyle|yaml.DoubleQuotedStyle|yaml.LiteralStyle|yaml.FoldedStyle) == 0 &&
			strings.ContainsAny(n.Value, ":?,[]{}#")
	case yaml.SequenceNode, yaml.MappingNode, yaml.DocumentNode:
		need := false
		for _, c := range n.Content {
			if keepPlain(c) {
				need = true
			}
		}
		if need && n.Style&yaml.FlowStyle != 0 {
			n.Style &^= yaml.FlowStyle
		}
		return need && n.Kind != yaml.DocumentNode
	}
	return false
}

func joinComments(a, b string) string {
	switch {
	case a == "":
		return b
	case b == "":
		return a
	}
	return a + "\n" + b
}

var yamlLineRE = regexp.MustCompile(`^yaml: line (\d+): (.*)$`)

// yamlError turns a YAML syntax error into an *Error with the line.
func yamlError(field string, err error) error {
	msg := err.Error()
	if m := yamlLineRE.FindStringSubmatch(msg); m != nil {
		line, _ := strconv.Atoi(m[1])
		return &Error{Field: field, Line: line, Rendered: true, Err: &explained{msg: "invalid YAML: " + m[2], cause: err}}
	}
	return &Error{Field: field, Err: &explained{msg: "invalid YAML: " + strings.TrimPrefix(msg, "yaml: "), cause: err}}
}

func docRoot(doc *yaml.Node) *yaml.Node {
	if doc.Kind == yaml.DocumentNode {
		if len(doc.Content) == 0 {
			return nil
		}
		return resolve(doc.Content[0])
	}
	return resolve(doc)
}

// resolve follows aliases.
func resolve(n *yaml.Node) *yaml.Node {
	for i := 0; n != nil && n.Kind == yaml.AliasNode && n.Alias != nil && i < 100; i++ {
		n = n.Alias
	}
	return n
}

func isNull(n *yaml.Node) bool {
	return n.Kind == yaml.ScalarNode && n.Tag == "!!null"
}

func mapIndex(m *yaml.Node, key string) int {
	for i := 0; i+1 < len(m.Content); i += 2 {
		if m.Content[i].Value == key {
			return i
		}
	}
	return -1
}

func mapValue(m *yaml.Node, key string) *yaml.Node {
	if i := mapIndex(m, key); i >= 0 {
		return m.Content[i+1]
	}
	return nil
}

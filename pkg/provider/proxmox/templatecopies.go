package proxmox

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/hyperfleet/hyperfleet/pkg/provider"
	"github.com/hyperfleet/hyperfleet/pkg/provider/proxmox/privileges"
)

// templateCopies are the templates a source's clones are made from: the
// one template it names by id or by name, or, under a templateSelector,
// one copy on each node holding a template with every tag. Copies on
// local storage (local-lvm, local-zfs) let every such node make linked
// clones of its own copy, which Proxmox refuses across nodes.
type templateCopies struct {
	// one is the template a source names by id or by name; nil under a
	// selector.
	one *templateInfo
	// byNode are a selector's copies by node.
	byNode map[string]*templateInfo
	// tags are the selector's tags, for messages.
	tags []string
}

// nodes are the nodes holding a copy, sorted; the template's own node for
// a source naming one template.
func (c templateCopies) nodes() []string {
	if c.one != nil {
		return []string{c.one.node}
	}
	return slices.Sorted(maps.Keys(c.byNode))
}

// on is the template held on node: the one template, or node's copy (nil
// when it holds none).
func (c templateCopies) on(node string) *templateInfo {
	if c.one != nil {
		return c.one
	}
	return c.byNode[node]
}

// first is the template on the first of nodes: what a caller reads that
// every copy is expected to share (the memory a VM keeps by default).
func (c templateCopies) first() *templateInfo {
	return c.on(c.nodes()[0])
}

// templateCopies resolves src to its templates: the one it names, or the
// copy on each node under a selector (from the cluster's listing, each
// copy's config cached as one template's is).
func (p *Provider) templateCopies(ctx context.Context, src provider.TemplateSource) (templateCopies, error) {
	ref := templateRefOf(src)
	tags := ref.selectorTags()
	if len(tags) == 0 {
		t, err := p.template(ctx, src)
		return templateCopies{one: t}, err
	}
	view, err := p.clusterView(ctx, viewTTL)
	if err != nil {
		return templateCopies{}, err
	}
	ids, err := selectTemplates(view, tags)
	if err != nil {
		return templateCopies{}, err
	}
	out := templateCopies{byNode: map[string]*templateInfo{}, tags: tags}
	for _, node := range slices.Sorted(maps.Keys(ids)) {
		t, err := p.templateCopy(ctx, ids[node], node, tags)
		if err != nil {
			return templateCopies{}, err
		}
		if t != nil {
			out.byNode[node] = t
		}
	}
	if len(out.byNode) == 0 {
		return templateCopies{}, noTemplateTagged(tags)
	}
	return out, nil
}

// selectTemplates finds, in a listing, the template on each node that
// carries every tag (Proxmox lists a VM's tags lower-case, ';'-separated).
// A node with two is refused rather than guessed: which one a clone came
// from would depend on the listing's order.
func selectTemplates(view *clusterView, tags []string) (map[string]int, error) {
	byNode := map[string][]int{}
	for id, r := range view.vms {
		if r.Template == 1 && hasTags(splitTags(r.Tags), tags) {
			byNode[r.Node] = append(byNode[r.Node], id)
		}
	}
	if len(byNode) == 0 {
		return nil, noTemplateTagged(tags)
	}
	out := make(map[string]int, len(byNode))
	for _, node := range slices.Sorted(maps.Keys(byNode)) {
		ids := byNode[node]
		if len(ids) > 1 {
			slices.Sort(ids)
			return nil, configErr("TemplateAmbiguous", fieldSelector,
				"node %s holds %d templates tagged %s (ids %s); keep one copy per node (remove the tags from the others), or add a tag to matchTags that only one of them carries",
				node, len(ids), strings.Join(tags, ","), joinInts(ids))
		}
		out[node] = ids[0]
	}
	return out, nil
}

// noTemplateTagged is the error of a selector no template matches.
func noTemplateTagged(tags []string) error {
	return configErr("TemplateNotFound", fieldSelector,
		"no template carries every tag of %s on any node, or the operator's Proxmox token lacks VM.Audit on them to see them (grant it: %s): %w",
		strings.Join(tags, ","), privileges.Fix("VM.Audit"), provider.ErrNotFound)
}

// templateCopy is the copy VM id on node, from cache when fresh; nil when
// its config says the listing is stale (gone, no longer a template, or
// without one of the tags): that node has no copy.
func (p *Provider) templateCopy(ctx context.Context, id int, node string, tags []string) (*templateInfo, error) {
	p.mu.Lock()
	t := p.templates[id]
	p.mu.Unlock()
	if t != nil && t.node == node && p.clock.Since(t.at) < templateTTL && hasTags(t.tags, tags) {
		return t, nil
	}
	cfg, err := p.api.config(ctx, node, id)
	switch {
	case isNotFound(err):
		return nil, nil
	case err != nil:
		return nil, err
	case cfg["template"] != "1" || !hasTags(cfg.tags(), tags):
		return nil, nil
	}
	return p.keepTemplate(id, node, cfg), nil
}

// hasTags reports whether have (a VM's tags, in any case) includes every
// tag of want (lower-case).
func hasTags(have, want []string) bool {
	norm := normalizeTags(have)
	for _, w := range want {
		if !slices.Contains(norm, w) {
			return false
		}
	}
	return true
}

func joinInts(ids []int) string {
	s := make([]string, len(ids))
	for i, id := range ids {
		s[i] = fmt.Sprint(id)
	}
	return strings.Join(s, ", ")
}

// cloneCandidates are the nodes a clone of copies may be placed on,
// sorted, and why the allowed nodes left out are: a template whose
// volumes are all on shared storage reaches every node, one on local
// storage only its own node. Under a selector that is every node holding
// a copy, or every node when a copy is on shared storage.
func (p *Provider) cloneCandidates(view *clusterView, copies templateCopies) ([]string, []string) {
	all := slices.Sorted(maps.Keys(view.nodes))
	if t := copies.one; t != nil {
		if p.crossNodeClone(view, t) {
			return all, nil
		}
		return []string{t.node}, nil
	}
	if p.sharedCopy(view, copies) != nil {
		return all, nil
	}
	var why []string
	for _, name := range all {
		if copies.byNode[name] == nil && p.allowed(name) {
			why = append(why, fmt.Sprintf("%s: no template tagged %s", name, strings.Join(copies.tags, ",")))
		}
	}
	return copies.nodes(), why
}

// cloneSource is the template a clone placed on node is made from: the
// one template, else node's own copy, else a copy on shared storage; nil
// when node has none of these.
func (p *Provider) cloneSource(view *clusterView, copies templateCopies, node string) *templateInfo {
	if t := copies.on(node); t != nil {
		return t
	}
	return p.sharedCopy(view, copies)
}

// sharedCopy is the first copy (by node) whose volumes are all on shared
// storage (its clones may go to any node), nil when none is.
func (p *Provider) sharedCopy(view *clusterView, copies templateCopies) *templateInfo {
	for _, node := range copies.nodes() {
		if t := copies.byNode[node]; t != nil && p.crossNodeClone(view, t) {
			return t
		}
	}
	return nil
}

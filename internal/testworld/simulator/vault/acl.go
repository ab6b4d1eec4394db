package vault

import (
	"slices"
	"strings"
)

// Rule grants capabilities on a path, as one path block of a Vault ACL
// policy: Path may end in "*" (any suffix) and contain "+" segments (any
// one segment), and may hold identity templates:
// {{identity.entity.id}}, {{identity.entity.aliases.<mount accessor>.name}}
// and {{identity.entity.aliases.<mount accessor>.metadata.<key>}}. A rule
// whose template the token's identity cannot fill is left out, as Vault
// does.
//
// AllowedParameters, when set, limits what a create or update may send:
// only the keys listed (lower case; "*" for any), each with a value in its
// list (an empty list allows any value). As in Vault, a string value
// matches an entry that equals it or that globs it with a leading or
// trailing "*"; any other value (a list, a number) must equal an entry,
// which a policy's string entries never do, so a client that must pass such
// a policy sends strings.
type Rule struct {
	Path              string
	Capabilities      []string
	AllowedParameters map[string][]string
}

// Policy is a named ACL policy.
type Policy struct {
	Name  string
	Rules []Rule
}

// SetPolicy creates or replaces a policy.
func (s *Server) SetPolicy(name string, rules ...Rule) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.policies[name] = &Policy{Name: name, Rules: rules}
}

// allowed reports whether t's policies grant capability on path. As in
// Vault, the most specific matching rule decides: an exact path over a
// glob, and among globs the longest literal prefix before a wildcard, then
// fewer "+" segments; rules of the same path from several policies are
// merged, and "deny" wins over everything.
func (s *Server) allowed(t *token, path, capability string, data map[string]any) bool {
	var best []Rule
	for _, name := range t.policies {
		p := s.policies[name]
		if p == nil {
			continue
		}
		for _, r := range p.Rules {
			expanded, ok := expand(r.Path, t)
			if !ok || !matches(expanded, path) {
				continue
			}
			r.Path = expanded
			switch {
			case len(best) == 0 || moreSpecific(r.Path, best[0].Path):
				best = []Rule{r}
			case r.Path == best[0].Path:
				best = append(best, r)
			}
		}
	}
	granted := false
	var params map[string][]string
	for _, r := range best {
		if slices.Contains(r.Capabilities, "deny") {
			return false
		}
		if slices.Contains(r.Capabilities, capability) {
			granted = true
		}
		for k, v := range r.AllowedParameters {
			if params == nil {
				params = map[string][]string{}
			}
			old, seen := params[k]
			switch {
			case len(v) == 0 || seen && len(old) == 0:
				params[k] = []string{}
			default:
				params[k] = append(v, old...)
			}
		}
	}
	if !granted || params == nil || capability != "create" && capability != "update" {
		return granted
	}
	return parametersAllowed(params, data)
}

// parametersAllowed is Vault's allowed_parameters check.
func parametersAllowed(params map[string][]string, data map[string]any) bool {
	_, allowAll := params["*"]
	if len(params) == 1 && allowAll {
		return true
	}
	for key, value := range data {
		list, ok := params[strings.ToLower(key)]
		if !ok && !allowAll {
			return false
		}
		if ok && len(list) > 0 && !valueInList(value, list) {
			return false
		}
	}
	return true
}

func valueInList(v any, list []string) bool {
	str, ok := v.(string)
	if !ok {
		return false
	}
	for _, el := range list {
		if globbedStringsMatch(el, str) {
			return true
		}
	}
	return false
}

// globbedStringsMatch is Vault's: a leading "*", a trailing "*" or both
// (contains); a lone "*" or any shorter item matches only itself.
func globbedStringsMatch(item, val string) bool {
	if len(item) < 2 {
		return val == item
	}
	prefix, suffix := strings.HasPrefix(item, "*"), strings.HasSuffix(item, "*")
	switch {
	case prefix && suffix:
		return strings.Contains(val, item[1:len(item)-1])
	case prefix:
		return strings.HasSuffix(val, item[1:])
	case suffix:
		return strings.HasPrefix(val, item[:len(item)-1])
	}
	return val == item
}

// moreSpecific reports whether rule path a beats b.
func moreSpecific(a, b string) bool {
	wa, wb := strings.ContainsAny(a, "*+"), strings.ContainsAny(b, "*+")
	if wa != wb {
		return !wa
	}
	la, lb := literalPrefix(a), literalPrefix(b)
	if la != lb {
		return la > lb
	}
	if ca, cb := strings.Count(a, "+"), strings.Count(b, "+"); ca != cb {
		return ca < cb
	}
	return len(a) > len(b)
}

func literalPrefix(p string) int {
	if i := strings.IndexAny(p, "*+"); i >= 0 {
		return i
	}
	return len(p)
}

// matches reports whether rule path pattern matches request path p.
func matches(pattern, p string) bool {
	glob := strings.HasSuffix(pattern, "*")
	pattern = strings.TrimSuffix(pattern, "*")
	ps, rs := strings.Split(pattern, "/"), strings.Split(p, "/")
	if len(rs) < len(ps) || !glob && len(rs) != len(ps) {
		return false
	}
	for i, seg := range ps {
		last := i == len(ps)-1
		switch {
		case seg == "+":
			if rs[i] == "" {
				return false
			}
		case last && glob:
			if !strings.HasPrefix(rs[i], seg) {
				return false
			}
		case seg != rs[i]:
			return false
		}
	}
	return true
}

// expand fills the identity templates in a rule path from t's identity; ok
// is false when one cannot be filled.
func expand(path string, t *token) (string, bool) {
	var b strings.Builder
	for {
		start := strings.Index(path, "{{")
		if start < 0 {
			b.WriteString(path)
			return b.String(), true
		}
		end := strings.Index(path[start:], "}}")
		if end < 0 {
			return "", false
		}
		v, ok := templateValue(strings.TrimSpace(path[start+2:start+end]), t)
		if !ok {
			return "", false
		}
		b.WriteString(path[:start])
		b.WriteString(v)
		path = path[start+end+2:]
	}
}

func templateValue(name string, t *token) (string, bool) {
	if name == "identity.entity.id" {
		return t.entityID, t.entityID != ""
	}
	rest, ok := strings.CutPrefix(name, "identity.entity.aliases.")
	if !ok || t.alias == nil {
		return "", false
	}
	accessor, field, ok := strings.Cut(rest, ".")
	if !ok || accessor != t.alias.mountAccessor {
		return "", false
	}
	if field == "name" {
		return t.alias.name, true
	}
	if key, ok := strings.CutPrefix(field, "metadata."); ok {
		v, ok := t.alias.metadata[key]
		return v, ok
	}
	return "", false
}

package proxmoxsim

import (
	"regexp"
	"sort"
	"strings"
)

// tagRE is PVE's PVE_TAG_RE, matched case-insensitively.
var tagRE = regexp.MustCompile(`^(?i)[a-z0-9_][a-z0-9_\-+.]*$`)

// ParseTags validates and normalises a Proxmox tag list: separators are
// ',', ';' and white space; tags are lower-cased, sorted, de-duplicated and
// joined with ';'. An illegal tag (for example one containing '/', ':' or
// '=') yields the reason Proxmox reports after "invalid format - ".
func ParseTags(v string) (string, error) {
	seen := map[string]bool{}
	var tags []string
	for _, t := range splitList(v) {
		if !tagRE.MatchString(t) {
			return "", fmtErr("invalid characters in tag")
		}
		lt := strings.ToLower(t)
		if !seen[lt] {
			seen[lt] = true
			tags = append(tags, lt)
		}
	}
	sort.Strings(tags)
	return strings.Join(tags, ";"), nil
}

func verifyTags(v string) error {
	_, err := ParseTags(v)
	return err
}

// These tests check the claims the repository's front pages make
// about the repository itself: the project files a user looks for before
// adopting it (LICENSE, NOTICE, CHANGELOG.md, SECURITY.md, CONTRIBUTING.md)
// exist and reach the image and the chart, the README fits a screen and
// links only to files that exist, and every row of the status table
// (docs/status.md) cites a doc, a package or a make target that exists.

package repo

import (
	"bytes"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// repoRoot is the repository's top directory, two levels above this
// package.
const repoRoot = "../.."

func read(t *testing.T, rel string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repoRoot, rel))
	if err != nil {
		t.Fatalf("reading %s: %v", rel, err)
	}
	return string(b)
}

// TestProjectFiles fails when a project file is missing or empty, when
// LICENSE is not the Apache License 2.0, when the chart's copy differs from
// it, or when the image or the chart would ship without it.
func TestProjectFiles(t *testing.T) {
	for _, f := range []string{"LICENSE", "NOTICE", "CHANGELOG.md", "SECURITY.md", "CONTRIBUTING.md"} {
		if strings.TrimSpace(read(t, f)) == "" {
			t.Errorf("%s is empty", f)
		}
	}

	license := read(t, "LICENSE")
	for _, want := range []string{
		"Apache License",
		"Version 2.0, January 2004",
		"http://www.apache.org/licenses/",
		"TERMS AND CONDITIONS FOR USE, REPRODUCTION, AND DISTRIBUTION",
		"9. Accepting Warranty or Additional Liability.",
		"END OF TERMS AND CONDITIONS",
	} {
		if !strings.Contains(license, want) {
			t.Errorf("LICENSE is not the full Apache License 2.0 text: it lacks %q", want)
		}
	}
	if !strings.Contains(read(t, "NOTICE"), "The HyperFleet Authors") {
		t.Error(`NOTICE names no copyright holder ("The HyperFleet Authors")`)
	}

	// helm package ships the chart directory: the license must be in it.
	if read(t, "charts/hyperfleet/LICENSE") != license {
		t.Error("charts/hyperfleet/LICENSE differs from LICENSE: cp LICENSE charts/hyperfleet/LICENSE")
	}
	if !strings.Contains(read(t, "charts/hyperfleet/Chart.yaml"), "artifacthub.io/license: Apache-2.0") {
		t.Error("charts/hyperfleet/Chart.yaml has no license annotation (artifacthub.io/license: Apache-2.0)")
	}

	// The image: the Containerfile copies both files from the build context
	// and labels the license; make image-context stages them there.
	containerfile := read(t, "Containerfile")
	if !regexp.MustCompile(`(?m)^COPY\s+LICENSE\s+NOTICE\s+/licenses/\s*$`).MatchString(containerfile) {
		t.Error("Containerfile does not copy LICENSE and NOTICE into /licenses/")
	}
	if !strings.Contains(containerfile, `org.opencontainers.image.licenses="Apache-2.0"`) {
		t.Error(`Containerfile lacks the label org.opencontainers.image.licenses="Apache-2.0"`)
	}
	if !strings.Contains(read(t, "Makefile"), "cp LICENSE NOTICE $(IMAGE_CONTEXT)/") {
		t.Error("make image-context does not stage LICENSE and NOTICE into the image's build context")
	}

	changelog := read(t, "CHANGELOG.md")
	for _, want := range []string{"https://keepachangelog.com/en/1.1.0/", "## [Unreleased]"} {
		if !strings.Contains(changelog, want) {
			t.Errorf("CHANGELOG.md lacks %q (Keep a Changelog 1.1.0)", want)
		}
	}
}

// statusPage is the page holding the status table; its links are relative
// to its directory.
const statusPage = "docs/status.md"

// statusRow is one row of the status table.
type statusRow struct {
	line       int
	area, text string
}

// statusTable returns the rows of the first table in docs/status.md.
func statusTable(t *testing.T) []statusRow {
	t.Helper()
	var rows []statusRow
	inTable := false
	for i, l := range strings.Split(read(t, statusPage), "\n") {
		switch {
		case strings.HasPrefix(l, "|---"):
			inTable = true
		case inTable && strings.HasPrefix(l, "|"):
			cells := strings.Split(strings.Trim(l, "|"), "|")
			rows = append(rows, statusRow{line: i + 1, area: strings.TrimSpace(cells[0]), text: l})
		case inTable:
			inTable = false
		}
		if !inTable && len(rows) > 0 {
			break
		}
	}
	if len(rows) == 0 {
		t.Fatalf("%s has no status table", statusPage)
	}
	return rows
}

var (
	// mdLink is a markdown link's target, without its #fragment.
	mdLink = regexp.MustCompile(`\]\(([^)#\s]+)(#[^)]*)?\)`)
	// codeSpan is a backticked span.
	codeSpan = regexp.MustCompile("`([^`]+)`")
	// makeTarget is a Makefile rule's name.
	makeTarget = regexp.MustCompile(`(?m)^([a-z][a-z0-9-]*):`)
	// repoPath is a code span that names a place in the repository.
	repoPath = regexp.MustCompile(`^(api|cmd|config|docs|hack|internal|pkg|test|charts)/[A-Za-z0-9_./-]*$`)
)

// exists says whether a path relative to the repository's top exists.
func exists(rel string) bool {
	_, err := os.Stat(filepath.Join(repoRoot, filepath.FromSlash(rel)))
	return err == nil
}

// TestStatusTableCitesEvidence fails when a row of the status table
// (docs/status.md) cites nothing that exists, or cites a path or make
// target that does not: a row's claim must point at the doc, package or
// make target that shows it. Links are relative to docs/, code spans name
// paths from the repository's top.
func TestStatusTableCitesEvidence(t *testing.T) {
	targets := map[string]bool{}
	for _, m := range makeTarget.FindAllStringSubmatch(read(t, "Makefile"), -1) {
		targets[m[1]] = true
	}
	pageDir := filepath.Dir(statusPage)

	for _, row := range statusTable(t) {
		var cited []string
		for _, m := range mdLink.FindAllStringSubmatch(row.text, -1) {
			if strings.Contains(m[1], "://") {
				continue
			}
			if !exists(filepath.Join(pageDir, m[1])) {
				t.Errorf("%s:%d (%s): the link %s names no file", statusPage, row.line, row.area, m[1])
				continue
			}
			cited = append(cited, m[1])
		}
		for _, m := range codeSpan.FindAllStringSubmatch(row.text, -1) {
			span := m[1]
			if target, ok := strings.CutPrefix(span, "make "); ok {
				if !targets[target] {
					t.Errorf("%s:%d (%s): `%s` is no Makefile target", statusPage, row.line, row.area, span)
					continue
				}
				cited = append(cited, span)
				continue
			}
			if !repoPath.MatchString(span) {
				continue // a field, a value or a command, not a citation
			}
			if !exists(span) {
				t.Errorf("%s:%d (%s): `%s` does not exist", statusPage, row.line, row.area, span)
				continue
			}
			cited = append(cited, span)
		}
		if len(cited) == 0 {
			t.Errorf("%s:%d (%s): the row cites no doc, package or make target that shows it", statusPage, row.line, row.area)
		}
	}
}

// readmeMaxWords is what one screen of the README holds: what HyperFleet
// is, the two commands, where to install from and what to read next. The
// details live in docs/ (the status table in docs/status.md).
const readmeMaxWords = 600

// TestReadmeFitsAScreen fails when the README grows past one screen, holds
// a table, gives a newcomer other commands than exactly make dev and make
// test, does not link the status page, or links a file that does not
// exist.
func TestReadmeFitsAScreen(t *testing.T) {
	readme := read(t, "README.md")
	if n := len(strings.Fields(readme)); n > readmeMaxWords {
		t.Errorf("README.md has %d words, more than a screen (%d): move the detail into docs/", n, readmeMaxWords)
	}
	for i, l := range strings.Split(readme, "\n") {
		if strings.HasPrefix(l, "|---") {
			t.Errorf("README.md:%d holds a table: tables belong in docs/ (the status table in %s)", i+1, statusPage)
		}
	}
	if got, want := gettingStartedCommands(readme), []string{"make dev", "make test"}; !slices.Equal(got, want) {
		t.Errorf("README.md's Get started block runs %q, want exactly %q", got, want)
	}
	linked := false
	for _, m := range mdLink.FindAllStringSubmatch(readme, -1) {
		if strings.Contains(m[1], "://") {
			continue
		}
		if !exists(m[1]) {
			t.Errorf("README.md: the link %s names no file", m[1])
		}
		linked = linked || m[1] == statusPage
	}
	if !linked {
		t.Errorf("README.md does not link the status table (%s)", statusPage)
	}
}

// gettingStartedCommands returns the commands of the first ```sh block
// under the README's "## Get started", without their comments.
func gettingStartedCommands(readme string) []string {
	var cmds []string
	inSection, inBlock := false, false
	for _, l := range strings.Split(readme, "\n") {
		switch {
		case strings.HasPrefix(l, "## "):
			if inSection && len(cmds) > 0 {
				return cmds
			}
			inSection = l == "## Get started"
		case inSection && !inBlock && l == "```sh":
			inBlock = true
		case inSection && inBlock && strings.HasPrefix(l, "```"):
			return cmds
		case inSection && inBlock:
			if cmd, _, _ := strings.Cut(l, "#"); strings.TrimSpace(cmd) != "" {
				cmds = append(cmds, strings.TrimSpace(cmd))
			}
		}
	}
	return cmds
}

// TestNoWorkingFeatureCalledPlanned fails when the README or the status
// table calls SPIFFE or the credential broker planned or not started: both
// work (docs/identity.md, make test-spire).
func TestNoWorkingFeatureCalledPlanned(t *testing.T) {
	for _, page := range []string{"README.md", statusPage} {
		for i, l := range bytes.Split([]byte(read(t, page)), []byte("\n")) {
			lower := strings.ToLower(string(l))
			if (strings.Contains(lower, "spiffe") || strings.Contains(lower, "broker")) &&
				(strings.Contains(lower, "planned") || strings.Contains(lower, "not started")) {
				t.Errorf("%s:%d calls a working feature planned or not started: %s", page, i+1, strings.TrimSpace(string(l)))
			}
		}
	}
}

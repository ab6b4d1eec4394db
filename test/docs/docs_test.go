// Package docs_test checks the claims the repository's front pages make
// about the repository itself: the project files a user looks for before
// adopting it (LICENSE, NOTICE, CHANGELOG.md, SECURITY.md, CONTRIBUTING.md)
// exist and reach the image and the chart, and every row of the README's
// status table cites a doc, a package or a make target that exists.
package docs_test

import (
	"bytes"
	"os"
	"path/filepath"
	"regexp"
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

// statusRow is one row of the README's status table.
type statusRow struct {
	line       int
	area, text string
}

// statusTable returns the rows of the table under "## Status" in README.md.
func statusTable(t *testing.T) []statusRow {
	t.Helper()
	var rows []statusRow
	inSection, inTable := false, false
	for i, l := range strings.Split(read(t, "README.md"), "\n") {
		switch {
		case strings.HasPrefix(l, "## "):
			inSection = l == "## Status"
			inTable = false
		case inSection && strings.HasPrefix(l, "|---"):
			inTable = true
		case inSection && inTable && strings.HasPrefix(l, "|"):
			cells := strings.Split(strings.Trim(l, "|"), "|")
			rows = append(rows, statusRow{line: i + 1, area: strings.TrimSpace(cells[0]), text: l})
		case inTable:
			inTable = false
		}
	}
	if len(rows) == 0 {
		t.Fatal(`README.md has no status table under "## Status"`)
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

// TestStatusTableCitesEvidence fails when a row of the README's status
// table cites nothing that exists, or cites a path or make target that does
// not: a row's claim must point at the doc, package or make target that
// shows it.
func TestStatusTableCitesEvidence(t *testing.T) {
	targets := map[string]bool{}
	for _, m := range makeTarget.FindAllStringSubmatch(read(t, "Makefile"), -1) {
		targets[m[1]] = true
	}
	exists := func(rel string) bool {
		_, err := os.Stat(filepath.Join(repoRoot, filepath.FromSlash(rel)))
		return err == nil
	}

	for _, row := range statusTable(t) {
		var cited []string
		for _, m := range mdLink.FindAllStringSubmatch(row.text, -1) {
			if strings.Contains(m[1], "://") {
				continue
			}
			if !exists(m[1]) {
				t.Errorf("README.md:%d (%s): the link %s names no file", row.line, row.area, m[1])
				continue
			}
			cited = append(cited, m[1])
		}
		for _, m := range codeSpan.FindAllStringSubmatch(row.text, -1) {
			span := m[1]
			if target, ok := strings.CutPrefix(span, "make "); ok {
				if !targets[target] {
					t.Errorf("README.md:%d (%s): `%s` is no Makefile target", row.line, row.area, span)
					continue
				}
				cited = append(cited, span)
				continue
			}
			if !repoPath.MatchString(span) {
				continue // a field, a value or a command, not a citation
			}
			if !exists(span) {
				t.Errorf("README.md:%d (%s): `%s` does not exist", row.line, row.area, span)
				continue
			}
			cited = append(cited, span)
		}
		if len(cited) == 0 {
			t.Errorf("README.md:%d (%s): the row cites no doc, package or make target that shows it", row.line, row.area)
		}
	}
}

// TestNoWorkingFeatureCalledPlanned fails when the README calls SPIFFE or
// the credential broker planned or not started: both work (docs/identity.md,
// make test-spire).
func TestNoWorkingFeatureCalledPlanned(t *testing.T) {
	readme := []byte(read(t, "README.md"))
	for i, l := range bytes.Split(readme, []byte("\n")) {
		lower := strings.ToLower(string(l))
		if (strings.Contains(lower, "spiffe") || strings.Contains(lower, "broker")) &&
			(strings.Contains(lower, "planned") || strings.Contains(lower, "not started")) {
			t.Errorf("README.md:%d calls a working feature planned or not started: %s", i+1, strings.TrimSpace(string(l)))
		}
	}
}

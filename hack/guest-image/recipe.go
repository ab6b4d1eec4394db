package main

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"regexp"
	"strings"

	yaml "go.yaml.in/yaml/v3"
)

// The template recipe lives in docs/templates.md, once: the builder runs
// the fenced blocks that follow these markers, as the page tells users to.
const (
	recipeMarker = "<!-- guest-image: recipe -->"
	sealMarker   = "<!-- guest-image: seal -->"
	spireMarker  = "<!-- guest-image: spire-agent -->"
)

// recipe is what the builder takes from docs/templates.md.
type recipe struct {
	// cloudConfig is step 2's cloud-config without the entries marked
	// optional and without the agent's download (the builder puts the
	// agent in itself, see injectFiles).
	cloudConfig []byte
	// packages is that cloud-config's packages list.
	packages []string
	// seal is the shell program step 3 runs in the VM through the guest
	// agent.
	seal string
	// spireAgent is where the SPIFFE section installs spire-agent (the
	// builder copies the binary it is given there instead of downloading
	// the release).
	spireAgent string
}

// readRecipe extracts the recipe from the templates page.
func readRecipe(path string) (recipe, error) {
	doc, err := os.ReadFile(path)
	if err != nil {
		return recipe{}, fmt.Errorf("read the template recipe: %w", err)
	}
	cc, err := fencedAfter(doc, recipeMarker)
	if err != nil {
		return recipe{}, fmt.Errorf("%s: %w", path, err)
	}
	sealBlock, err := fencedAfter(doc, sealMarker)
	if err != nil {
		return recipe{}, fmt.Errorf("%s: %w", path, err)
	}
	spireBlock, err := fencedAfter(doc, spireMarker)
	if err != nil {
		return recipe{}, fmt.Errorf("%s: %w", path, err)
	}
	r := recipe{}
	if r.spireAgent, err = installTarget(spireBlock); err != nil {
		return recipe{}, fmt.Errorf("%s: the SPIFFE section: %w", path, err)
	}
	if r.cloudConfig, r.packages, err = buildCloudConfig(cc); err != nil {
		return recipe{}, fmt.Errorf("%s: step 2's cloud-config: %w", path, err)
	}
	if r.seal, err = sealProgram(sealBlock); err != nil {
		return recipe{}, fmt.Errorf("%s: step 3: %w", path, err)
	}
	return r, nil
}

var fenceRE = regexp.MustCompile("(?s)^\\s*```[a-z]*\\n(.*?)\\n```")

// fencedAfter returns the body of the first fenced code block after marker.
func fencedAfter(doc []byte, marker string) ([]byte, error) {
	_, after, ok := bytes.Cut(doc, []byte(marker))
	if !ok {
		return nil, fmt.Errorf("no %s marker", marker)
	}
	// Skip the lines between the marker and the fence (a caption).
	i := bytes.Index(after, []byte("```"))
	if i < 0 {
		return nil, fmt.Errorf("no fenced block after %s", marker)
	}
	m := fenceRE.FindSubmatch(after[i:])
	if m == nil {
		return nil, fmt.Errorf("unterminated fenced block after %s", marker)
	}
	return m[1], nil
}

var optionalRE = regexp.MustCompile(`(?i)^#\s*optional`)

// buildCloudConfig drops the list items whose comment starts with
// "# optional" and the agent's download (the runcmd entry named
// install-agent), and returns the packages it installs.
func buildCloudConfig(src []byte) ([]byte, []string, error) {
	var root yaml.Node
	if err := yaml.Unmarshal(src, &root); err != nil {
		return nil, nil, err
	}
	if root.Kind != yaml.DocumentNode || len(root.Content) != 1 || root.Content[0].Kind != yaml.MappingNode {
		return nil, nil, errors.New("not a YAML mapping")
	}
	top := root.Content[0]
	var packages []string
	for i := 0; i+1 < len(top.Content); i += 2 {
		key, val := top.Content[i].Value, top.Content[i+1]
		if val.Kind != yaml.SequenceNode {
			continue
		}
		var kept []*yaml.Node
		for _, item := range val.Content {
			if optionalRE.MatchString(strings.TrimSpace(item.LineComment)) || optionalRE.MatchString(strings.TrimSpace(item.HeadComment)) || isAgentDownload(item) {
				continue
			}
			kept = append(kept, item)
			if key == "packages" && item.Kind == yaml.ScalarNode {
				packages = append(packages, item.Value)
			}
		}
		val.Content = kept
	}
	out, err := yaml.Marshal(&root)
	if err != nil {
		return nil, nil, err
	}
	if !bytes.HasPrefix(out, []byte("#cloud-config\n")) {
		out = append([]byte("#cloud-config\n"), out...)
	}
	return out, packages, nil
}

// isAgentDownload is the runcmd entry [sh, -c, <script>, install-agent, ...].
func isAgentDownload(item *yaml.Node) bool {
	return item.Kind == yaml.SequenceNode && len(item.Content) > 3 && item.Content[3].Value == "install-agent"
}

var installRE = regexp.MustCompile(`(?m)^install -D -m 0755 \S+ (/\S+)$`)

// installTarget is the destination of the block's `install -D -m 0755
// <file> <destination>`.
func installTarget(block []byte) (string, error) {
	m := installRE.FindSubmatch(block)
	if m == nil {
		return "", errors.New("no `install -D -m 0755 <file> <destination>` in the spire-agent block")
	}
	return string(m[1]), nil
}

var sealRE = regexp.MustCompile(`(?s)qm guest exec \d+ -- sh -c '([^']*)'`)

// sealProgram is the shell program of step 3's `qm guest exec ... sh -c`.
func sealProgram(block []byte) (string, error) {
	m := sealRE.FindSubmatch(block)
	if m == nil {
		return "", errors.New("no `qm guest exec <id> -- sh -c '...'` in the seal block")
	}
	return string(m[1]), nil
}

package pvefw

import (
	"errors"
	"fmt"
	"os/exec"
	"strings"
)

// Apply loads a compiled ruleset into the network namespace netns, whose
// bridge the taps are on: it first lets the bridge hand its IP traffic to
// netfilter (nf_call_iptables and nf_call_ip6tables, which conntrack needs
// for bridged packets), then runs nft -f, which replaces both tables in
// one transaction.
func Apply(netns, bridge, ruleset string) error {
	if _, err := run(netns, "", "ip", "link", "set", bridge, "type", "bridge", "nf_call_iptables", "1", "nf_call_ip6tables", "1"); err != nil {
		return err
	}
	if _, err := run(netns, ruleset, "nft", "-f", "-"); err != nil {
		return err
	}
	return nil
}

// Remove deletes the tables from the namespace (nothing is filtered any
// more); absent tables are fine.
func Remove(netns string) error {
	var b strings.Builder
	for _, fam := range []string{"bridge", "inet"} {
		fmt.Fprintf(&b, "add table %s %s\ndelete table %s %s\n", fam, Table, fam, Table)
	}
	_, err := run(netns, b.String(), "nft", "-f", "-")
	return err
}

// Loaded returns the tables as the kernel holds them (nft list), for a
// test's log when a verdict surprises it.
func Loaded(netns string) (string, error) {
	var out strings.Builder
	for _, fam := range []string{"bridge", "inet"} {
		s, err := run(netns, "", "nft", "list", "table", fam, Table)
		if err != nil {
			return out.String(), err
		}
		out.WriteString(s)
	}
	return out.String(), nil
}

func run(netns, stdin string, args ...string) (string, error) {
	full := append([]string{"netns", "exec", netns}, args...)
	cmd := exec.Command("ip", full...)
	if stdin != "" {
		cmd.Stdin = strings.NewReader(stdin)
	}
	out, err := cmd.CombinedOutput()
	if err != nil {
		var ee *exec.Error
		if errors.As(err, &ee) {
			return "", fmt.Errorf("pvefw: %s is not installed: %w", ee.Name, err)
		}
		return "", fmt.Errorf("pvefw: %s in %s: %w: %s", strings.Join(args, " "), netns, err, strings.TrimSpace(string(out)))
	}
	return string(out), nil
}

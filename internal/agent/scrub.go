package agent

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
)

// CloudInitCopies are the files in which cloud-init keeps the VM's
// user-data, whole or in parts, after it ran. The operator writes the
// agent config, single-use runner credential included, into the user-data
// (write_files); cloud-init copies it to disk and /run, where it would
// outlive the agent's removal of the config file. The agent removes every
// file these patterns (filepath.Match syntax, relative to the VM's root,
// Options.Root) match, right after reading its config. docs/security.md,
// "Credentials after the VM", explains each.
var CloudInitCopies = []string{
	// The raw user-data and vendor-data, as read from the datasource and
	// as processed (.i); instance is a symbolic link to instances/<id>.
	"/var/lib/cloud/instance/user-data.txt",
	"/var/lib/cloud/instance/user-data.txt.i",
	"/var/lib/cloud/instance/vendor-data.txt",
	"/var/lib/cloud/instance/vendor-data.txt.i",
	"/var/lib/cloud/instance/vendor-data2.txt",
	"/var/lib/cloud/instance/vendor-data2.txt.i",
	"/var/lib/cloud/instances/*/user-data.txt*",
	"/var/lib/cloud/instances/*/vendor-data*.txt*",
	// The merged #cloud-config (write_files content included).
	"/var/lib/cloud/instance/cloud-config.txt",
	"/var/lib/cloud/instances/*/cloud-config.txt",
	// The pickled datasource object, which holds the user-data too.
	"/var/lib/cloud/instance/obj.pkl",
	"/var/lib/cloud/instances/*/obj.pkl",
	// A NoCloud seed directory, for templates seeded from disk.
	"/var/lib/cloud/seed/nocloud/user-data",
	"/var/lib/cloud/seed/nocloud-net/user-data",
	// /run copies: the unredacted instance data and the merged config.
	"/run/cloud-init/instance-data-sensitive.json",
	"/run/cloud-init/combined-cloud-config.json",
}

// CloudInitScanned are files cloud-init writes from the user-data that
// usually hold no credential (the runcmd script, part scripts, the
// redacted instance data): each is removed only if it contains the
// credential, so a user's scripts stay for debugging.
var CloudInitScanned = []string{
	"/var/lib/cloud/instance/scripts/*",
	"/var/lib/cloud/instances/*/scripts/*",
	"/run/cloud-init/*",
}

// maxScanBytes bounds how much of a scanned file is read; a larger file
// is removed unread when its prefix already holds a credential, and kept
// (with a log line) otherwise.
const maxScanBytes = 16 << 20

// scrubCloudInit removes cloud-init's copies of the user-data under root
// (see CloudInitCopies and CloudInitScanned). secrets are the credential
// values to look for in scanned files. It returns the removed paths; a
// missing file is not an error.
func scrubCloudInit(root string, secrets []string) ([]string, error) {
	var removed []string
	var errs []error
	remove := func(p string) {
		switch err := os.Remove(p); {
		case err == nil:
			removed = append(removed, p)
		case !errors.Is(err, os.ErrNotExist):
			errs = append(errs, err)
		}
	}
	for _, pattern := range CloudInitCopies {
		for _, p := range regularFiles(root, pattern, &errs) {
			remove(p)
		}
	}
	for _, pattern := range CloudInitScanned {
		for _, p := range regularFiles(root, pattern, &errs) {
			holds, err := holdsSecret(p, secrets)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			if holds {
				remove(p)
			}
		}
	}
	return removed, errors.Join(errs...)
}

// regularFiles are the regular files (not directories, not links) that
// pattern matches under root.
func regularFiles(root, pattern string, errs *[]error) []string {
	matches, err := filepath.Glob(filepath.Join(root, pattern))
	if err != nil {
		*errs = append(*errs, fmt.Errorf("pattern %s: %w", pattern, err))
		return nil
	}
	var out []string
	for _, m := range matches {
		if fi, err := os.Lstat(m); err == nil && fi.Mode().IsRegular() {
			out = append(out, m)
		}
	}
	return out
}

// holdsSecret reports whether the file at p contains one of secrets.
func holdsSecret(p string, secrets []string) (bool, error) {
	if len(secrets) == 0 {
		return false, nil
	}
	f, err := os.Open(p)
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxScanBytes))
	if err != nil {
		return false, fmt.Errorf("read %s: %w", p, err)
	}
	for _, s := range secrets {
		if s != "" && strings.Contains(string(data), s) {
			return true, nil
		}
	}
	return false, nil
}

// configSecrets are the secret values of a config document, read loosely
// so that an invalid document still yields them: a credential only an
// operator from before the guest channel wrote there, and the notice token.
func configSecrets(data []byte) []string {
	var loose struct {
		JITConfig         string `json:"jitConfig"`
		RegistrationToken string `json:"registrationToken"`
		SPIFFE            *struct {
			JoinToken string `json:"joinToken"`
		} `json:"spiffe"`
		PowerOffNotify *struct {
			Token string `json:"token"`
		} `json:"powerOffNotify"`
	}
	if json.Unmarshal(data, &loose) != nil {
		return nil
	}
	var out []string
	if n := loose.PowerOffNotify; n != nil && n.Token != "" {
		out = append(out, n.Token)
	}
	for _, s := range []string{loose.JITConfig, loose.RegistrationToken} {
		if s != "" {
			out = append(out, s)
		}
	}
	if loose.SPIFFE != nil && loose.SPIFFE.JoinToken != "" {
		out = append(out, loose.SPIFFE.JoinToken)
	}
	return out
}

// scrubCloudInitCopies runs scrubCloudInit for the agent, logging what it
// removed and what it could not.
func (a *agent) scrubCloudInitCopies(config []byte) {
	removed, err := scrubCloudInit(a.opts.Root, configSecrets(config))
	for _, p := range removed {
		a.log.Info("cloud-init copy of the user-data removed", "path", p)
	}
	if err != nil {
		// Go on: the VM is single-use and destroyed after its job.
		a.log.Error("cannot remove every cloud-init copy of the user-data, which holds the runner credential", "error", err)
	}
}

//go:build guest

package guest

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/hyperfleet/hyperfleet/internal/agentconfig"
	proxmoxsim "github.com/hyperfleet/hyperfleet/internal/testworld/simulator/proxmox"
)

// seedSecretRE finds the single-use credentials in a seed's user-data:
// the agent's config is JSON inside it (docs/cloud-init.md).
var seedSecretRE = regexp.MustCompile(`"(jitConfig|registrationToken|joinToken)":\s*"([^"]+)"`)

// seedSecrets returns the credentials in a seed's files, value -> what it
// is.
func seedSecrets(files map[string]string) map[string]string {
	out := map[string]string{}
	for _, content := range files {
		for _, m := range seedSecretRE.FindAllStringSubmatch(content, -1) {
			out[m[2]] = m[1]
		}
	}
	return out
}

// diskScan is what a powered-off guest left on its disk.
type diskScan struct {
	// inFiles are "<secret> in <path>" for every file of the guest's file
	// system that holds a secret.
	inFiles []string
	// inBlocks are the secrets found anywhere in the bytes the guest
	// wrote (the overlay's clusters), deleted files' blocks included.
	inBlocks []string
}

// convertWhenReleased converts overlay to raw once no QEMU holds it: a VM
// the operator stopped (SIGKILL) and destroyed may still be exiting, its
// lock on the disk held until it is gone, seconds on a loaded machine.
func convertWhenReleased(overlay, raw string) error {
	deadline := time.Now().Add(2 * time.Minute)
	for {
		out, err := exec.Command("nice", "-n", "19", "qemu-img", "convert", "-O", "raw", overlay, raw).CombinedOutput()
		if err == nil {
			return nil
		}
		if !strings.Contains(string(out), "Failed to get shared \"write\" lock") || time.Now().After(deadline) {
			return fmt.Errorf("convert %s to raw: %w: %s", overlay, err, out)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// scanDisk reads a destroyed guest's overlay: the bytes the guest wrote,
// and the files of its file system (the overlay converted to raw, the
// directories where the guest keeps state copied out with debugfs, which
// needs no mount). secrets maps each value to what it is.
func scanDisk(overlay, work string, secrets map[string]string) (diskScan, error) {
	var res diskScan
	found, err := scanBytes(overlay, secrets)
	if err != nil {
		return res, err
	}
	res.inBlocks = found
	raw := filepath.Join(work, "disk.raw")
	defer os.Remove(raw)
	if err := convertWhenReleased(overlay, raw); err != nil {
		return res, err
	}
	// The guest's last transactions may still be in the journal only
	// (a clean shutdown need not checkpoint it), and debugfs does not
	// replay it: e2fsck does, on this copy.
	// Exit status 1 says it changed the file system: it replayed.
	var exit *exec.ExitError
	if out, err := exec.Command("e2fsck", "-E", "journal_only", "-y", raw).CombinedOutput(); err != nil && (!errors.As(err, &exit) || exit.ExitCode() != 1) {
		return res, fmt.Errorf("replay the journal of %s: %w: %s", overlay, err, out)
	}
	tree := filepath.Join(work, "tree")
	defer os.RemoveAll(tree)
	if err := os.MkdirAll(filepath.Join(tree, "usr"), 0o755); err != nil {
		return res, fmt.Errorf("scan %s: %w", overlay, err)
	}
	// Every directory of the root file system that is not a mount point
	// of a pseudo file system at run time (/run, /proc, /sys, /dev).
	for _, dir := range []string{"etc", "home", "opt", "root", "srv", "tmp", "usr/local", "var"} {
		// rdump copies the directory into the one named last.
		dst := filepath.Join(tree, filepath.Dir(dir))
		if out, err := exec.Command("nice", "-n", "19", "debugfs", "-R", "rdump /"+dir+" "+dst, raw).CombinedOutput(); err != nil {
			return res, fmt.Errorf("debugfs rdump /%s of %s: %w: %s", dir, overlay, err, out)
		}
	}
	err = filepath.WalkDir(tree, func(path string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return nil //nolint:nilerr // unreadable entries (dangling links) hold nothing
		}
		found, err := scanBytes(path, secrets)
		for _, s := range found {
			res.inFiles = append(res.inFiles, s+" in "+strings.TrimPrefix(path, tree))
		}
		return err
	})
	sort.Strings(res.inFiles)
	return res, err
}

// scanBytes returns what of secrets (value -> what it is) the file holds.
func scanBytes(path string, secrets map[string]string) ([]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("scan: %w", err)
	}
	defer f.Close()
	longest := 0
	for s := range secrets {
		longest = max(longest, len(s))
	}
	r := bufio.NewReaderSize(f, 1<<20)
	buf := make([]byte, 0, 2<<20)
	hit := map[string]bool{}
	for {
		chunk := make([]byte, 1<<20)
		n, err := io.ReadFull(r, chunk)
		buf = append(buf, chunk[:n]...)
		for s := range secrets {
			if bytes.Contains(buf, []byte(s)) {
				hit[s] = true
			}
		}
		// Keep a tail as long as a secret, for one across two chunks.
		if len(buf) > longest {
			buf = append(buf[:0], buf[len(buf)-longest:]...)
		}
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("scan %s: %w", path, err)
		}
	}
	var out []string
	for s := range hit {
		out = append(out, secrets[s])
	}
	sort.Strings(out)
	return out, nil
}

// placedSecrets keeps what the operator writes into running guests
// (POST .../agent/file-write, whose content is a GuestSecrets document),
// by VM id: each value -> what it is.
type placedSecrets struct {
	mu   sync.Mutex
	byVM map[int]map[string]string
	// firstAt is when the first secrets document was written into each
	// VM (its "credential placed" milestone).
	firstAt map[int]time.Time
	// uploaded counts uploads to a storage (cloud-init ISOs).
	uploaded int
}

// observe is devenv.Options.OnProxmoxRequest: it reads a file-write's
// content (and puts the body back for the simulator).
func (p *placedSecrets) observe(r *http.Request) {
	if r.Method == http.MethodPost && strings.HasSuffix(r.URL.Path, "/upload") {
		p.mu.Lock()
		p.uploaded++
		p.mu.Unlock()
	}
	vmid, raw, ok := proxmoxsim.FileWriteRequest(r)
	if !ok {
		return
	}
	doc, err := agentconfig.ParseGuestSecrets(raw)
	if err != nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.byVM[vmid] == nil {
		p.byVM[vmid] = map[string]string{}
	}
	if _, seen := p.firstAt[vmid]; !seen {
		p.firstAt[vmid] = time.Now()
	}
	for what, v := range map[string]string{"jitConfig": doc.JITConfig, "registrationToken": doc.RegistrationToken, "joinToken": doc.JoinToken, "enrollmentProof": doc.EnrollmentProof, "brokerProof": doc.BrokerProof} {
		if v != "" {
			p.byVM[vmid][v] = what
		}
	}
}

// uploads is how many uploads to a storage were seen.
func (p *placedSecrets) uploads() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.uploaded
}

// placedAt is when the first secrets document was written into VM vmid.
func (p *placedSecrets) placedAt(vmid int) (time.Time, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	at, ok := p.firstAt[vmid]
	return at, ok
}

// of is what was placed in VM vmid.
func (p *placedSecrets) of(vmid int) map[string]string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return maps.Clone(p.byVM[vmid])
}

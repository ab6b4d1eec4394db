package ownership

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// releasePrefix starts the note a released VM carries.
const releasePrefix = "Released from HyperFleet management:"

// ReleasedDescription is what a VM's description becomes when a provider
// releases the VM from this install's management (a platform admin's
// disownment, provider.Provider.DisownVM): the description without any
// ownership block, followed by a one-line note saying whose VM it was and
// since when it is no longer HyperFleet's, for the people who keep it.
//
// The note is not signed and proves nothing: no call modifies or destroys a
// VM because of it, and a VM without a block is foreign to every install.
// Its one use is to let a repeated release of the same VM for the same
// claim recognise its own work (Released), so that releasing is idempotent.
func (s *Signer) ReleasedDescription(description string, r Record, at time.Time) string {
	note := fmt.Sprintf("%s install=%s claim=%s/%s uid=%s vmid=%d at=%s", releasePrefix,
		s.operatorID, r.Namespace, r.Name, r.UID, r.VMID, at.UTC().Truncate(time.Second).Format(time.RFC3339))
	var kept []string
	for _, line := range strings.Split(StripBlock(description), "\n") {
		// An earlier release's note goes: a VM says once whose it was.
		if !strings.HasPrefix(strings.TrimSpace(line), releasePrefix) {
			kept = append(kept, line)
		}
	}
	text := strings.TrimSpace(strings.Join(kept, "\n"))
	if text == "" {
		return note
	}
	return text + "\n\n" + note
}

// Released reports whether description is one ReleasedDescription wrote
// for this install, the claim with uid and VM vmid: it holds no ownership
// block and a release note naming all three.
func (s *Signer) Released(description, uid string, vmid int) bool {
	if strings.Contains(description, blockBegin) {
		return false
	}
	for _, line := range strings.Split(description, "\n") {
		rest, ok := strings.CutPrefix(strings.TrimSpace(line), releasePrefix)
		if !ok {
			continue
		}
		fields := map[string]string{}
		for _, f := range strings.Fields(rest) {
			if k, v, ok := strings.Cut(f, "="); ok {
				fields[k] = v
			}
		}
		if fields["install"] == s.operatorID && fields["uid"] == uid && fields["vmid"] == strconv.Itoa(vmid) {
			return true
		}
	}
	return false
}
